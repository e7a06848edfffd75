"""Where DiLoCo's trainer waits for the outer round in flight, and when, with overlap, it goes on
without it (p2p/averaging/diloco.py, "Overlap").

With ``overlap`` the trainer waits before the step that closes the next period while the round
is still in flight, and after its last step (so the last outer step is in the final model). It
waits there only while the round runs at its usual pace: once the round has run
``UNUSUAL`` times its usual wait it is held by something unusual (a cut or crashed neighbour it
waits for until its deadline, at least 2 s), and the trainer goes on; diloco.py skips the
boundaries the round is still in flight at (their steps go into the next Delta) and lands the
round when it ends. Issue 16 asks that training never wait out such a round. Measured with
bench/diloco_repair.py --overlap --compression sparseloco (20 Mbit/s, 4 peers on 2 cores, one
link cut for 2 rounds): waiting cost every peer 0.53-0.67x of its steady steps/s in the worst
4-s window of the cut (3 runs); going on, 0.90-1.06x (2 runs, stop 35), and 0.81-1.04x with the
``MIN_WAIT_S`` floor below (6 runs, stop 36; at least 0.91x of compute-only's mean steps/s).

At most once in ``PASS_EVERY`` outer steps, though: the gates are what hold the peers' rounds in
step. With no such limit the cut peer, back and behind, passed gate after gate, the others
waited for its late shares and passed theirs, and in 2 of 4 lab runs (tests/test_diloco_lab.py,
overlap) the copies kept falling apart, at 3x the codec's bytes a round; with it, 15 of 16 runs
of the test's two cases passed (the failure's case was not recorded), and CI's.
In the simulator a crashed peer held the survivors 0.57-0.64 s of 15 s of compute, 0.10-0.16 s
with the ratio alone and 0.32-0.38 s with the floor below (tests/test_diloco_overlap.py).

And only once the trainer itself has waited ``MIN_WAIT_S``: the usual wait is a round's length,
a few hundred ms, and on a loaded machine a round ran 1.25x that often enough. With the ratio
alone, 4 peers on 2 cores (bench/slow_links.py, examples/slow-links.toml, stop 36) went on
without rounds in steady state: 57-65 of 66 rounds began (65-66 before the rule), rounds fell
out of step (partial ones, a peer waiting 5.5 s in all), and train time rose to +17-22% over
compute-only at unlimited (+10-17% before). Without the rule (stop 34's runs) the trainer's
wait within one 0.5-s progress interval passed 0.3 s in 12 of 2405 intervals and 0.4 s in 2; a
cut neighbour holds a round for its whole deadline, at least 2 s. 0.3 s of a 4-s window is
0.925x of its steps.

The time the trainer waited is not compute: the schedule's step time leaves it out
(outer_schedule.py, ``paused``), and the dense rounds' rule judges a round by it (outer_dense.py).
"""

from __future__ import annotations

import math
from typing import Optional

UNUSUAL = 1.25  # a round this many times its usual wait is held by something unusual
PASS_EVERY = 4  # outer steps between two rounds the trainer went on without
MIN_WAIT_S = 0.3  # the trainer goes on only after waiting this long at the gate (docstring)


class TrainerGate:
    """The trainer's wait for the round in flight: since when, and whether it went on."""

    def __init__(self, overlap: bool) -> None:
        self.overlap = overlap
        self.blocked_since: Optional[float] = None  # when the trainer began waiting (not compute)
        self.waited: Optional[float] = None  # what it waited before it went on without the round
        self.finishing = False  # it took its last step: it waits for the round, whatever it takes
        self._passed_at = -PASS_EVERY  # the outer steps taken when it last went on without a round

    def may_go(self, now: float, began_at: float, usual_wait: Optional[float], outer_steps: int) -> bool:
        """The trainer is at a gate and the round is in flight: may it go on without it?"""
        if self.blocked_since is None:
            self.blocked_since = now
        if self.waited is not None:  # it went on without this round already
            return not self.finishing
        if now < self.release_at(began_at, usual_wait, outer_steps):
            return False
        self.waited = now - self.blocked_since
        self._passed_at = outer_steps
        return True

    def release_at(self, began_at: float, usual_wait: Optional[float], outer_steps: int) -> float:
        """When a trainer waiting at the gate goes on: once the round ran ``UNUSUAL`` times its
        usual wait and the trainer waited ``MIN_WAIT_S``. Never without overlap, before a round
        set the usual wait, after the last step, nor within ``PASS_EVERY`` outer steps of the
        last time; inf while not waiting."""
        if (not self.overlap or self.blocked_since is None or self.waited is not None or usual_wait is None
                or self.finishing or outer_steps < self._passed_at + PASS_EVERY):
            return math.inf
        return max(began_at + UNUSUAL * usual_wait, self.blocked_since + MIN_WAIT_S)

    def waited_for(self, now: float) -> float:
        """What the trainer has waited at the gate for the round in flight (0: it never waited;
        once it went on, what it would have waited: the dense rounds' rule judges the round by it)."""
        return 0.0 if self.blocked_since is None else now - self.blocked_since

    def landed(self, now: float) -> float:
        """The round landed: the seconds the trainer waited for it (the schedule's pause)."""
        paused = self.waited_for(now) if self.waited is None else self.waited
        self.blocked_since = self.waited = None
        return paused
