"""Catching a DiLoCo copy up by replaying the rounds it missed, from one donor's log.

Why. A peer cut off for a few outer rounds comes back with its copy of theta_start apart. The
full pull (outer_repair.py) moves theta_start itself: 4 bytes per parameter, 8.7 MB on
nodes.wide, ~3.5 s of a whole 20 Mbit/s link, when one of SparseLoCo's rounds (2% top-k at 2
bits, Sarfi et al., arXiv:2508.15706) moves ~92 KB per neighbour: the pull outweighs the rounds
it repairs by ~25x and cannot end within a few rounds of ~1 s (issue 16). What the peer missed
is much smaller: the compressed pseudo-gradients each missed round averaged. On ``full`` every
peer that averaged the same set took the same outer step (diloco.py), so the missed outer
steps can be replayed from those shares, as a replica that missed log entries replays them
from a peer's log instead of copying its whole state (Ongaro & Ousterhout, "In Search of an
Understandable Consensus Algorithm", USENIX ATC 2014, Sec. 5.3 and 7 on log catch-up vs
snapshot install) and as Streaming DiLoCo's workers rejoin from the fragments' outer updates
(Douillard et al., arXiv:2501.18512).

- **Donor's log** (``ShareLog``): every peer keeps, for the rounds that ended in one of its outer
  steps over an exact average (``mixed``, diloco.py: not with staleness weights), the packed
  share of every sender that average took, its own included, and the set it took. The log
  follows the copy: a one-round replay repair (outer_copies.py) that replaced a round's
  average by the reference's replaces the set (the late shares it names are kept too), and a
  pull or catch-up that landed drops the rounds before it (they were not the swarm's). A donor
  serving a round it has since replayed would land its puller apart (a likely, unconfirmed,
  cause of a second repair seen once in the lab test). The newest rounds that fit in
  ``log_budget`` bytes (half of theta_start's: more, and the pull is cheaper) and at most
  ``LOG_ROUNDS``. A request for a logged round is answered with one ``CatchUpShare`` per
  sender; for a round not reached yet, when the donor's outer step of it comes (at most
  ``MAX_PENDING`` waiting); for one it does not hold, ``CatchUpMissing``.
- **Our base** (``CatchUpPuller.note_begin`` / ``note_agreed``): our (theta_start, momentum) at
  the start of the last round whose sketches put us in the reference group (outer_copies.py):
  the state the swarm shared then. One copy, plus the round in flight's.
- **When.** Chosen over the pull (diloco.py) when we hold that base, the rounds since it are at
  most ``LOG_ROUNDS``, their shares (rounds x senders x our own share's bytes) fit in the log
  budget, and no catch-up was tried from that base before: a catch-up that failed or landed
  a copy still apart (the next round's sketches tell) leaves the full pull to mend it. So it
  is tried at most once per episode of being apart and can never grow into a loop.
- **How.** Round by round from the base, one round's request in flight, paced to
  ``CATCH_UP_SHARE`` of the link (an answer is at most one round's shares: a round share of
  the donor's queued behind it waits a fraction of a second at 20 Mbit/s). Each round's shares
  are decoded and averaged as the round did (robust mixing's clipped mean, robust.py "One
  answer for one set", or the plain mean), and the outer step ``m <- mu m + D;
  theta <- theta - lr (D + mu m)`` is replayed. The result is the swarm's (theta_start, m) as of
  the round after the last one replayed: handed to diloco.py as a ``Pulled`` state, which
  lands it like a pull's (carried through the outer steps since, checked against the donor's
  ``mixed`` lists until it lands, verified by the next sketches).
- **Bounded.** A request's deadline is its expected bytes / the measured link rate x
  ``DEADLINE_SLACK``, plus a round's wait (the donor may answer when its round ends); past it,
  the same round is asked for again after a doubling backoff (the shares already in are kept);
  after ``MAX_ATTEMPTS``, on ``CatchUpMissing``, or when the donor leaves, the catch-up is
  dropped and the next round's sketches decide (a full pull).

Pure state, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from p2p.averaging.outer_repair import (ASSUMED_RATE_BPS, DEADLINE_SLACK, MAX_ATTEMPTS, MAX_BACKOFF_S,
                                        MIN_DEADLINE_S, Pulled)
from p2p.averaging.robust import RobustMixing, robust_mean
from p2p.bandwidth import BandwidthMonitor
from p2p.compression import decompress
from p2p.compression.codecs import Compressed
from p2p.compression.messages import CompressedFields, compressed_fields
from p2p.protocol import RemoteProtocolError, Send
from p2p.wire import message

LOG_ROUNDS = 8  # rounds a donor keeps and a catch-up may replay
CATCH_UP_SHARE = 0.75  # of the link's time a catch-up may take (module docstring, "How")
MAX_PENDING = 16  # requests a donor keeps for rounds it has not reached
MAX_SENDERS = 4096  # senders one round's average may name (as diloco.MAX_MIXED)


@message(31)
@dataclass(frozen=True)
class CatchUpRequest:
    round: int  # the outer round whose averaged shares we want
    model_key: str


@message(32)
@dataclass(frozen=True)
class CatchUpMissing:
    round: int  # the round asked for, which the donor does not hold
    model_key: str


@message(69)
@dataclass(frozen=True)
class CatchUpShare(CompressedFields):
    """One sender's packed pseudo-gradient that the donor's round ``round`` averaged."""

    round: int
    sender: str
    mixed: tuple  # every sender that round averaged (sorted); the puller waits for all of them
    model_key: str


def replay_round(vectors: Sequence[np.ndarray], robust: RobustMixing) -> np.ndarray:
    """The average a round took over these decoded Deltas (sorted by sender), as the round
    mixed it: robust mixing's ``robust_mean`` (the same bits whatever the order), or the plain mean."""
    if robust.enabled:
        return robust_mean(vectors, robust.config.factor)[0]
    return np.sum(vectors, axis=0, dtype=np.float32) / np.float32(len(vectors))


class ShareLog:
    """The donor side: the packed shares of the last rounds' averages (module docstring)."""

    def __init__(self, numel: int, model_key: str, stats: dict[str, int], budget_bytes: int) -> None:
        self.numel, self.model_key, self.stats, self.budget = numel, model_key, stats, budget_bytes
        self._shares: dict[int, dict[str, Compressed]] = {}  # round -> sender -> share (not sealed yet)
        self._sealed: dict[int, tuple[tuple, dict[str, Compressed]]] = {}  # round -> (mixed, shares: those
        # it averaged and any that came late)
        self._pending: list[tuple[str, CatchUpRequest]] = []

    def keep(self, round: int, src: Optional[str], packed: Optional[Compressed], current: int) -> None:
        """A share of round ``round`` (ours, or a neighbour's): kept until the round is sealed, and
        after it when it came late to a logged round (a replay may name it: ``reseal``)."""
        if src is None or packed is None or round > current + LOG_ROUNDS:
            return
        arrays = tuple(np.array(a, copy=True) for a in packed.arrays)  # off the receive buffer
        share = Compressed(packed.codec, packed.numel, arrays, packed.meta)
        if round in self._sealed:
            self._sealed[round][1].setdefault(src, share)
        elif round >= current:
            self._shares.setdefault(round, {})[src] = share

    def reseal(self, round: int, mixed: tuple) -> None:
        """Our copy took another average of round ``round`` (a replay repair, outer_copies.py):
        ``mixed`` is the set the swarm averaged; the round is dropped if a share of it is missing."""
        held = self._sealed.pop(round, None)
        if held is not None and mixed and all(s in held[1] for s in mixed):
            self._sealed[round] = (tuple(mixed), held[1])

    def forget_before(self, round: int) -> None:
        """A pulled or caught-up state landed: our rounds before ``round`` were not the swarm's."""
        self._sealed = {k: v for k, v in self._sealed.items() if k >= round}

    def sealed(self, round: int, mixed: tuple) -> list[Send]:
        """Our outer step of round ``round`` averaged ``mixed`` (() when not replayable): log it
        within the budget, and answer the requests that waited for it."""
        shares = self._shares.pop(round, {})
        self._shares = {k: v for k, v in self._shares.items() if k > round}
        if mixed and all(s in shares for s in mixed):
            self._sealed[round] = (mixed, shares)
        while self._sealed and (len(self._sealed) > LOG_ROUNDS or self._bytes() > self.budget):
            del self._sealed[min(self._sealed)]
        due = [(s, m) for s, m in self._pending if m.round <= round]
        self._pending = [(s, m) for s, m in self._pending if m.round > round]
        return [x for src, msg in due for x in self._answer(src, msg.round)]

    def _bytes(self) -> int:
        return sum(c.nbytes for _, shares in self._sealed.values() for c in shares.values())

    def receive(self, src: str, msg: CatchUpRequest, current: int) -> list[Send]:
        """A catch-up request (``current``: our round in flight or next)."""
        if msg.model_key != self.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.model_key!r}")
        if msg.round < 0:
            raise RemoteProtocolError("bad_value", f"catch-up round {msg.round}")
        if msg.round >= current and msg.round < current + LOG_ROUNDS:  # not reached yet: when we do
            self._pending = [(s, m) for s, m in self._pending if s != src][-(MAX_PENDING - 1):] + [(src, msg)]
            return []
        return self._answer(src, msg.round)

    def _answer(self, src: str, round: int) -> list[Send]:
        held = self._sealed.get(round)
        if held is None:
            return [Send(src, CatchUpMissing(round, self.model_key))]
        mixed, shares = held
        out = []
        for sender in mixed:
            c = shares[sender]
            self.stats["repair_bytes_served"] += c.nbytes
            out.append(Send(src, CatchUpShare(**compressed_fields(c), round=round, sender=sender, mixed=mixed,
                                              model_key=self.model_key)))
        return out


@dataclass
class _CatchUp:
    donor: str
    round: int  # the state we build is the swarm's at the start of this round (as _Pull.round)
    next: int  # the round being fetched (base round .. round - 1)
    start: np.ndarray  # the replay so far (from our base)
    momentum: np.ndarray
    own_start: np.ndarray  # ours at the start of ``round``
    own_momentum: np.ndarray
    expected_bytes: int  # one round's shares, as estimated (deadlines)
    wait_s: float  # a round's wait (the donor may answer when its round ends)
    got: dict[str, np.ndarray] = field(default_factory=dict)  # decoded shares of ``next`` so far
    got_bytes: int = 0  # their packed bytes (the link estimate)
    mixed: tuple = ()
    asked_at: float = math.inf
    deadline: float = math.inf
    retry_at: float = -math.inf
    failures: int = 0
    backoff_s: float = 0.0


class CatchUpPuller:
    """The repairing side (module docstring): our base, at most one catch-up in flight. Its
    surface is the pull's (``RepairPuller``): ``pull`` / ``done`` name a donor and a round."""

    def __init__(self, numel: int, model_key: str, monitor: BandwidthMonitor, stats: dict[str, int],
                 outer_lr: float, outer_momentum: float, robust: RobustMixing, budget_bytes: int) -> None:
        self.numel, self.model_key, self.monitor, self.stats = numel, model_key, monitor, stats
        self.lr, self.mu, self.robust, self.budget = outer_lr, outer_momentum, robust, budget_bytes
        self.pull: Optional[_CatchUp] = None
        self.done: Optional[Pulled] = None
        self._pending: Optional[tuple[int, np.ndarray, np.ndarray]] = None  # the round in flight's start
        self._base: Optional[tuple[int, np.ndarray, np.ndarray]] = None  # the last agreed round's
        self._tried: Optional[int] = None  # the base round a catch-up was begun from

    @property
    def active(self) -> bool:
        return self.pull is not None or self.done is not None

    # -- our base ----------------------------------------------------------------------------
    def note_begin(self, round: int, start: np.ndarray, momentum: np.ndarray) -> None:
        """Round ``round`` begins from (start, momentum): the base, should its sketches agree."""
        m = momentum.copy() if self.mu else momentum  # mu = 0: the replay never reads it
        self._pending = (round, start.copy(), m)

    def note_agreed(self, round: int) -> None:
        """Round ``round``'s sketches put us in the reference group: its start is our base."""
        if self._pending is not None and self._pending[0] == round:
            self._base, self._pending = self._pending, None
            self._tried = None

    # -- the catch-up -------------------------------------------------------------------------
    def begin(self, donor: str, current: int, own: tuple[np.ndarray, np.ndarray], now: float,
              share_bytes: int, senders: int, wait_s: float) -> bool:
        """Catch up from our base to the start of round ``current`` (our state then: ``own``)
        from ``donor``. False when it would not fit (module docstring, "When"): pull instead."""
        if self.active or self._base is None or self._tried == self._base[0]:
            return False
        base_round, start, momentum = self._base
        rounds = current - base_round
        per_round = max(1, senders) * share_bytes
        if not 1 <= rounds <= LOG_ROUNDS or rounds * per_round > self.budget:
            return False
        self._tried = base_round
        self.pull = _CatchUp(donor, current, base_round, start.copy(), momentum.copy(), own[0].copy(),
                             own[1].copy(), per_round, wait_s)
        self.stats["repairs_started"] += 1
        self.stats["catch_ups_started"] += 1
        return True

    def next_deadline(self) -> float:
        p = self.pull
        if p is None:
            return math.inf
        return p.deadline if p.asked_at < math.inf else p.retry_at

    def tick(self, now: float) -> list[Send]:
        p = self.pull
        if p is None:
            return []
        if p.asked_at < math.inf:
            if now >= p.deadline:
                self._fail(now)
            return []
        if now < p.retry_at:
            return []
        link = self.monitor.links.get(p.donor)
        rate = (link.throughput_bps if link is not None else None) or ASSUMED_RATE_BPS
        p.asked_at = now
        p.deadline = now + min(MAX_BACKOFF_S, max(MIN_DEADLINE_S, DEADLINE_SLACK * p.expected_bytes / rate) + p.wait_s)
        return [Send(p.donor, CatchUpRequest(p.next, self.model_key))]

    def _fail(self, now: float) -> None:
        p = self.pull
        self.stats["repair_chunks_missed"] += 1
        self.stats["repairs_failed"] += 1
        p.failures += 1
        p.backoff_s = min(MAX_BACKOFF_S, max(2 * p.backoff_s, p.deadline - p.asked_at))
        p.asked_at, p.deadline, p.retry_at = math.inf, math.inf, now + p.backoff_s
        if p.failures >= MAX_ATTEMPTS:
            self.pull = None

    def receive(self, src: str, msg: object, now: float) -> None:
        """A ``CatchUpShare`` or ``CatchUpMissing`` (diloco.py routes both here)."""
        if msg.model_key != self.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.model_key!r}")
        p = self.pull
        if p is None or src != p.donor or msg.round != p.next:
            self.stats["repair_chunks_unasked"] += 1
            return
        if isinstance(msg, CatchUpMissing):  # the donor does not hold it: the next round decides (a pull)
            self.stats["repair_stale"] += 1
            self.stats["repairs_failed"] += 1
            self.pull = None
            return
        mixed = msg.mixed
        if not isinstance(mixed, (tuple, list)) or not 0 < len(mixed) <= MAX_SENDERS \
                or not all(isinstance(s, str) for s in mixed) or list(mixed) != sorted(set(mixed)) \
                or msg.sender not in mixed or (p.mixed and tuple(mixed) != p.mixed):
            raise RemoteProtocolError("bad_value", f"catch-up share of {msg.sender!r} for a set of {len(mixed)}")
        if msg.numel != self.numel:
            raise RemoteProtocolError("bad_tensor", f"{msg.numel} parameters, want {self.numel}")
        p.mixed = tuple(mixed)
        if msg.sender in p.got:
            self.stats["repair_chunks_unasked"] += 1
            return
        packed = msg.payload()
        p.got[msg.sender] = decompress(packed, self.numel)
        p.got_bytes += packed.nbytes
        self.stats["repair_bytes"] += packed.nbytes
        if len(p.got) < len(p.mixed):
            return
        if p.asked_at < math.inf and now > p.asked_at:
            self.monitor.observe(src, p.got_bytes, now - p.asked_at)
        self._replay(p)
        took = max(0.0, now - p.asked_at) if p.asked_at < math.inf else 0.0
        p.asked_at, p.deadline, p.retry_at = math.inf, math.inf, now + took * (1 / CATCH_UP_SHARE - 1)
        p.next, p.got, p.got_bytes, p.mixed, p.failures, p.backoff_s = p.next + 1, {}, 0, (), 0, 0.0
        if p.next == p.round:
            self.done = Pulled(p.round, p.start, p.momentum, p.own_start, p.own_momentum, p.donor)
            self.pull = None
            self.stats["catch_ups_completed"] += 1

    def _replay(self, p: _CatchUp) -> None:
        """One outer step with the round's average (module docstring, "How")."""
        d = replay_round([p.got[s] for s in p.mixed], self.robust)
        mu = np.float32(self.mu)
        p.momentum = mu * p.momentum + d
        p.start = p.start - np.float32(self.lr) * (d + mu * p.momentum)

    def abandon(self) -> None:
        if self.pull is not None or self.done is not None:
            self.stats["repairs_failed"] += 1
            self.pull = self.done = None

    def drop_if_donor_gone(self, neighbours: Sequence[str]) -> None:
        p = self.pull
        if p is not None and p.donor not in neighbours:
            self.stats["repairs_failed"] += 1
            self.stats["repair_donors_gone"] += 1
            self.pull = None

    def take(self) -> Optional[Pulled]:
        done, self.done = self.done, None
        if done is not None:
            self.stats["repairs_completed"] += 1
        return done
