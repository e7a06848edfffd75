"""Array kernels behind the codecs: cache-chunked loops, blockwise reductions, float16 and
bfloat16 bit conversions, exact top-k. Pure numpy; inputs are 1-D float32 (checked by callers).

Why chunks: a codec is a handful of elementwise passes. Run over a whole 64 MB vector each pass
streams through memory; run over ``CHUNK`` elements (256 KB of float32) the temporaries stay in
L2, which measured 2-4x faster here. The Python loop runs n / CHUNK times (245 for 16M
elements), never per element or per block.
"""

from __future__ import annotations

import numpy as np

CHUNK = 1 << 16  # elements per cache-sized chunk


def nblocks(n: int, block: int) -> int:
    return -(-n // block)


def spans(n: int, align: int) -> list[tuple[int, int]]:
    """(lo, hi) element ranges of about CHUNK elements, lo a multiple of ``align``."""
    step = max(align, CHUNK // align * align)
    if n <= step:
        return [(0, n)] if n else []
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


def per_element(per_block: np.ndarray, lo: int, hi: int, block: int) -> np.ndarray:
    """The per-block values covering elements [lo, hi) (lo block-aligned), one per element."""
    return np.repeat(per_block[lo // block:nblocks(hi, block)], block)[: hi - lo]


def _block_reduce(x: np.ndarray, block: int, reduce: np.ufunc) -> np.ndarray:
    out = np.empty(nblocks(x.size, block), dtype=np.float32)
    for lo, hi in spans(x.size, block):
        starts = np.arange(0, hi - lo, block)
        out[lo // block: lo // block + starts.size] = reduce.reduceat(np.abs(x[lo:hi]), starts)
    return out


def block_absmax(x: np.ndarray, block: int) -> np.ndarray:
    return _block_reduce(x, block, np.maximum)


def block_abssum(x: np.ndarray, block: int) -> np.ndarray:
    return _block_reduce(x, block, np.add)


_U32_MAG = np.uint32(0x7FFFFFFF)
_F16_REBIAS_RNE = np.uint32((0xFFF - (112 << 23)) & 0xFFFFFFFF)  # exponent 127 -> 15, + half ulp - 1
_F16_DENORM_MAGIC = np.float32(0.5)  # adding 0.5f leaves the half subnormal bits in the low mantissa
_F16_DENORM_BITS = np.uint32(0x3F000000)
_F16_FROM_BITS = np.float32(2.0**112)  # (h << 13) as float32 times 2^112 = the half's value


def f16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> IEEE half bit patterns (uint16), round to nearest even, saturating at +-65504.

    Integer ops on the uint32 view (normals), the FPU's own rounding for half subnormals (add
    0.5f, after F. Giesen's float_to_half_fast3_rtne); bit-identical to numpy's cast below 65504
    and 25-40% faster than it, in cache-sized chunks."""
    out = np.empty(x.size, dtype=np.uint16)
    u = x.view(np.uint32)
    for lo, hi in spans(x.size, 1):
        c = u[lo:hi]
        mag = c & _U32_MAG
        r = mag >> 13
        r &= np.uint32(1)
        r += mag
        r += _F16_REBIAS_RNE  # wraps for tiny magnitudes: those are replaced just below
        r >>= 13
        np.minimum(r, np.uint32(0x7BFF), out=r)  # saturate (also NaN/Inf) at 65504
        small = mag < np.uint32(0x38800000)  # below the smallest normal half, 2^-14
        if small.any():
            sub = mag.view(np.float32) + _F16_DENORM_MAGIC
            sub_bits = sub.view(np.uint32)
            sub_bits -= _F16_DENORM_BITS
            np.copyto(r, sub_bits, where=small)
        r |= (c >> 16) & np.uint32(0x8000)
        out[lo:hi] = r
    return out


def f16_to_float32(h: np.ndarray) -> np.ndarray:
    """IEEE half (float16 or its uint16 bits, finite) -> float32, exact."""
    bits = h.view(np.uint16)
    out = np.empty(bits.size, dtype=np.float32)
    ou = out.view(np.uint32)
    for lo, hi in spans(bits.size, 1):
        c = bits[lo:hi]
        o = ou[lo:hi]
        np.bitwise_and(c, np.uint16(0x7FFF), out=o, casting="unsafe")
        o <<= 13
        of = out[lo:hi]
        of *= _F16_FROM_BITS
        sign = (c & np.uint16(0x8000)).astype(np.uint32)
        sign <<= 16
        o |= sign
    return out


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16): round to nearest even on the uint32 view,
    saturating to +-max finite (0x7F7F) so that no input yields an Inf/NaN pattern."""
    out = np.empty(x.size, dtype=np.uint16)
    u = x.view(np.uint32)
    for lo, hi in spans(x.size, 1):
        c = u[lo:hi]
        mag = c & np.uint32(0x7FFFFFFF)
        np.minimum(mag, np.uint32(0x7F7F7FFF), out=mag)  # below the value that rounds to Inf
        r = mag >> 16
        r &= np.uint32(1)
        r += np.uint32(0x7FFF)
        r += mag
        r >>= 16
        r |= (c >> 16) & np.uint32(0x8000)
        out[lo:hi] = r
    return out


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    out = bits.astype(np.uint32)
    out <<= 16
    return out.view(np.float32)


def top_k_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices (int32, ascending) of the k largest |x|, exactly.

    A threshold estimated from a strided sample (DGC's trick) picks a candidate set a little
    larger than k in one pass; an exact ``argpartition`` runs on the candidates only. If the
    sample misleads (fewer than k candidates), fall back to ``argpartition`` on everything."""
    n = x.size
    if k <= 0:
        return np.empty(0, dtype=np.int32)
    if k >= n:
        return np.arange(n, dtype=np.int32)
    absx = np.abs(x)
    cand = None
    if n >= 1 << 16 and k <= n // 8:
        stride = max(1, n // (1 << 15))
        sample = absx[::stride]
        # aim for ~1.5k candidates (+ slack for sampling noise on small k)
        want = min(sample.size - 1, int(sample.size * (1.5 * k + 64) / n))
        thr = np.partition(sample, sample.size - 1 - want)[sample.size - 1 - want]
        c = np.flatnonzero(absx >= thr)
        if c.size >= k:
            cand = c
    if cand is None:
        top = np.argpartition(absx, n - k)[n - k:]
    else:
        top = cand[np.argpartition(absx[cand], cand.size - k)[cand.size - k:]]
    top = top.astype(np.int32)
    top.sort()
    return top


def rows_top_k(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a 2-D float32 array, the k entries of largest |x|: their columns (int64) and
    values (float32, the same bits), each (rows, k), in no particular order within a row. Ties
    are broken arbitrarily; NaN counts as larger than any number (as in ``np.sort``).

    Why not ``argpartition`` per row, as before: it was most of sparseloco's compress
    (bench/round_cpu.py). Here the passes over all entries are elementwise or SIMD
    ``partition``s, on |x|'s bits as uint32 (ordered as |x|, NaN above Inf), per batch of rows:

    1. split a row into G groups of m lanes (group j: columns j, j + G, ...: rows' middle
       axis, so the max over lanes is m - 1 contiguous ``maximum`` passes), each group's max;
    2. t = the k-th largest group max (``partition``). The k groups at or above t each hold an
       entry >= t, so the row's k-th largest |x| is >= t: every entry of the top k is >= t;
    3. the candidates, entries >= t (~1.1k per row on Gaussian data), are sorted on one uint64
       key each, (row, |x| bits, sign, column), and each row keeps its last k.

    m = 8 when it divides the width and leaves >= 4k groups; else m = 1, where t is the exact
    k-th largest: each row's candidates are its top k unless |x| ties at t, and a batch without
    such ties skips step 3 (its key and sort were ~2/3 of the selection at 10% of a 4096-entry
    chunk: 18.5 to 8.5 ms on nodes.wide; the columns come out ascending). Steps 1-3 run per
    batch of 2 * CHUNK elements: fastest measured (half the batches: fewer numpy calls); step 3
    over all rows at once was slower: its temporaries (~0.4 MB each on nodes.wide) page-faulted
    on every call."""
    nrows, width = rows.shape
    if k >= width:
        return np.broadcast_to(np.arange(width), rows.shape).copy(), rows.copy()
    m = 8 if width % 8 == 0 and width >= 32 * k else 1
    groups = width // m
    col_bits = max(1, (width - 1).bit_length())  # row, 31 bits of |x|, sign, column: 64 bits
    cols = np.empty((nrows, k), dtype=np.int64)
    vals = np.empty((nrows, k), dtype=np.uint32)
    step = max(1, 2 * CHUNK // width)  # rows per batch: < 2^(32 - col_bits), the key's row fits
    mag = np.empty((min(step, nrows), width), dtype=np.float32)
    last_k = np.arange(-k, 0)
    for r0 in range(0, nrows, step):
        r1 = min(r0 + step, nrows)
        raw = rows[r0:r1]
        a = np.abs(raw, out=mag[: r1 - r0]).view(np.uint32)
        gmax = a.reshape(r1 - r0, m, groups).max(axis=1) if m > 1 else a.copy()
        gmax.partition(groups - k, axis=1)
        flat = np.flatnonzero(a >= gmax[:, groups - k: groups - k + 1])
        if m == 1 and flat.size == (r1 - r0) * k:  # no ties at t: each row's candidates are its top k
            cols[r0:r1] = flat.reshape(r1 - r0, k) - (np.arange(r1 - r0) * width)[:, None]
            vals[r0:r1] = raw.reshape(-1)[flat].view(np.uint32).reshape(r1 - r0, k)
            continue
        row = flat // width
        bits = raw.reshape(-1)[flat].view(np.uint32)
        key = row.astype(np.uint64)
        key <<= 31
        key |= bits & _U32_MAG
        key <<= 1
        key |= bits >> 31
        key <<= col_bits
        key |= (flat - row * width).astype(np.uint64)
        key.sort()
        top = key[np.cumsum(np.bincount(row, minlength=r1 - r0))[:, None] + last_k]
        cols[r0:r1] = top & ((1 << col_bits) - 1)
        top >>= col_bits
        vals[r0:r1] = ((top >> 1) & _U32_MAG) | ((top & 1) << 31)
    return cols, vals.view(np.float32)


def sort_rows_u16(a: np.ndarray) -> np.ndarray:
    """Each row of a 2-D uint16 array sorted, as one flat sort of (row << 16 | value): numpy
    sorts along an axis row by row, which on sparseloco's (chunks, ~82) codes cost 4x more."""
    nrows, width = a.shape
    key = np.arange(nrows, dtype=np.uint32 if nrows <= 1 << 16 else np.uint64)[:, None] << 16
    key = key | a
    key = key.reshape(-1)
    key.sort()
    return key.astype(np.uint16).reshape(nrows, width)  # drops the row
