"""Compression on the tensor path: codecs (none, fp16, bf16, int8, int4, topk, sign,
sparseloco) behind a name registry, error feedback, and the wire message that carries a
compressed tensor.

- ``codecs``: ``Compressed`` records, ``COMPRESSORS``, ``make_compressor``, ``validate``,
  ``decompress`` (pure numpy, vectorised).
- ``feedback``: ``ErrorFeedback`` (per-stream residual memory, EF-SGD).
- ``sparse``: ``SparseDelta``, a decoded sparseloco vector kept sparse (DiLoCo's round works on
  its kept entries only).
- ``messages``: ``CompressedFields`` (base for messages carrying a record) and
  ``CompressedTensor`` (tag 60). Tags 60..79 are compression's.

CHOCO-gossip, the averaging algorithm that makes compressed gossip converge, lives in
p2p/averaging/choco.py.
"""

from p2p.compression.codecs import (
    COMPRESSORS,
    Compressed,
    Compressor,
    compressor_from_config,
    decompress,
    make_compressor,
    nbytes,
    validate,
)
from p2p.compression.feedback import ErrorFeedback

__all__ = ["COMPRESSORS", "Compressed", "Compressor", "ErrorFeedback", "compressor_from_config",
           "decompress", "make_compressor", "nbytes", "validate"]
