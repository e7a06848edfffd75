"""DiLoCo's pseudo-gradient through its codec: packed for the wire, decoded for the mix.

Kept apart from diloco.py for one reason: with ``sparseloco`` the decoded Delta stays sparse
(p2p/compression/sparse.py). It keeps ~2% of the entries, and the round's work on it (error
feedback, robust mixing's norms, sum and direction test) then runs over those entries only;
decoded dense, each of those steps was a model-sized pass (bench/round_cpu.py).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from p2p.averaging.base import ModelPort, decoded_params
from p2p.compression import Compressed, Compressor, decompress
from p2p.compression.messages import CompressedFields
from p2p.compression.sparse import SparseDelta, Vector, decode_sparseloco
from p2p.protocol import RemoteProtocolError


def decode(packed: Compressed) -> Vector:
    """D(Q(Delta)) of a validated or local record: sparse for sparseloco, else dense."""
    return decode_sparseloco(packed) if packed.codec == "sparseloco" else decompress(packed, packed.numel)


def received_delta(msg: CompressedFields, port: ModelPort) -> Vector:
    """A neighbour's Q(Delta), checked against our model and decoded (``decode``)."""
    if msg.codec != "sparseloco":
        return decoded_params(msg, port)
    if msg.model_key != port.model_key:
        raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {port.model_key!r}")
    if msg.numel != port.numel:
        raise RemoteProtocolError("bad_tensor", f"{msg.numel} parameters, want {port.numel}")
    return decode_sparseloco(msg.payload())  # payload() validates the record


def pack(compressor: Compressor, delta: np.ndarray,
         residual: Optional[np.ndarray] = None) -> tuple[Compressed, Vector]:
    """(Q(Delta), D(Q(Delta))). With ``residual`` e (error feedback, diloco.py "Compression"):
    Q(Delta + e), and e <- Delta + e - D(Q(Delta + e)), in e's own buffer (no model-sized
    temporary) and, for a sparse decoding, on its kept entries only (elsewhere D is zero: the
    dense subtraction's bits)."""
    if residual is not None:
        residual += delta  # e + Delta: the same bits as Delta + e
        delta = residual
    packed = compressor.compress(delta)
    decoded = decode(packed)
    if residual is not None:
        if isinstance(decoded, SparseDelta):
            residual[decoded.idx] -= decoded.vals
        else:
            residual -= decoded
    return packed, decoded

