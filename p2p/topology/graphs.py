"""The communication graphs, as pure functions of the membership.

Every function has the signature ``f(me, members, round=0) -> list[str]``:

- ``members`` is the list of live member ids/addresses as this peer sees it, with or without
  ``me``; order and duplicates do not matter. Each function sorts the set itself, so every peer
  that holds the same membership computes the same graph without talking to anyone.
- ``round`` selects the graph of a time-varying topology (``one-peer-exponential``,
  ``hypercube``); static topologies ignore it. The averaging algorithm says which round it is
  at (``Averager.topology_round()``).
- The result is ``me``'s (out-)neighbours in sorted-position order, never ``me`` itself, no
  duplicates. Because the graphs are functions of the member list, they recompute themselves
  when members join or leave: there is no state to update.

Peer i is the i-th member in sorted order, n the number of members (``me`` included).

Symmetry: every topology here is undirected (j in N(i) iff i in N(j)) except
``one-peer-exponential``, which is a directed permutation: every peer has exactly one
out-neighbour and exactly one in-neighbour per round, so in-degree equals out-degree for all
of them, which the synchronous algorithms rely on (they wait for ``len(neighbours)`` messages).
"""

from __future__ import annotations

import hashlib
import math
import random as _random
from functools import lru_cache
from typing import Sequence


def order(me: str, members: Sequence[str]) -> tuple[list[str], int]:
    """The sorted member list with ``me`` in it, and ``me``'s index."""
    ordered = sorted(set(members) | {me})
    return ordered, ordered.index(me)


def _pick(ordered: list[str], i: int, indices) -> list[str]:
    """Members at ``indices`` (mod n), without ``me`` and without repeats, in index order."""
    n = len(ordered)
    chosen = sorted({j % n for j in indices} - {i})
    return [ordered[j] for j in chosen]


def log2_ceil(n: int) -> int:
    """Rounds of a one-peer exponential / hypercube cycle over n peers: ceil(log2 n)."""
    return max(1, (n - 1).bit_length())


def full(me: str, members: Sequence[str], round: int = 0) -> list[str]:
    """Fully connected: every other member. (Also the old 2-argument ``full(me, alive)``.)"""
    ordered, i = order(me, members)
    return ordered[:i] + ordered[i + 1:]


def ring(me: str, members: Sequence[str], round: int = 0) -> list[str]:
    """Undirected ring over the sorted members: i - 1 and i + 1."""
    ordered, i = order(me, members)
    return _pick(ordered, i, (i - 1, i + 1))


def torus_shape(n: int) -> tuple[int, int]:
    """Near-square factorisation rows x cols = n with rows <= cols (a prime n gives a ring)."""
    rows = int(math.isqrt(n))
    while n % rows:
        rows -= 1
    return rows, n // rows


def torus(me: str, members: Sequence[str], round: int = 0) -> list[str]:
    """2-D torus over the sorted members laid out row-major on a near-square grid."""
    ordered, i = order(me, members)
    rows, cols = torus_shape(len(ordered))
    r, c = divmod(i, cols)
    cells = [((r - 1) % rows) * cols + c, ((r + 1) % rows) * cols + c,
             r * cols + (c - 1) % cols, r * cols + (c + 1) % cols]
    return _pick(ordered, i, cells)


def exponential(me: str, members: Sequence[str], round: int = 0) -> list[str]:
    """Static exponential graph: i +- 2^k for every 2^k < n (made undirected, degree ~2 log2 n)."""
    ordered, i = order(me, members)
    n = len(ordered)
    hops = [1 << k for k in range(max(n - 1, 1).bit_length()) if (1 << k) < n]
    return _pick(ordered, i, [i + h for h in hops] + [i - h for h in hops])


def one_peer_exponential(me: str, members: Sequence[str], round: int = 0) -> list[str]:
    """Time-varying one-peer exponential graph (Ying et al., NeurIPS 2021): at round t the single
    out-neighbour is i + 2^(t mod ceil(log2 n)). Directed; a shift, so in-degree is 1 too. For n a
    power of two, averaging x_i <- (x_i + x_{in(i)}) / 2 over any log2 n consecutive rounds gives
    the exact average: the product of (I + P^(2^t)) / 2 is J / n."""
    ordered, i = order(me, members)
    n = len(ordered)
    if n < 2:
        return []
    hop = 1 << (round % log2_ceil(n))
    return [ordered[(i + hop) % n]]


def hypercube(me: str, members: Sequence[str], round: int = 0) -> list[str]:
    """Time-varying hypercube pairing (GossipGraD's partner rotation): at round t the partner is
    i XOR 2^(t mod ceil(log2 n)), none if that index is past the end (n not a power of two).
    Symmetric: partners pair up. Exact averaging after log2 n rounds for n a power of two; for any
    n the union over a cycle is connected (i XOR its top bit is a smaller index)."""
    ordered, i = order(me, members)
    n = len(ordered)
    if n < 2:
        return []
    j = i ^ (1 << (round % log2_ceil(n)))
    return [ordered[j]] if j < n else []


@lru_cache(maxsize=64)
def _random_graph(ordered: tuple[str, ...], degree: int, seed: int) -> tuple[frozenset[int], ...]:
    """Adjacency sets of a random undirected graph: a random Hamiltonian cycle (connected) plus
    random near-perfect matchings until the degree reaches ``degree`` (duplicate edges merge, so
    a few degrees fall short: "k-regular-ish"). Seeded by a hash of the sorted membership."""
    n = len(ordered)
    digest = hashlib.sha256(f"{seed}\n{degree}\n".encode() + "\n".join(ordered).encode()).digest()
    rng = _random.Random(int.from_bytes(digest[:8], "big"))
    adj: list[set[int]] = [set() for _ in range(n)]
    perm = list(range(n))
    rng.shuffle(perm)
    for a, b in zip(perm, perm[1:] + perm[:1]):
        if a != b:
            adj[a].add(b)
            adj[b].add(a)
    for _ in range(max(0, degree - 2)):
        rng.shuffle(perm)
        for a, b in zip(perm[0::2], perm[1::2]):
            adj[a].add(b)
            adj[b].add(a)
    return tuple(frozenset(s) for s in adj)


def random_regular(me: str, members: Sequence[str], round: int = 0, degree: int = 3,
                   seed: int = 0) -> list[str]:
    """Random k-regular-ish undirected graph, the same on every peer that holds the same
    membership, stable while the membership is stable (``round`` is ignored), reshuffled when a
    member joins or leaves. ``degree`` >= 2 (the Hamiltonian cycle keeps it connected)."""
    if degree < 2:
        raise ValueError("random topology needs degree >= 2")
    ordered, i = order(me, members)
    adj = _random_graph(tuple(ordered), degree, seed)
    return [ordered[j] for j in sorted(adj[i])]
