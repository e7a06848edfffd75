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
int8   int8[n], float32 scale[n/B]           n + 4n/B                     <= absmax(block)/254
topk   int32 idx[k] (ascending), f16/f32[k]  6k or 8k, k = ceil(f*n)      0 on the k largest |x|
sign   uint8 bits[n/8], float32 mean|x|[n/B] n/8 + 4n/B                   sign kept, size = mean
====== ===================================== ============================ =====================

(int8: blockwise absmax scaling, scale = absmax/127, round to nearest; sign: 1 bit per element,
packed with ``np.packbits``, decoded as +-mean|x| of its block, after Seide et al., "1-bit SGD",
Interspeech 2014; topk: Deep Gradient Compression, Lin et al., ICLR 2018, with an exact top-k
found from a sampled threshold.) topk and sign are biased and lose most of the signal in one
shot: use them with ``ErrorFeedback`` (p2p/compression/feedback.py) or inside CHOCO-gossip
(p2p/averaging/choco.py), never to average raw parameters directly.

Speed: no Python loop runs over elements or blocks. Long vectors are processed in cache-sized
chunks of ``_CHUNK`` elements (a loop of n/_CHUNK iterations, each a handful of whole-array
numpy calls), which keeps the temporaries in L2 and is 2-4x faster than whole-vector passes.

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

from p2p.protocol import LocalProtocolError, RemoteProtocolError

_CHUNK = 1 << 16  # elements per cache-sized chunk
MAX_NUMEL = 2**31 - 1  # topk indices are int32
MAX_BLOCK = 1 << 24
_EMPTY = np.empty(0, dtype=np.uint8)


@dataclass(frozen=True, eq=False)
class Compressed:
    """One compressed flat vector. ``arrays`` are 1-D and contiguous; ``meta`` holds ints."""

    codec: str
    numel: int
    arrays: tuple[np.ndarray, ...]
    meta: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
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


def _nblocks(n: int, block: int) -> int:
    return -(-n // block)


def _spans(n: int, align: int):
    """(lo, hi) element ranges of about _CHUNK elements, lo a multiple of ``align``."""
    step = max(align, _CHUNK // align * align)
    for lo in range(0, n, step):
        yield lo, min(lo + step, n)


def _per_element(per_block: np.ndarray, lo: int, hi: int, block: int) -> np.ndarray:
    """The per-block values covering elements [lo, hi) (lo block-aligned), one per element."""
    return np.repeat(per_block[lo // block:_nblocks(hi, block)], block)[: hi - lo]


def _block_absmax(x: np.ndarray, block: int) -> np.ndarray:
    out = np.empty(_nblocks(x.size, block), dtype=np.float32)
    for lo, hi in _spans(x.size, block):
        starts = np.arange(0, hi - lo, block)
        out[lo // block: lo // block + starts.size] = np.maximum.reduceat(np.abs(x[lo:hi]), starts)
    return out


def _block_abssum(x: np.ndarray, block: int) -> np.ndarray:
    out = np.empty(_nblocks(x.size, block), dtype=np.float32)
    for lo, hi in _spans(x.size, block):
        starts = np.arange(0, hi - lo, block)
        out[lo // block: lo // block + starts.size] = np.add.reduceat(np.abs(x[lo:hi]), starts)
    return out


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
        return Compressed("none", x.size, (_flat32(x).copy(),))

    @staticmethod
    def check(c: Compressed) -> None:
        _no_meta(c)
        _want(c.arrays[0], "values", "float32", c.numel)
        if c.numel and not np.isfinite(c.arrays[0]).all():
            _fail("non_finite", "values carry NaN or Inf")

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        return np.array(c.arrays[0], dtype=np.float32)


_F16_MAX = np.float32(65504.0)


class FP16(_Codec):
    """IEEE half precision, round to nearest even, saturating at +-65504 (never Inf)."""

    name = "fp16"

    def compress(self, x: np.ndarray) -> Compressed:
        x = _flat32(x)
        out = np.empty(x.size, dtype=np.float16)
        for lo, hi in _spans(x.size, 1):
            chunk = x[lo:hi]
            if np.abs(chunk).max(initial=0) > _F16_MAX:
                chunk = np.clip(chunk, -_F16_MAX, _F16_MAX)
            out[lo:hi] = chunk
        return Compressed("fp16", x.size, (out,))

    @staticmethod
    def check(c: Compressed) -> None:
        _no_meta(c)
        _want(c.arrays[0], "values", "float16", c.numel)
        if c.numel and not np.isfinite(c.arrays[0]).all():
            _fail("non_finite", "values carry NaN or Inf")

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        return c.arrays[0].astype(np.float32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16): round to nearest even on the uint32 view,
    saturating to +-max finite (0x7F7F) so that no input yields an Inf/NaN pattern."""
    x = _flat32(x)
    out = np.empty(x.size, dtype=np.uint16)
    u = x.view(np.uint32)
    for lo, hi in _spans(x.size, 1):
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


class BF16(_Codec):
    """bfloat16 (float32's exponent, 8-bit mantissa), travelling as uint16 bit patterns."""

    name = "bf16"

    def compress(self, x: np.ndarray) -> Compressed:
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
        absmax = _block_absmax(x, block)
        scales = absmax / np.float32(127.0)
        with np.errstate(divide="ignore"):
            inv = np.where(absmax > 0, np.float32(127.0) / absmax, np.float32(0.0)).astype(np.float32)
        q = np.empty(x.size, dtype=np.int8)
        for lo, hi in _spans(x.size, block):
            t = x[lo:hi] * _per_element(inv, lo, hi, block)
            np.rint(t, out=t)
            np.clip(t, -127, 127, out=t)  # guards x/absmax*127 rounding past 127
            q[lo:hi] = t
        return Compressed("int8", x.size, (q, scales), (block,))

    @staticmethod
    def check(c: Compressed) -> None:
        block = _meta_block(c)
        _want(c.arrays[0], "q", "int8", c.numel)
        _want(c.arrays[1], "scales", "float32", _nblocks(c.numel, block))
        _want_scales(c.arrays[1])

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        q, scales = c.arrays
        (block,) = c.meta
        out = np.empty(c.numel, dtype=np.float32)
        for lo, hi in _spans(c.numel, block):
            np.multiply(q[lo:hi], _per_element(scales, lo, hi, block), out=out[lo:hi])
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
            vals = np.clip(vals, -_F16_MAX, _F16_MAX).astype(np.float16)
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
        out[idx] = vals
        return out


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
        sums = _block_abssum(x, block)
        counts = np.full(sums.size, block, dtype=np.float32)
        if sums.size:
            counts[-1] = n - (sums.size - 1) * block
        scales = sums / counts
        bits = np.empty(-(-n // 8), dtype=np.uint8)
        for lo, hi in _spans(n, 8):  # spans start on byte boundaries
            bits[lo // 8: -(-hi // 8)] = np.packbits(x[lo:hi] >= 0)
        return Compressed("sign", n, (bits, scales), (block,))

    @staticmethod
    def check(c: Compressed) -> None:
        block = _meta_block(c)
        _want(c.arrays[0], "bits", "uint8", -(-c.numel // 8))
        _want(c.arrays[1], "scales", "float32", _nblocks(c.numel, block))
        _want_scales(c.arrays[1])

    @staticmethod
    def decode(c: Compressed) -> np.ndarray:
        bits, scales = c.arrays
        (block,) = c.meta
        n = c.numel
        out = np.empty(n, dtype=np.float32)
        align = block * 8 // math.gcd(block, 8)  # spans on byte and block boundaries
        for lo, hi in _spans(n, align):
            s = _per_element(scales, lo, hi, block)
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
    "topk": TopK,
    "sign": Sign,
}


def make_compressor(name: str, **params: Any) -> Compressor:
    """The compressor called ``name`` with its parameters (``block`` for int8/sign,
    ``fraction`` and ``values`` for topk). Unknown names or parameters raise ValueError."""
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
    ``compression_topk_fraction`` (None: 0.01); parameters a codec does not take are ignored."""
    name = getattr(config, "compression", "none")
    params: dict[str, Any] = {}
    block = getattr(config, "compression_block", None)
    fraction = getattr(config, "compression_topk_fraction", None)
    if name in ("int8", "sign") and block is not None:
        params["block"] = block
    if name == "topk" and fraction is not None:
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
