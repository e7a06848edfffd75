"""Codecs: round-trip error bounds, sizes, error feedback, wire round trip, rejection of
malformed payloads (always RemoteProtocolError, never IndexError and friends)."""

import math

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from p2p.compression import (COMPRESSORS, Compressed, ErrorFeedback, compressor_from_config,
                             decompress, make_compressor, nbytes, validate)
from p2p.compression.kernels import (bf16_bits, f16_bits, f16_to_float32, rows_top_k, sort_rows_u16,
                                     top_k_indices)
from p2p.compression.messages import CompressedTensor, compressed_fields
from p2p.protocol import LocalProtocolError, RemoteProtocolError
from p2p.compression.sparse_wire import pack_codes, packed_size, unpack_codes
from p2p.wire import PROTOCOL_VERSION, decode, encode, registered_tags

# derandomize: the same examples every run (deterministic tests; no example database needed)
FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])

floats32 = st.floats(min_value=-(2.0**100), max_value=2.0**100, allow_nan=False, allow_infinity=False, width=32)
vectors = hnp.arrays(np.float32, st.integers(0, 600), elements=floats32)
moderate = hnp.arrays(np.float32, st.integers(0, 600),
                      elements=st.floats(-6e4, 6e4, allow_nan=False, allow_infinity=False, width=32))


def wide(n, seed=0, lo=-30, hi=30):
    """Random magnitudes spread over many binades (and both signs)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp(rng.uniform(lo, hi, n))).astype(np.float32)


def roundtrip(name, x, **params):
    c = make_compressor(name, **params).compress(x)
    validate(c, x.size)
    out = decompress(c, x.size)
    assert out.dtype == np.float32 and out.shape == x.shape
    return c, out


def test_registry_names():
    assert list(COMPRESSORS) == ["none", "fp16", "bf16", "int8", "int4", "topk", "sign", "sparseloco"]
    with pytest.raises(ValueError, match="available"):
        make_compressor("zip")
    with pytest.raises(ValueError):
        make_compressor("int8", fraction=0.1)
    with pytest.raises(ValueError):
        make_compressor("topk", fraction=0)
    with pytest.raises(ValueError):
        make_compressor("sign", block=0)
    with pytest.raises(ValueError):
        make_compressor("sparseloco", block=2**14 + 1)  # offsets would not fit their 14 bits


def test_compressor_from_config_reads_optional_attributes():
    class Cfg:
        compression = "int8"
        compression_block = 512
        compression_topk_fraction = 0.05

    assert make_compressor("none").name == compressor_from_config(object()).name == "none"
    assert compressor_from_config(Cfg()).block == 512
    Cfg.compression = "topk"
    assert compressor_from_config(Cfg()).fraction == 0.05
    Cfg.compression = "sparseloco"
    assert (compressor_from_config(Cfg()).fraction, compressor_from_config(Cfg()).block) == (0.05, 512)


@pytest.mark.parametrize("bad", [np.zeros(4), np.zeros((2, 2), np.float32), [1.0, 2.0]])
def test_compressing_the_wrong_kind_of_array_is_a_local_error(bad):
    for name in COMPRESSORS:
        with pytest.raises(LocalProtocolError):
            make_compressor(name).compress(bad)


@pytest.mark.parametrize("name", list(COMPRESSORS))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 70_001])
def test_every_codec_handles_every_length(name, n):
    x = wide(n, seed=n, lo=-3, hi=3)
    c, out = roundtrip(name, x)
    assert c.numel == n and np.isfinite(out).all()


def test_none_is_exact():
    x = wide(1000)
    np.testing.assert_array_equal(roundtrip("none", x)[1], x)


# -- fp16 -------------------------------------------------------------------------------------

def test_fp16_decode_is_exact_for_every_finite_half():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00]
    np.testing.assert_array_equal(f16_to_float32(bits), bits.view(np.float16).astype(np.float32))


def test_fp16_encode_is_numpys_round_to_nearest_even_and_saturates():
    x = np.concatenate([wide(200_000, lo=-25, hi=12), np.float32([65504, 65519.99, 65520, 1e30, -1e38]),
                        np.float32([2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14, 0.0, -0.0])])
    with np.errstate(over="ignore"):
        expect = np.clip(x, -65504, 65504).astype(np.float16)
    np.testing.assert_array_equal(f16_bits(x), expect.view(np.uint16))
    inf = np.float32([np.inf, -np.inf])
    np.testing.assert_array_equal(f16_to_float32(f16_bits(inf)), [65504, -65504])


@FAST
@given(moderate)
def test_fp16_relative_error(x):
    out = roundtrip("fp16", x)[1]
    assert (np.abs(out - x) <= np.abs(x) * 2.0**-11 + 2.0**-25).all()


# -- bf16 -------------------------------------------------------------------------------------

def test_bf16_is_round_to_nearest_even():
    """Against a float64 reference: round to 8 significant bits (ties to even, np.rint), the
    subnormal quantum 2^-133, saturation at the largest finite bfloat16."""
    x = np.concatenate([wide(100_000, lo=-95, hi=86), wide(2000, lo=-104, hi=-85),
                        np.float32([1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.39e38, -3.4e38, 0.0])])
    x64 = x.astype(np.float64)
    _, e = np.frexp(x64)
    quantum = np.maximum(np.ldexp(1.0, e - 8), 2.0**-133)
    bf16_max = float(np.uint32(0x7F7F0000).view(np.float32))
    expect = np.clip(np.rint(x64 / quantum) * quantum, -bf16_max, bf16_max)
    np.testing.assert_array_equal(decompress(make_compressor("bf16").compress(x), x.size), expect)


def test_bf16_never_produces_inf_or_nan_patterns():
    x = np.float32([3.4e38, -3.4e38, np.inf, -np.inf, np.nan])
    bits = bf16_bits(x)
    assert ((bits & 0x7F80) != 0x7F80).all()
    assert np.isfinite(roundtrip("bf16", x[:2])[1]).all()


@FAST
@given(vectors)
def test_bf16_relative_error(x):
    out = roundtrip("bf16", x)[1]
    assert (np.abs(out - x) <= np.abs(x) * 2.0**-8 + 1e-38).all()


# -- int8 -------------------------------------------------------------------------------------

def per_block(x, block, reduce):
    """reduce(|x|) over each block, repeated to one value per element (float64)."""
    if x.size == 0:
        return np.zeros(0)
    return np.repeat(reduce.reduceat(np.abs(x.astype(np.float64)), np.arange(0, x.size, block)), block)[: x.size]


@FAST
@given(vectors, st.sampled_from([1, 3, 16, 64, 256]))
def test_int8_error_is_at_most_half_a_step_per_block(x, block):
    c, out = roundtrip("int8", x, block=block)
    q = c.arrays[0]
    assert q.dtype == np.int8 and (np.abs(q.astype(int)) <= 127).all()
    absmax = per_block(x, block, np.maximum)
    assert (np.abs(out - x) <= absmax / 254 * (1 + 1e-5) + 1e-37).all()


def test_int8_zero_blocks_and_extremes():
    x = np.concatenate([np.zeros(300, np.float32), np.float32([3e38, -3e38, 1.0])])
    out = roundtrip("int8", x, block=256)[1]
    np.testing.assert_array_equal(out[:256], 0)
    assert np.isfinite(out).all() and abs(out[300] - 3e38) <= 3e38 / 254


# -- int4 -------------------------------------------------------------------------------------

@FAST
@given(vectors, st.sampled_from([1, 3, 16, 64, 256]))
def test_int4_error_is_at_most_half_a_step_per_block(x, block):
    c, out = roundtrip("int4", x, block=block)
    codes = c.arrays[0]
    assert codes.dtype == np.uint8 and codes.size == -(-x.size // 2)
    nibbles = np.stack([codes & 15, codes >> 4], axis=1).reshape(-1)
    assert ((nibbles >= 1) & (nibbles <= 15)).all()  # q + 8 with q in [-7, 7]
    if x.size % 2:
        assert nibbles[-1] == 8  # the pad nibble is a zero
    absmax = per_block(x, block, np.maximum)
    assert (np.abs(out - x) <= absmax / 14 * (1 + 1e-5) + 1e-37).all()


def test_int4_nibble_order_and_extremes():
    x = np.float32([7, -7, 1, 0, 3e38, -3e38, 1e-40, 0, 1e-40, -1e-40])
    c = make_compressor("int4", block=4).compress(x)
    assert c.arrays[0][0] == (8 + 7) | ((8 - 7) << 4)  # element 0 low nibble, 1 high
    out = decompress(c, x.size)
    np.testing.assert_allclose(out[:4], [7, -7, 1, 0])
    assert np.isfinite(out).all() and abs(out[4] - 3e38) <= 3e38 / 14
    assert out[8] > 0 > out[9]  # a denormal-sized block keeps its signs


def test_int4_received_nibble_zero_decodes_bounded():
    c = Compressed("int4", 3, (np.uint8([0x00, 0x00]), np.float32([2.0])), (4,))
    validate(c, 3)
    np.testing.assert_array_equal(decompress(c, 3), [-16, -16, -16])


# -- topk -------------------------------------------------------------------------------------

@FAST
@given(vectors, st.sampled_from([0.01, 0.1, 0.5, 1.0]))
def test_topk_keeps_exactly_the_k_largest_magnitudes(x, fraction):
    comp = make_compressor("topk", fraction=fraction, values="float32")
    c = comp.compress(x)
    validate(c, x.size)
    idx, vals = c.arrays
    k = comp.k_for(x.size)
    assert idx.size == k == (0 if x.size == 0 else max(1, math.ceil(fraction * x.size)))
    assert idx.dtype == np.int32 and (np.diff(idx) > 0).all()
    np.testing.assert_array_equal(vals, x[idx])
    dropped = np.delete(np.abs(x), idx)
    if k and dropped.size:
        assert np.abs(x[idx]).min() >= dropped.max()
    out = decompress(c, x.size)
    np.testing.assert_array_equal(out[idx], x[idx])
    assert np.count_nonzero(np.delete(out, idx)) == 0


@pytest.mark.parametrize("kind", ["gaussian", "heavy", "ties", "zeros", "sorted"])
def test_topk_sampled_threshold_path_is_exact(kind):
    n, k = 300_000, 3000
    rng = np.random.default_rng(7)
    x = {"gaussian": rng.standard_normal(n), "heavy": wide(n, lo=-40, hi=40),
         "ties": rng.integers(-3, 4, n), "zeros": np.zeros(n), "sorted": np.arange(n)}[kind].astype(np.float32)
    idx = top_k_indices(x, k)
    assert idx.size == k and np.unique(idx).size == k
    assert np.abs(x[idx]).min() >= np.delete(np.abs(x), idx).max()


@pytest.mark.parametrize("kind", ["gaussian", "heavy", "ties", "zeros", "signed_zeros", "inf", "sorted"])
@pytest.mark.parametrize("nrows, width, k", [(37, 4096, 82), (9, 4096, 123), (37, 4096, 410), (5, 1000, 30),
                                             (70, 64, 2), (40, 8, 3), (3, 10, 10), (2, 3, 1)])
def test_rows_top_k_keeps_what_a_sorted_reference_keeps(kind, nrows, width, k):
    """sparseloco's selection (both of its paths: 8 lanes per group, and 1, as at 10% of a
    4096-entry chunk, where a batch without ties at the threshold skips the sort) against a full sort:
    the same multiset of |x| per row, each column once, values with their bits; the same
    columns where |x| has no ties."""
    rng = np.random.default_rng(3)
    n = nrows * width
    x = {"gaussian": rng.standard_normal(n), "heavy": wide(n, lo=-40, hi=40), "ties": rng.integers(-3, 4, n),
         "zeros": np.where(rng.random(n) < 0.01, rng.standard_normal(n), 0.0),
         "signed_zeros": np.where(rng.random(n) < 0.5, -0.0, 0.0), "inf": np.where(rng.random(n) < 0.02, np.inf, 1.0),
         "sorted": np.arange(n)}[kind].astype(np.float32)
    rows = x.reshape(nrows, width)
    if kind == "inf":
        rows[0] = -np.inf  # a row of nothing but ties at Inf
    cols, vals = rows_top_k(rows, k)
    assert cols.shape == vals.shape == (nrows, k) and vals.dtype == np.float32
    assert ((cols >= 0) & (cols < width)).all()
    assert all(np.unique(c).size == k for c in cols)
    np.testing.assert_array_equal(vals.view(np.uint32), np.take_along_axis(rows, cols, 1).view(np.uint32))
    mags = np.abs(rows)
    ref = np.argsort(mags, axis=1, kind="stable")[:, width - k:]
    np.testing.assert_array_equal(np.sort(np.abs(vals), axis=1), np.sort(np.take_along_axis(mags, ref, 1), axis=1))
    if kind in ("gaussian", "heavy", "sorted"):
        np.testing.assert_array_equal(np.sort(cols, axis=1), np.sort(ref, axis=1))


def test_rows_top_k_keeps_nan_as_the_largest():
    """NaN is the caller's bug; kept, it reaches the wire, which rejects it (module docstring)."""
    rows = np.arange(4096, dtype=np.float32).reshape(1, -1)
    rows[0, 7] = np.nan
    cols, vals = rows_top_k(rows, 82)
    assert 7 in cols and np.isnan(vals).sum() == 1


@pytest.mark.parametrize("shape", [(5, 300), (2**16, 3), (2**16 + 5, 2)])  # both key widths
def test_sort_rows_u16_sorts_each_row(shape):
    a = np.random.default_rng(4).integers(0, 2**16, shape).astype(np.uint16)
    np.testing.assert_array_equal(sort_rows_u16(a), np.sort(a, axis=1))


def test_topk_float16_values_round_and_saturate():
    x = np.zeros(100, np.float32)
    x[[3, 50]] = [1e6, 0.1]
    c, out = roundtrip("topk", x, fraction=0.02)
    assert c.arrays[1].dtype == np.float16
    assert out[3] == 65504 and abs(out[50] - 0.1) <= 0.1 * 2.0**-11


# -- sign -------------------------------------------------------------------------------------

@FAST
@given(vectors, st.sampled_from([1, 5, 8, 64, 1024]))
def test_sign_keeps_signs_and_block_mean_magnitude(x, block):
    c, out = roundtrip("sign", x, block=block)
    assert c.arrays[0].size == -(-x.size // 8)
    counts = np.repeat(np.diff(np.append(np.arange(0, x.size, block), x.size)), block)[: x.size]
    scale = per_block(x, block, np.add) / np.maximum(counts, 1)
    np.testing.assert_allclose(np.abs(out), scale, rtol=1e-5)
    kept = (x != 0) & (scale > 0)
    assert (np.sign(out[kept]) == np.sign(x[kept])).all()


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(moderate, st.sampled_from([0.01, 0.03, 0.3, 1.0]), st.sampled_from([1, 7, 64, 4096]))
def test_sparseloco_keeps_each_chunks_k_largest_within_its_documented_bound(x, fraction, block):
    c, out = roundtrip("sparseloco", x, fraction=fraction, block=block)
    k = min(block, math.ceil(fraction * block))
    for lo in range(0, x.size, block):
        a, d = np.abs(x[lo:lo + block]), out[lo:lo + block]
        kept = np.zeros(a.size, bool)
        kept[(c.arrays[0][lo // block * k:][:min(k, a.size)] >> 2).astype(int)] = True
        assert kept.sum() == -(-k * a.size // block)  # the last, shorter chunk at the same density
        if (~kept).any():  # the kept ones are the largest: no dropped |x| above a kept one
            assert a[~kept].max() <= a[kept].min()
            assert (d[~kept] == 0).all()
        spread = a[kept].max() - a[kept].min()
        assert (np.abs(x[lo:lo + block][kept] - d[kept]) <= spread * (1 + 1e-6) + 1e-30).all()
        assert len(np.unique(np.abs(d[kept]))) <= 2  # two magnitude levels per chunk
        signs = x[lo:lo + block][kept] != 0
        assert (np.sign(d[kept][signs]) == np.sign(x[lo:lo + block][kept][signs])).all()


def test_sparseloco_levels_are_the_means_of_the_two_halves():
    x = np.float32([0, 9, -1, 0, 3, 0, -5, 0.5])  # one chunk, k = 4: |9|, |-5|, |3|, |-1|
    c, out = roundtrip("sparseloco", x, fraction=0.5, block=8)
    np.testing.assert_array_equal(c.arrays[1], [2, 7])  # mean(1, 3), mean(5, 9)
    np.testing.assert_array_equal(out, [0, 7, -2, 0, 2, 0, -7, 0])
    assert list(c.arrays[0]) == [1 << 2 | 1, 2 << 2 | 2, 4 << 2, 6 << 2 | 3]


# -- sizes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, params, expect", [
    ("none", {}, 4 * 2**20),
    ("fp16", {}, 2 * 2**20),
    ("bf16", {}, 2 * 2**20),
    ("int8", {"block": 256}, 2**20 + 4 * 2**20 // 256),
    ("int8", {"block": 4096}, 2**20 + 4 * 2**20 // 4096),
    ("int4", {"block": 64}, 2**19 + 4 * 2**20 // 64),
    ("topk", {"fraction": 0.01}, 6 * math.ceil(0.01 * 2**20)),  # int32 index + float16 value
    ("topk", {"fraction": 0.01, "values": "float32"}, 8 * math.ceil(0.01 * 2**20)),
    ("sign", {"block": 1024}, 2**20 // 8 + 4 * 2**20 // 1024),
    # k = ceil(0.02 * 4096) = 82 per chunk, on the wire (sparse_wire.py): a bitmap of 82 + 4096 / 2^5
    # bits per chunk, 5 low bits and 2 value bits per entry, and two float32 levels per chunk
    ("sparseloco", {"fraction": 0.02, "block": 4096}, 256 * (82 + 128) // 8 + (5 + 2) * 82 * 256 // 8 + 8 * 256),
])
def test_compressed_sizes(name, params, expect):
    x = np.random.default_rng(0).standard_normal(2**20).astype(np.float32)
    c = make_compressor(name, **params).compress(x)
    assert nbytes(c) == c.nbytes == expect
    ratio = expect / x.nbytes
    assert {"int8": 0.25 <= ratio < 0.26, "int4": 0.125 <= ratio < 0.141, "topk": 0.01 < ratio <= 0.021, "sign": 1 / 32 <= ratio < 0.035,
            "sparseloco": 0.006 < ratio < 0.007}.get(name, True)


# -- error feedback ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, params", [("topk", {"fraction": 0.01}), ("sign", {"block": 64}),
                                          ("int8", {"block": 64}), ("fp16", {}),
                                          ("sparseloco", {"fraction": 0.02, "block": 500})])
def test_error_feedback_running_sum_tracks_the_inputs(name, params):
    """sum_t D(c_t) = sum_t x_t - e_T, and the residual e_T stays bounded (it does not grow
    with T): the property that makes EF-SGD converge."""
    n, steps = 2000, 300
    ef = ErrorFeedback(make_compressor(name, **params))
    rng = np.random.default_rng(1)
    sent = np.zeros(n, np.float64)
    meant = np.zeros(n, np.float64)
    norms = []
    for t in range(steps):
        x = rng.standard_normal(n).astype(np.float32) + 0.3  # a persistent bias, as in gradients
        c, decoded = ef.compress_with_decoded(x, key="peer-b")
        np.testing.assert_array_equal(decoded, decompress(c, n))
        sent += decoded
        meant += x
        e = ef.residual("peer-b")
        np.testing.assert_allclose(sent, meant - e, atol=1e-3 * (t + 1) ** 0.5)
        norms.append(np.linalg.norm(e))
    x_norm = np.linalg.norm(np.ones(n) * 1.04)  # ~ ||x||
    assert max(norms[steps // 2:]) <= 1.5 * max(norms[: steps // 2]) + 1e-6  # not growing
    assert max(norms) <= {"topk": 150, "sign": 10, "int8": 1, "fp16": 1, "sparseloco": 100}[name] * x_norm
    # and so the time-averaged transmission converges to the time-averaged input
    assert np.abs(sent - meant).max() / steps < 0.2


def test_without_error_feedback_topk_loses_the_mass():
    n, steps = 2000, 500
    comp = make_compressor("topk", fraction=0.01)
    x = np.full(n, 0.3, np.float32) + np.random.default_rng(0).standard_normal(n).astype(np.float32) * 0.01
    plain = sum(decompress(comp.compress(x), n) for _ in range(steps))
    ef = ErrorFeedback(comp)
    fed = sum(ef.compress_with_decoded(x)[1] for _ in range(steps))
    assert plain.sum() < 0.02 * steps * x.sum()  # top-k alone sends ~1% of the mass
    # error feedback sends all of it but the residual (each element waits ~1/fraction steps)
    assert fed.sum() > 0.75 * steps * x.sum()


def test_error_feedback_streams_are_independent_and_forgettable():
    ef = ErrorFeedback(make_compressor("sign", block=4))
    x = np.float32([1, 2, 3, 10])
    ef.compress(x, "a")
    assert ef.residual("a").size == 4 and ef.residual("b").size == 0
    ef.compress(x * 2, "b")
    assert not np.array_equal(ef.residual("a"), ef.residual("b"))
    ef.forget("a")
    assert list(ef.keys()) == ["b"]
    with pytest.raises(LocalProtocolError):
        ef.compress(np.zeros(3, np.float32), "b")


# -- wire -------------------------------------------------------------------------------------

def _wire(frames):
    return [bytes(f) for f in frames]


def test_tag_is_pinned():
    assert registered_tags()[60] == "CompressedTensor"


@pytest.mark.parametrize("name, params", [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {"block": 100}),
                                          ("int4", {"block": 100}), ("topk", {"fraction": 0.05}), ("topk", {"values": "float32"}),
                                          ("sign", {"block": 100}), ("sparseloco", {"block": 100})])
def test_wire_round_trip(name, params):
    x = np.random.default_rng(2).standard_normal(1001).astype(np.float32)
    c = make_compressor(name, **params).compress(x)
    msg = CompressedTensor(**compressed_fields(c), stream="m/1001", seq=7)
    frames = encode(msg, "10.0.0.1:7000")
    assert len(frames) == 3 and sum(memoryview(f).nbytes for f in frames[1:]) == c.nbytes
    src, back = decode(_wire(frames))
    assert src == "10.0.0.1:7000" and back.stream == "m/1001" and back.seq == 7
    got = back.payload()
    assert got.codec == name and got.numel == 1001 and got.meta == c.meta
    np.testing.assert_array_equal(decompress(got, 1001), decompress(c, 1001))


def _frames(codec, numel, meta, data, aux, stream="s", seq=1):
    """Frames of a CompressedTensor built by hand (so no local validation runs)."""
    arrays = [np.ascontiguousarray(data), np.ascontiguousarray(aux)]
    header = msgpack.packb([PROTOCOL_VERSION, 60, "a:1", [codec, numel, meta, None, None, stream, seq],
                            [[a.dtype.name, list(a.shape)] for a in arrays]])
    return [header, *(a.tobytes() for a in arrays)]


f32, i32, u8 = np.float32, np.int32, np.uint8
NONE = np.empty(0, u8)
SIGN_BITS = np.zeros(2, u8)


def _sparse(offsets, code=3):
    return (np.uint16(offsets) << 2) | np.uint16(code)


SPARSE = _sparse([0, 3, 1, 2, 1])


def _packed(codes):
    """sparseloco codes of the 10-element record below as the wire carries them (sparse_wire.py)."""
    return pack_codes(codes, 10, 4, 2)


PACKED = _packed(SPARSE)


@pytest.mark.parametrize("codec, numel, meta, data, aux, reason", [
    ("zstd", 4, [], np.zeros(4, f32), NONE, "unknown_codec"),
    ("none", 5, [], np.zeros(4, f32), NONE, "bad_payload"),  # wrong length
    ("none", 4, [], np.zeros(4, np.float64), NONE, "bad_payload"),  # wrong dtype
    ("none", 4, [], np.zeros(4, f32), np.zeros(1, u8), "bad_payload"),  # stray aux
    ("none", 4, [1], np.zeros(4, f32), NONE, "bad_payload"),  # stray meta
    ("none", -1, [], np.zeros(0, f32), NONE, "bad_payload"),
    ("none", 2, [], np.float32([1, np.nan]), NONE, "non_finite"),
    ("fp16", 2, [], np.float16([1, np.inf]), NONE, "non_finite"),
    ("bf16", 2, [], np.uint16([0x3F80, 0x7F80]), NONE, "non_finite"),  # +Inf pattern
    ("bf16", 2, [], np.uint16([0x3F80, 0xFFC1]), NONE, "non_finite"),  # NaN pattern
    ("bf16", 2, [], np.zeros(2, np.float16), NONE, "bad_payload"),
    ("int8", 10, [4], np.zeros(10, np.int8), np.zeros(2, f32), "bad_payload"),  # 3 blocks needed
    ("int8", 10, [4], np.zeros(9, np.int8), np.zeros(3, f32), "bad_payload"),
    ("int8", 10, [0], np.zeros(10, np.int8), np.zeros(3, f32), "bad_payload"),  # block 0
    ("int8", 10, [2**40], np.zeros(10, np.int8), np.zeros(1, f32), "bad_payload"),
    ("int8", 10, [True], np.zeros(10, np.int8), np.zeros(10, f32), "bad_payload"),
    ("int8", 10, [], np.zeros(10, np.int8), np.zeros(3, f32), "bad_payload"),  # no block
    ("int8", 10, [4, 4], np.zeros(10, np.int8), np.zeros(3, f32), "bad_payload"),
    ("int8", 10, ["4"], np.zeros(10, np.int8), np.zeros(3, f32), "bad_payload"),
    ("int8", 10, [4], np.zeros(10, np.int8), np.float32([1, np.nan, 1]), "non_finite"),
    ("int8", 10, [4], np.zeros(10, np.int8), np.float32([1, -1, 1]), "non_finite"),  # negative scale
    ("int8", 10, [4], np.zeros(10, np.uint8), np.zeros(3, f32), "bad_payload"),
    ("int4", 10, [4], np.zeros(10, np.uint8), np.zeros(3, f32), "bad_payload"),  # 5 bytes for 10
    ("int4", 10, [4], np.zeros(5, np.int8), np.zeros(3, f32), "bad_payload"),
    ("int4", 10, [4], np.zeros(5, np.uint8), np.zeros(2, f32), "bad_payload"),
    ("int4", 10, [4], np.zeros(5, np.uint8), np.float32([1, np.inf, 1]), "non_finite"),
    ("int4", 10, [4], np.zeros(5, np.uint8), np.float32([1, 3e38, 1]), "non_finite"),  # 8 * scale overflows
    ("topk", 10, [], np.int32([1, 10]), np.zeros(2, np.float16), "bad_payload"),  # index == numel
    ("topk", 10, [], np.int32([-1, 3]), np.zeros(2, np.float16), "bad_payload"),
    ("topk", 10, [], np.int32([3, 1]), np.zeros(2, np.float16), "bad_payload"),  # unsorted
    ("topk", 10, [], np.int32([3, 3]), np.zeros(2, np.float16), "bad_payload"),  # duplicate
    ("topk", 10, [], np.int32([1, 2, 3]), np.zeros(2, np.float16), "bad_payload"),  # lengths differ
    ("topk", 2, [], np.int32([0, 1, 2]), np.zeros(3, np.float16), "bad_payload"),  # k > numel
    ("topk", 10, [], np.int64([1, 2]), np.zeros(2, np.float16), "bad_payload"),
    ("topk", 10, [], np.int32([1, 2]), np.zeros(2, np.int8), "bad_payload"),
    ("topk", 10, [], np.int32([1, 2]), np.float32([1, np.inf]), "non_finite"),
    ("topk", 10, [], np.int32([1, 2]), np.float16([1, np.nan]), "non_finite"),
    ("sign", 16, [8], np.zeros(3, u8), np.zeros(2, f32), "bad_payload"),  # 2 bytes needed
    ("sign", 16, [8], SIGN_BITS, np.zeros(3, f32), "bad_payload"),
    ("sign", 16, [8], SIGN_BITS, np.float32([1, np.inf]), "non_finite"),
    ("sign", 16, [8], SIGN_BITS, np.float32([1, -2]), "non_finite"),
    ("sign", 16, [-8], SIGN_BITS, np.zeros(2, f32), "bad_payload"),
    ("sign", 16, [8], SIGN_BITS.astype(np.int8), np.zeros(2, f32), "bad_payload"),
    # sparseloco, 10 elements in chunks of 4 (4, 4, 2), k = 2 (1 in the last): 5 codes, 3 level pairs
    ("sparseloco", 10, [4, 2], PACKED, np.zeros(6, f32), "ok"),  # the well-formed record below
    ("sparseloco", 10, [4, 2], PACKED[:-1], np.zeros(6, f32), "bad_payload"),  # a byte short
    ("sparseloco", 10, [4, 2], np.append(PACKED, u8(0)), np.zeros(6, f32), "bad_payload"),  # a byte over
    ("sparseloco", 10, [4, 2], SPARSE, np.zeros(6, f32), "bad_payload"),  # codes unpacked (uint16)
    ("sparseloco", 10, [4, 2], PACKED.astype(np.int8), np.zeros(6, f32), "bad_payload"),
    ("sparseloco", 10, [4, 2], PACKED, np.zeros(4, f32), "bad_payload"),
    ("sparseloco", 10, [4], PACKED, np.zeros(6, f32), "bad_payload"),
    ("sparseloco", 10, [4, 5], PACKED, np.zeros(6, f32), "bad_payload"),  # k > block
    ("sparseloco", 10, [4, 0], PACKED, np.zeros(6, f32), "bad_payload"),
    ("sparseloco", 10, [2**14 + 1, 2], PACKED, np.zeros(2, f32), "bad_payload"),
    ("sparseloco", 10, [4, True], PACKED, np.zeros(6, f32), "bad_payload"),
    ("sparseloco", 2**31 - 1, [4, 2], PACKED, np.zeros(6, f32), "bad_payload"),  # hostile size
    ("sparseloco", 10, [4, 2], PACKED, np.float32([1, 2, np.nan, 1, 1, 1]), "non_finite"),
    ("sparseloco", 10, [4, 2], PACKED, np.float32([1, 2, np.inf, 1, 1, 1]), "non_finite"),
    ("sparseloco", 10, [4, 2], PACKED, np.float32([1, -2, 1, 1, 1, 1]), "non_finite"),
    ("sparseloco", 10, [4, 2], _packed(_sparse([0, 4, 1, 2, 1])), np.zeros(6, f32), "bad_payload"),  # offset 4 of 4
    ("sparseloco", 10, [4, 2], _packed(_sparse([0, 3, 1, 2, 2])), np.zeros(6, f32), "bad_payload"),  # past numel
    ("sparseloco", 10, [4, 2], _packed(_sparse([3, 1, 1, 2, 1])), np.zeros(6, f32), "bad_payload"),  # unsorted
    ("sparseloco", 10, [4, 2], _packed(_sparse([0, 3, 2, 2, 1])), np.zeros(6, f32), "bad_payload"),  # duplicate
    # a chunk's bitmap with one entry too many or too few (the byte holds chunk 0's 4 bits and chunk 1's)
    ("sparseloco", 10, [4, 2], np.concatenate([[PACKED[0] | 0x40], PACKED[1:]]).astype(u8), np.zeros(6, f32), "bad_payload"),
    ("sparseloco", 10, [4, 2], np.concatenate([[PACKED[0] & 0x7F], PACKED[1:]]).astype(u8), np.zeros(6, f32), "bad_payload"),
])
def test_malformed_payloads_are_rejected_on_decode(codec, numel, meta, data, aux, reason):
    if reason == "ok":  # a control: the rows around it break one thing each
        _, msg = decode(_frames(codec, numel, meta, data, aux))
        assert decompress(msg.payload(), numel).shape == (numel,)
        return
    with pytest.raises(RemoteProtocolError) as info:
        decode(_frames(codec, numel, meta, data, aux))
    assert info.value.reason == reason


def test_validate_checks_the_expected_size():
    c = make_compressor("int8").compress(np.ones(300, np.float32))
    validate(c, 300)
    with pytest.raises(RemoteProtocolError) as info:
        validate(c, 301)
    assert info.value.reason == "bad_tensor"
    with pytest.raises(RemoteProtocolError):
        validate(Compressed("int8", 300, (c.arrays[0],), c.meta))  # missing array


any_array = st.one_of(
    hnp.arrays(st.sampled_from([np.float32, np.float16, np.uint16, np.int8, np.uint8, np.int32, np.int64]),
               st.integers(0, 40)),
    st.just(np.empty(0, np.uint8)))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(list(COMPRESSORS) + ["bogus"]), st.integers(-3, 64),
       st.lists(st.one_of(st.integers(-5, 2**33), st.booleans(), st.text(max_size=2)), max_size=3),
       any_array, any_array)
def test_arbitrary_payloads_validate_or_raise_remote_error_only(codec, numel, meta, data, aux):
    """Whatever a peer sends: RemoteProtocolError, or a record that decodes to numel finite
    floats. Never IndexError, ValueError, OverflowError..."""
    try:
        _, msg = decode(_frames(codec, numel, meta, data, aux))
    except RemoteProtocolError:
        return
    out = decompress(msg.payload(), numel)
    assert out.shape == (numel,) and out.dtype == np.float32 and np.isfinite(out).all()


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 20_000), st.sampled_from([1, 4, 16, 100, 4096, 2**14]), st.floats(1e-4, 1.0))
def test_sparseloco_codes_travel_packed_and_come_back_the_same(numel, block, fraction):
    """Elias-Fano offsets and 2-bit values (sparse_wire.py): what a peer unpacks is exactly what
    was packed, in the size the layout says (test_compressed_sizes: 9.6 bits an entry at 2% of
    4096, where the in-memory code takes 16)."""
    x = np.random.default_rng(numel).standard_normal(numel).astype(np.float32)
    c = make_compressor("sparseloco", fraction=fraction, block=block).compress(x)
    buf = pack_codes(c.arrays[0], c.numel, *c.meta)
    assert buf.dtype == np.uint8 and buf.size == packed_size(c.numel, *c.meta)
    np.testing.assert_array_equal(unpack_codes(buf, c.numel, *c.meta), c.arrays[0])
