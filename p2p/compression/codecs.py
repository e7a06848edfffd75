"""Tensor codecs: flat float32 vector <-> a few small numpy arrays, vectorised, pure numpy.

Every codec turns ``x`` (float32, 1-D, ``numel`` elements) into a ``Compressed`` record: the
codec's name, ``numel``, one or two 1-D arrays, and a tuple of int metadata (the block size).
Decoding needs nothing but the record, so a node decodes whatever codec its peer chose
(``--compression`` is per node). Codecs and their documented error bounds:

====== ===================================== ============================ =====================
name   arrays                                bytes (n elements)           |x - D(Q(x))|
====== ===================================== ============================ =====================
none   float32[n]                            4n                           0
fp16   float16[n] (saturates at +-65504)     2n                           <= 2^-11 |x| + 2^-25
bf16   uint16[n] (bfloat16 bits, RNE)        2n                           <= 2^-8 |x| (+ denorm)
int8   int8[n], float32 scale[n/B]           n + 4n/B                     <= absmax(block)/254 (*)
int4   uint8 nibbles[n/2], f32 scale[n/B]    n/2 + 4n/B                   <= absmax(block)/14 (*)
topk   int32 idx[k] (ascending), f16/f32[k]  6k or 8k, k = ceil(f*n)      0 on the k largest |x|
sign   uint8 bits[n/8], float32 mean|x|[n/B] n/8 + 4n/B                   sign kept, size = mean
sparse uint16 code[~fn], f32 levels[2n/B]    2 ceil(fB) n/B + 8n/B        (**)
====== ===================================== ============================ =====================

(*) plus float32's denormal granularity for blocks whose absmax is below ~1e-36.
(**) ``sparseloco`` (the row says "sparse"): per chunk of B elements (B <= 2^14) the k = ceil(fB)
largest |x|, 2 bits each (sign, and which of the chunk's two magnitude levels) in a uint16
beside their 14-bit offset; a kept entry is off by <= the spread of its half of the chunk's
kept magnitudes, a dropped one by |x| <= the chunk's k-th largest |x|. At f = 0.02, B = 4096:
~0.042 bytes per element in memory (int4 at B = 64: 0.5625), ~13x fewer; on the wire the offsets
travel Elias-Fano coded (sparse_wire.py): ~0.026 bytes per element, ~22x fewer.

(int8: blockwise absmax scaling, scale = absmax/127, round to nearest; int4: the same with
scale = absmax/7, two 4-bit codes per byte, for DiLoCo's pseudo-gradients, which Streaming
DiLoCo (Douillard et al., arXiv:2501.18512, 2025, Sec. 2.3) sends in 4 bits; sign: 1 bit per element,
packed with ``np.packbits``, decoded as +-mean|x| of its block, after Seide et al., "1-bit SGD",
Interspeech 2014; topk: Deep Gradient Compression, Lin et al., ICLR 2018, with an exact top-k
found from a sampled threshold; sparseloco: SparseLoCo, Sarfi et al., arXiv:2508.15706, 2025,
chunked top-k at 1-3% density with 2-bit values.) topk, sign and sparseloco are biased and lose most of the signal in one
shot: use them with ``ErrorFeedback`` (p2p/compression/feedback.py) or inside CHOCO-gossip
(p2p/averaging/choco.py), never to average raw parameters directly.

Speed: no Python loop runs over elements or blocks; the array work is in
p2p/compression/kernels.py, which processes long vectors in cache-sized chunks.

Remote input: ``validate(c, numel)`` checks a received record completely (codec name, array
count, dtypes, lengths, block size, index range and order, finite non-negative scales, bf16
bit patterns) and raises ``RemoteProtocolError`` with a short reason; ``decompress`` trusts its
input and must only see validated records. Compressing NaN/Inf is the caller's bug: fp16/bf16
saturate Inf to the largest finite value; the other codecs pass NaN through to the wire, which
rejects it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import numpy as np

from p2p.compression.kernels import (CHUNK, bf16_bits, bf16_to_float32, block_absmax, block_abssum, f16_bits,
                                     f16_to_float32, nblocks, per_element, rows_top_k, sort_rows_u16, spans,
                                     top_k_indices)
from p2p.compression.sparse_wire import entries, packed_size, sparse_layout
from p2p.protocol import LocalProtocolError, RemoteProtocolError

MAX_NUMEL = 2**31 - 1  # topk indices are int32
MAX_BLOCK = 1 << 24


@dataclass(frozen=True, eq=False)
class Compressed:
    """One compressed flat vector. ``arrays`` are 1-D and contiguous; ``meta`` holds ints."""

    codec: str
    numel: int
    arrays: tuple[np.ndarray, ...]
    meta: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        """Payload bytes on the wire (its tensor frames): sparseloco's codes travel packed."""
        if self.codec == SparseLoCo.name:
            return packed_size(self.numel, *self.meta) + int(self.arrays[1].nbytes)
        return sum(int(a.nbytes) for a in self.arrays)


def nbytes(c: Compressed) -> int:
    """Payload bytes of ``c`` on the wire (tensor frames; the msgpack header adds ~30 bytes)."""
    return c.nbytes


class Compressor(Protocol):
    """A configured codec. ``compress`` is local (raises LocalProtocolError on misuse)."""

    name: str

    def compress(self, x: np.ndarray) -> Compressed: ...

    def decompress(self, c: Compressed, numel: int) -> np.ndarray: ...


# -- helpers ------------------------------------------------------------------------------------

def _flat32(x: np.ndarray) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
        raise LocalProtocolError(f"compress wants a 1-D float32 array, got {getattr(x, 'dtype', type(x))}"
                                 f"{list(getattr(x, 'shape', ()))}")
    if x.size > MAX_NUMEL:
        raise LocalProtocolError(f"vector of {x.size} elements is too long to compress")
    return np.ascontiguousarray(x)


def _check_block(block: int) -> int:
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= MAX_BLOCK:
        raise ValueError(f"block must be an int in [1, {MAX_BLOCK}], got {block!r}")
    return block


def _fail(reason: str, detail: str) -> None:
    raise RemoteProtocolError(reason, detail)


def _want(arr: Any, name: str, dtype: str, size: int) -> None:
    if not isinstance(arr, np.ndarray) or arr.ndim != 1:
        _fail("bad_payload", f"{name} is not a 1-D array")
    if arr.dtype.name != dtype:
        _fail("bad_payload", f"{name} is {arr.dtype.name}, want {dtype}")
    if arr.size != size:
        _fail("bad_payload", f"{name} has {arr.size} elements, want {size}")


def _want_scales(scales: np.ndarray) -> None:
    if scales.size and not (np.isfinite(scales).all() and (scales >= 0).all()):
        _fail("non_finite", "scales must be finite and >= 0")


def _meta_block(c: Compressed) -> int:
    meta = c.meta
    if not isinstance(meta, tuple) or len(meta) != 1:
        _fail("bad_payload", f"{c.codec}: meta must be (block,)")
    block = meta[0]
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= MAX_BLOCK:
        _fail("bad_payload", f"{c.codec}: block {block!r} outside [1, {MAX_BLOCK}]")
    return block


def _no_meta(c: Compressed) -> None:
    if c.meta != ():
        _fail("bad_payload", f"{c.codec}: unexpected meta {c.meta!r}")


# -- codecs -------------------------------------------------------------------------------------

class _Codec:
    name = ""
    ARRAYS = 1  # how many arrays a record of this codec holds (1 or 2)

    def decompress(self, c: Compressed, numel: int) -> np.ndarray:
        return decompress(c, numel)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"


class NoCompression(_Codec):
    """Identity: float32 as is (the baseline, and CHOCO's exact-gossip limit)."""

    name = "none"

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        return Compressed("none", x.size, (x.copy(),))

    @staticmethod
    def check(c: Compressed) -> None:
        _no_meta(c)
        _want(c.arrays[0], "values", "float32", c.numel)
        if c.numel and not np.isfinite(c.arrays[0]).all():
            _fail("non_finite", "values carry NaN or Inf")

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        return np.array(c.arrays[0], dtype=np.float32)


class FP16(_Codec):
    """IEEE half precision, round to nearest even, saturating at +-65504 (never Inf)."""

    name = "fp16"

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        return Compressed("fp16", x.size, (f16_bits(x).view(np.float16),))

    @staticmethod
    def check(c: Compressed) -> None:
        _no_meta(c)
        _want(c.arrays[0], "values", "float16", c.numel)
        if c.numel and ((c.arrays[0].view(np.uint16) & np.uint16(0x7C00)) == np.uint16(0x7C00)).any():
            _fail("non_finite", "values carry NaN or Inf")

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        return f16_to_float32(c.arrays[0])


class BF16(_Codec):
    """bfloat16 (float32's exponent, 8-bit mantissa), travelling as uint16 bit patterns."""

    name = "bf16"

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        return Compressed("bf16", x.size, (bf16_bits(x),))

    @staticmethod
    def check(c: Compressed) -> None:
        _no_meta(c)
        _want(c.arrays[0], "values", "uint16", c.numel)
        # exponent all ones = Inf or NaN; a uint16 frame is not checked for finiteness by the wire
        if c.numel and ((c.arrays[0] & np.uint16(0x7F80)) == np.uint16(0x7F80)).any():
            _fail("non_finite", "bf16 values carry NaN or Inf")

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        return bf16_to_float32(c.arrays[0])


_MAX_SCALE = np.float32(np.finfo(np.float32).max / 128)  # |q| <= 128 stays finite (int8, int4)


def _check_absmax_record(c: Compressed, name: str, dtype: str, size: int) -> None:
    """A blockwise absmax record (int8, int4): codes, then one finite scale per block."""
    block = _meta_block(c)
    _want(c.arrays[0], name, dtype, size)
    _want(c.arrays[1], "scales", "float32", nblocks(c.numel, block))
    _want_scales(c.arrays[1])
    if c.arrays[1].size and c.arrays[1].max() > _MAX_SCALE:
        _fail("non_finite", f"{c.codec} scale would overflow float32")


class Int8Block(_Codec):
    """Blockwise absmax int8: per block of ``block`` elements scale = absmax/127 (float32),
    q = round(x / scale) in [-127, 127]; decoded q * scale, error <= absmax/254 per element."""

    name = "int8"
    ARRAYS = 2

    def __init__(self, block: int = 256) -> None:
        self.block = _check_block(block)

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        block = self.block
        absmax = block_absmax(x, block)
        scales = absmax / np.float32(127.0)
        with np.errstate(divide="ignore"):
            inv64 = np.where(absmax > 0, 127.0 / absmax.astype(np.float64), 0.0)
        # 127/absmax overflows float32 for blocks with absmax < ~3.7e-37: those chunks (rare:
        # denormal-sized blocks) are scaled in float64
        tiny = inv64 > np.finfo(np.float32).max
        inv = np.where(tiny, 0.0, inv64).astype(np.float32)
        q = np.empty(x.size, dtype=np.int8)
        for lo, hi in spans(x.size, block):
            if tiny[lo // block:nblocks(hi, block)].any():
                t = x[lo:hi] * per_element(inv64, lo, hi, block)
            else:
                t = x[lo:hi] * per_element(inv, lo, hi, block)
            np.rint(t, out=t)
            np.clip(t, -127, 127, out=t)  # guards x/absmax*127 rounding past 127
            q[lo:hi] = t
        return Compressed("int8", x.size, (q, scales), (block,))

    @staticmethod
    def check(c: Compressed) -> None:
        _check_absmax_record(c, "q", "int8", c.numel)

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        q, scales = c.arrays
        (block,) = c.meta
        out = np.empty(c.numel, dtype=np.float32)
        for lo, hi in spans(c.numel, block):
            np.multiply(q[lo:hi], per_element(scales, lo, hi, block), out=out[lo:hi])
        return out


class Int4Block(_Codec):
    """Blockwise absmax int4: per block scale = absmax/7 (float32), q = round(x / scale) in
    [-7, 7], stored as the nibble q + 8, element 2i in the low and 2i+1 in the high nibble of
    byte i (an odd last element pads with 8, a zero). Error <= absmax/14 per element. A
    received nibble 0 decodes to -8 * scale: still bounded, so it is not worth a check."""

    name = "int4"
    ARRAYS = 2

    def __init__(self, block: int = 64) -> None:
        self.block = _check_block(block)

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        block, n = self.block, x.size
        absmax = block_absmax(x, block)
        scales = absmax / np.float32(7.0)
        with np.errstate(divide="ignore"):
            inv64 = np.where(absmax > 0, 7.0 / absmax.astype(np.float64), 0.0)
        codes = np.empty(-(-n // 2), dtype=np.uint8)
        for lo, hi in spans(n, 2 * block):  # spans start on byte and block boundaries
            # float64 scaling: 7/absmax overflows float32 only for denormal-sized blocks, and a
            # chunk of float64 still fits in L2
            t = x[lo:hi] * per_element(inv64, lo, hi, block)
            np.rint(t, out=t)
            np.clip(t, -7, 7, out=t)
            t += 8
            q = t.astype(np.uint8)
            if q.size % 2:
                q = np.append(q, np.uint8(8))
            codes[lo // 2: lo // 2 + q.size // 2] = q[0::2] | (q[1::2] << 4)
        return Compressed("int4", n, (codes, scales), (block,))

    @staticmethod
    def check(c: Compressed) -> None:
        _check_absmax_record(c, "codes", "uint8", -(-c.numel // 2))

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        codes, scales = c.arrays
        (block,) = c.meta
        n = c.numel
        out = np.empty(n, dtype=np.float32)
        for lo, hi in spans(n, 2 * block):
            b = codes[lo // 2: -(-hi // 2)]
            q = np.empty(2 * b.size, dtype=np.int8)
            np.bitwise_and(b, 15, out=q[0::2], casting="unsafe")
            np.right_shift(b, 4, out=q[1::2], casting="unsafe")
            q -= 8
            np.multiply(q[: hi - lo], per_element(scales, lo, hi, block), out=out[lo:hi])
        return out


class TopK(_Codec):
    """Keep the k = ceil(fraction * n) largest |x| (ties broken arbitrarily), indices int32 in
    ascending order, values float16 (saturating) or float32; everything else decodes to 0."""

    name = "topk"
    ARRAYS = 2

    def __init__(self, fraction: float = 0.01, values: str = "float16") -> None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"topk fraction must be in (0, 1], got {fraction!r}")
        if values not in ("float16", "float32"):
            raise ValueError(f"topk values must be 'float16' or 'float32', got {values!r}")
        self.fraction = float(fraction)
        self.values = values

    def k_for(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.fraction * n))) if n else 0

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        n = x.size
        idx = top_k_indices(x, self.k_for(n))
        vals = x[idx]
        if self.values == "float16":
            vals = f16_bits(vals).view(np.float16)
        return Compressed("topk", n, (idx, vals))

    @staticmethod
    def check(c: Compressed) -> None:
        _no_meta(c)
        idx, vals = c.arrays
        if not isinstance(idx, np.ndarray) or not isinstance(vals, np.ndarray):
            _fail("bad_payload", "topk arrays must be arrays")
        k = idx.size
        _want(idx, "indices", "int32", k)
        if vals.dtype.name not in ("float16", "float32"):
            _fail("bad_payload", f"values are {vals.dtype.name}, want float16 or float32")
        _want(vals, "values", vals.dtype.name, k)
        if k > c.numel:
            _fail("bad_payload", f"{k} indices for {c.numel} elements")
        if k:
            if idx[0] < 0 or idx[-1] >= c.numel:
                _fail("bad_payload", "index out of range")
            if k > 1 and not (idx[1:] > idx[:-1]).all():
                _fail("bad_payload", "indices not strictly increasing")
            if not np.isfinite(vals).all():
                _fail("non_finite", "values carry NaN or Inf")

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        idx, vals = c.arrays
        out = np.zeros(c.numel, dtype=np.float32)
        out[idx] = f16_to_float32(vals) if vals.dtype == np.float16 else vals
        return out


MAX_SPARSE_BLOCK = 1 << 14  # a sparseloco offset takes 14 bits of a uint16, the 2-bit code the other 2


class SparseLoCo(_Codec):
    """Chunked top-k with 2-bit values, after SparseLoCo (Sarfi et al., arXiv:2508.15706, 2025).

    Per chunk of ``block`` elements keep the k = ceil(fraction * block) largest |x| (the last,
    shorter chunk of L elements ceil(k L / block) of them). Their magnitudes are split at their median into a
    low and a high group, and each group is sent as its mean, one float32 level each: a kept
    entry is 2 bits, its sign and which level. Each entry travels as one uint16,
    ``offset << 2 | negative << 1 | high`` (offset within the chunk, ascending: hence
    block <= 2^14); the levels as float32 pairs (low, high) per chunk. Decoded, a kept entry
    is +-its group's mean, which is off by at most the spread of its group (<= the chunk's
    largest minus smallest kept |x|); a dropped entry decodes to 0, off by |x| <= the chunk's
    k-th largest |x|. Biased and lossy by design: DiLoCo sends it with error feedback."""

    name = "sparseloco"
    ARRAYS = 2

    def __init__(self, fraction: float = 0.02, block: int = 4096) -> None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"sparseloco fraction must be in (0, 1], got {fraction!r}")
        if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= MAX_SPARSE_BLOCK:
            raise ValueError(f"sparseloco block must be an int in [1, {MAX_SPARSE_BLOCK}], got {block!r}")
        self.fraction, self.block = fraction, block
        self.k = min(block, math.ceil(fraction * block))

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        n, block, k = x.size, self.block, self.k
        chunks, kept, k_last = sparse_layout(n, block, k)
        codes = np.empty(kept, dtype=np.uint16)
        levels = np.empty(2 * chunks, dtype=np.float32)
        full = n // block
        if full:  # the whole chunks at once (kernels.py, rows_top_k), then the last, shorter one
            rows = x[: full * block].reshape(full, block)
            self._rows(rows, k, codes[: full * k], levels[: 2 * full])
        if full < chunks:
            self._rows(x[full * block:].reshape(1, -1), k_last, codes[full * k:], levels[2 * full:])
        return Compressed("sparseloco", n, (codes, levels), (block, k))

    @staticmethod
    def _rows(rows: np.ndarray, k: int, codes: np.ndarray, levels: np.ndarray) -> None:
        cols, kept = rows_top_k(rows, k)  # per row in no particular order: codes sorted below
        mag = np.abs(kept)
        # the median split: entries above the (k - k//2)-th smallest kept magnitude are "high"
        thr = np.partition(mag, k - k // 2 - 1, axis=1)[:, k - k // 2 - 1: k - k // 2]
        high = mag > thr
        n_high = high.sum(axis=1)
        # float64 sums, each row's k terms in one call (the same bits however many rows)
        mag64 = mag.astype(np.float64)
        s_high = np.where(high, mag64, 0).sum(axis=1)
        s_low = np.where(high, 0, mag64).sum(axis=1)  # not total - s_high: it cancels
        lv = levels.reshape(-1, 2)
        lv[:, 0] = s_low / (k - n_high)  # >= 1 entry is low: the threshold itself
        lv[:, 1] = np.where(n_high > 0, s_high / np.maximum(n_high, 1), lv[:, 0])
        # the offset is a code's top bits: sorted codes, ascending offsets
        codes[:] = sort_rows_u16(((cols << 2) | ((kept < 0) << 1) | high).astype(np.uint16)).ravel()

    @staticmethod
    def layout(numel: object, meta: object) -> tuple[int, int]:
        """(block, k) of a received record's meta, checked with its numel (before its codes are
        unpacked from the wire: sparse_wire.py)."""
        if isinstance(numel, bool) or not isinstance(numel, int) or not 0 <= numel <= MAX_NUMEL:
            _fail("bad_payload", f"numel {numel!r}")
        if not isinstance(meta, tuple) or len(meta) != 2 or any(isinstance(m, bool) or not isinstance(m, int) for m in meta):
            _fail("bad_payload", "sparseloco: meta must be (block, k), ints")
        block, k = meta
        if not 1 <= block <= MAX_SPARSE_BLOCK or not 1 <= k <= block:
            _fail("bad_payload", f"sparseloco: block {block} / k {k} outside 1 <= k <= block <= {MAX_SPARSE_BLOCK}")
        return block, k

    @staticmethod
    def check(c: Compressed) -> None:
        block, k = SparseLoCo.layout(c.numel, c.meta)
        chunks, kept, _ = sparse_layout(c.numel, block, k)
        codes, levels = c.arrays
        _want(codes, "codes", "uint16", kept)
        _want(levels, "levels", "float32", 2 * chunks)
        _want_scales(levels)
        if not kept:
            return
        # offsets inside their chunk (the last one may be shorter) and strictly increasing
        # within it: an offset past the chunk would land in the next one, or past numel
        offsets = (codes >> 2).astype(np.int32)
        last = (chunks - 1) * k
        if offsets.max() >= block or offsets[last:].max() >= c.numel - (chunks - 1) * block:
            _fail("bad_payload", "sparseloco offset outside its chunk")
        # per chunk (every one but the last holds k entries): no per-entry chunk numbers
        if not ((np.diff(offsets[:last].reshape(-1, k), axis=1) > 0).all() and (np.diff(offsets[last:]) > 0).all()):
            _fail("bad_payload", "sparseloco offsets not strictly increasing within a chunk")

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        out = np.zeros(c.numel, dtype=np.float32)
        indices, values = entries(*c.arrays, *c.meta)
        out[indices] = values
        return out


class Sign(_Codec):
    """1-bit sign (x >= 0 -> +) packed with np.packbits, one float32 scale = mean|x| per block;
    decoded +-scale (Seide et al. 2014; the scaled sign of Karimireddy et al. 2019)."""

    name = "sign"
    ARRAYS = 2

    def __init__(self, block: int = 1024) -> None:
        self.block = _check_block(block)

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        n, block = x.size, self.block
        sums = block_abssum(x, block)
        counts = np.full(sums.size, block, dtype=np.float32)
        if sums.size:
            counts[-1] = n - (sums.size - 1) * block
        scales = sums / counts
        bits = np.empty(-(-n // 8), dtype=np.uint8)
        for lo, hi in spans(n, 8):  # spans start on byte boundaries
            bits[lo // 8: -(-hi // 8)] = np.packbits(x[lo:hi] >= 0)
        return Compressed("sign", n, (bits, scales), (block,))

    @staticmethod
    def check(c: Compressed) -> None:
        block = _meta_block(c)
        _want(c.arrays[0], "bits", "uint8", -(-c.numel // 8))
        _want(c.arrays[1], "scales", "float32", nblocks(c.numel, block))
        _want_scales(c.arrays[1])

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        bits, scales = c.arrays
        (block,) = c.meta
        n = c.numel
        out = np.empty(n, dtype=np.float32)
        align = block * 8 // math.gcd(block, 8)  # spans on byte and block boundaries
        for lo, hi in spans(n, align):
            s = per_element(scales, lo, hi, block)
            o = out[lo:hi]
            np.multiply(np.unpackbits(bits[lo // 8: -(-hi // 8)], count=hi - lo), s, out=o)
            o *= 2
            o -= s
        return out


COMPRESSORS: dict[str, type] = {
    "none": NoCompression,
    "fp16": FP16,
    "bf16": BF16,
    "int8": Int8Block,
    "int4": Int4Block,
    "topk": TopK,
    "sign": Sign,
    "sparseloco": SparseLoCo,
}


def make_compressor(name: str, **params: Any) -> Compressor:
    """The compressor called ``name`` with its parameters (``block`` for int8/int4/sign,
    ``fraction`` and ``values`` for topk, ``fraction`` and ``block`` for sparseloco). Unknown
    names or parameters raise ValueError."""
    cls = COMPRESSORS.get(name)
    if cls is None:
        raise ValueError(f"unknown compression {name!r} (available: {', '.join(COMPRESSORS)})")
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"compression {name!r}: {exc}") from None


def compressor_from_config(config: Any) -> Compressor:
    """Build the compressor a config names. Reads, with these defaults, the attributes
    ``compression`` ("none"), ``compression_block`` (None: the codec's default) and
    ``compression_topk_fraction`` (None: the codec's default, topk 0.01, sparseloco 0.02);
    parameters a codec does not take are ignored."""
    name = getattr(config, "compression", "none")
    params: dict[str, Any] = {}
    block = getattr(config, "compression_block", None)
    fraction = getattr(config, "compression_topk_fraction", None)
    if name in ("int8", "int4", "sign", "sparseloco") and block is not None:
        params["block"] = block
    if name in ("topk", "sparseloco") and fraction is not None:
        params["fraction"] = fraction
    return make_compressor(name, **params)


def validate(c: Compressed, numel: Optional[int] = None) -> None:
    """Check a received record completely; raise RemoteProtocolError(reason) if malformed.
    With ``numel``, also require that it decodes to exactly that many elements."""
    if not isinstance(c.codec, str) or c.codec not in COMPRESSORS:
        _fail("unknown_codec", f"codec {c.codec!r}")
    if isinstance(c.numel, bool) or not isinstance(c.numel, int) or not 0 <= c.numel <= MAX_NUMEL:
        _fail("bad_payload", f"numel {c.numel!r}")
    if numel is not None and c.numel != numel:
        _fail("bad_tensor", f"{c.codec} payload of {c.numel} elements, want {numel}")
    cls = COMPRESSORS[c.codec]
    if not isinstance(c.arrays, tuple) or len(c.arrays) != cls.ARRAYS:
        _fail("bad_payload", f"{c.codec} wants {cls.ARRAYS} arrays")
    cls.check(c)


def decompress(c: Compressed, numel: Optional[int] = None) -> np.ndarray:
    """Decode a (validated or locally made) record into a fresh float32 vector."""
    if numel is not None and c.numel != numel:
        raise LocalProtocolError(f"{c.codec} record holds {c.numel} elements, not {numel}")
    cls = COMPRESSORS.get(c.codec)
    if cls is None:
        raise LocalProtocolError(f"unknown codec {c.codec!r}")
    return cls.decode(c)
