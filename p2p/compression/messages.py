"""Compressed tensors on the wire.

``CompressedFields`` is a frozen dataclass base holding one ``Compressed`` record flattened
into wire fields: ``codec``, ``numel``, ``meta`` (ints) and two tensor frames, ``data`` (the
codec's first array) and ``aux`` (its second, or an empty uint8 array). A message that carries
a compressed tensor subclasses it and adds its own fields after these; its ``__post_init__``
runs ``validate`` so that a malformed payload is rejected by ``p2p.wire.decode`` with
``RemoteProtocolError`` (reasons: unknown_codec, bad_payload, non_finite) before any protocol
object sees it. Checking ``numel`` against the local model is the receiving algorithm's job.

Tags 60..79 belong to compression (append-only): 60 CompressedTensor here; 61..63 CHOCO-gossip
(p2p/averaging/choco.py); 64..65 compressed AD-PSGD (adpsgd.py); 66 compressed DiLoCo (diloco.py);
67..68 DiLoCo's reduce-scatter round (outer_scatter.py); 69 DiLoCo's catch-up shares (outer_catchup.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from p2p.compression.codecs import COMPRESSORS, Compressed, SparseLoCo, validate
from p2p.compression.sparse_wire import pack_codes, unpack_codes
from p2p.protocol import RemoteProtocolError
from p2p.wire import message

_NO_AUX = np.empty(0, dtype=np.uint8)


@dataclass(frozen=True)
class CompressedFields:
    codec: str
    numel: int
    meta: tuple[int, ...]
    data: np.ndarray
    aux: np.ndarray

    def __post_init__(self) -> None:
        payload = self._unpacked()
        validate(payload)
        object.__setattr__(self, "_payload", payload)  # sparseloco's codes are unpacked once

    def payload(self) -> Compressed:
        """The carried record (validated at construction; arrays are views of the received
        frames, read-only, but sparseloco's codes, unpacked from the wire's: sparse_wire.py)."""
        return self._payload

    def _unpacked(self) -> Compressed:
        cls = COMPRESSORS.get(self.codec) if isinstance(self.codec, str) else None
        if cls is None:
            raise RemoteProtocolError("unknown_codec", f"codec {self.codec!r}")
        meta = tuple(self.meta) if isinstance(self.meta, (tuple, list)) else self.meta
        if cls.ARRAYS == 1:
            if not isinstance(self.aux, np.ndarray) or self.aux.size:
                raise RemoteProtocolError("bad_payload", f"{self.codec} carries no aux array")
            arrays: tuple = (self.data,)
        elif cls is SparseLoCo:
            arrays = (unpack_codes(self.data, self.numel, *SparseLoCo.layout(self.numel, meta)), self.aux)
        else:
            arrays = (self.data, self.aux)
        return Compressed(self.codec, self.numel, arrays, meta)


def compressed_fields(c: Compressed) -> dict[str, Any]:
    """Keyword arguments for a ``CompressedFields`` subclass carrying ``c`` (sparseloco's codes
    packed for the wire: sparse_wire.py)."""
    data = pack_codes(c.arrays[0], c.numel, *c.meta) if c.codec == SparseLoCo.name else c.arrays[0]
    return {"codec": c.codec, "numel": c.numel, "meta": tuple(c.meta), "data": data,
            "aux": c.arrays[1] if len(c.arrays) > 1 else _NO_AUX}


@message(60)
@dataclass(frozen=True)
class CompressedTensor(CompressedFields):
    """A standalone compressed tensor: ``stream`` says what it is (the sender's label, e.g. a
    model key or "grad"), ``seq`` orders a stream's tensors (for gap detection)."""

    stream: str
    seq: int
