"""The averaging algorithms by name, each with its natural topology.

``make_averager(name, config, port, rng, now)`` builds one; the CLI picks by name (as aioquic's
congestion-control registry). Adding an algorithm is one new module plus one line here. Every
class takes ``(config, port, rng, now)`` and carries ``name``, ``natural_topology``,
``MESSAGES`` and ``wants_gradient``.

Step hooks as implemented (k = the trainer's step; "-" = the AsynchronousHooks no-op, which the
trainer's proxy skips entirely):

    name        may_step(k+1)              on_gradient / gradient_ready(k)   after_step(k)
    dpsgd       False until round r done   -                                 params -> all neighbours
    adpsgd      -                          -                                 -   (tick: pairwise exchange)
    sgp         -                          -                                 half (z, w) -> one out-peer
    elastic     -                          -                                 -   (tick: pairwise exchange)
    gossipgrad  -                          grad (+params some rounds) ->     -
                                           partner / False until it replied
    diloco      False from every H-th      -                                 at k % H == 0: (theta_start,
                step until the outer step                                    Delta) -> all neighbours

"Done" always includes "or the round timeout passed": no hook waits unboundedly.

Importing this module registers every algorithm's wire messages (tags 20..39; CHOCO's
compressed messages use the compression range, 61..63).
"""

from __future__ import annotations

import random
from typing import Any, Callable

from p2p.averaging.adpsgd import PairwiseGossip
from p2p.averaging.base import Averager, AveragingConfig, ModelPort
from p2p.averaging.choco import ChocoGossip
from p2p.averaging.diloco import DiLoCo
from p2p.averaging.dpsgd import Dpsgd
from p2p.averaging.elastic import ElasticGossip
from p2p.averaging.gossipgrad import GossipGraD
from p2p.averaging.sgp import PushSum

ALGORITHMS: dict[str, Callable[..., Averager]] = {
    "dpsgd": Dpsgd,  # synchronous rounds, waits for neighbours; natural topology: exponential
    "adpsgd": PairwiseGossip,  # asynchronous pairwise averaging; full
    "sgp": PushSum,  # push-sum, overlapped, never waits; one-peer-exponential
    "elastic": ElasticGossip,  # asynchronous pairwise elastic pull; random
    "gossipgrad": GossipGraD,  # per-step gradient exchange with a rotating partner; hypercube
    "diloco": DiLoCo,  # H local steps, gossip-averaged outer Nesterov step; full
    "choco": ChocoGossip,  # CHOCO-gossip: compressed differences to public copies; ring
}

# Algorithms that make the trainer wait in ``may_step`` / ``gradient_ready``.
SYNCHRONOUS = frozenset({"dpsgd", "gossipgrad", "diloco"})


def natural_topology(name: str) -> str:
    """The topology name an algorithm is designed for (the CLI's default for --topology)."""
    return _lookup(name).natural_topology


def check_combination(name: str, topology: str, compression: str = "none") -> None:
    """Raise ValueError for an algorithm that cannot run on a topology or with a codec."""
    from p2p.topology import TIME_VARYING

    cls = _lookup(name)
    if getattr(cls, "needs_static_topology", False) and topology in TIME_VARYING:
        raise ValueError(f"{name} keeps copies of fixed neighbours; topology {topology!r} changes them "
                         f"every round (use a static one, e.g. {natural_topology(name)})")
    codecs = getattr(cls, "CODECS", ("none",))
    if compression not in codecs:
        raise ValueError(f"{name} does not support compression {compression!r} (it supports: {', '.join(codecs)})")


def config_class(name: str) -> type:
    """The class of an algorithm's own settings (``NoOptions`` when it has none)."""
    return _lookup(name).Config


def default_round_timeout_s(name: str, shared_default: float) -> float:
    """The round timeout an algorithm wants when none is given (DiLoCo's rounds move models)."""
    return getattr(_lookup(name), "default_round_timeout_s", shared_default)


def make_averager(name: str, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float,
                  options: Any = None, **kw: Any) -> Averager:
    """Build the averager registered as ``name`` with its own settings ``options`` (an
    instance of its ``Config``; None: the defaults). Unknown names and settings of another
    algorithm raise ValueError."""
    cls = _lookup(name)
    if options is not None and not isinstance(options, cls.Config):
        raise ValueError(f"{name} takes {cls.Config.__name__} settings, got {type(options).__name__}")
    return cls(config, port, rng, now, options=options, **kw)


def _lookup(name: str):
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown averaging algorithm {name!r} (available: {', '.join(ALGORITHMS)})") from None
