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

Failure: the exchange is not atomic under message loss. If the reply is lost, j has moved and
i has not; the mean drifts by (s_i - s_j) / 2n for that one exchange, which later exchanges mix
away. Training never waits on any of this. A reply that comes after the timeout is still mixed
if it answers the last exchange that timed out (the snapshot is kept for it): on a slow link
that is the usual case, and dropping it would leave every such exchange one-sided.

Timeouts follow the link: ``exchange_timeout_s`` is the least; once exchanges with a partner
have been measured, an exchange waits up to ``TIMEOUT_FACTOR`` times their expected duration
(capped at ``max_interval_s``; p2p/bandwidth.py ``link_timeout``). A timeout counts as an exchange that took at least that long,
so the pause stretches after it: without that, a link too slow for the fixed timeout (8.7 MB
each way at 100 Mbit/s under contention) never completes an exchange, never gets measured, and
starts a new model-sized transfer after every timeout.

Staleness (``staleness_aware``, off by default): each end scales its half by
``staleness_weight(own step, partner step)``, so a partner whose model is older moves us less.
The exchange is then no longer zero-sum (the fresher end keeps more of itself).

Compression (``compression`` = fp16, bf16 or int8; p2p/compression): requests and replies
carry Q(s) instead of s, and each end mixes against its *own decoded* value D(Q(s)), not its
exact snapshot: i adds (D(Q(s_j)) - D(Q(s_i))) / 2 and j the opposite, so every exchange is
still zero-sum and the mean is preserved exactly; each end keeps its own quantisation error
locally. Sparsifying codecs (topk, sign) are refused here: without CHOCO's public copies
they do not reach consensus (see p2p/averaging/choco.py). A peer accepts either message
form whatever its own setting, so peers with different codecs mix.

Bandwidth awareness (``bandwidth_aware``, on by default; p2p/bandwidth.py): each completed
exchange tells the peer how long moving those bytes to and from that partner took, and (with a
port that has ``cpu_seconds``) what the cycle cost the network thread's CPU next to training's.
The pause before the next exchange is stretched so exchanges take at most ``comm_fraction`` of
wall time and their CPU at most that share of the compute's, partners are chosen in proportion
to measured throughput, and with ``compression="auto"`` the codec climbs none -> fp16 -> int8
when even ``max_interval_s`` cannot meet the budget.

Robust mixing (``robust_mixing``, on by default; p2p/averaging/robust.py, after ClippedGossip):
each end clips the partner's difference s_j - s_i to the adaptive radius tau before it applies
its fraction, or refuses it (a request goes unanswered, a reply is not mixed) when it is far
beyond. A clipped exchange is no longer zero-sum; that is the price of bounding what one peer
can do to another.

Subclasses (elastic gossip) change the mixing fraction and the message types through
``_request``, ``_reply`` and ``_fraction``; the state machine stays this one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from p2p.averaging.base import (AsynchronousHooks, AveragingConfig, Disagreement, ModelPort, NoOptions,
                               check_params, decoded_params, staleness_weight)
from p2p.averaging.robust import REFUSED, RobustMixing
from p2p.bandwidth import BandwidthConfig, BandwidthMonitor, link_timeout
from p2p.compression import Compressor, decompress, make_compressor
from p2p.compression.messages import CompressedFields, compressed_fields
from p2p.protocol import LocalProtocolError, RemoteProtocolError, Send
from p2p.wire import message

# Codecs whose decoded values can be averaged directly (dense, unbiased up to rounding).
PARAMETER_CODECS = ("none", "fp16", "bf16", "int8")
AUTO_LADDER = ("none", "fp16", "int8")


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


@message(64)
@dataclass(frozen=True)
class AvgRequestQ(CompressedFields):
    """AvgRequest carrying Q(params) (compression range of tags)."""

    exchange: int
    step: int
    model_key: str


@message(65)
@dataclass(frozen=True)
class AvgReplyQ(CompressedFields):
    exchange: int
    step: int
    model_key: str


def _received_params(msg: object, port: ModelPort) -> np.ndarray:
    """The partner's parameters from either message form, checked against our model."""
    if isinstance(msg, CompressedFields):
        return decoded_params(msg, port)
    check_params(msg.params, msg.model_key, port)
    return msg.params


def _payload_bytes(msg: object) -> int:
    if isinstance(msg, CompressedFields):
        return msg.data.nbytes + msg.aux.nbytes
    return msg.params.nbytes


@dataclass
class _InFlight:
    exchange: int
    partner: str
    snapshot: np.ndarray  # what we sent, as the partner will decode it
    deadline: float
    started: float
    sent_bytes: int


class PairwiseGossip(AsynchronousHooks):
    """AD-PSGD pairwise averaging (module docstring)."""

    name = "adpsgd"
    natural_topology = "full"
    MESSAGES: tuple[type, ...] = (AvgRequest, AvgReply)

    COMPRESSED_MESSAGES: tuple[type, ...] = (AvgRequestQ, AvgReplyQ)
    CODECS: tuple[str, ...] = PARAMETER_CODECS + ("auto",)  # what --compression may say
    Config: type = NoOptions  # subclasses with settings of their own name their class here

    def __init__(self, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float,
                 options: object = None) -> None:
        self.config = config
        self.options = options if options is not None else self.Config()
        self.port = port
        self.rng = rng
        self._auto = config.compression == "auto"
        codec = "none" if self._auto else config.compression
        if codec not in PARAMETER_CODECS or (codec != "none" and not self.COMPRESSED_MESSAGES):
            allowed = PARAMETER_CODECS if self.COMPRESSED_MESSAGES else ("none",)
            raise LocalProtocolError(f"{self.name} cannot average with compression {codec!r} "
                                     f"(use one of {', '.join(allowed)}, 'auto', or algorithm choco)")
        self._compressors: dict[str, Compressor] = {}
        self._codec = codec
        self.monitor = BandwidthMonitor(BandwidthConfig(
            comm_fraction=config.comm_fraction, min_interval_s=config.interval_s,
            max_interval_s=config.max_interval_s, prefer_fast_partners=config.bandwidth_aware,
            compression_ladder=AUTO_LADDER))
        self._next_exchange = 0
        self._in_flight: Optional[_InFlight] = None
        self._late: Optional[_InFlight] = None  # the last exchange that timed out: its reply may still come
        self._scratch: Optional[np.ndarray] = None  # the difference of the exchange being mixed
        self._next_start = now + rng.uniform(0, config.interval_s)  # de-synchronise peers
        self.stats = {"exchanges_started": 0, "exchanges_completed": 0, "exchanges_timed_out": 0,
                      "requests_served": 0, "late_replies": 0, "late_completed": 0}
        self.disagreement = Disagreement()
        self.robust = RobustMixing(config.robust_mixing, self.stats)
        self.MESSAGES = tuple(self.MESSAGES) + tuple(self.COMPRESSED_MESSAGES)

    def busy(self) -> bool:
        return self._in_flight is not None

    def state_dict(self) -> dict:
        return {}  # pairwise averaging keeps nothing beyond the model

    def load_state_dict(self, state: dict, source: str) -> None:
        if state:
            raise ValueError(f"{self.name} keeps no state, got {sorted(state)}")

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

    # -- compression and bandwidth ------------------------------------------------------------
    @property
    def codec(self) -> str:
        return self._codec

    def _encode(self, snapshot: np.ndarray) -> tuple[np.ndarray, Optional[dict]]:
        """(our value as the partner will see it, compressed fields or None for float32)."""
        if self._codec == "none":
            return snapshot, None
        compressor = self._compressors.get(self._codec)
        if compressor is None:
            compressor = self._compressors[self._codec] = make_compressor(self._codec)
        packed = compressor.compress(snapshot)
        return decompress(packed, snapshot.size), compressed_fields(packed)

    def _pause(self, neighbours: Sequence[str], now: float) -> float:
        """The pause after an exchange cycle ends (completed, refused or timed out)."""
        if not self.config.bandwidth_aware:
            return self.config.interval_s
        cpu_seconds = getattr(self.port, "cpu_seconds", None)  # ports without one: the link rule only
        if cpu_seconds is not None:
            self.monitor.observe_cpu(now, *(cpu_seconds() or (None, None)))
        if self._auto:
            self._codec = self.monitor.compression(neighbours, self.config.interval_s)
        return self.monitor.interval(self.config.interval_s, neighbours)

    def bandwidth_report(self) -> dict:
        """For status output: per-partner estimates, the current pause and codec."""
        return {"links": self.monitor.report(), "codec": self._codec,
                "interval_s": round(self.monitor.interval(self.config.interval_s, list(self.monitor.links)), 4)
                if self.config.bandwidth_aware else self.config.interval_s}

    def _screen(self, src: str, difference: np.ndarray, mine: np.ndarray, now: float) -> float:
        """The robust-mixing factor on the partner's difference (one norm each, shared with the
        consensus estimate)."""
        distance, own = float(np.sqrt(np.dot(difference, difference))), float(np.sqrt(np.dot(mine, mine)))
        self.disagreement.observe_norms(distance, own)
        return self.robust.screen(src, "params", distance, own, now)

    def _mix(self, src: str, theirs: np.ndarray, mine: np.ndarray, fraction: float, now: float) -> bool:
        """Queue ``fraction * clip * (theirs - mine)``; False if robust mixing refuses it. This runs
        for every exchange on both ends: the difference goes into one buffer kept for it (a fresh
        model-sized array costs its page faults each time) and is scaled in place; ``add_delta``
        copies it into the queue."""
        if self._scratch is None or self._scratch.shape != mine.shape:
            self._scratch = np.empty_like(mine)
        difference = np.subtract(theirs, mine, out=self._scratch)
        clip = self._screen(src, difference, mine, now)
        if clip == REFUSED:
            return False
        difference *= np.float32(fraction * clip)
        self.port.add_delta(difference)
        return True

    def _timeout(self, partner: str) -> float:
        """How long an exchange with ``partner`` may take (module docstring: timeouts follow the link)."""
        return link_timeout(self.monitor.expected_exchange_s([partner]), self.config.exchange_timeout_s,
                            self.config.max_interval_s)

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        flight = self._in_flight
        if flight is not None:
            if now >= flight.deadline:
                self.stats["exchanges_timed_out"] += 1
                self._in_flight, self._late = None, flight
                # it took at least this long: the pause and the next timeout stretch to match
                self.monitor.observe(flight.partner, 2 * flight.sent_bytes, now - flight.started)
                self._next_start = now + self._pause(neighbours, now)
            return []
        if now < self._next_start or not neighbours:
            if not neighbours:
                self._next_start = now + self.config.interval_s
            return []
        partner = self.monitor.choose(neighbours, self.rng)
        mine, packed = self._encode(self.port.snapshot())
        self._next_exchange += 1
        request = (self._request(self._next_exchange, mine) if packed is None else
                   AvgRequestQ(**packed, exchange=self._next_exchange, step=self.port.step,
                               model_key=self.port.model_key))
        self._in_flight = _InFlight(self._next_exchange, partner, mine, now + self._timeout(partner),
                                    now, _payload_bytes(request))
        self.stats["exchanges_started"] += 1
        return [Send(partner, request)]

    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]:
        request_type, reply_type = self.MESSAGES[:2]
        if isinstance(msg, (request_type, AvgRequestQ)):
            fraction = self._fraction(msg)  # validates it first
            theirs = _received_params(msg, self.port)
            mine, packed = self._encode(self.port.snapshot())
            if not self._mix(src, theirs, mine, self._scaled(fraction, msg.step), now):
                return []  # not mixed, not answered: the requester times out
            self.stats["requests_served"] += 1
            reply = (self._reply(msg, mine) if packed is None else
                     AvgReplyQ(**packed, exchange=msg.exchange, step=self.port.step, model_key=self.port.model_key))
            return [Send(src, reply)]
        if isinstance(msg, (reply_type, AvgReplyQ)):
            flight, late = self._in_flight, False
            if flight is None or msg.exchange != flight.exchange or src != flight.partner:
                flight, late = self._late, True
                if flight is None or msg.exchange != flight.exchange or src != flight.partner:
                    self.stats["late_replies"] += 1  # an older exchange's, or not ours: drop
                    return []
            theirs = _received_params(msg, self.port)
            fraction = self._scaled(self._own_fraction(), msg.step)
            if late:
                self._late = None  # the partner mixed when it replied: mixing now keeps the pair zero-sum
            else:
                self._in_flight = None
            mixed = self._mix(src, theirs, flight.snapshot, fraction, now)
            self.monitor.observe(src, flight.sent_bytes + _payload_bytes(msg), now - flight.started)
            self.monitor.forget(neighbours)
            if mixed:
                self.stats["late_completed" if late else "exchanges_completed"] += 1
            if not late:  # (after a late one, the pause set at the timeout stands)
                self._next_start = now + self._pause(neighbours, now)
            return []
        raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not an averaging message")
