"""CHOCO-gossip: decentralized averaging that converges under any contractive compression.

After Koloskova, Stich & Jaggi, "Decentralized Stochastic Optimization and Gossip Algorithms
with Compressed Communication", ICML 2019, Algorithm 1 (CHOCO-Gossip); with local SGD steps
landing between rounds it is their Algorithm 2 (CHOCO-SGD).

Theory of operation. Peer i keeps a *public copy* x̂_i of its own parameters (what its
neighbours believe about it) and a copy x̂_j of each neighbour's public copy. Every
``interval_s`` (an asynchronous algorithm: training never waits) peer i

1. mixes: x_i += γ Σ_j w_ij (x̂_j − x̂_i) over the neighbours whose copy it holds
   (``port.add_delta``; γ = ``ChocoConfig.gamma``; w_ij = 1 / (1 + max(d_i, d_j)), Metropolis-
   Hastings, d = the topology degree, which travels with every message);
2. publishes: q_i = Q(x_i − x̂_i) with its ``Compressor``; x̂_i += D(q_i); sends q_i, the same
   record, to every neighbour (one compression per round, not per edge).

On receiving q_j: x̂_j += D(q_j). Step 1 of round t+1 is the paper's consensus step of round t,
deferred to the moment when round t's messages have arrived, so with lockstep rounds this is
exactly Algorithm 1.

Invariants. (a) Every holder of a copy of x̂_i holds the same value at the same ``seq``: copies
change only by applying q_i in seq order; a gap or a stream it does not know makes the receiver
drop its copy and ask for a full-precision reset (ChocoResync). (b) With W symmetric and all
copies current, Σ_i of the mixing deltas is zero, so the swarm mean is preserved exactly; with
messages in flight during a mix (asynchrony) the error is γ w times the in-flight q's, which
shrink to zero at consensus. (c) x_i − x̂_i → 0 and x̂_j − x̂_i → 0 together: that is what lets
a lossy Q (sign, top-k) reach exact consensus where averaging Q(x) directly cannot.

Bootstrap and churn. Everyone starts with x̂_i = 0 (the paper's choice): a peer whose public
copy is still 0 (seq 0) starts any stream with an ordinary compressed delta, seq 1, and a
receiver without a copy starts one at zero for a seq-1 delta. A peer that has already published
(seq > 0) sends a *reset* (ChocoReset: x̂_i in float32, once) to a neighbour it has not synced:
a new neighbour, one that asked (ChocoResync), one that came back. Receivers ignore
averaging messages from peers outside their neighbour list and drop the copy of a neighbour
that left the list or has been silent for ``max(exchange_timeout_s, 4 interval_s)``; the
sender forgets a destination that left its list. Each stream carries a random 62-bit ``stream``
id drawn at construction, so a restarted peer is never mistaken for its former self.

Slow links (issue 16). Nothing acknowledges a record, and the transport drops what a link
cannot carry (two large messages queued per peer), so a round published faster than the link
carries it is lost, and each loss costs a full-precision reset: 4x an int8 delta, ~30x a sign
one. At 20 Mbit/s on a 2.2 M-parameter model, rounds every 50 ms against 1.8 s of link time
per round made the resets feed on themselves: the peers applied 3-8 of ~1000 records each
while their links ran full. So repairs make traffic rarer, never denser:
- a record the transport drops unsent (its queue to that neighbour is full; the driver calls
  ``send_dropped``) is the sender's congestion signal: the publishing interval doubles on it
  (once per two intervals: later drops were queued before it; up to ``max_interval_s``) and
  halves back per ``RECOVERY_S`` of rounds published without one, down to ``interval_s``, so it
  settles near the link's pace and most records land (a test: tests/test_choco_slow_link.py;
  in the lab the peers then applied about as many records as they published, with ChocoResync
  as the signal; random loss on a fast link asks for resets too, and slowed the simulator's
  lossy runs, so the signal is now the sender's own drops);
- a receiver that asked for a reset asks again only after twice the wait before the last ask
  (first ``forget_after``), until a reset arrives: a reset still crossing a slow link is never
  doubled by a second one;
- a neighbour's copy is forgotten for silence only after ``max(forget_after, 4 x`` the usual
  gap between its records``)``: a sender that slowed down to its link is not mistaken for a
  gone one (which would cost a reset per record).

Robust mixing (``robust_mixing``, on by default; p2p/averaging/robust.py, after ClippedGossip):
the consensus step clips each term x̂_j − x̂_i to the adaptive radius (or drops it when far
beyond), by scaling that neighbour's weight: the public copies themselves stay exact, so the
compressed streams stay in step.

Costs. Memory: (2 + degree) float32 vectors (x̂_i, the copies, a mixing buffer). Traffic per
round: one compressed record per neighbour, plus one float32 model per (re)synced edge.
Settings read: ``AveragingConfig.interval_s``,
``exchange_timeout_s``, ``ChocoConfig.gamma`` (None: ``suggested_gamma``), and through
``compressor_from_config`` ``compression`` / ``compression_block`` /
``compression_topk_fraction`` when no compressor is passed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from p2p.averaging.base import (AsynchronousHooks, AveragingConfig, Disagreement, ModelPort, check_params,
                               state_array, state_int)
from p2p.averaging.robust import RobustMixing
from p2p.compression.codecs import Compressor, compressor_from_config, decompress
from p2p.compression.messages import CompressedFields, compressed_fields
from p2p.topology.weights import metropolis_hastings_weight
from p2p.protocol import RemoteProtocolError, Send
from p2p.wire import message

RECOVERY_S = 60.0  # the publishing interval halves back towards interval_s per this long without a loss signal
PACE_ALPHA = 0.3  # weight of the newest gap in a neighbour's usual gap between records


@dataclass(frozen=True)
class ChocoConfig:
    """CHOCO-gossip's own setting."""

    gamma: Optional[float] = None  # consensus step size in (0, 1] (None: ``suggested_gamma`` for the codec)

    def __post_init__(self) -> None:
        if self.gamma is not None and not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")


def suggested_gamma(compressor: Compressor) -> float:
    """A consensus step size that converged in our tests (tests/test_choco.py): 1 for the
    near-lossless codecs and for scaled sign; for top-k about twice the kept fraction (larger
    steps diverge: x moves faster than x̂ can follow at k coordinates a round; the paper's
    theory asks for γ = O(δ) too, with δ = k/n for top-k)."""
    if compressor.name == "topk":
        return min(1.0, 2.0 * float(getattr(compressor, "fraction", 0.5)))
    return 1.0


@message(61)
@dataclass(frozen=True)
class ChocoDelta(CompressedFields):
    """q_i: the sender's compressed public-copy increment number ``seq`` of stream ``stream``."""

    stream: int
    seq: int
    degree: int  # sender's topology degree (Metropolis-Hastings weights)
    model_key: str


@message(62)
@dataclass(frozen=True)
class ChocoReset:
    """The sender's whole public copy x̂_i after increment ``seq``, float32."""

    stream: int
    seq: int
    degree: int
    model_key: str
    params: np.ndarray


@message(63)
@dataclass(frozen=True)
class ChocoResync:
    """Please send me a ChocoReset: my copy of yours is missing or has a gap."""

    have_seq: int  # the seq of the copy the receiver holds (-1: none), for diagnostics


@dataclass
class _Copy:
    stream: int
    seq: int
    hat: np.ndarray  # x̂_j, writable float32
    degree: int
    heard: float  # last time a message advanced it


def _check_counters(seq: int, degree: int) -> None:
    if seq < 1 or degree < 1:
        raise RemoteProtocolError("malformed", f"seq {seq} and degree {degree} must be >= 1")


class ChocoGossip(AsynchronousHooks):
    """CHOCO-gossip over a ModelPort (module docstring)."""

    # Public copies x-hat_j only make sense for neighbours that stay neighbours: a graph that
    # changes every round (hypercube, one-peer-exponential) would reset them constantly.
    needs_static_topology = True
    # any codec is CHOCO's point (sparseloco, made for DiLoCo's error feedback, is not tried here)
    CODECS = ("none", "fp16", "bf16", "int8", "int4", "topk", "sign")

    name = "choco"
    natural_topology = "ring"  # the paper's; any symmetric graph (ring, torus, exponential, full) works
    MESSAGES = (ChocoDelta, ChocoReset, ChocoResync)
    Config = ChocoConfig

    def __init__(self, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float,
                 options: ChocoConfig | None = None, compressor: Optional[Compressor] = None) -> None:
        self.config = config
        self.options = options or ChocoConfig()
        self.port = port
        self.rng = rng
        self.compressor = compressor if compressor is not None else compressor_from_config(config)
        gamma = self.options.gamma
        self.gamma = suggested_gamma(self.compressor) if gamma is None else float(gamma)
        self.base_interval = float(config.interval_s)
        self.max_interval = max(float(config.max_interval_s), self.base_interval)
        self.interval = self.base_interval  # stretched by loss signals (module docstring, "Slow links")
        self._lost = False  # a loss signal came since the last round published
        self._calm_until = -float("inf")  # loss signals before this report losses already acted on
        self.forget_after = max(float(config.exchange_timeout_s), 4 * self.base_interval)
        self.stream = rng.getrandbits(62)
        self.seq = 0
        self.hat = np.zeros(port.numel, dtype=np.float32)  # x̂_i
        self.disagreement = Disagreement()
        self._copies: dict[str, _Copy] = {}
        self._synced: set[str] = set()  # destinations whose copy of x̂_i is current
        # per neighbour, kept across its copies (a reset replaces a copy, the sender's pace stays):
        self._arrived: dict[str, float] = {}  # when its last record arrived
        self._pace: dict[str, float] = {}  # the usual gap between its records (EWMA)
        self._asked: dict[str, tuple[float, float]] = {}  # src -> (when we last asked it for a reset, wait before asking again)
        self._next = now + rng.uniform(0, self.interval)  # de-synchronise peers
        # exchanges_started: records sent (deltas + resets); exchanges_completed: records applied
        self.stats = {"exchanges_started": 0, "exchanges_completed": 0, "rounds": 0, "deltas_sent": 0,
                      "resets_sent": 0, "bytes_sent": 0,
                      "deltas_applied": 0, "resets_applied": 0, "resyncs_sent": 0,
                      "resyncs_served": 0, "gaps": 0, "stale": 0, "not_neighbour": 0}
        self.robust = RobustMixing(config.robust_mixing, self.stats)

    # -- queries (status, tests) ---------------------------------------------------------------
    def public_copy(self, addr: Optional[str] = None) -> Optional[np.ndarray]:
        """A copy of x̂_addr as we hold it (None: our own x̂_i), or None if we hold none."""
        if addr is None:
            return self.hat.copy()
        copy = self._copies.get(addr)
        return None if copy is None else copy.hat.copy()

    def copies(self) -> dict[str, tuple[int, int]]:
        """The neighbours whose public copy we hold: {addr: (stream, seq)}."""
        return {a: (c.stream, c.seq) for a, c in self._copies.items()}

    def synced(self) -> frozenset[str]:
        """The destinations we believe hold our public copy at our current seq."""
        return frozenset(self._synced)

    # -- driver interface ---------------------------------------------------------------------
    def busy(self) -> bool:
        return False  # nothing waits for a reply

    def state_dict(self) -> dict:
        return {"hat": self.hat.copy(), "seq": self.seq}

    def load_state_dict(self, state: dict, source: str) -> None:
        """From a checkpoint: our public copy x̂_i and its seq. Our stream id stays the fresh
        one drawn at construction, so a neighbour holding an older copy of ours (we may have
        published after the checkpoint) resets it (ChocoReset) instead of applying deltas to the
        wrong base. Copies of the neighbours' are not kept: after a restart they are stale, and
        the neighbours' resets rebuild them. A donor's state is not ours: a joiner starts afresh."""
        if source != "checkpoint":
            return
        self.hat, self.seq = state_array(state, "hat", self.port.numel), state_int(state, "seq")
        self._synced = set()

    def next_deadline(self) -> float:
        return self._next

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        if now < self._next:
            return []
        self._next = now + self.interval
        live = set(neighbours)
        for addr in [a for a, c in self._copies.items()
                     if a not in live or now - c.heard > max(self.forget_after, 4 * self._pace.get(a, 0.0))]:
            del self._copies[addr]
        self._synced &= live
        self._asked = {a: t for a, t in self._asked.items() if a in live}
        self._arrived = {a: t for a, t in self._arrived.items() if a in live}
        self._pace = {a: t for a, t in self._pace.items() if a in live}
        if self._lost:
            self._lost = False
        elif self.interval > self.base_interval:
            # by time, not by round: losses are reported at most every few seconds (a receiver's
            # asks back off), so a per-round decay would undo each doubling at once
            self.interval = max(self.base_interval, self.interval * 0.5 ** (self.interval / RECOVERY_S))
        if not neighbours:
            return []
        self._mix(len(neighbours), now)
        return self._publish(neighbours)

    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]:
        if isinstance(msg, ChocoDelta):
            return self._on_delta(src, msg, now, neighbours)
        if isinstance(msg, ChocoReset):
            check_params(msg.params, msg.model_key, self.port)
            _check_counters(msg.seq, msg.degree)
            if src not in neighbours:
                self.stats["not_neighbour"] += 1
                return []
            copy = self._copies.get(src)
            if copy is not None and copy.stream == msg.stream and msg.seq <= copy.seq:
                self.stats["stale"] += 1
                return []
            self._copies[src] = _Copy(msg.stream, msg.seq, np.array(msg.params, dtype=np.float32),
                                      msg.degree, now)
            self._asked.pop(src, None)
            self._note_arrival(src, now)
            self.stats["resets_applied"] += 1
            self.stats["exchanges_completed"] += 1
            return []
        if isinstance(msg, ChocoResync):
            self._synced.discard(src)  # the next round sends src a reset
            self.stats["resyncs_served"] += 1
            return []
        raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not a CHOCO message")

    def send_dropped(self, to: str, msg: object, now: float) -> None:
        """The transport dropped one of our records unsent: its queue to ``to`` is full, the link
        cannot carry our pace. Publish less often (module docstring, "Slow links"), once per
        episode: the drops that follow a doubling within two new intervals were queued before
        it. (A ChocoResync is no such signal: random loss on a fast link asks for resets too.)"""
        if isinstance(msg, (ChocoDelta, ChocoReset)) and now >= self._calm_until:
            self.interval = min(self.max_interval, 2 * self.interval)
            self._calm_until = now + 2 * self.interval
            self._lost = True
            self.stats["slowdowns"] = self.stats.get("slowdowns", 0) + 1

    # -- the two halves of a round ------------------------------------------------------------
    def _mix(self, degree: int, now: float) -> None:
        """x_i += γ Σ_j w_ij (x̂_j − x̂_i) over the copies held."""
        if not self._copies:
            return
        acc = np.zeros_like(self.hat)
        total = 0.0
        clips = self._screen(now)
        for addr, copy in self._copies.items():
            w = metropolis_hastings_weight(degree, copy.degree) * clips.get(addr, 1.0)
            acc += np.float32(w) * copy.hat
            total += w
        if total == 0.0:
            return
        acc -= np.float32(total) * self.hat
        # the copies' weighted mean vs ours, without a temporary: ||acc|| / total
        self.disagreement.observe_norms(float(np.linalg.norm(acc)) / total, float(np.linalg.norm(self.hat)))
        acc *= np.float32(self.gamma)
        self.port.add_delta(acc)

    def _screen(self, now: float) -> dict[str, float]:
        """Robust mixing over the public copies: {neighbour: factor < 1 on its weight}, so its
        term w (x̂_j − x̂_i) is clipped to the radius (0: refused). Scaling the weight is the
        same as clipping the difference, and needs no temporary per copy beyond the norm's."""
        if not self.robust.enabled or not self._copies:
            return {}
        own = float(np.linalg.norm(self.hat))
        entries = [(addr, float(np.linalg.norm(copy.hat - self.hat))) for addr, copy in self._copies.items()]
        factors = self.robust.screen_round("params", entries, own, now)
        return {addr: f for (addr, _), f in zip(entries, factors) if f < 1.0}

    def _publish(self, neighbours: Sequence[str]) -> list[Send]:
        """q_i = Q(x_i − x̂_i); x̂_i += D(q_i); q_i to synced neighbours, x̂_i to the others."""
        diff = self.port.snapshot()  # queued deltas (our mix) included
        diff -= self.hat
        q = self.compressor.compress(diff)
        self.hat += decompress(q, self.port.numel)
        first = self.seq == 0  # every receiver's copy of a seq-0 public copy is zero
        self.seq += 1
        self.stats["rounds"] += 1
        sends: list[Send] = []
        fields = compressed_fields(q)
        delta: Optional[ChocoDelta] = None
        reset: Optional[ChocoReset] = None
        degree = len(neighbours)
        for addr in neighbours:
            if addr in self._synced or first:
                if delta is None:
                    delta = ChocoDelta(**fields, stream=self.stream, seq=self.seq, degree=degree,
                                       model_key=self.port.model_key)
                sends.append(Send(addr, delta))
                self.stats["deltas_sent"] += 1
                self.stats["bytes_sent"] += q.nbytes
            else:
                if reset is None:  # a copy: self.hat changes in place while frames may queue
                    reset = ChocoReset(self.stream, self.seq, degree, self.port.model_key, self.hat.copy())
                sends.append(Send(addr, reset))
                self.stats["resets_sent"] += 1
                self.stats["bytes_sent"] += self.hat.nbytes
            self._synced.add(addr)
        self.stats["exchanges_started"] += len(sends)
        return sends

    def _on_delta(self, src: str, msg: ChocoDelta, now: float, neighbours: Sequence[str]) -> list[Send]:
        if msg.model_key != self.port.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.port.model_key!r}")
        if msg.numel != self.port.numel:
            raise RemoteProtocolError("bad_tensor", f"{msg.codec} payload of {msg.numel} elements, want {self.port.numel}")
        _check_counters(msg.seq, msg.degree)
        if src not in neighbours:
            self.stats["not_neighbour"] += 1
            return []
        copy = self._copies.get(src)
        if copy is not None and copy.stream == msg.stream:
            if msg.seq <= copy.seq:
                self.stats["stale"] += 1  # duplicate or reordered behind a reset
                return []
            if msg.seq != copy.seq + 1:
                return self._gap(src, now, copy.seq)
        elif msg.seq == 1:  # the sender's public copy was 0 before this delta
            copy = self._copies[src] = _Copy(msg.stream, 0, np.zeros_like(self.hat), msg.degree, now)
        else:
            return self._gap(src, now, -1)
        copy.hat += decompress(msg.payload(), self.port.numel)
        copy.seq, copy.degree, copy.heard = msg.seq, msg.degree, now
        self._note_arrival(src, now)
        self.stats["deltas_applied"] += 1
        self.stats["exchanges_completed"] += 1
        return []

    def _note_arrival(self, src: str, now: float) -> None:
        """Learn src's usual gap between records (how long its silence means nothing)."""
        last = self._arrived.get(src)
        if last is not None:
            gap, pace = now - last, self._pace.get(src)
            self._pace[src] = gap if pace is None else (1 - PACE_ALPHA) * pace + PACE_ALPHA * gap
        self._arrived[src] = now

    def _gap(self, src: str, now: float, have: int) -> list[Send]:
        """Our copy of src's public copy is missing or behind: drop it, ask for a reset. The
        reset may be lost, or still crossing a slow link: ask again only after twice the wait
        before the last ask (first ``forget_after``), until one arrives."""
        self._copies.pop(src, None)
        self.stats["gaps"] += 1
        asked = self._asked.get(src)
        if asked is not None and now - asked[0] < asked[1]:
            return []
        wait = self.forget_after if asked is None else min(self.max_interval, 2 * asked[1])
        self._asked[src] = (now, wait)
        self.stats["resyncs_sent"] += 1
        return [Send(src, ChocoResync(have))]
