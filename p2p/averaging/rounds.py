"""Synchronous neighbour-averaging rounds: the engine under D-PSGD, GossipGraD and DiLoCo.

Theory of operation. A round r is one mixing step of a doubly stochastic matrix W (Xiao & Boyd
2004): the peer sends its vector(s) tagged (r, its degree d_i) to its neighbours, waits until
``len(neighbours)`` round-r vectors arrived (every topology here has in-degree = out-degree) or
the round timeout passed, then mixes with Metropolis-Hastings weights

    v_i <- v_i + sum_j w_ij (v_j - v_i),   w_ij = 1 / (1 + max(d_i, d_j))  [x staleness factor]

over the vectors that arrived. A missing neighbour is dropped from that round: its weight stays
on v_i, so the row stays stochastic (the swarm mean drifts by that one asymmetric term).

States: idle (between rounds) and waiting (round r begun, ``deadline`` set). Vectors for later
rounds are buffered (at most ``MAX_BUFFERED_ROUNDS`` rounds, one vector per sender per round);
vectors for rounds already finished are late: counted and dropped, never mixed.

Round alignment without a clock: rounds are numbered by the peers, not by time. A peer that
falls behind (a joiner starting at 0, a straggler whose neighbours timed out on it) learns it
from a vector two or more rounds ahead of it: in lock step on a symmetric graph a neighbour can
be at most one round ahead (it needs our vector for the round in between). Such a vector ends
the current wait at once, and the next round begins at the highest round buffered. So a joiner
costs at most one round timeout; a lying peer can only push rounds forward, costing the same.

Invariants: ``round`` never decreases; nothing is mixed twice; at most one round in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from p2p.averaging.base import staleness_weight
from p2p.protocol import RemoteProtocolError

INF = float("inf")
MAX_BUFFERED_ROUNDS = 4  # future rounds kept per peer (a joiner needs only the newest)
MAX_SENDERS_PER_ROUND = 1024  # vectors kept per round (bounds memory under a flood)
MAX_DEGREE = 1 << 20


@dataclass(frozen=True)
class Entry:
    degree: int  # the sender's neighbour count this round
    step: int  # the sender's local step count (staleness)
    payload: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class Mixed:
    payload: tuple[np.ndarray, ...]  # the mixed vectors
    deltas: tuple[np.ndarray, ...]  # mixed - own, per vector
    received: int  # how many neighbours' vectors went in
    expected: int  # how many were awaited


class NeighbourRounds:
    """One synchronous averaging round at a time (module docstring). Pure state, no I/O: the
    owning algorithm builds and sends the messages and validates their tensors."""

    def __init__(self, timeout_s: float, stats: dict[str, int], prefix: str = "") -> None:
        self.timeout_s = timeout_s
        self.round = 0  # the current round while waiting; the next one to begin while idle
        self.waiting = False
        self.deadline = INF
        self._abort = False
        self._expected = 0
        self._degree = 0
        self._own: tuple[np.ndarray, ...] = ()
        self._inbox: dict[int, dict[str, Entry]] = {}
        self.stats = stats
        self._k = {name: prefix + name for name in
                   ("exchanges_started", "exchanges_completed", "rounds_partial", "late", "jumps",
                    "duplicates", "overflow")}
        for key in self._k.values():
            stats.setdefault(key, 0)

    def _count(self, name: str) -> None:
        self.stats[self._k[name]] += 1

    def next_round(self) -> int:
        """The round the next ``begin`` uses: ours, or the highest buffered one if a neighbour is
        two or more rounds ahead (we fell behind)."""
        if self.waiting:
            return self.round
        ahead = max(self._inbox, default=self.round)
        return ahead if ahead >= self.round + 2 else self.round

    def begin(self, now: float, neighbours: Sequence[str], payload: tuple[np.ndarray, ...]) -> int:
        """Start the next round with our ``payload``; returns its number (tag the sends with it)."""
        if self.waiting:
            raise AssertionError("begin() while a round is in flight")
        r = self.next_round()
        if r > self.round:
            self._count("jumps")
            self._inbox = {k: v for k, v in self._inbox.items() if k >= r}
        self.round = r
        self.waiting, self._abort = True, False
        self.deadline = now + self.timeout_s
        self._expected = self._degree = len(neighbours)
        self._own = payload
        self._count("exchanges_started")
        return r

    def offer(self, src: str, round: int, degree: int, step: int, payload: tuple[np.ndarray, ...]) -> bool:
        """Buffer a neighbour's round vector (tensors already checked). False if dropped."""
        if round < 0 or not 0 <= degree <= MAX_DEGREE:
            raise RemoteProtocolError("bad_value", f"round {round}, degree {degree}")
        if round < self.round:
            self._count("late")
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
        if self.waiting and round >= self.round + 2:
            self._abort = True  # we fell behind: stop waiting for a round nobody will finish
        return True

    def advance_to(self, round: int) -> None:
        """Skip ahead to ``round`` while idle (an algorithm aligning two round counters)."""
        if self.waiting:
            raise AssertionError("advance_to() while a round is in flight")
        if round > self.round:
            self.round = round
            self._inbox = {k: v for k, v in self._inbox.items() if k >= round}

    def ready(self, now: float) -> bool:
        """The round in flight can be finished (all in, timed out, or we fell behind)."""
        if not self.waiting:
            return False
        got = len(self._inbox.get(self.round, ()))
        return got >= self._expected or now >= self.deadline or self._abort

    def finish(self, my_step: int, staleness_tau: Optional[float] = None) -> Mixed:
        """Mix what arrived for the round in flight and move to the next round."""
        if not self.waiting:
            raise AssertionError("finish() with no round in flight")
        box = self._inbox.pop(self.round, {})
        own = self._own
        acc = [np.zeros_like(a) for a in own]
        for entry in box.values():
            w = 1.0 / (1.0 + max(self._degree, entry.degree))
            if staleness_tau is not None:
                w *= staleness_weight(my_step, entry.step, staleness_tau)
            for k, (mine, theirs) in enumerate(zip(own, entry.payload)):
                acc[k] += np.float32(w) * (theirs - mine)
        mixed = tuple(mine + delta for mine, delta in zip(own, acc))
        self._count("exchanges_completed")
        if len(box) < self._expected:
            self._count("rounds_partial")
        result = Mixed(mixed, tuple(acc), len(box), self._expected)
        self.round += 1
        self.waiting, self._abort, self.deadline, self._own = False, False, INF, ()
        return result
