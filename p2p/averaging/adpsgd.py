"""Asynchronous pairwise gossip averaging, after AD-PSGD (Lian et al., ICML 2018, Alg. 1).

Theory of operation. Each peer is *active* on its own timer and *passive* whenever asked:

- active: every ``interval_s`` (when no exchange is in flight) pick a uniformly random live
  neighbour j, take a snapshot s_i of x_i and send it (AvgRequest). On j's reply carrying s_j,
  add (s_j - s_i) / 2 to x_i. No reply within ``exchange_timeout_s``: drop the exchange.
- passive: on a request carrying s_i, take a snapshot s_j, add (s_i - s_j) / 2 to x_j and reply
  with s_j at once. A passive peer never waits, so no cycle of peers can deadlock (the role
  the paper's bipartite active/passive split plays).

Invariant: both deltas of one exchange sum to zero, so the swarm mean is preserved exactly,
however exchanges interleave with each other and with local SGD steps (both ends apply a delta,
not an overwrite). Both ends move to the average of the two snapshots.

Failure: the exchange is not atomic under message loss. If the reply is lost or arrives after
the timeout, j has moved and i has not; the mean drifts by (s_i - s_j) / 2n for that one
exchange, which later exchanges mix away. Training never waits on any of this.

Staleness (``staleness_aware``, off by default): each end scales its half by
``staleness_weight(own step, partner step)``, so a partner whose model is older moves us less.
The exchange is then no longer zero-sum (the fresher end keeps more of itself).

Subclasses (elastic gossip) change the mixing fraction and the message types through
``_request``, ``_reply`` and ``_fraction``; the state machine stays this one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from p2p.averaging.base import AsynchronousHooks, AveragingConfig, ModelPort, check_params, staleness_weight
from p2p.protocol import RemoteProtocolError, Send
from p2p.wire import message


@message(20)
@dataclass(frozen=True)
class AvgRequest:
    exchange: int  # the active peer's exchange counter, echoed in the reply
    step: int  # sender's local step count (for staleness-aware weighting and status)
    model_key: str
    params: np.ndarray


@message(21)
@dataclass(frozen=True)
class AvgReply:
    exchange: int
    step: int
    model_key: str
    params: np.ndarray


@dataclass
class _InFlight:
    exchange: int
    partner: str
    snapshot: np.ndarray
    deadline: float


class PairwiseGossip(AsynchronousHooks):
    """AD-PSGD pairwise averaging (module docstring)."""

    name = "adpsgd"
    natural_topology = "full"
    MESSAGES: tuple[type, ...] = (AvgRequest, AvgReply)

    def __init__(self, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float) -> None:
        self.config = config
        self.port = port
        self.rng = rng
        self._next_exchange = 0
        self._in_flight: Optional[_InFlight] = None
        self._next_start = now + rng.uniform(0, config.interval_s)  # de-synchronise peers
        self.stats = {"exchanges_started": 0, "exchanges_completed": 0, "exchanges_timed_out": 0,
                      "requests_served": 0, "late_replies": 0}

    def busy(self) -> bool:
        return self._in_flight is not None

    def topology_round(self) -> int:
        return self._next_exchange  # a time-varying topology rotates partners per exchange

    # -- what subclasses change ---------------------------------------------------------------
    def _request(self, exchange: int, snapshot: np.ndarray) -> object:
        return AvgRequest(exchange, self.port.step, self.port.model_key, snapshot)

    def _reply(self, request: object, snapshot: np.ndarray) -> object:
        return AvgReply(request.exchange, self.port.step, self.port.model_key, snapshot)

    def _fraction(self, request: object) -> float:
        """How far each end moves towards the other (checked on the request for the passive end)."""
        return 0.5

    def _own_fraction(self) -> float:
        """The fraction the active end applies on the reply (must match what it requested)."""
        return 0.5

    def _scaled(self, fraction: float, their_step: int) -> float:
        if self.config.staleness_aware:
            fraction *= staleness_weight(self.port.step, their_step, self.config.staleness_tau)
        return fraction

    def next_deadline(self) -> float:
        return self._in_flight.deadline if self._in_flight else self._next_start

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        flight = self._in_flight
        if flight is not None:
            if now >= flight.deadline:
                self.stats["exchanges_timed_out"] += 1
                self._in_flight = None
                self._next_start = now + self.config.interval_s
            return []
        if now < self._next_start or not neighbours:
            if not neighbours:
                self._next_start = now + self.config.interval_s
            return []
        partner = neighbours[self.rng.randrange(len(neighbours))]
        snapshot = self.port.snapshot()
        self._next_exchange += 1
        self._in_flight = _InFlight(self._next_exchange, partner, snapshot, now + self.config.exchange_timeout_s)
        self.stats["exchanges_started"] += 1
        return [Send(partner, self._request(self._next_exchange, snapshot))]

    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]:
        request_type, reply_type = self.MESSAGES
        if isinstance(msg, request_type):
            fraction = self._fraction(msg)  # validates it first
            check_params(msg.params, msg.model_key, self.port)
            mine = self.port.snapshot()
            self.port.add_delta((msg.params - mine) * np.float32(self._scaled(fraction, msg.step)))
            self.stats["requests_served"] += 1
            return [Send(src, self._reply(msg, mine))]
        if isinstance(msg, reply_type):
            flight = self._in_flight
            if flight is None or msg.exchange != flight.exchange or src != flight.partner:
                self.stats["late_replies"] += 1  # timed out already, or not ours: drop
                return []
            check_params(msg.params, msg.model_key, self.port)
            fraction = self._scaled(self._own_fraction(), msg.step)
            self.port.add_delta((msg.params - flight.snapshot) * np.float32(fraction))
            self._in_flight = None
            self.stats["exchanges_completed"] += 1
            self._next_start = now + self.config.interval_s
            return []
        raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not an averaging message")
