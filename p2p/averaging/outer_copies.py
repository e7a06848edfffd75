"""Which DiLoCo copies of the outer parameters are apart, and how each is mended.

DiLoCo (p2p/averaging/diloco.py) keeps one copy of theta_start per peer; on ``full`` they stay
equal because every peer takes the same outer step. This module holds the decisions about
copies that fell apart; the mending itself (a pull from one donor, ``propagate``) lives in
``outer_repair.py``, and DiLoCo applies the corrections.

- **Apart or not.** Every share carries a sketch of its sender's theta_start (``round_finished``
  compares them with ours when the round ends). The largest group of matching sketches is the
  reference (``outer_repair.reference_group``); a peer outside it mends its copy, the others do
  nothing, so no repair ever answers another. A share robust mixing refused is no copy to
  compare. One repair at a time, and none from sketches taken before the last one landed.
  Finished peers too: they keep serving the neighbours' rounds, and one with a copy apart took
  every outer step it served on the wrong theta_start (seen in CI: a peer that finished before
  a late joiner's rounds ended at 0.41 accuracy while the others agreed at 0.78).
- **Replay first.** Most copies fall apart by one round's average, not by missed rounds: a
  share that reached some peers in time and others after their round's deadline leaves the two
  sides with averages over different sets. Each share names whose Deltas its sender's previous
  round averaged (``mixed``; empty when staleness weights were used), and each peer keeps the
  decoded Deltas of the last two rounds, late ones included (``REPLAY_BUDGET_BYTES`` at most). A
  peer that agreed with the reference one round ago and holds every Delta the reference averaged
  recomputes their average (clipped and screened as they did it: robust mixing there is a
  function of the set, robust.py "One answer for one set") and corrects its copy by the difference:
  d m = d Delta, d theta_start = -lr (1 + mu) d Delta. No model travels.
- **Else catch up or pull** from the reference's member with the fastest measured link: replay
  the rounds since we last agreed from its log of compressed shares when that is small
  (outer_catchup.py: a few rounds of a sparse codec), else pull its (theta_start, momentum)
  (outer_repair.py). diloco.py picks which when it takes the outer step.
- **A pull must still fit.** The pulled state is the donor's as of its round R, carried to ours
  by ``propagate``, which holds only if every outer step we took since R used the donor's
  average. The donor's share of round r names whose Deltas it averaged in round r - 1: the same
  set as ours, or the pull is dropped before it lands a wrong correction (seen in the lab: a peer
  that began a pull while cut off, mixed alone for three rounds and jumped, landed a copy as far
  apart as before, 30 rounds later). Also when the donor's share is missing: nothing vouches for
  that round. (Dropping the pull at any round of ours that missed a share was tried: at 20
  Mbit/s such rounds are common, and a joiner's pulls never completed in a 1200-step run.)

Pure state, no I/O.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from p2p.averaging.base import Disagreement
from p2p.averaging.outer_repair import RepairPuller, reference_group
from p2p.averaging.robust import RobustMixing, robust_mean
from p2p.compression.sparse import dense
from p2p.bandwidth import BandwidthMonitor

SKETCH_SIZE = 256  # entries of theta_start in a share's sketch
# Copies whose sketches differ by more than this (relative L2) are repaired. Float rounding
# drifts copies apart by ~1e-7 per outer step; one missed Delta moves them by ~1e-2.
SKETCH_RTOL = 1e-4
REPLAY_BUDGET_BYTES = 512 * 2**20  # at most this much memory for the Deltas kept for replay repairs
_SELF = ""  # our own key among the sketches before our address is known (no address is empty)


def sketch_positions(numel: int) -> np.ndarray:
    """The fixed theta_start positions every peer samples (evenly spread, all tensors)."""
    return np.unique(np.linspace(0, max(numel - 1, 0), min(SKETCH_SIZE, numel)).astype(np.int64))


def sketches_differ(mine: np.ndarray, theirs: np.ndarray) -> bool:
    return float(np.linalg.norm(theirs - mine)) > SKETCH_RTOL * (float(np.linalg.norm(mine)) + 1e-30)


class CopyWatch:
    """One per DiLoCo peer: the neighbours' sketches and ``mixed`` lists, the Deltas and
    averages kept for replays, and the repair decided (module docstring). DiLoCo takes the
    decision: ``replay`` (a correction to apply) or ``pull_from`` (a donor to pull from)."""

    def __init__(self, outer_lr: float, outer_momentum: float, robust: RobustMixing, pullers: Sequence[RepairPuller],
                 monitor: BandwidthMonitor, disagreement: Disagreement, stats: dict[str, int],
                 on_agreed: Callable[[int], None] = lambda r: None) -> None:
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        # The pull and the catch-up (outer_catchup.py, same surface): at most one repair at a time.
        self.robust, self.pullers, self.monitor = robust, tuple(pullers), monitor
        self.on_agreed = on_agreed  # told each round whose sketches put us in the reference group
        self.disagreement, self.stats = disagreement, stats
        self.self_addr: Optional[str] = None  # ours: it names us in the neighbours' ``mixed`` lists
        self.replay: Optional[tuple[int, np.ndarray, np.ndarray]] = None  # (round, d theta_start, d momentum)
        self.replayed_set: tuple = ()  # (round, the set it averaged) of the last replay decided
        self.pull_from: Optional[str] = None  # the donor to pull from after this outer step
        self.mixed_last: tuple = ()  # whose Deltas our last round averaged (sent with our next share)
        self._fresh_from = 0  # rounds begun before this one compared copies from before a repair
        self._theirs: dict[int, dict[str, tuple]] = {}  # round -> sender -> (sketch, step, mixed)
        self._deltas: dict[int, dict[str, np.ndarray]] = {}
        self._averaged: dict[int, np.ndarray] = {}
        self._mixed_at: dict[int, tuple] = {}  # round -> mixed_last after it (a pull's check)
        self._agreed_at = -1  # the last round whose sketches put us in the reference group

    # -- what the rounds bring -------------------------------------------------------------
    def share_received(self, round: int, src: str, sketch: np.ndarray, step: int, mixed: tuple,
                       buffered) -> None:
        """A neighbour's share the rounds took (``buffered``: the rounds they still hold)."""
        self._theirs = {k: v for k, v in self._theirs.items() if k in buffered}
        self._theirs.setdefault(round, {})[src] = (sketch.copy(), step, mixed)  # off the receive buffer

    def keep_delta(self, round: int, current: int, src: Optional[str], delta: np.ndarray) -> None:
        """Keep a round's decoded Delta for replays (the two rounds either side of ``current``,
        within ``REPLAY_BUDGET_BYTES``)."""
        if src is None or not current - 2 <= round <= current + 2:
            return
        self._deltas = {k: v for k, v in self._deltas.items() if k >= current - 2}
        if (1 + sum(map(len, self._deltas.values()))) * delta.nbytes > REPLAY_BUDGET_BYTES:
            return
        self._deltas.setdefault(round, {})[src] = delta

    def note_average(self, r: int, average: np.ndarray, mixed, exact: bool, names: Optional[tuple] = None) -> None:
        """Round ``r``'s average, and whose Deltas it took (``mixed``, or ``names`` as given: a
        reduce-scatter round's per-slice owners and sets, outer_scatter.py). Not replayable when
        a Delta was down-weighted by staleness: () says "unknown". A clipped one is replayable:
        the clipping is a function of the set (robust.py, "One answer for one set")."""
        self._averaged = {k: v for k, v in self._averaged.items() if k >= r - 1}
        self._averaged[r] = average
        if not exact or self.self_addr is None:
            self.mixed_last = ()
        else:
            self.mixed_last = names or tuple(sorted((mixed.senders - mixed.refused) | {self.self_addr}))
        self._mixed_at = {k: v for k, v in self._mixed_at.items() if k >= r - 2}
        self._mixed_at[r] = self.mixed_last

    def repaired(self, current: int) -> None:
        """A correction landed: sketches of rounds begun before ``current`` are stale, and the
        last agreement no longer vouches for our copy (a replay from it would apply the same
        difference again: a finished peer compares final sketches of one round more than once,
        diloco.py "Finished peers")."""
        self._fresh_from = current
        self._agreed_at = -1

    # -- the decision ----------------------------------------------------------------------
    def round_finished(self, r: int, refused: frozenset, sketch: np.ndarray, step: int, decide: bool) -> None:
        """Round ``r`` finished with our theta_start ``sketch``: check a pull in flight, measure
        the disagreement, and (``decide``: one outer round mixes the whole Delta, so copies
        should be equal) decide a replay or a pull if we are outside the reference group."""
        theirs = self._theirs.pop(r, {})
        self._theirs = {k: v for k, v in self._theirs.items() if k > r}
        self._check_pull(r, theirs)
        sketches = {}
        for src, (their_sketch, their_step, _) in theirs.items():
            if src in refused:
                continue
            self.disagreement.observe(their_sketch - sketch, sketch)
            if sketches_differ(sketch, their_sketch):
                self.stats["copies_apart"] += 1
            sketches[src] = (their_sketch, their_step)
        busy = any(p.active for p in self.pullers)
        if not decide or not sketches or r < self._fresh_from or busy or self.replay is not None:
            return  # one repair at a time
        me = self.self_addr or _SELF
        reference = reference_group({**sketches, me: (sketch, step)}, sketches_differ)
        if me in reference:
            self._agreed_at = r
            self.on_agreed(r)  # the catch-up's base: this round's start (outer_catchup.py)
            return
        if self._replay_from(r, reference, theirs):
            return
        links = self.monitor.links
        self.pull_from = max(sorted(reference), key=lambda j: links[j].throughput_bps or 0 if j in links else 0)

    def _check_pull(self, r: int, theirs: dict) -> None:
        """Drop a pull whose donor's outer steps no longer match ours (module docstring)."""
        for puller in self.pullers:
            pull = puller.pull or puller.done
            if pull is None or r - 1 < pull.round:
                continue
            named = theirs.get(pull.donor, (None, None, ()))[2]
            if not named or named != self._mixed_at.get(r - 1):
                self.stats["repairs_diverged"] += 1
                puller.abandon()

    def _replay_from(self, r: int, reference: set[str], theirs: dict) -> bool:
        """Our copy agreed with the reference group's one round ago, so only round r - 1's
        average differs: recompute theirs from the Deltas we kept and correct ours by the
        difference (module docstring, "Replay first"). False: pull instead."""
        prev = r - 1
        if self._agreed_at != prev or self.self_addr is None or prev not in self._averaged:
            return False
        lists = [theirs[j][2] for j in sorted(reference) if j in theirs and theirs[j][2]]
        if not lists or any(other != lists[0] for other in lists[1:]):
            return False  # the group must agree on what it averaged (one liar cannot steer us)
        kept = self._deltas.get(prev, {})
        if any(s not in kept for s in lists[0]):
            self.stats["replays_missing"] += 1
            return False
        vectors = [kept[s] for s in lists[0]]
        if self.robust.enabled:  # the reference clipped the same set the same way (robust.py)
            average, _, _ = robust_mean(vectors, self.robust.config.factor)
        else:
            average = np.sum([dense(v) for v in vectors], axis=0, dtype=np.float32) / np.float32(len(vectors))
        d = average - self._averaged[prev]
        self.replay = (r, np.float32(-self.outer_lr * (1 + self.outer_momentum)) * d, d)
        self.replayed_set = (prev, tuple(lists[0]))
        self.stats["repairs_replayed"] += 1
        return True
