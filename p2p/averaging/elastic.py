"""Elastic gossip: pairwise symmetric elastic averaging.

After EASGD (Zhang, Choromanska & LeCun, "Deep learning with Elastic Averaging SGD", NeurIPS
2015, eq. 5-6: the elastic force alpha (x_i - x_j) between a worker and its anchor) made
decentralised by Elastic Gossip (Pramod, arXiv:1812.02407, 2018, Alg. 1: the anchor is a random
peer). Update, applied on both ends of one exchange:

    x_i <- x_i - alpha (x_i - x_j)        x_j <- x_j - alpha (x_j - x_i)

Theory of operation: exactly AD-PSGD's state machine (``adpsgd.PairwiseGossip``: the active
peer sends its snapshot on its own timer, the passive one answers at once, each end adds a
delta against the snapshots exchanged), with the fraction 1/2 replaced by ``alpha``. The
request carries the requester's alpha and the passive end uses it, so both ends always use the
same alpha even if their configs differ: the pair of deltas stays zero-sum and the swarm mean
is preserved exactly (without loss, staleness weighting off). alpha = 0.5 is AD-PSGD; smaller
alpha keeps peers apart longer (the paper's exploration argument), so consensus is slower.

Failure: as AD-PSGD (a lost reply leaves one end moved; training never waits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from p2p.averaging.adpsgd import PairwiseGossip
from p2p.protocol import RemoteProtocolError
from p2p.wire import message


@message(23)
@dataclass(frozen=True)
class ElasticRequest:
    exchange: int  # the active peer's exchange counter, echoed in the reply
    step: int  # sender's local step count
    alpha: float  # the elastic fraction both ends apply (the requester's config)
    model_key: str
    params: np.ndarray


@message(24)
@dataclass(frozen=True)
class ElasticReply:
    exchange: int
    step: int
    model_key: str
    params: np.ndarray


@dataclass(frozen=True)
class ElasticConfig:
    """Elastic gossip's own setting."""

    alpha: float = 0.25  # both ends move this fraction of the way to each other (0.5 = plain averaging)

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError("alpha must be in (0, 1)")


class ElasticGossip(PairwiseGossip):
    """Symmetric elastic pairwise gossip (module docstring)."""

    name = "elastic"
    natural_topology = "random"
    MESSAGES = (ElasticRequest, ElasticReply)
    COMPRESSED_MESSAGES = ()  # elastic mixes exact parameters only
    CODECS = ("none",)
    Config = ElasticConfig

    def _request(self, exchange: int, snapshot: np.ndarray) -> object:
        return ElasticRequest(exchange, self.port.step, self.options.alpha, self.port.model_key, snapshot)

    def _reply(self, request: object, snapshot: np.ndarray) -> object:
        return ElasticReply(request.exchange, self.port.step, self.port.model_key, snapshot)

    def _fraction(self, request: object) -> float:
        alpha = request.alpha
        if not (math.isfinite(alpha) and 0 < alpha < 1):
            raise RemoteProtocolError("bad_value", f"elastic alpha {alpha!r} outside (0, 1)")
        return alpha

    def _own_fraction(self) -> float:
        return self.options.alpha
