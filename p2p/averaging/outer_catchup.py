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
  pull or catch-up that landed drops the rounds before it (they were not the swarm's). The
  newest rounds that fit in ``log_budget`` bytes (half of theta_start's: more, and the pull is
  cheaper) and at most ``LOG_ROUNDS``. A request names a range of rounds (``CatchUpRange``,
  first..last, at most ``LOG_ROUNDS``): every logged round of it is answered in order, one
  ``CatchUpShare`` per sender per round; the first round it does not hold gets
  ``CatchUpMissing`` and ends the answer; from the first round not confirmed yet on, the rest
  is answered when it is (at most ``MAX_PENDING`` requests waiting).
- **Only confirmed rounds are served** (``confirm_before``). A round is logged at our outer
  step with the set we averaged, but whether that was the swarm's set shows only when the next
  round's sketches are compared: the copy it made agreed with the reference group's, or a
  replay repair replaced the set by theirs (``reseal``). Served before that, a round that our
  copy then replayed landed its puller apart by that round's difference: two catch-ups and then
  the full pull (8.7 MB on nodes.wide), seen in 4 of 15 runs of the lab's overlap test (stop 39)
  and reproduced in a simulated cut with link latency (stop 40: the donor's round had missed
  the restored peer's late share). The newest round waits one round longer for it. The one-round
  ``CatchUpRequest`` of the first protocol is still answered, as the range [round, round].
- **Our base** (``CatchUpPuller.note_begin`` / ``note_agreed``): our (theta_start, momentum) at
  the start of the last round whose sketches put us in the reference group (outer_copies.py):
  the state the swarm shared then. One copy, plus the round in flight's.
- **When.** Chosen over the pull (diloco.py) when we hold that base, the rounds since it are at
  most ``LOG_ROUNDS``, their shares (rounds x senders x our own share's bytes) fit in the log
  budget, and no catch-up was tried from that base before: a catch-up that failed or landed
  a copy still apart (the next round's sketches tell) leaves the full pull to mend it (after
  at most one more catch-up, from the state it landed: below). So it is tried at most twice
  per episode of being apart and can never grow into a loop. The second (``note_landed``):
  the state a catch-up landed is the swarm's at the start of its round (replayed from the
  swarm's own shares), a base as good as an agreed round's, and one more catch-up may start
  from it (``MAX_CHAINED``) before the next agreement. Why: a peer
  back from a cut link whose catch-up landed can still miss the next round's outer step (it
  began late and the others' shares of the round after were already in: rounds.py's
  "Overtaken"), one round apart again. Without a base after its landing, the full pull mended
  that one round: 8.7 MB on nodes.wide, paced over 24 rounds at 20 Mbit/s
  (bench/diloco_repair.py, stop 36), where two rounds' shares (~0.4 MB) sufficed. A pull's
  landed state is not a base: in the simulator's flapping membership
  (tests/test_diloco_auto.py) catch-ups begun from pulled states found their rounds missing
  from the donors' logs and cost a round each before the pull that mended anyway.
- **How.** The rounds from the base to the last one before the round we rejoin (at most
  ``LOG_ROUNDS``, within the log budget) are asked for as ranges, one request in flight, each
  range as many rounds as ``MAX_ANSWER`` shares hold (the transport's send queue), the next
  asked for as soon as one is in. (A round at a time, each request waiting a round trip and
  the donor's round, took more than three rounds at ``--diloco-inner-steps 10`` in the lab;
  the whole range at once overflowed the donor's send queue.) The shares are kept packed as they
  come (at most ``MAX_KEPT`` x the log budget); as soon as a round's set is complete, in round
  order, its shares are decoded and averaged as the round did (robust mixing's clipped mean,
  robust.py "One answer for one set", or the plain mean), and the outer step
  ``m <- mu m + D; theta <- theta - lr (D + mu m)`` is replayed. The result is the swarm's
  (theta_start, m) as of the round after the last one replayed: handed to diloco.py as a
  ``Pulled`` state, which lands it like a pull's (carried through the outer steps since,
  checked against the donor's ``mixed`` lists until it lands, verified by the next sketches).
- **Bounded** (the pull's rules, donor_pull.py). A request's deadline is the expected bytes of
  its range (rounds x senders x our share's bytes) / the measured link rate x the slack,
  plus a round's wait (the donor may answer when its round ends); past it, after a doubling
  backoff, only the rounds whose shares are not all in are asked for again (a range never wider
  than the one before; the shares in are kept); after ``MAX_ATTEMPTS`` attempts without a round
  replayed, on ``CatchUpMissing``, or when the donor leaves, the catch-up is dropped and the
  next round's sketches decide (a full pull).

Pure state, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from p2p.averaging.donor_pull import DonorPull
from p2p.averaging.outer_codec import decode
from p2p.averaging.outer_repair import Pulled
from p2p.averaging.robust import RobustMixing, robust_mean
from p2p.bandwidth import BandwidthMonitor
from p2p.compression.codecs import Compressed
from p2p.compression.messages import CompressedFields, compressed_fields
from p2p.compression.sparse import dense
from p2p.protocol import RemoteProtocolError, Send
from p2p.wire import message

LOG_ROUNDS = 8  # rounds a donor keeps and a catch-up may replay
MAX_KEPT = 2  # a puller keeps at most this many x the log budget of shares not replayed yet
# Shares one request may ask for: the donor sends them at once, and the transport queues 16
# messages per peer before it drops sends (p2p/net/transport.py ``send_hwm``), its round shares
# included. Asked for all at once, a 4-round range of 4 senders lost part of every answer in
# the lab and the catch-up ran out of its 3 rounds re-asking.
MAX_ANSWER = 8
MAX_PENDING = 16  # requests a donor keeps for rounds it has not reached
MAX_SENDERS = 4096  # senders one round's average may name (as diloco.MAX_MIXED)
MAX_CHAINED = 1  # catch-ups begun from a landed state before the next agreed round ("When")


@message(31)
@dataclass(frozen=True)
class CatchUpRequest:
    """One round (the first protocol; still answered, as the range [round, round], for peers
    that speak it)."""

    round: int  # the outer round whose averaged shares we want
    model_key: str


@message(33)
@dataclass(frozen=True)
class CatchUpRange:
    first: int  # the outer rounds whose averaged shares we want, first..last (at most LOG_ROUNDS)
    last: int
    model_key: str


@message(32)
@dataclass(frozen=True)
class CatchUpMissing:
    round: int  # the first round asked for that the donor does not hold
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
    return np.sum([dense(v) for v in vectors], axis=0, dtype=np.float32) / np.float32(len(vectors))


class ShareLog:
    """The donor side: the packed shares of the last rounds' averages (module docstring)."""

    def __init__(self, numel: int, model_key: str, stats: dict[str, int], budget_bytes: int) -> None:
        self.numel, self.model_key, self.stats, self.budget = numel, model_key, stats, budget_bytes
        self._shares: dict[int, dict[str, Compressed]] = {}  # round -> sender -> share (not sealed yet)
        self._sealed: dict[int, tuple[tuple, dict[str, Compressed]]] = {}  # round -> (mixed, shares: those
        # it averaged and any that came late)
        self._pending: list[tuple[str, int, int]] = []  # (asker, first round not confirmed yet, last)
        self._confirmed = 0  # the rounds before this one are the swarm's (module docstring)
        self._current = 0  # our round in flight or next, as last seen

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
        ``mixed`` is the set the swarm averaged; the round is dropped if a share of it is missing.
        Either way our copy is the reference's from the next round on: ``serve_due`` answers."""
        held = self._sealed.pop(round, None)
        if held is not None and mixed and all(s in held[1] for s in mixed):
            self._sealed[round] = (tuple(mixed), held[1])
        self.confirm_before(round + 1)

    def confirm_before(self, round: int) -> None:
        """Our copy at the start of round ``round`` was the reference group's: the rounds before
        it averaged what the swarm did, and may be served (module docstring)."""
        self._confirmed = max(self._confirmed, round)

    def serve_due(self) -> list[Send]:
        """The waiting requests whose first round is confirmed now."""
        due = [x for x in self._pending if x[1] < self._confirmed]
        self._pending = [x for x in self._pending if x[1] >= self._confirmed]
        return [x for src, first, last in due for x in self._serve(src, first, last, self._current)]

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
        self._current = max(self._current, round + 1)
        return self.serve_due()

    def _bytes(self) -> int:
        return sum(c.nbytes for _, shares in self._sealed.values() for c in shares.values())

    def receive(self, src: str, msg: object, current: int) -> list[Send]:
        """A ``CatchUpRange`` (or a one-round ``CatchUpRequest``); ``current``: our round in
        flight or next."""
        if msg.model_key != self.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.model_key!r}")
        first, last = (msg.round, msg.round) if isinstance(msg, CatchUpRequest) else (msg.first, msg.last)
        if not 0 <= first <= last < first + LOG_ROUNDS:
            raise RemoteProtocolError("bad_value", f"catch-up rounds {first}..{last}")
        self._pending = [x for x in self._pending if x[0] != src]  # a new ask replaces the one before
        self._current = max(self._current, current)
        return self._serve(src, first, last, self._current)

    def _serve(self, src: str, first: int, last: int, current: int) -> list[Send]:
        """Every logged round of first..last in order; for the first one we do not hold, a
        ``CatchUpMissing`` and nothing after it; from the first one not confirmed yet (not
        reached, or not compared yet), the rest when it is (at most ``MAX_PENDING`` requests wait)."""
        out = []
        for r in range(first, last + 1):
            if self._confirmed <= r < current + LOG_ROUNDS:
                self._pending = self._pending[-(MAX_PENDING - 1):] + [(src, r, last)]
                return out
            held = self._sealed.get(r)
            if held is None:
                return out + [Send(src, CatchUpMissing(r, self.model_key))]
            mixed, shares = held
            for sender in mixed:
                c = shares[sender]
                self.stats["repair_bytes_served"] += c.nbytes
                out.append(Send(src, CatchUpShare(**compressed_fields(c), round=r, sender=sender, mixed=mixed,
                                                  model_key=self.model_key)))
        return out


@dataclass
class _CatchUp:
    donor: str
    round: int  # the state we build is the swarm's at the start of this round (as _Pull.round)
    next: int  # the first round not replayed yet (base round .. round - 1)
    start: np.ndarray  # the replay so far (from our base)
    momentum: np.ndarray
    own_start: np.ndarray  # ours at the start of ``round``
    own_momentum: np.ndarray
    per_round: int  # one round's shares, as estimated (deadlines)
    senders: int  # one round's senders, as estimated (until a share names them)
    wait_s: float  # a round's wait (the donor may answer when its round ends)
    got: dict[int, dict[str, Compressed]] = field(default_factory=dict)  # round -> sender -> packed
    # share, kept packed (decoded when its round replays: a few rounds of shares stay small)
    mixed: dict[int, tuple] = field(default_factory=dict)  # round -> the set it averaged
    got_bytes: int = 0  # packed bytes kept, all rounds (bounded: ``MAX_KEPT``)
    asked_bytes: int = 0  # packed bytes arrived since the request in flight (the link estimate)
    asked_last: int = -1  # the last round the request in flight names

    def missing(self) -> list[int]:
        """The rounds not replayed whose shares are not all in."""
        return [r for r in range(self.next, self.round)
                if r not in self.mixed or len(self.got.get(r, ())) < len(self.mixed[r])]


class CatchUpPuller(DonorPull):
    """The repairing side (module docstring): our base, at most one catch-up in flight, asked for
    as one range of rounds (donor_pull.py: its deadline, retries and drops). Its surface is the
    pull's (``RepairPuller``): ``pull`` / ``done`` name a donor and a round."""

    def __init__(self, numel: int, model_key: str, monitor: BandwidthMonitor, stats: dict[str, int],
                 outer_lr: float, outer_momentum: float, robust: RobustMixing, budget_bytes: int) -> None:
        super().__init__(monitor, stats)
        self.numel, self.model_key = numel, model_key
        self.lr, self.mu, self.robust, self.budget = outer_lr, outer_momentum, robust, budget_bytes
        self._pending: Optional[tuple[int, np.ndarray, np.ndarray]] = None  # the round in flight's start
        self._base: Optional[tuple[int, np.ndarray, np.ndarray]] = None  # the last agreed round's
        self._tried: Optional[int] = None  # the base round a catch-up was begun from
        self._chained = 0  # bases taken from landed states since the last agreed round

    # -- our base ----------------------------------------------------------------------------
    def note_begin(self, round: int, start: np.ndarray, momentum: np.ndarray) -> None:
        """Round ``round`` begins from (start, momentum): the base, should its sketches agree."""
        # start itself, not a copy (a model-sized pass per round, ~6% of the network thread's CPU
        # in a 4-peer sparseloco run): DiLoCo replaces theta_start at each outer step and repair
        # and never writes it in place (diloco.py: _outer_step, _correct; tests/test_diloco_catchup.py)
        m = momentum.copy() if self.mu else momentum  # mu = 0: the replay never reads it
        start.flags.writeable = False  # the invariant above, enforced: an in-place write raises
        self._pending = (round, start, m)

    def note_agreed(self, round: int) -> None:
        """Round ``round``'s sketches put us in the reference group: its start is our base."""
        if self._pending is not None and self._pending[0] == round:
            self._base, self._pending = self._pending, None
            self._tried, self._chained = None, 0

    def note_landed(self, done: Pulled) -> None:
        """Our catch-up landed: ``done.start`` is the swarm's theta_start at the start of
        ``done.round``, a base for one more catch-up (module docstring, "When")."""
        # (a base as new as the landing: defensive, outer_copies.py reports no agreement while a
        # catch-up runs)
        if self._chained >= MAX_CHAINED or (self._base is not None and self._base[0] >= done.round):
            return
        for a in (done.start, done.momentum):  # fresh arrays (_replay): a base is never written
            a.flags.writeable = False
        self._base, self._tried = (done.round, done.start, done.momentum), None
        self._chained += 1

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
        self._start(_CatchUp(donor, current, base_round, start.copy(), momentum.copy(), own[0].copy(),
                             own[1].copy(), per_round, max(1, senders), wait_s))
        self.stats["catch_ups_started"] += 1
        return True

    def _ask(self) -> tuple[object, int, float]:
        """The rounds not all in yet, from the first, as one range of at most ``MAX_ANSWER``
        shares (the donor re-sends a round whole)."""
        p = self.pull
        todo = p.missing()
        first = todo[0]
        last = min(todo[-1], first + max(1, MAX_ANSWER // p.senders) - 1)
        p.asked_bytes, p.asked_last = 0, last
        return CatchUpRange(first, last, self.model_key), (last - first + 1) * p.per_round, p.wait_s

    def receive(self, src: str, msg: object, now: float) -> None:
        """A ``CatchUpShare`` or ``CatchUpMissing`` (diloco.py routes both here)."""
        if msg.model_key != self.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.model_key!r}")
        p = self.pull
        if p is None or src != p.donor or not p.next <= msg.round < p.round:
            self.stats["repair_chunks_unasked"] += 1
            return
        if isinstance(msg, CatchUpMissing):  # the donor does not hold it: the next round decides (a pull)
            self._drop("repair_stale")
            return
        mixed, known = msg.mixed, p.mixed.get(msg.round)
        if not isinstance(mixed, (tuple, list)) or not 0 < len(mixed) <= MAX_SENDERS \
                or not all(isinstance(s, str) for s in mixed) or list(mixed) != sorted(set(mixed)) \
                or msg.sender not in mixed or (known is not None and tuple(mixed) != known):
            raise RemoteProtocolError("bad_value", f"catch-up share of {msg.sender!r} for a set of {len(mixed)}")
        if msg.numel != self.numel:
            raise RemoteProtocolError("bad_tensor", f"{msg.numel} parameters, want {self.numel}")
        shares = p.got.setdefault(msg.round, {})
        if msg.sender in shares:
            self.stats["repair_chunks_unasked"] += 1
            return
        packed = msg.payload()
        if p.got_bytes + packed.nbytes > MAX_KEPT * self.budget:  # more than any honest range
            raise RemoteProtocolError("oversized", f"catch-up shares past {MAX_KEPT} x the log budget")
        p.mixed[msg.round] = tuple(mixed)
        p.senders = len(mixed)
        arrays = tuple(np.array(a, copy=True) for a in packed.arrays)  # off the receive buffer
        shares[msg.sender] = Compressed(packed.codec, packed.numel, arrays, packed.meta)
        p.got_bytes += packed.nbytes
        p.asked_bytes += packed.nbytes
        self.stats["repair_bytes"] += packed.nbytes
        replayed = False
        while p.next < p.round and p.next in p.mixed and len(p.got[p.next]) == len(p.mixed[p.next]):
            self._replay(p)
            replayed = True
        if replayed:  # progress: a re-ask after this attempt starts afresh
            self._failures, self._backoff_s = 0, 0.0
        if p.next > p.asked_last:  # the range asked for is in: the next one goes out at once
            self._answered(src, p.asked_bytes, now, 1.0)
        if p.next == p.round:
            self._finish(Pulled(p.round, p.start, p.momentum, p.own_start, p.own_momentum, p.donor))
            self.stats["catch_ups_completed"] += 1

    def _replay(self, p: _CatchUp) -> None:
        """Round ``p.next``'s outer step with its average (module docstring, "How")."""
        shares, mixed = p.got.pop(p.next), p.mixed.pop(p.next)
        p.got_bytes -= sum(c.nbytes for c in shares.values())
        d = replay_round([decode(shares[s]) for s in mixed], self.robust)  # as the round decoded them
        mu = np.float32(self.mu)
        p.momentum = mu * p.momentum + d
        p.start = p.start - np.float32(self.lr) * (d + mu * p.momentum)
        p.next += 1
