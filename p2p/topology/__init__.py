"""Topologies: which live members a peer talks to. Pure functions of the membership view.

``TOPOLOGIES`` maps a name to ``f(me, members, round=0) -> list[str]`` (see ``graphs``);
``get_topology(name, **options)`` binds options (``random``: ``degree``, ``seed``). The 2-argument
call ``f(me, alive)`` still works for every entry (round defaults to 0), so ``Peer`` can keep
calling ``topology(me, alive)`` for static graphs; time-varying ones want
``topology(me, alive, averager.topology_round())``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

from p2p.topology.graphs import (exponential, full, hypercube, one_peer_exponential, random_regular,
                                 ring, torus)
from p2p.topology.weights import (in_neighbours, is_connected, metropolis_hastings_weight,
                                  metropolis_hastings_weights, mixing_matrix)

TOPOLOGIES: dict[str, Callable[..., list[str]]] = {
    "ring": ring,
    "torus": torus,
    "exponential": exponential,
    "one-peer-exponential": one_peer_exponential,
    "hypercube": hypercube,
    "random": random_regular,
    "full": full,
}

# Graphs where j in N(i) iff i in N(j) at every round (the rest are directed permutations).
SYMMETRIC = frozenset({"ring", "torus", "exponential", "hypercube", "random", "full"})
# Graphs that change with the round argument.
TIME_VARYING = frozenset({"one-peer-exponential", "hypercube"})


def get_topology(name: str, **options) -> Callable[..., list[str]]:
    """The topology function registered as ``name``, with ``options`` bound (e.g. random's
    ``degree``/``seed``). Unknown names raise ValueError listing the known ones."""
    try:
        fn = TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology {name!r} (available: {', '.join(TOPOLOGIES)})") from None
    return partial(fn, **options) if options else fn


__all__ = ["TOPOLOGIES", "SYMMETRIC", "TIME_VARYING", "get_topology", "full", "ring", "torus",
           "exponential", "one_peer_exponential", "hypercube", "random_regular",
           "metropolis_hastings_weight", "metropolis_hastings_weights", "mixing_matrix",
           "in_neighbours", "is_connected"]
