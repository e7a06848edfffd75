"""A decoded sparseloco vector kept sparse: the kept entries' indices and values, nothing else.

Why: a sparseloco pseudo-gradient keeps ~2% of its entries (codecs.py, ``SparseLoCo``). Decoded
dense, every use of it is a model-sized pass: the decode itself, robust mixing's norms, sum and
direction test (p2p/averaging/robust.py, ``robust_mean``), error feedback's subtraction. On the
2.2 M-parameter wide task those passes were most of the ~65 ms of CPU an outer round cost each
of 4 peers (bench/round_cpu.py). Kept sparse, each is a pass over ~2% of the entries.

The operations here give the dense computation's values: a sum into a dense total adds the
same terms in the same order (the dense one only adds zeros besides, which change no bits), a
scaling multiplies the same entries. Norms and dot products sum the same nonzero terms in
another order, so they may differ from the dense ones in the last bits (tests/test_sparse_mean.py).

Mixed with dense vectors (a peer that sends another codec), ``dense`` gives the dense one.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from p2p.compression.codecs import Compressed
from p2p.compression.sparse_wire import entries


class SparseDelta:
    """``numel`` float32 entries, zero but at ``idx`` (int64, strictly ascending): ``vals``."""

    __slots__ = ("numel", "idx", "vals")
    __array_ufunc__ = None  # numpy scalars defer to __rmul__ instead of building object arrays
    dtype = np.dtype(np.float32)

    def __init__(self, numel: int, idx: np.ndarray, vals: np.ndarray) -> None:
        self.numel, self.idx, self.vals = numel, idx, vals

    @property
    def shape(self) -> tuple[int]:
        return (self.numel,)

    @property
    def size(self) -> int:
        return self.numel

    @property
    def nbytes(self) -> int:  # what it holds in memory (the replay log's budget)
        return int(self.idx.nbytes + self.vals.nbytes)

    def __rmul__(self, factor: np.float32) -> "SparseDelta":
        return SparseDelta(self.numel, self.idx, factor * self.vals)

    def dense(self) -> np.ndarray:
        out = np.zeros(self.numel, dtype=np.float32)
        out[self.idx] = self.vals
        return out


Vector = Union[np.ndarray, SparseDelta]


def decode_sparseloco(c: Compressed) -> SparseDelta:
    """A (validated or locally made) sparseloco record as a SparseDelta: what ``decompress``
    gives, without the model-sized zeros (the same index and value arithmetic)."""
    codes, levels = c.arrays
    block, k = c.meta
    # offsets ascend within a chunk and chunks in order: the indices ascend (validate checks it)
    return SparseDelta(c.numel, *entries(codes, levels, block, k))


def dense(v: Vector) -> np.ndarray:
    return v.dense() if isinstance(v, SparseDelta) else v


def one_kind(vectors: Sequence[Vector]) -> Sequence[Vector]:
    """All sparse as they are, else all dense (a set that mixes both is computed dense)."""
    if all(isinstance(v, SparseDelta) for v in vectors) or not any(isinstance(v, SparseDelta) for v in vectors):
        return vectors
    return [dense(v) for v in vectors]


def norm(v: Vector) -> float:
    return float(np.linalg.norm(v.vals if isinstance(v, SparseDelta) else v))


def accumulate(total: np.ndarray, v: Vector) -> None:
    """total += v (a sparse vector's indices are distinct: one fancy-indexed add)."""
    if isinstance(v, SparseDelta):
        total[v.idx] += v.vals
    else:
        total += v


def dot(v: Vector, total: np.ndarray) -> float:
    """<v, total>, total dense."""
    if isinstance(v, SparseDelta):
        return float(np.dot(v.vals, total[v.idx]))
    return float(np.vdot(v, total))


def head(v: Vector, count: int = 16) -> bytes:
    """The first ``count`` entries' bytes, as the dense vector's (robust.py's canonical order)."""
    if not isinstance(v, SparseDelta):
        return v.reshape(-1)[:count].tobytes()
    out = np.zeros(min(count, v.numel), dtype=np.float32)
    front = int(np.searchsorted(v.idx, out.size))
    out[v.idx[:front]] = v.vals[:front]
    return out.tobytes()
