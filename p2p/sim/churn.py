"""The simulators' churn schedule: joins, crashes and graceful leaves at seeded times.

Theory of operation
-------------------
``Churn`` says how many members join, crash and leave, and when: each event at a uniform time
inside ``window``, a pair of fractions of the run's span (the membership simulator's duration,
the averaging simulator's nominal training time). ``schedule(rng, span_s)`` draws the times
from the RNG it is given in a fixed order (crashes, then leaves, then joins), so a seed replays
the same schedule. The simulators give churn an RNG stream of its own, so a scenario with
churn sees the same network draws as the one without until its first churn event.

Who is not decided in advance. A joiner is simply the next member not started yet; it joins
through a member ``pick``-ed among the running ones when its event fires. A crash or leave
picks its victim when it fires, uniformly among the members running then (joiners included),
and is skipped when that would leave fewer than ``floor`` members running: the schedule never
empties the swarm, whatever the order the events come in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

JOIN, CRASH, LEAVE = "join", "crash", "leave"


@dataclass(frozen=True)
class Churn:
    joins: int = 0  # members that start during the run, each through a running member
    crashes: int = 0  # running members that stop without a word (found by failure detection)
    leaves: int = 0  # running members that leave gracefully (announce it, then stop)
    window: tuple[float, float] = (0.25, 0.5)  # when, as fractions of the run's span
    floor: int = 1  # a crash or leave never takes the running members below this

    def __post_init__(self) -> None:
        for name in ("joins", "crashes", "leaves"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        lo, hi = self.window
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"churn window must be 0 <= lo <= hi <= 1, got {self.window}")
        if isinstance(self.floor, bool) or not isinstance(self.floor, int) or self.floor < 1:
            raise ValueError(f"churn floor must be an int >= 1, got {self.floor!r}")

    def schedule(self, rng: random.Random, span_s: float) -> list[tuple[float, str]]:
        """``(time, kind)`` of every churn event, kind JOIN, CRASH or LEAVE (not sorted)."""
        lo, hi = (f * span_s for f in self.window)
        kinds = [CRASH] * self.crashes + [LEAVE] * self.leaves + [JOIN] * self.joins
        return [(lo + rng.random() * (hi - lo), kind) for kind in kinds]

    def victim(self, rng: random.Random, running: Sequence[int]) -> Optional[int]:
        """The member a crash or leave firing now takes, or None (it would cross the floor)."""
        if len(running) <= self.floor:
            return None
        return pick(rng, running)


def pick(rng: random.Random, members: Sequence[int]) -> Optional[int]:
    """One of ``members`` uniformly (None if empty): one RNG draw."""
    if not members:
        return None
    return members[int(rng.random() * len(members))]
