"""Topologies: pure functions of (me, members, round); every peer computes the same graph."""

import random

import numpy as np
import pytest

from p2p.topology import (SYMMETRIC, TIME_VARYING, TOPOLOGIES, full, get_topology, hypercube,
                          in_neighbours, is_connected, metropolis_hastings_weights, mixing_matrix,
                          one_peer_exponential, ring, torus)
from p2p.topology.graphs import log2_ceil, torus_shape
from p2p.topology.weights import adjacency

NAMES = sorted(TOPOLOGIES)
SIZES = [1, 2, 3, 5, 8, 12, 16]


def members(n):
    return [f"peer{i:03d}:7000" for i in range(n)]  # sorted order = index order


def rounds_of(name, n):
    return range(2 * log2_ceil(n)) if name in TIME_VARYING else [0]


def test_registry_names():
    assert set(TOPOLOGIES) == {"ring", "torus", "exponential", "one-peer-exponential", "hypercube", "random", "full"}
    with pytest.raises(ValueError, match="available"):
        get_topology("star")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", SIZES)
def test_well_formed_with_or_without_me(name, n):
    topo, ms = TOPOLOGIES[name], members(n)
    for r in rounds_of(name, n):
        for me in ms:
            out = topo(me, ms, r)
            assert me not in out and len(out) == len(set(out)) and set(out) <= set(ms)
            assert topo(me, [m for m in ms if m != me], r) == out  # members may exclude me


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_under_permutation_and_duplicates(name):
    ms = members(11)
    shuffled = ms[:]
    random.Random(4).shuffle(shuffled)
    topo = TOPOLOGIES[name]
    for r in rounds_of(name, 11):
        for me in ms:
            assert topo(me, shuffled + shuffled[:3], r) == topo(me, ms, r)


@pytest.mark.parametrize("name", sorted(SYMMETRIC))
@pytest.mark.parametrize("n", SIZES)
def test_symmetric_topologies_are_symmetric(name, n):
    for r in rounds_of(name, n):
        a = adjacency(TOPOLOGIES[name], members(n), r)
        assert (a == a.T).all()


@pytest.mark.parametrize("n", SIZES[1:])
def test_one_peer_exponential_is_a_permutation(n):
    for r in rounds_of("one-peer-exponential", n):
        a = adjacency(one_peer_exponential, members(n), r)
        assert (a.sum(axis=0) == 1).all() and (a.sum(axis=1) == 1).all() and not a.diagonal().any()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", SIZES)
def test_connected(name, n):
    assert is_connected(TOPOLOGIES[name], members(n), list(rounds_of(name, n)))


def test_shapes_and_degrees():
    ms = members(16)
    assert torus_shape(16) == (4, 4) and torus_shape(12) == (3, 4) and torus_shape(7) == (1, 7)
    assert len(torus(ms[5], ms)) == 4
    assert ring(ms[0], ms) == [ms[1], ms[15]]
    assert TOPOLOGIES["exponential"](ms[0], ms) == [ms[j] for j in (1, 2, 4, 8, 12, 14, 15)]
    assert [one_peer_exponential(ms[3], ms, r) for r in range(5)] == [[ms[4]], [ms[5]], [ms[7]], [ms[11]], [ms[4]]]
    assert [hypercube(ms[3], ms, r) for r in range(4)] == [[ms[2]], [ms[1]], [ms[7]], [ms[11]]]
    assert hypercube(members(6)[3], members(6), 2) == []  # 3 XOR 4 = 7 is past the end
    degrees = [len(TOPOLOGIES["random"](m, members(40))) for m in members(40)]
    assert min(degrees) >= 2 and max(degrees) <= 3 and np.mean(degrees) > 2.5


def test_full_keeps_the_two_argument_call():
    assert full("b", ["a", "b", "c"]) == ["a", "c"]
    assert full("z", ["a", "b"]) == ["a", "b"]


def test_random_is_stable_while_membership_is_stable_and_changes_with_it():
    ms = members(20)
    topo = get_topology("random")
    before = {m: topo(m, ms, 0) for m in ms}
    assert {m: topo(m, ms, 99) for m in ms} == before  # the round does not matter
    assert get_topology("random", seed=1)(ms[0], ms) != before[ms[0]] or \
        get_topology("random", seed=1)(ms[1], ms) != before[ms[1]]
    grown = ms + ["peer999:7000"]
    assert any(topo(m, grown) != before[m] for m in ms)


@pytest.mark.parametrize("name", NAMES)
def test_recomputed_on_join_and_leave(name):
    ms = members(9)
    topo = TOPOLOGIES[name]
    after_leave = [m for m in ms if m != ms[4]]
    for me in after_leave:
        assert ms[4] not in topo(me, after_leave, 1)
    joined = ms + ["peer099:7000"]
    assert any("peer099:7000" in topo(me, joined, r) for me in ms for r in rounds_of(name, 10))


@pytest.mark.parametrize("name, k", [("one-peer-exponential", k) for k in (1, 2, 3, 4, 5)] +
                         [("hypercube", k) for k in (1, 2, 3, 4, 5)])
def test_exact_averaging_in_log2_n_rounds(name, k):
    """Ying et al. 2021: with n = 2^k, k rounds of x_i <- (x_i + x_in(i)) / 2 give the exact mean
    (any k consecutive rounds: the factors commute)."""
    n = 1 << k
    ms = members(n)
    topo = TOPOLOGIES[name]
    x = np.random.default_rng(k).normal(size=(n, 3))
    target = x.mean(axis=0)
    for r in range(5, 5 + k):
        sender = {ms.index(topo(m, ms, r)[0]): i for i, m in enumerate(ms)}  # receiver -> sender
        x = np.stack([(x[i] + x[sender[i]]) / 2 for i in range(n)])
    assert np.abs(x - target).max() <= 1e-12


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [2, 5, 8, 13])
def test_metropolis_hastings_matrix_is_doubly_stochastic(name, n):
    for r in rounds_of(name, n):
        w = mixing_matrix(TOPOLOGIES[name], members(n), r)
        assert np.allclose(w.sum(axis=0), 1, atol=1e-12) and np.allclose(w.sum(axis=1), 1, atol=1e-12)
        assert (w >= 0).all()


def test_metropolis_hastings_row_from_neighbour_degrees():
    row = metropolis_hastings_weights("a", ["b", "c"], {"b": 1, "c": 4})
    assert row == pytest.approx({"b": 1 / 3, "c": 1 / 5, "a": 1 - 1 / 3 - 1 / 5})
    assert metropolis_hastings_weights("a", [], {}) == {"a": 1.0}
    ms = members(7)
    row = metropolis_hastings_weights(ms[0], ring(ms[0], ms), lambda m: len(ring(m, ms)))
    assert row[ms[1]] == pytest.approx(1 / 3) and sum(row.values()) == pytest.approx(1.0)


def test_in_neighbours_of_the_shift():
    ms = members(8)
    assert in_neighbours(one_peer_exponential, ms[0], ms, 2) == [ms[4]]
    assert in_neighbours(one_peer_exponential, ms[0], ms, 1) == [ms[6]]
