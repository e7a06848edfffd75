"""Invariant checkers run on every membership-table change during a simulation.

A failed invariant raises ``InvariantViolation`` whose message names the run's seed, the
simulated time, the observer and the member, so the run can be replayed exactly.

Checked on each change of one observer's row about one member (``observe``):

1. no member holds itself DEAD (it must refute), nor LEFT unless it is leaving;
2. a member's own incarnation, and the incarnation of any row while held, never decreases;
3. a row that went DEAD/LEFT at incarnation i only comes back ALIVE/SUSPECT at an incarnation > i.

The simulator also checks that ``tick(now)`` always moves ``next_deadline()`` past ``now``.
"""

from __future__ import annotations

from typing import Optional

from p2p.gossip.messages import DEAD, LEFT, STATE_NAMES, SUSPECT


class InvariantViolation(AssertionError):
    """A protocol invariant failed; the message names the seed to replay."""

    def __init__(self, seed: int, now: float, text: str) -> None:
        super().__init__(f"invariant violated (seed={seed}, t={now:.3f}s): {text}")
        self.seed = seed
        self.now = now
        self.text = text


def _name(state: Optional[int]) -> str:
    return "absent" if state is None else STATE_NAMES[state]


class InvariantChecker:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.checked = 0

    def fail(self, now: float, text: str) -> None:
        raise InvariantViolation(self.seed, now, text)

    def observe(self, now: float, observer: str, member: str, old_state: Optional[int], old_inc: int,
                new_state: Optional[int], new_inc: int, observer_leaving: bool = False) -> None:
        """Check one row change in ``observer``'s table; raises InvariantViolation."""
        self.checked += 1
        if new_state is None:  # reaped: allowed for dead/left rows only
            if old_state is not None and old_state <= SUSPECT:
                self.fail(now, f"{observer} reaped {member} while it was {_name(old_state)}")
            return
        if member == observer:
            if new_state == DEAD or (new_state == LEFT and not observer_leaving):
                self.fail(now, f"{observer} marked itself {_name(new_state)} at incarnation {new_inc}")
        if old_state is None:
            return
        if new_inc < old_inc:
            self.fail(now, f"{observer}'s row for {member} went from incarnation {old_inc} "
                           f"({_name(old_state)}) down to {new_inc} ({_name(new_state)})")
        if old_state >= DEAD and new_state <= SUSPECT and new_inc <= old_inc:
            self.fail(now, f"{observer} took {member} back as {_name(new_state)} at incarnation "
                           f"{new_inc} after it was {_name(old_state)} at {old_inc}")
