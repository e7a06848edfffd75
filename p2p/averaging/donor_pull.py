"""One transfer from one donor, one request in flight: the deadline, retry and drop rules that
the full pull (outer_repair.py) and the catch-up (outer_catchup.py) share.

Why one place: both repair a DiLoCo copy from a single donor in the background, and both must
stay bounded the same way (issue 16: "a failed repair must not trigger a bigger one"):

- A request's deadline is its expected bytes / the measured link rate (p2p/bandwidth.py; 10
  Mbit/s assumed before the first answer) x ``DEADLINE_SLACK``, plus the wait the subclass
  names (a donor that answers when its round ends), never under ``MIN_DEADLINE_S``.
- Past it the attempt fails (counted); after a backoff that doubles with every failure (from one
  deadline, capped at ``MAX_BACKOFF_S``) the subclass asks again, for no more than the attempt
  before; an answer to the earlier ask is still taken meanwhile.
- After ``MAX_ATTEMPTS`` failures the transfer is dropped, and a new one waits out the backoff;
  a transfer whose donor left our neighbours is dropped at once. The next round's sketches
  decide afresh (outer_copies.py).
- An answer paces the next ask: after one that took t seconds, the next goes out
  t (1 / share - 1) seconds later, so the transfer takes at most ``share`` of the link.

Subclasses keep their transfer in ``self.pull`` (anything with a ``donor``), put a finished one
in ``self.done`` via ``_finish``, and implement ``_ask() -> (message, expected bytes, wait_s)``.
Pure state, no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from p2p.bandwidth import BandwidthMonitor
from p2p.protocol import Send

ASSUMED_RATE_BPS = 1.25e6  # bytes/s a deadline assumes before any rate is measured (10 Mbit/s)
DEADLINE_SLACK = 4.0  # a request may take this many times its bytes / the measured rate
MIN_DEADLINE_S = 0.5  # ... but never less (a round trip, a busy donor)
MAX_ATTEMPTS = 4  # failed attempts before the transfer is dropped (the sketches decide again)
MAX_BACKOFF_S = 60.0


class DonorPull:
    """At most one transfer from one donor, at most one request of it in flight (module docstring)."""

    def __init__(self, monitor: BandwidthMonitor, stats: dict[str, int]) -> None:
        self.monitor, self.stats = monitor, stats
        self.pull: Optional[Any] = None  # the transfer in flight (the subclass's)
        self.done: Optional[Any] = None  # finished, not applied yet (a ``Pulled``)
        self._asked_at = math.inf  # when the request in flight went out (inf: none in flight)
        self._deadline = math.inf
        self._retry_at = -math.inf  # none in flight: ask from then on
        self._failures = 0  # attempts given up in this transfer
        self._backoff_s = 0.0  # doubles with every failed attempt, this transfer's or the last one's
        self._not_before = -math.inf  # a new transfer's first ask (after one that was dropped)

    @property
    def active(self) -> bool:
        return self.pull is not None or self.done is not None

    @property
    def asking(self) -> bool:
        """A request is in flight (not backing off, not pacing)."""
        return self.pull is not None and self._asked_at < math.inf

    def _ask(self) -> tuple[object, int, float]:
        """The request to send now, its expected answer bytes, and the extra wait it may need."""
        raise NotImplementedError

    def _start(self, pull: Any) -> None:
        self.pull = pull
        self._asked_at, self._deadline, self._retry_at, self._failures = math.inf, math.inf, self._not_before, 0
        self.stats["repairs_started"] += 1

    def next_deadline(self) -> float:
        if self.pull is None:
            return math.inf
        return self._deadline if self._asked_at < math.inf else self._retry_at

    def timeout(self, nbytes: int) -> float:
        """A request's deadline for ``nbytes`` of answer (module docstring)."""
        link = self.monitor.links.get(self.pull.donor) if self.pull is not None else None
        rate = (link.throughput_bps if link is not None else None) or ASSUMED_RATE_BPS
        return max(MIN_DEADLINE_S, DEADLINE_SLACK * nbytes / rate)

    def tick(self, now: float) -> list[Send]:
        """Ask when nothing is in flight and the pacing / backoff allow; fail a request past its deadline."""
        if self.pull is None:
            return []
        if self._asked_at < math.inf:
            if now >= self._deadline:
                self.stats["repair_chunks_missed"] += 1
                self._fail(now)
            return []
        if now < self._retry_at:
            return []
        msg, nbytes, wait_s = self._ask()
        self._asked_at = now
        self._deadline = now + min(MAX_BACKOFF_S, self.timeout(nbytes) + wait_s)
        return [Send(self.pull.donor, msg)]

    def _fail(self, now: float) -> None:
        self.stats["repairs_failed"] += 1
        self._failures += 1
        self._backoff_s = min(MAX_BACKOFF_S, max(2 * self._backoff_s, self._deadline - self._asked_at))
        self._asked_at, self._deadline, self._retry_at = math.inf, math.inf, now + self._backoff_s
        if self._failures >= MAX_ATTEMPTS:
            self.pull, self._not_before = None, self._retry_at

    def _answered(self, src: str, nbytes: int, now: float, share: float) -> None:
        """The request in flight was answered in full (``nbytes``): measure the link, pace the next ask."""
        took = max(0.0, now - self._asked_at) if self._asked_at < math.inf else 0.0
        if took > 0:
            self.monitor.observe(src, nbytes, took)
        self._asked_at, self._deadline, self._retry_at = math.inf, math.inf, now + took * (1 / share - 1)

    def _finish(self, done: Any) -> None:
        self.done, self.pull, self._backoff_s = done, None, 0.0

    def _drop(self, reason: str) -> None:
        """The donor cannot serve this transfer (``reason``: the counter saying why)."""
        self.stats["repairs_failed"] += 1
        self.stats[reason] += 1
        self.pull = None

    def abandon(self) -> None:
        """Drop the transfer in flight or its unapplied result (its state would not fit ours:
        diloco.py ``_check_pull``); the next round's sketches decide afresh."""
        if self.pull is not None or self.done is not None:
            self.stats["repairs_failed"] += 1
            self.pull = self.done = None

    def drop_if_donor_gone(self, neighbours: Sequence[str]) -> None:
        """The donor left our neighbours (dead, left, cut off): drop at once rather than ask it
        again after ever longer backoffs; the next round's sketches pick a live donor."""
        if self.pull is not None and self.pull.donor not in neighbours:
            self._drop("repair_donors_gone")

    def take(self) -> Optional[Any]:
        done, self.done = self.done, None
        if done is not None:
            self.stats["repairs_completed"] += 1
        return done
