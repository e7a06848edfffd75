"""The machinery that mends a DiLoCo copy, both sides, as diloco.py drives it.

outer_copies.py decides who is apart and from whom to mend; this holds what carries it out:

- **Donor side**: ``RepairDonor`` serves pulls of (theta_start, momentum) (outer_repair.py);
  ``ShareLog`` keeps the last rounds' packed shares and serves catch-ups (outer_catchup.py).
- **Puller side**: at most one transfer at a time, a catch-up when the rounds since our base
  fit the log (``CatchUpPuller.begin`` says), else the full pull (``RepairPuller``).

diloco.py routes the repair messages here (``receive``), tells it when a round begins and when
its outer step is taken, asks it to begin a repair, and lands what ``take`` hands back. Pure
state, no I/O.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from p2p.averaging.outer_catchup import (LOG_ROUNDS, CatchUpMissing, CatchUpPuller, CatchUpRange, CatchUpRequest,
                                         CatchUpShare, ShareLog)
from p2p.averaging.outer_repair import Pulled, RepairChunk, RepairDonor, RepairPuller, RepairRequest
from p2p.averaging.robust import RobustMixing
from p2p.bandwidth import BandwidthMonitor
from p2p.compression.codecs import Compressed
from p2p.protocol import Send

MESSAGES = (RepairRequest, RepairChunk, CatchUpRequest, CatchUpShare, CatchUpMissing, CatchUpRange)
# Pulls and catch-ups started / completed / failed, outer steps taken while one was in flight,
# bytes pulled and served, requests that missed their deadline, answers nobody asked for, ...
STATS = ("repairs_started", "repairs_completed", "repairs_failed", "repair_rounds", "repair_bytes",
         "repair_bytes_served", "repair_chunks_missed", "repair_chunks_unasked", "repair_stale",
         "repair_donors_gone", "repairs_replayed", "replays_missing", "repairs_diverged",
         "catch_ups_started", "catch_ups_completed", "repair_in_flight")
# A round passed by (rounds.py, "Passed by") ends early only on a neighbour's vector fewer rounds
# past ours than this: no further than a catch-up replays, so the jump it leads to stays mendable
# by the rounds' shares (outer_catchup.py), never by the full pull.
PASSED_WITHIN = LOG_ROUNDS


class Mending:
    """One per DiLoCo peer (module docstring). ``log_budget`` 0: no catch-ups (no codec, or a
    round whose shares no peer holds whole: diloco.py)."""

    def __init__(self, numel: int, model_key: str, stats: dict[str, int], monitor: BandwidthMonitor,
                 outer_lr: float, outer_momentum: float, robust: RobustMixing, log_budget: int) -> None:
        for key in STATS:
            stats[key] = 0
        self.stats = stats
        self.donor = RepairDonor(numel, model_key, stats)
        self.puller = RepairPuller(numel, model_key, monitor, stats, momentum=outer_momentum != 0)
        self.log = ShareLog(numel, model_key, stats, log_budget)
        self.catchup = CatchUpPuller(numel, model_key, monitor, stats, outer_lr, outer_momentum, robust, log_budget)
        self.pullers = (self.puller, self.catchup)  # the same surface; at most one active
        self._share_bytes = 0  # our last packed share's bytes (a catch-up's estimate)

    # -- diloco.py's round ----------------------------------------------------------------------
    def round_begins(self, r: int, own: str, packed: Optional[Compressed], start: np.ndarray,
                     momentum: np.ndarray) -> None:
        """Round ``r`` begins from (start, momentum) with our packed share: logged, and the
        catch-up's base should the round's sketches agree."""
        if self.log.budget and packed is not None:
            self._share_bytes = packed.nbytes
            self.log.keep(r, own, packed, r)
            self.catchup.note_begin(r, start, momentum)

    def agreed(self, r: int) -> None:
        """Round ``r``'s sketches put us in the reference group: its start is the catch-up's
        base, and the rounds before it may be served (outer_catchup.py)."""
        self.catchup.note_agreed(r)
        self.log.confirm_before(r)

    def share_in(self, r: int, src: str, packed: Compressed, current: int) -> None:
        """A neighbour's packed share of round ``r`` (late ones too): logged for catch-ups."""
        if self.log.budget:
            self.log.keep(r, src, packed, current)

    def outer_step(self, current: int, state: tuple[np.ndarray, np.ndarray], mixed: tuple, now: float) -> list[Send]:
        """Our outer step closed round ``current - 1`` (averaging ``mixed``); ``state``: ours now.
        Counts it as a repair round when one is in flight; serves what waited for it."""
        self.stats["repair_in_flight"] = int(self.in_flight)
        if self.in_flight:
            self.stats["repair_rounds"] += 1
        return self.donor.outer_step(current, state, now) + self.log.sealed(current - 1, mixed)

    def begin(self, donor: str, current: int, state: tuple[np.ndarray, np.ndarray], now: float, senders: int,
              wait_s: float) -> None:
        """Mend from ``donor``: replay the rounds missed from its log when that is small (a few
        rounds of a sparse codec), else pull its state (outer_catchup.py, "When")."""
        if not self.catchup.begin(donor, current, state, now, self._share_bytes, senders, wait_s):
            self.puller.begin(donor, current, state, now)

    # -- the transfers ------------------------------------------------------------------------
    @property
    def in_flight(self) -> bool:
        return any(p.active for p in self.pullers)

    @property
    def landed(self) -> bool:
        """A finished transfer waits for ``take``."""
        return any(p.done is not None for p in self.pullers)

    def next_deadline(self) -> float:
        return min(math.inf, *(p.next_deadline() for p in self.pullers))

    def take(self) -> list[Pulled]:
        pulled, caught_up = self.puller.take(), self.catchup.take()
        if caught_up is not None:  # the swarm's state at its round: one more catch-up's base
            self.catchup.note_landed(caught_up)
        out = [done for done in (pulled, caught_up) if done is not None]
        self.stats["repair_in_flight"] = int(self.in_flight)  # not 1 until the next tick: status reads it
        return out

    def receive(self, src: str, msg: object, now: float, current: int,
                state: tuple[np.ndarray, np.ndarray]) -> list[Send]:
        """One of ``MESSAGES`` (``current``: our round in flight or next; ``state``: ours)."""
        if isinstance(msg, RepairRequest):
            return self.donor.receive(src, msg, current, state, now)
        if isinstance(msg, (CatchUpRange, CatchUpRequest)):
            return self.log.receive(src, msg, current)
        (self.puller if isinstance(msg, RepairChunk) else self.catchup).receive(src, msg, now)
        return []

    def drop_if_donor_gone(self, neighbours: Sequence[str]) -> None:
        for p in self.pullers:
            p.drop_if_donor_gone(neighbours)

    def tick(self, now: float) -> list[Send]:
        sends = self.puller.tick(now) + self.catchup.tick(now)
        self.stats["repair_in_flight"] = int(self.in_flight)  # status: 1 while one runs
        return sends
