"""sparseloco's codes on the wire: Elias-Fano offsets, 2-bit values (about 9.6 bits an entry, not 16).

In memory a kept entry is one uint16, ``offset << 2 | negative << 1 | high`` (codecs.py,
``SparseLoCo``): 14 of its 16 bits say where the entry is. But a chunk's k offsets ascend
within ``block`` positions, which takes about log2(block / k) + 2 bits each in Elias-Fano's
encoding (Elias 1974, Fano 1971; as in Vigna, "Quasi-succinct indices", WSDM 2013, Sec. 3):

- the low ``l = floor(log2(block // k))`` bits of each offset, as l bit planes;
- the high bits as a bitmap per chunk: entry i of the chunk sets bit ``(offset >> l) + i``, so a
  chunk takes ``k + ceil(block / 2^l)`` bits and entry i's high part is the position of the
  chunk's i-th set bit minus i;
- the 2-bit value codes, as two bit planes.

At the default 2% of 4096-element chunks (k 82, l 5) an entry takes 2.56 + 5 + 2 bits: a
2.2 M-parameter Delta's share is 57.6 KB on the wire instead of 92.6 KB (measured in the lab),
which is what a round costs each link. The bitmaps are one ``np.packbits`` over all chunks, the
planes one each (a pass per bit: packing bits per value took 5x as long to unpack). The buffer's
size follows from (numel, block, k), so a record whose size disagrees is refused before anything
is allocated. Unpacking checks that every chunk's bitmap holds exactly its count of entries;
``check`` in codecs.py then checks the offsets (inside their chunk, strictly ascending) as for
any record. Pack ~0.4 ms, unpack ~0.5-0.7 ms a 2.2 M-parameter share here at 2% (stop 40; ~1
and ~1.3 ms before the per-entry bases were cached and the bit planes read as uint16).

``entries`` turns the codes and per-chunk levels into indices and values: the decoding both
the sparse path (sparse.py) and the dense one (codecs.py) use.
"""

from __future__ import annotations

import functools

import numpy as np

from p2p.compression.kernels import nblocks
from p2p.protocol import RemoteProtocolError


def sparse_layout(numel: int, block: int, k: int) -> tuple[int, int, int]:
    """(chunks, kept entries, entries of the last chunk) of a sparseloco record (codecs.py,
    ``SparseLoCo``): every chunk keeps k entries, the last one, of length L <= block,
    ceil(k L / block) (the same density)."""
    chunks = nblocks(numel, block)
    if not chunks:
        return 0, 0, 0
    last = -(-k * (numel - (chunks - 1) * block) // block)
    return chunks, (chunks - 1) * k + last, last


def _layout(numel: int, block: int, k: int) -> tuple[int, int, int, int, int]:
    """(chunks, kept, entries of the last chunk, low bits, high buckets of a whole chunk)."""
    chunks, kept, k_last = sparse_layout(numel, block, k)
    low = max(0, (block // k).bit_length() - 1)
    return chunks, kept, k_last, low, -(-block >> low)


def _rows(numel: int, block: int, k: int) -> tuple[int, int, int, int, int, int]:
    """(kept, low bits, bits of a whole chunk's bitmap, of the last chunk's, whole chunks, entries
    of the last chunk)."""
    chunks, kept, k_last, low, buckets = _layout(numel, block, k)
    if not chunks:
        return 0, low, 0, 0, 0, 0
    last_len = numel - (chunks - 1) * block
    return kept, low, k + buckets, k_last + -(-last_len >> low), chunks - 1, k_last


def _sizes(numel: int, block: int, k: int) -> tuple[int, int, int]:
    """Bytes of the bitmaps, of the low bits and of the value codes."""
    kept, low, row_bits, last_bits, full, _ = _rows(numel, block, k)
    plane = -(-kept // 8)  # one packed plane per bit of the low parts and of the value codes
    return -(-(full * row_bits + last_bits) // 8), low * plane, 2 * plane


def packed_size(numel: int, block: int, k: int) -> int:
    return sum(_sizes(numel, block, k))


@functools.lru_cache(maxsize=2)  # the swarm's codec settings; small: a peer picks (block, k)
def _entries(kept: int, k: int, full: int, row_bits: int) -> np.ndarray:
    """Per entry: where its chunk's bitmap starts plus its rank in the chunk (its bit is that
    plus its offset's high part). The same for every record of one model and codec, so computed
    once: it was ~1 ms of each pack and unpack of a 2.2 M-parameter share at 10%."""
    entry = np.arange(kept, dtype=np.int64)
    row = np.minimum(entry // k, full)  # every chunk but the last holds exactly k entries
    base = row * row_bits + (entry - row * k)
    base.flags.writeable = False
    return base


def _planes(values: np.ndarray, width: int) -> np.ndarray:
    """The low ``width`` bits of every value as bit planes, most significant first, each plane
    packed (``kept`` bits, padded to whole bytes): a pass per bit, no per-value bit arrays."""
    values = values.astype(np.uint16)  # < 2^14 (an offset's low bits or a 2-bit code): 4x less to read than int64
    return np.concatenate([np.packbits(((values >> j) & 1).astype(np.uint8)) for j in range(width - 1, -1, -1)]
                          or [np.empty(0, np.uint8)])


def _values(buf: np.ndarray, width: int, count: int) -> np.ndarray:
    """Inverse of ``_planes``: ``count`` values of ``width`` bits."""
    values = np.zeros(count, dtype=np.uint16)  # as _planes: in place, no int64 temporaries
    plane = -(-count // 8)
    for j in range(width):
        values <<= 1
        values |= np.unpackbits(buf[j * plane:(j + 1) * plane], count=count)
    return values


def pack_codes(codes: np.ndarray, numel: int, block: int, k: int) -> np.ndarray:
    """sparseloco's uint16 codes (ascending offsets within each chunk) as the wire's uint8 buffer."""
    kept, low, row_bits, last_bits, full, _ = _rows(numel, block, k)
    if codes.size != kept:
        raise ValueError(f"sparseloco codes: {codes.size} entries, the layout holds {kept}")
    offsets = (codes >> 2).astype(np.int64)
    bitmaps = np.zeros(full * row_bits + last_bits, dtype=np.uint8)
    bitmaps[_entries(kept, k, full, row_bits) + (offsets >> low)] = 1
    parts = (np.packbits(bitmaps), _planes(offsets & ((1 << low) - 1), low), _planes(codes & 3, 2))
    return np.concatenate(parts)


def _fail(detail: str) -> None:
    raise RemoteProtocolError("bad_payload", f"sparseloco: {detail}")


def unpack_codes(buf: np.ndarray, numel: int, block: int, k: int) -> np.ndarray:
    """The uint16 codes of a wire buffer (``block`` and ``k`` already checked); RemoteProtocolError
    ``bad_payload`` when its size or a chunk's count of entries is wrong."""
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
        _fail("codes must be one uint8 buffer")
    sizes = _sizes(numel, block, k)
    if buf.size != sum(sizes):
        _fail(f"codes buffer of {buf.size} bytes, the layout takes {sum(sizes)}")
    kept, low, row_bits, last_bits, full, k_last = _rows(numel, block, k)
    if not kept:
        return np.empty(0, dtype=np.uint16)
    upper_end, low_end = sizes[0], sizes[0] + sizes[1]
    bitmaps = np.unpackbits(buf[:upper_end], count=full * row_bits + last_bits)
    counts = np.add.reduceat(bitmaps, np.arange(full + 1) * row_bits, dtype=np.int64)  # the last: to the end
    want = np.full(full + 1, k, dtype=np.int64)
    want[full] = k_last
    if not np.array_equal(counts, want):
        _fail("a chunk's bitmap does not hold its count of entries")
    high = np.flatnonzero(bitmaps.view(np.bool_))  # 0/1 bytes: a bool view is exact, and 5x faster
    high -= _entries(kept, k, full, row_bits)
    lows = _values(buf[upper_end:low_end], low, kept)
    offsets = (high << low) | lows
    if offsets.max() >= block:  # before the uint16 below could wrap it (check() then bounds the last chunk)
        _fail("offset outside its chunk")
    values = _values(buf[low_end:], 2, kept)
    return ((offsets << 2) | values).astype(np.uint16)


def entries(codes: np.ndarray, levels: np.ndarray, block: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The (indices, float32 values) of a sparseloco record's uint16 codes and per-chunk (low,
    high) levels (codecs.py, ``SparseLoCo``)."""
    first, signed = _chunk_bases(codes.size, block, k)
    # each chunk's four values, +low, +high, -low, -high: a code's low two bits (negative << 1 |
    # high) pick one; one gather instead of a gather and a masked negation (4x faster here)
    pairs = levels.reshape(-1, 2)
    table = np.concatenate([pairs, -pairs], axis=1)
    return first + (codes >> 2), table.reshape(-1)[signed + (codes & 3)]


@functools.lru_cache(maxsize=2)  # the swarm's codec settings; small: a peer picks (block, k)
def _chunk_bases(kept: int, block: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per kept entry, its chunk's first index and its chunk's first entry in ``entries``' table
    of signed levels: the same for every record of one model and codec, so computed once (an
    int64 division per entry was ~1/3 of a decode). Every chunk but the last holds exactly k
    entries."""
    chunk = np.arange(kept) // k
    first, signed = chunk * block, 4 * chunk
    first.flags.writeable = signed.flags.writeable = False
    return first, signed
