"""Mixing weights and graph helpers: small pure functions, table-tested.

Metropolis-Hastings weights (Xiao & Boyd, "Fast linear iterations for distributed averaging",
2004; Boyd et al., "Randomized gossip algorithms", 2006): on an undirected graph,

    W_ij = 1 / (1 + max(d_i, d_j))   for j in N(i),     W_ii = 1 - sum_j W_ij,

where d is the degree. W is symmetric and row-stochastic, hence doubly stochastic, and each peer
computes its row from its neighbours' degrees alone (they travel with the parameters). On the
one-peer exponential graph (in = out = 1) the same formula gives W = (I + P) / 2, again doubly
stochastic. Dropping a neighbour from one round moves its weight onto W_ii: the row stays
stochastic (the lost symmetry costs a small drift of the mean, which later rounds mix away).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence, Union

import numpy as np

from p2p.topology.graphs import order

Topology = Callable[..., list]


def metropolis_hastings_weight(d_i: int, d_j: int) -> float:
    """W_ij for neighbours of degrees ``d_i`` and ``d_j``."""
    return 1.0 / (1.0 + max(d_i, d_j))


def metropolis_hastings_weights(me: str, neighbours: Sequence[str],
                                degree_of: Union[Mapping[str, int], Callable[[str], int]]) -> dict[str, float]:
    """``me``'s row of the Metropolis-Hastings matrix: {peer: weight}, ``me`` included, sums to 1.
    ``degree_of`` maps a neighbour to its degree (a dict or a function)."""
    get = degree_of.__getitem__ if isinstance(degree_of, Mapping) else degree_of
    d_i = len(neighbours)
    row = {j: metropolis_hastings_weight(d_i, get(j)) for j in neighbours if j != me}
    row[me] = 1.0 - sum(row.values())
    return row


def in_neighbours(topology: Topology, me: str, members: Sequence[str], round: int = 0) -> list[str]:
    """The members that list ``me`` as a neighbour at ``round`` (O(n) topology calls)."""
    ordered, _ = order(me, members)
    return [m for m in ordered if m != me and me in topology(m, ordered, round)]


def adjacency(topology: Topology, members: Sequence[str], round: int = 0) -> np.ndarray:
    """0/1 matrix A[i, j] = 1 when the i-th sorted member sends to the j-th."""
    ordered = sorted(set(members))
    index = {m: k for k, m in enumerate(ordered)}
    a = np.zeros((len(ordered), len(ordered)), dtype=np.int8)
    for k, m in enumerate(ordered):
        for j in topology(m, ordered, round):
            a[k, index[j]] = 1
    return a


def mixing_matrix(topology: Topology, members: Sequence[str], round: int = 0) -> np.ndarray:
    """The Metropolis-Hastings matrix (float64) of the graph at ``round``, rows in sorted order.
    For a directed graph with in = out degrees it uses out-degrees and column j of sender i."""
    a = adjacency(topology, members, round)
    deg = a.sum(axis=1)
    n = len(a)
    w = np.zeros((n, n))
    for i in range(n):
        for j in np.flatnonzero(a[:, i]):  # i receives from j
            w[i, j] = metropolis_hastings_weight(int(deg[i]), int(deg[j]))
        w[i, i] = 1.0 - w[i].sum()
    return w


def is_connected(topology: Topology, members: Sequence[str], rounds: Sequence[int] = (0,)) -> bool:
    """Whether the union of the graphs over ``rounds`` is (weakly) connected."""
    a = sum(adjacency(topology, members, r).astype(np.int64) for r in rounds)
    a = (a + a.T) > 0
    n = len(a)
    if n <= 1:
        return True
    seen, todo = {0}, [0]
    while todo:
        for j in np.flatnonzero(a[todo.pop()]):
            if int(j) not in seen:
                seen.add(int(j))
                todo.append(int(j))
    return len(seen) == n
