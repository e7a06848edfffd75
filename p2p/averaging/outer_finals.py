"""DiLoCo's final sketches: the copy the last outer round left apart, compared after training.

Finished DiLoCo peers keep serving their neighbours' rounds (diloco.py, "Finished peers"), but no
round follows the last one, so nothing compared the copies it left: a share of the last round
lost, or late for one peer's deadline (and copies apart before the end whose repair had not
landed), left that peer's final model apart for good. Seen in the simulator
(tests/test_diloco_end.py: 4 peers at 0.05 Mbit/s, 2% message loss): 3 seeds of 8 ended with a
copy apart by 0.33-0.84x the initial consensus distance, 2 of them still after a 10 s linger
(one checked: still after 60 s).

So a finished peer sends its final sketch (``OuterDone``: its round count, step, sketch and the
set its last round averaged) to its neighbours when it finishes, after every outer step or
correction it takes since, and again now and then (doubling from ``first_every_s`` to
``FINAL_EVERY_MAX_S``: one lost is sent again). Once a finished peer holds the final sketch of
every neighbour, and those of its own round are most of the swarm, diloco.py compares them as a
round's sketches (outer_copies.py): outside the reference group it mends its copy, by a replay
from the Deltas it kept or a pull, as after any round. Only with one gossip round per outer step
(``full``): on sparse graphs the copies differ by design.

Pure state, no I/O: this holds the neighbours' finals and when ours is due; diloco.py checks the
messages, builds ours and takes the decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from p2p.wire import message

FINAL_EVERY_MAX_S = 60.0  # a finished peer sends its final sketch again at most this far apart
MAX_FINALS = 4096  # neighbours' finals kept (as diloco.MAX_MIXED: a round's senders)


@message(35)
@dataclass(frozen=True)
class OuterDone:
    """A finished peer's final sketch (module docstring)."""

    round: int  # the sender's round count: its sketch is of theta_start after round - 1
    step: int  # its last step
    model_key: str
    sketch: np.ndarray  # its theta_start at sketch_positions
    mixed: tuple = ()  # whose Deltas its last round averaged (as OuterShare.mixed)


class FinalSketches:
    """The neighbours' final sketches and the schedule of ours (module docstring)."""

    def __init__(self, first_every_s: float) -> None:
        self.first_every_s = first_every_s
        self._finals: dict[str, tuple[int, np.ndarray, int, tuple]] = {}  # sender -> (round, sketch, step, mixed)
        self.next_at, self._every = math.inf, first_every_s  # when ours goes out next (-inf: now)
        self._new = False  # a final came, or ours changed, since the last comparison

    def changed(self, new_round: bool) -> None:
        """Our theta_start moved (or we just finished): ours goes out now. ``new_round``: compare
        with the neighbours' finals of our new round; not after a correction (the finals that
        decided it would only decide it again)."""
        self.next_at, self._every = -math.inf, self.first_every_s
        self._new = self._new or new_round

    def due(self, now: float) -> bool:
        """Ours goes out now: when it changed, and again with a doubling backoff."""
        if now < self.next_at or self.next_at == math.inf:
            return False
        if self.next_at > -math.inf:
            self._every = min(FINAL_EVERY_MAX_S, 2 * self._every)
        self.next_at = now + self._every
        return True

    def store(self, src: str, msg: OuterDone) -> None:
        """A neighbour's final (already checked), off the receive buffer; bounded."""
        if src not in self._finals and len(self._finals) >= MAX_FINALS:
            return
        self._finals[src] = (msg.round, msg.sketch.copy(), msg.step, msg.mixed)
        self._new = True

    def comparable(self, round: int, neighbours: Sequence[str]) -> Optional[dict[str, tuple]]:
        """The finals of ``round`` to compare ours with, once something changed, every neighbour's
        final is in, and most of the swarm is at ``round`` (a part could pick another group; the
        finals of an earlier round, before a round served since, are not copies to compare with
        ours); else None."""
        if not self._new or not neighbours:
            return None
        self._finals = {j: f for j, f in self._finals.items() if j in neighbours}
        swarm = len(set(neighbours)) + 1
        ours = {j: f for j, f in self._finals.items() if f[0] == round}
        if len(self._finals) < swarm - 1 or 2 * (len(ours) + 1) <= swarm:
            return None
        self._new = False
        return ours
