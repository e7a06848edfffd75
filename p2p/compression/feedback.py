"""Error feedback: remember what compression dropped and send it later.

Theory of operation (Seide et al., "1-bit SGD", 2014; Karimireddy et al., "Error Feedback Fixes
SignSGD", ICML 2019; Lin et al., "Deep Gradient Compression", ICLR 2018). Per stream (one per
destination, or one per broadcast channel) keep a residual e, initially 0. To send x:

    v = x + e;   c = Q(v);   e <- v - D(c);   send c

Invariant: after T sends, sum_t D(c_t) = sum_t x_t - e_T. Nothing is ever lost, only delayed,
and for a contractive Q (||v - D(Q(v))|| <= (1 - delta) ||v||) the residual stays bounded by
about ||x|| / delta, so the running sum of what the receiver decodes tracks the running sum of
what was meant to be sent: the property that makes EF-SGD converge at the uncompressed rate.

Each stream's residual belongs to one receiver's view of the sum. Forget a stream when its
receiver goes away (``forget``); a stream whose messages were lost has lost that mass for good
(the residual only covers what Q dropped, not what the network dropped).
"""

from __future__ import annotations

from typing import Hashable, Iterator

import numpy as np

from p2p.compression.codecs import Compressed, Compressor, decompress
from p2p.protocol import LocalProtocolError


class ErrorFeedback:
    """A compressor with per-stream residual memory (module docstring)."""

    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor
        self.name = compressor.name
        self._residual: dict[Hashable, np.ndarray] = {}

    def compress_with_decoded(self, x: np.ndarray, key: Hashable = None) -> tuple[Compressed, np.ndarray]:
        """Compress ``x`` plus ``key``'s residual; return the record and its decoding."""
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
            raise LocalProtocolError("ErrorFeedback wants a 1-D float32 array")
        e = self._residual.get(key)
        if e is not None and e.size != x.size:
            raise LocalProtocolError(f"stream {key!r} holds {e.size} elements, got {x.size}")
        v = x + e if e is not None else x.copy()
        c = self.compressor.compress(v)
        decoded = decompress(c, x.size)
        v -= decoded  # v is now the new residual
        self._residual[key] = v
        return c, decoded

    def compress(self, x: np.ndarray, key: Hashable = None) -> Compressed:
        return self.compress_with_decoded(x, key)[0]

    def decompress(self, c: Compressed, numel: int) -> np.ndarray:
        return decompress(c, numel)

    def residual(self, key: Hashable = None) -> np.ndarray:
        """A copy of ``key``'s residual (zeros of size 0 if the stream is new)."""
        e = self._residual.get(key)
        return np.zeros(0, dtype=np.float32) if e is None else e.copy()

    def forget(self, key: Hashable) -> None:
        self._residual.pop(key, None)

    def keys(self) -> Iterator[Hashable]:
        return iter(list(self._residual))
