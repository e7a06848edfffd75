"""Sparse sparseloco Deltas (p2p/compression/sparse.py) give what the dense computation gave:
the decoding, robust mixing's mean (p2p/averaging/robust.py), error feedback
(p2p/averaging/outer_codec.py) and a round's lazily computed deltas (rounds.py ``Mixed``)."""

from __future__ import annotations

import numpy as np
import pytest

from p2p.averaging.outer_codec import decode, pack
from p2p.averaging.robust import robust_mean
from p2p.averaging.rounds import NeighbourRounds
from p2p.compression import decompress, make_compressor
from p2p.compression.sparse import SparseDelta, decode_sparseloco, dense

CODEC = make_compressor("sparseloco", fraction=0.02, block=512)


def sparse_deltas(count: int, n: int, seed: int, spread: float = 0.5) -> list[np.ndarray]:
    """Decoded sparseloco records of ``count`` noisy estimates of one pseudo-gradient (float32[n])."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=n).astype(np.float32)
    return [decode_sparseloco(CODEC.compress(g + np.float32(spread) * rng.normal(size=n).astype(np.float32)))
            for _ in range(count)]


@pytest.mark.parametrize("n", [1, 511, 512, 5000, 70001])
def test_the_sparse_decoding_is_the_dense_one_bit_for_bit(n):
    rng = np.random.default_rng(n)
    for x in (rng.normal(size=n).astype(np.float32), np.zeros(n, np.float32)):
        c = CODEC.compress(x)
        s = decode_sparseloco(c)
        assert (np.diff(s.idx) > 0).all()
        np.testing.assert_array_equal(s.dense(), decompress(c, n))
        assert s.dense().tobytes() == decompress(c, n).tobytes()  # -0.0 included


def as_dense(vs):
    return [dense(v) for v in vs]


@pytest.mark.parametrize("seed", range(4))
def test_the_sparse_robust_mean_is_the_dense_one(seed):
    vs = sparse_deltas(5, 20_000, seed)
    # honest: no clipping, nobody opposed: the same terms summed in the same order, same bits
    mean, clipped, opposed = robust_mean(vs, 2.0)
    want, want_clipped, want_opposed = robust_mean(as_dense(vs), 2.0)
    assert (clipped, opposed) == (want_clipped, want_opposed) == (0, 0)
    np.testing.assert_array_equal(mean, want)
    # a scaled one (clipped), a sign-flipped one (left out), a zero one (a finished peer)
    vs[0] = np.float32(8) * vs[0]
    vs[1] = np.float32(-1) * vs[1]
    vs.append(SparseDelta(vs[2].numel, vs[2].idx, np.zeros_like(vs[2].vals)))
    mean, clipped, opposed = robust_mean(vs, 2.0)
    want, want_clipped, want_opposed = robust_mean(as_dense(vs), 2.0)
    assert (clipped, opposed) == (want_clipped, want_opposed) == (1, 1)
    # the norms sum their terms in another order: the clipping factor may differ in its last bits
    np.testing.assert_allclose(mean, want, rtol=1e-6, atol=1e-7 * float(np.abs(want).max()))
    # and the sparse answer is still one answer for one set, whatever the order
    again, _, _ = robust_mean(vs[::-1], 2.0)
    np.testing.assert_array_equal(mean, again)


def test_a_set_that_mixes_sparse_and_dense_vectors_is_computed_dense():
    vs = sparse_deltas(4, 3000, seed=9)
    mixed = [vs[0].dense()] + vs[1:]
    np.testing.assert_array_equal(robust_mean(mixed, 2.0)[0], robust_mean(as_dense(vs), 2.0)[0])


@pytest.mark.parametrize("name", ["sparseloco", "int4"])
def test_error_feedback_in_place_is_the_formula_bit_for_bit(name):
    codec = make_compressor(name)
    rng = np.random.default_rng(3)
    n = 50_000
    residual = rng.normal(size=n).astype(np.float32)
    want_e = residual.copy()
    for _ in range(3):
        delta = rng.normal(size=n).astype(np.float32)
        v = delta + want_e  # diloco.py before: v = Delta + e; e <- v - D(Q(v))
        want_c = codec.compress(v)
        want_e = v - decompress(want_c, n)
        packed, decoded = pack(codec, delta, residual)
        assert residual.tobytes() == want_e.tobytes()
        assert all(a.tobytes() == b.tobytes() for a, b in zip(packed.arrays, want_c.arrays))
        assert dense(decoded).tobytes() == decompress(want_c, n).tobytes()
        assert isinstance(decoded, SparseDelta) == (name == "sparseloco")
    assert isinstance(decode(packed), type(decoded))


def test_a_consistent_round_over_sparse_deltas_mixes_dense_and_gives_its_deltas_on_demand():
    from p2p.averaging.robust import RobustMixing

    vs = sparse_deltas(3, 4000, seed=4)
    start = np.ones(4000, np.float32)
    stats: dict[str, int] = {}
    rounds = NeighbourRounds(60.0, stats, robust=RobustMixing(True, stats), channels=("params", "delta"), uniform=True)
    rounds.begin(0.0, ["b", "c"], (start, vs[0]), wait_for=frozenset({"b", "c"}))
    rounds.offer("b", 0, 2, 0, (None, vs[1]))
    rounds.offer("c", 0, 2, 0, (None, vs[2]))
    mixed = rounds.finish(0, now=0.0)
    assert isinstance(mixed.payload[1], np.ndarray)
    np.testing.assert_array_equal(mixed.payload[1], robust_mean(as_dense(vs), 2.0)[0])
    np.testing.assert_array_equal(mixed.deltas[1], mixed.payload[1] - vs[0].dense())
    np.testing.assert_array_equal(mixed.deltas[0], np.zeros(4000, np.float32))
