"""Synchronous neighbour-averaging rounds: the engine under D-PSGD, GossipGraD and DiLoCo.

Theory of operation. A round r is one mixing step of a doubly stochastic matrix W (Xiao & Boyd
2004): the peer sends its vector(s) tagged (r, its degree d_i) to its neighbours, waits until
``len(neighbours)`` round-r vectors arrived (every topology here has in-degree = out-degree) or
the round timeout passed, then mixes with Metropolis-Hastings weights

    v_i <- v_i + sum_j w_ij (v_j - v_i),   w_ij = 1 / (1 + max(d_i, d_j))  [x staleness factor]

over the vectors that arrived (a sender may leave one of its vectors out of a round, None: it
then counts as equal to ours and moves nothing). A missing neighbour is dropped from that round: its weight stays
on v_i, so the row stays stochastic (the swarm mean drifts by that one asymmetric term). Vectors
from more senders than we have neighbours (membership views that disagree) are scaled down so
that v_i keeps at least 1/(1 + d_i), as in any Metropolis-Hastings row: the mix stays convex.

Round deadline: ``begin``'s ``timeout_s`` when given (DiLoCo sizes its own); else, with a
``link_deadline`` (D-PSGD, GossipGraD), one that follows the bytes of the round and the measured
link, never below the configured ``timeout_s`` (p2p/averaging/round_deadline.py); else
``timeout_s``. A round that times out only waits longer next time: it never sends more.

States: idle (between rounds) and waiting (round r begun, ``deadline`` set). Vectors for later
rounds are buffered (at most ``MAX_BUFFERED_ROUNDS`` rounds, one vector per sender per round);
vectors for rounds already finished are late: counted and dropped, never mixed.

Round alignment without a clock: rounds are numbered by the peers, not by time. A neighbour
may legitimately be ahead of us: by one round on a static symmetric graph (it needs our vector
for the round in between), by up to the period (log2 n) on a rotating one (it needs us only
once per period). A peer is BEHIND when a vector arrives ``LEAD`` or more rounds ahead (more
than any period: a joiner or restarted peer meeting an established swarm), or when it finished
a round short of vectors while a vector two or more rounds ahead is buffered (it is out of step:
a joiner meeting a young swarm times out once; two joiners paired with each other at round 0).
Being behind ends the current wait at once and the next round begins at the highest round
buffered. So a joiner costs at most one round timeout; a lying peer can only push rounds
forward, costing the same. A peer that lags by less (a straggler) keeps its lag: its
neighbours find its vectors in time or drop it from a round.

Passed by (``passed_within``, DiLoCo's): a peer cut off waits out its round in vain while the
others go on without it, and its round's deadline can span several of theirs. Once the link is
back, a vector from a neighbour the round waits for, tagged two or more rounds past ours, proves
that neighbour finished the round after ours without us (it needed our vector for it, which we
have not sent): the swarm has moved on. The round in flight then ends at once with what it
holds (a partial round, as at its deadline: nothing more is sent or repaired for it) and the
next begins at the round that proved it (the highest such, never a round further on that no
neighbour we wait for vouches for). Bounded so a forged round number buys little: only
from a neighbour the round waits for (a current member we have been hearing from), only rounds
less than ``passed_within`` past ours (beyond, the ``LEAD`` rule or the deadline decides: a
jump that far is more than a catch-up mends), and never before the round has waited its
``patience_s`` (``begin``: the usual wait, so the vectors still coming in an ordinary round
arrive first). It costs what a deadline would, only sooner.

Overtaken (``passed_within`` and ``uniform``, DiLoCo's on ``full``): a peer whose rounds fell
behind in time but not in number (its process stalled, or its trainer waited out rounds alone
while the others went on) begins round r with the others' vectors for r and r + 1 already
buffered. It would mix them all while they, no longer waiting for it, mixed without it: another
set every round, and it would stay that far behind for good (its own vectors reach them too late
to be waited for). On a full graph a neighbour needs our vector for every round, and we send
none for r before we begin it, so a vector for a later round from a neighbour the round waits for
proves it finished r without us. The round begins at the highest such round within
``passed_within`` of ours instead (``overtaken``; counted: ``rounds_overtaken``): the set the
others mix there is still open to ours, and the round skipped is mended like any missed one.
Bounded as "Passed by" is: only a neighbour the round waits for, only so far.

Finished peers (``serving``): a peer that stopped stepping but lingers answers rounds instead
of beginning them: ``serve_round`` names the oldest buffered round it has not begun (a
neighbour began it), and the owning algorithm begins that round from its timer. A finished
peer that is AHEAD of a neighbour still training (it trained alone before the others joined,
say) would drop that neighbour's vectors as late and leave it to time out every round; so a
late vector makes it begin a round ``LEAD`` past the late one instead, which the neighbour
takes as "behind" and jumps to. Finished peers never begin rounds otherwise, so once every
peer finished the rounds stop.

Robust mixing (``robust``, p2p/averaging/robust.py, after ClippedGossip): before the mix,
each neighbour's difference v_j - v_i is screened per vector against that vector's adaptive
radius, the round's own distances included (so a round with an honest majority screens
right from round 0): a far one is clipped to the radius, a far-beyond one refuses the
neighbour's whole entry, whose weight then stays on v_i (as for a missing neighbour).

Invariants: ``round`` never decreases; nothing is mixed twice; at most one round in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from p2p.averaging.base import Disagreement, state_int, staleness_weight
from p2p.averaging.robust import REFUSED, RobustMixing, robust_mean
from p2p.averaging.round_deadline import RoundDeadline
from p2p.compression import sparse
from p2p.compression.sparse import Vector
from p2p.protocol import RemoteProtocolError

INF = float("inf")
_OWN = ""  # our own vector among the norms a consistent round screens (no address is empty)
MAX_BUFFERED_ROUNDS = 16  # future rounds kept (>= LEAD: a peer catching up finds every round it needs)
MAX_SENDERS_PER_ROUND = 1024  # vectors kept per round (bounds memory under a flood)
MAX_DEGREE = 1 << 20
LEAD = 16  # a vector this many rounds ahead means we fell behind (more than any rotation period, log2 n)


@dataclass(frozen=True)
class Entry:
    degree: int  # the sender's neighbour count this round
    step: int  # the sender's local step count (staleness)
    payload: tuple[Optional[np.ndarray], ...]  # None: left out this round (mixed as equal to ours)


@dataclass(frozen=True)
class Mixed:
    payload: tuple[np.ndarray, ...]  # the mixed vectors
    own: tuple[Vector, ...]  # ours, before the mix
    received: int  # how many neighbours' vectors went in
    expected: int  # how many were awaited
    refused: frozenset = frozenset()  # senders whose vectors robust mixing refused this round
    senders: frozenset = frozenset()  # whose vectors arrived for the round (refused ones included)
    acc: Optional[tuple[np.ndarray, ...]] = None  # ``deltas``, when the mix computed them anyway

    @property
    def deltas(self) -> tuple[np.ndarray, ...]:
        """mixed - own, per vector: on demand (DiLoCo's consistent rounds never ask, and three
        model-sized subtractions per round were ~7% of its CPU: bench/round_cpu.py)."""
        if self.acc is not None:
            return self.acc
        return tuple(m - sparse.dense(o) for m, o in zip(self.payload, self.own))


class NeighbourRounds:
    """One synchronous averaging round at a time (module docstring). Pure state, no I/O: the
    owning algorithm builds and sends the messages and validates their tensors."""

    def __init__(self, timeout_s: float, stats: dict[str, int], prefix: str = "",
                 disagreement: Optional[Disagreement] = None, model_index: int = 0,
                 robust: Optional[RobustMixing] = None, channels: tuple[str, ...] = (),
                 uniform: bool = False, link_deadline: Optional[RoundDeadline] = None,
                 direction_test: bool = True, passed_within: int = 0) -> None:
        self.timeout_s = timeout_s
        self.direction_test = direction_test  # robust_mean's direction test (off for reduce-scatter slices)
        # The deadline of a round begun without an explicit ``timeout_s``: from the link
        # (round_deadline.py), or the constant ``timeout_s`` without one.
        self.link_deadline = link_deadline
        # Mix the plain average of ours and the vectors that arrived, instead of Metropolis-
        # Hastings weights: on a full graph in one round (DiLoCo's all-reduce) every peer that
        # got the same vectors then holds the same average even when some neighbour's vector
        # is missing (with MH weights its share would stay on each peer's own, all different).
        self.uniform = uniform
        self.passed_within = passed_within  # module docstring, "Passed by" (0: off)
        self._patient_until = INF  # the round may end passed by from then on
        self._jump_to: Optional[int] = None  # after a round passed by: the round the next begins
        self._passed: Optional[int] = None  # the round in flight ended passed by: the round to jump to
        self.robust = robust  # robust mixing (p2p/averaging/robust.py); None: mix as they come
        self.channels = channels  # the robust screen's channel name per payload vector
        self.disagreement = disagreement  # fed each neighbour's vector at ``model_index`` (the model)
        self.model_index = model_index
        self.round = 0  # the current round while waiting; the next one to begin while idle
        self.waiting = False
        self.deadline = INF
        self._behind = False  # a neighbour is far enough ahead that we should jump
        self._expected = 0
        self._wait_for: Optional[frozenset] = None  # the senders a round waits for (None: any ``_expected``)
        self._degree = 0
        self._own: tuple[np.ndarray, ...] = ()
        self._inbox: dict[int, dict[str, Entry]] = {}
        self.serving = False  # we no longer step, only answer rounds (``serve_round``)
        self._nudge = -1  # serving: a round to begin that pulls late neighbours forward
        self.stats = stats
        self._k = {name: prefix + name for name in
                   ("exchanges_started", "exchanges_completed", "rounds_partial", "late", "jumps",
                    "duplicates", "overflow", "rounds_passed", "rounds_overtaken")}
        for key in self._k.values():
            stats.setdefault(key, 0)

    def _count(self, name: str) -> None:
        self.stats[self._k[name]] += 1

    def buffered(self) -> list[int]:
        """The rounds holding neighbours' vectors, oldest first (for tests and status)."""
        return sorted(self._inbox)

    def moved_on(self) -> set[str]:
        """The senders of the vectors buffered for rounds past the last one finished: once it
        finished, neighbours that began a later round (they will not send that one)."""
        return set().union(*(box for r, box in self._inbox.items() if r >= self.round))

    @property
    def behind(self) -> bool:
        """We fell behind: the next ``begin`` jumps to the highest round buffered."""
        return self._behind

    def next_round(self) -> int:
        """The round the next ``begin`` uses: ours, or the highest buffered one if we fell behind."""
        if self.waiting or not self._behind:
            return self.round
        if self._jump_to is not None:
            return self._jump_to
        return max(self._inbox, default=self.round)

    def serve_round(self) -> Optional[int]:
        """For a peer that no longer steps but still takes part (``serving``: it finished
        training): the oldest round a neighbour began that we have not; else, when a late
        vector showed a neighbour behind us, a round ``LEAD`` ahead of it; else None."""
        if self.waiting or not self.serving:
            return None
        begun = min((r for r in self._inbox if r >= self.round), default=None)
        if begun is not None:
            return begun
        return self._nudge if self._nudge >= self.round else None

    def resume_at(self, round: int) -> None:
        """Continue from ``round`` (restored state): the next round begun is at least it."""
        if self.waiting:
            raise AssertionError("resume_at() while a round is in flight")
        self.round = max(self.round, round)
        self._inbox = {k: v for k, v in self._inbox.items() if k >= self.round}

    def discard(self, round: int, unwanted: Callable[[str], bool]) -> None:
        """Drop the vectors buffered for ``round`` from the senders ``unwanted`` names (DiLoCo's
        reduce-scatter: slices cut for another member set than the round's, outer_scatter.py)."""
        box = self._inbox.get(round, {})
        for src in [s for s in box if unwanted(s)]:
            del box[src]

    def begin(self, now: float, neighbours: Sequence[str], payload: tuple[np.ndarray, ...],
              round: Optional[int] = None, timeout_s: Optional[float] = None,
              wait_for: Optional[Sequence[str]] = None, patience_s: Optional[float] = None) -> int:
        """Start the next round with our ``payload``; returns its number (tag the sends with it).
        ``round`` (>= ours) begins that round instead: a finished peer answering ``serve_round``.
        ``timeout_s`` replaces the configured timeout for this round; ``wait_for`` (a subset of
        ``neighbours``) names the neighbours the round waits for (the others' vectors are mixed
        when they come in time, but the round does not wait for them), and stops waiting for
        one whose vector for a later round came (it moved on). ``patience_s``: with ``wait_for``,
        how long it waits before a neighbour two or more rounds on may end it (module docstring,
        "Passed by"; None: never)."""
        if self.waiting:
            raise AssertionError("begin() while a round is in flight")
        r = self.next_round() if round is None else round
        if r < self.round:
            raise AssertionError(f"begin({r}) after round {self.round}")
        if r > self.round:
            self._count("jumps")
            self._inbox = {k: v for k, v in self._inbox.items() if k >= r}
        self.round = r
        if r >= self._nudge:
            self._nudge = -1
        self.waiting, self._behind, self._jump_to = True, False, None
        if timeout_s is None:
            timeout_s = self.timeout_s
            if self.link_deadline is not None:
                nbytes = sum(int(a.nbytes) for a in payload if a is not None)
                timeout_s = self.link_deadline.begin(now, neighbours, nbytes)
        self.deadline = now + timeout_s
        self._patient_until, self._passed = INF if patience_s is None else now + patience_s, None
        self._expected = self._degree = len(neighbours)
        self._wait_for = None
        if wait_for is not None:
            self._wait_for = frozenset(wait_for)
            self._expected = len(self._wait_for)
        self._own = payload
        self._count("exchanges_started")
        return r

    def offer(self, src: str, round: int, degree: int, step: int,
              payload: tuple[Optional[np.ndarray], ...], now: Optional[float] = None) -> bool:
        """Buffer a neighbour's round vector (tensors already checked). False if dropped.
        ``now``: when it arrived (the link deadline learns from vectors of the round in flight)."""
        if round < 0 or not 0 <= degree <= MAX_DEGREE:
            raise RemoteProtocolError("bad_value", f"round {round}, degree {degree}")
        if round < self.round:
            self._count("late")
            if self.serving and not self.waiting:
                # A neighbour still training is behind us and we will never begin its round:
                # begin one far enough ahead that it jumps to it (``LEAD``) instead of waiting
                # a round timeout per round for us.
                self._nudge = max(self._nudge, self.round, round + LEAD)
            return False
        box = self._inbox.get(round)
        if box is None:
            if len(self._inbox) >= MAX_BUFFERED_ROUNDS:  # keep the newest rounds
                evictable = [k for k in self._inbox if not (self.waiting and k == self.round)]
                self._count("overflow")
                if not evictable or min(evictable) > round:
                    return False
                del self._inbox[min(evictable)]
            box = self._inbox[round] = {}
        if src in box:
            self._count("duplicates")
            return False
        if len(box) >= MAX_SENDERS_PER_ROUND:
            self._count("overflow")
            return False
        box[src] = Entry(degree, step, payload)
        if self.link_deadline is not None and now is not None and self.waiting and round == self.round:
            self.link_deadline.arrived(src, now)
        if round >= self.round + LEAD:
            self._behind = True  # stop waiting for a round nobody will finish; jump at begin
        return True

    def receipt(self, src: str, round: int, now: float) -> None:
        """A neighbour confirmed it has our vector for ``round`` (round_deadline.py, "Receipts")."""
        if round < 0:
            raise RemoteProtocolError("bad_value", f"round {round}")
        if self.link_deadline is not None and self.waiting and round == self.round:
            self.link_deadline.received(src, now)

    def ready(self, now: float) -> bool:
        """The round in flight can be finished (all in, timed out, or we fell behind)."""
        if not self.waiting:
            return False
        box = self._inbox.get(self.round, {})
        if self._wait_for is None:
            done = len(box) >= self._expected
        else:  # a neighbour whose vector for a later round came has moved on: it will not send this one
            later = set().union(*(v for r, v in self._inbox.items() if r > self.round))
            done = all(j in box or j in later for j in self._wait_for)
        return done or now >= self.deadline or self._behind or self._passed_by(now)

    @property
    def wake_at(self) -> float:
        """When to check ``ready`` next: the deadline, or sooner the end of the round's patience
        when a neighbour it waits for is already two or more rounds on (module docstring, "Passed by")."""
        if self.waiting and self._passed is None and self._patient_until < self.deadline and self._proof() is not None:
            return self._patient_until
        return self.deadline

    def _proof(self) -> Optional[int]:
        """The highest round within ``passed_within`` of ours, two or more on, that a neighbour the
        round waits for sent a vector for (None: none)."""
        if self.passed_within <= 2 or not self._wait_for:
            return None
        return max((r for r, box in self._inbox.items()
                    if 2 <= r - self.round < self.passed_within and not self._wait_for.isdisjoint(box)), default=None)

    def overtaken(self, wait_for: frozenset) -> int:
        """The round the next ``begin`` of a round waiting for ``wait_for`` should take: the
        highest within ``passed_within`` past ``next_round()`` that one of them sent a vector for
        (module docstring, "Overtaken"; counted); else ``next_round()``."""
        r = self.next_round()
        if self.waiting or not (self.uniform and self.passed_within > 1 and wait_for):
            return r
        ahead = max((k for k, box in self._inbox.items()
                     if 1 <= k - r < self.passed_within and not wait_for.isdisjoint(box)), default=r)
        if ahead > r:
            self._count("rounds_overtaken")
        return ahead

    def _passed_by(self, now: float) -> bool:
        """The round in flight was passed by (module docstring, "Passed by")."""
        if self._passed is None and now >= self._patient_until:
            self._passed = self._proof()
        return self._passed is not None

    def finish(self, my_step: int, staleness_tau: Optional[float] = None, now: float = 0.0) -> Mixed:
        """Mix what arrived for the round in flight and move to the next round. With ``robust``
        (robust mixing), each neighbour's difference is first screened per vector: clipped to
        the radius, or the neighbour's whole entry refused (its weight stays on ours)."""
        if not self.waiting:
            raise AssertionError("finish() with no round in flight")
        box = self._inbox.pop(self.round, {})
        if self.link_deadline is not None:
            self.link_deadline.finished(now, box, timed_out=now >= self.deadline and not self._behind)
        own = self._own
        if self.uniform and self.robust is not None and self.robust.enabled and staleness_tau is None:
            mixed, refused, entries = self._mix_consistent(box, own, now)
            return self._close(box, mixed, None, entries, refused)
        # the mixes below are dense: a sparse vector (p2p/compression/sparse.py) made dense here
        own = tuple(sparse.dense(a) for a in own)
        box = {src: Entry(e.degree, e.step, tuple(None if a is None else sparse.dense(a) for a in e.payload))
               for src, e in box.items()}
        # One norm per vector per round, and one per neighbour's difference: the robust screen
        # and the consensus estimate share them.
        own_norms = [float(np.linalg.norm(a)) for a in own]
        clips, refused, distances = self._screen(box, own, own_norms, now)
        entries = [(src, e) for src, e in box.items() if src not in refused]
        acc = [np.zeros_like(a) for a in own]
        if self.uniform:
            weights = [1.0 / (1.0 + len(entries))] * len(entries)
        else:
            weights = [1.0 / (1.0 + max(self._degree, e.degree)) for _, e in entries]
        if staleness_tau is not None:
            weights = [w * staleness_weight(my_step, e.step, staleness_tau) for w, (_, e) in zip(weights, entries)]
        # A Metropolis-Hastings row leaves at least 1/(1 + d_i) on ourselves. More senders than
        # neighbours (views that disagree) must not push our own weight below that: scale down.
        cap = self._degree / (1.0 + self._degree)
        total = sum(weights)
        if total > cap and not self.uniform:
            weights = [w * cap / total for w in weights]
        watch = self.disagreement is not None and entries and self.model_index < len(own)
        for w, (src, entry) in zip(weights, entries):
            for k, (mine, theirs) in enumerate(zip(own, entry.payload)):
                if theirs is not None:  # None: the sender left this vector out, "same as mine"
                    difference = theirs - mine
                    acc[k] += np.float32(w * clips.get((src, k), 1.0)) * difference
                    if watch and k == self.model_index:
                        distance = distances.get((src, k))
                        if distance is None:
                            distance = float(np.linalg.norm(difference))
                        self.disagreement.observe_norms(distance, own_norms[k])
        mixed = tuple(mine + delta for mine, delta in zip(own, acc))
        return self._close(box, mixed, acc, entries, refused)

    def _close(self, box: dict[str, Entry], mixed, acc, entries, refused) -> Mixed:
        self._count("exchanges_completed")
        short = len(box) < self._expected if self._wait_for is None else not self._wait_for.issubset(box)
        if short:
            self._count("rounds_partial")
            if self._passed is not None:
                self._count("rounds_passed")
        if short and max(self._inbox, default=-1) >= self.round + 2:
            self._behind = True  # out of step: we missed vectors while others are 2+ rounds on
        self._jump_to = self._passed if short else None  # passed by: no further than the proof
        result = Mixed(mixed, self._own, len(entries), self._expected, frozenset(refused), frozenset(box),
                       None if acc is None else tuple(acc))
        self.round += 1
        self.waiting, self.deadline, self._own = False, INF, ()
        return result

    def _mix_consistent(self, box: dict[str, Entry], own: tuple[np.ndarray, ...], now: float):
        """Robust mixing that every peer holding the same vectors agrees on (``uniform`` rounds,
        p2p/averaging/robust.py "One answer for one set"): per vector, refuse senders by norm
        against the round's median, then ``robust_mean`` of ours and the rest (clipped, a
        minority pointing against the others left out). A sender that left a vector out ("same as mine") counts as ours
        for it."""
        refused: set[str] = set()
        for k, mine in enumerate(own):
            norms = [(src, sparse.norm(e.payload[k])) for src, e in box.items()
                     if k < len(e.payload) and e.payload[k] is not None]
            if norms:
                channel = self.channels[k] if k < len(self.channels) else str(k)
                refused |= self.robust.screen_set(channel, norms + [(_OWN, sparse.norm(mine))], now)
        refused.discard(_OWN)
        entries = sorted((src, e) for src, e in box.items() if src not in refused)
        mixed = []
        for k, mine in enumerate(own):
            theirs = [e.payload[k] for _, e in entries if k < len(e.payload) and e.payload[k] is not None]
            if not theirs:
                mixed.append(sparse.dense(mine))
                continue
            vectors = [mine] + theirs + [mine] * (len(entries) - len(theirs))
            mean, clipped, opposed = robust_mean(vectors, self.robust.config.factor, self.direction_test)
            self.stats["robust_clipped"] += clipped
            self.stats["robust_opposed"] += opposed
            mixed.append(mean)
        return tuple(mixed), refused, entries

    def _screen(self, box: dict[str, Entry], own: tuple[np.ndarray, ...], own_norms: list[float],
                now: float) -> tuple[dict[tuple[str, int], float], set[str], dict[tuple[str, int], float]]:
        """Robust mixing over a round: ({(sender, vector index): clip factor < 1}, refused
        senders, {(sender, vector index): ||theirs - mine||} for the consensus estimate). Each
        vector is screened against its own channel's radius (p2p/averaging/robust.py)."""
        clips: dict[tuple[str, int], float] = {}
        refused: set[str] = set()
        distances: dict[tuple[str, int], float] = {}
        if self.robust is None or not self.robust.enabled or not box:
            return clips, refused, distances
        for k, mine in enumerate(own):
            senders = [(src, float(np.linalg.norm(e.payload[k] - mine)))
                       for src, e in box.items() if k < len(e.payload) and e.payload[k] is not None]
            distances.update(((src, k), d) for src, d in senders)
            channel = self.channels[k] if k < len(self.channels) else str(k)
            for (src, _), factor in zip(senders, self.robust.screen_round(channel, senders, own_norms[k], now)):
                if factor == REFUSED:
                    refused.add(src)
                elif factor < 1.0:
                    clips[(src, k)] = factor
        return clips, refused, distances


class ServesRounds:
    """The scheduling side of an algorithm built on ``NeighbourRounds`` (``self._rounds``):
    which round the topology is computed for, when to tick, and finished peers that keep
    answering their neighbours' rounds (module docstring, "Finished peers"). The owning
    algorithm's ``tick`` begins ``serve_round()`` with what it sends for a round."""

    _rounds: NeighbourRounds

    def topology_round(self) -> int:
        served = self._rounds.serve_round()
        return self._rounds.next_round() if served is None else served

    def busy(self) -> bool:
        return self._rounds.waiting

    def state_dict(self) -> dict:
        return {"round": self._rounds.round}

    def load_state_dict(self, state: dict, source: str) -> None:
        self._rounds.resume_at(state_int(state, "round"))

    def next_deadline(self) -> float:
        if self._rounds.serve_round() is not None:
            return -math.inf  # a neighbour began a round we have not: tick answers it now
        return self._rounds.deadline

    def training_done(self, step: int, now: float) -> None:
        """The trainer took its last step and lingers: keep taking part in the neighbours'
        rounds."""
        self._rounds.serving = True
