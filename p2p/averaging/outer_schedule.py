"""DiLoCo's inner-step count H, fixed or chosen from the link (``--diloco-inner-steps auto``, issue 13).

With ``auto``, H is the smallest value whose outer exchange still fits inside H inner steps of
compute: H >= exchange_s / step_s. Streaming DiLoCo (Douillard et al., arXiv:2501.18512, Sec.
2.2) hides the exchange behind the inner steps; DiLoCo (Douillard et al., arXiv:2311.08105,
Sec. 3, Fig. 5/Table 4) loses accuracy as H grows, so the smallest H that hides the exchange is
the one to take, and a small H early (before the first measurement: ``H_MIN``) also closes
DiLoCo's early-accuracy gap.

Every peer must put its outer boundaries on the same steps, or rounds fall apart. Five rules
make the schedule one that every peer derives alike, with no new message and no coordinator:

1. **A grid.** H is a rung of ``LADDER`` (4 x 2^k, 4..256) and a boundary is a step that is a
   multiple of H, as with a fixed H. Rungs nest: every boundary of a larger H is a boundary of
   each smaller one. So a joiner or a resumed peer that took the swarm's step count falls on the
   swarm's boundaries, and two peers that briefly disagree on H still meet at every boundary of
   the larger one (the one with the smaller H waits there, bounded by the round timeout, as for a
   straggler) instead of drifting apart for good.
2. **Agreement from the set averaged.** Each outer share carries its sender's proposal (the rung
   its own measurements want; 0 before it measured). When an outer round ends, H becomes the
   upper median of the proposals of the shares the round averaged (ours included, refused ones
   not): peers that averaged the same set, the peers whose theta_start copies agree, agree on H
   too. The median keeps a minority of hostile proposals from moving H past the honest ones
   (of two peers the upper median is the larger: a pair is only as honest as its worse half);
   each proposal is clamped to the ladder first. On ``full`` every peer waits for the same
   slowest link, so the proposals, and the medians of slightly different sets, rarely differ.
3. **A short round only raises H.** A round that missed a share it waited for saw less than
   the others did, and missed it most likely because the exchange did not fit: lowering H on
   that would split the peers most often, so such a round keeps H or raises it.
4. **When it applies.** Without overlap every peer is held at the boundary that began the round,
   so the new H applies at once (the next boundary is the next multiple of it). With overlap the
   round ends part way through the next period, at a different step on each peer: the new H
   waits for that period's boundary (``h_next``), which every peer computed with the old H.

5. **Rounds follow the steps.** Rounds are matched by number, boundaries are steps: a peer that
   held another H for a while (it averaged another set: cut off, or declared dead and
   re-admitted by a flapping membership) took more or fewer rounds over the same steps than the
   swarm, and from then on began each round at a different step than the others (seen: two of
   four peers 32 steps off for the rest of the run). So every share carries its sender's
   boundary step, and when a round ends the set it averaged fixes the swarm's step for it (the
   lower median, ours included, of the steps within ``H_MAX`` of ours: the peers that averaged
   the same set get the same). Our next boundary then begins the round the swarm begins there
   (``round_at``): rounds later by the swarm's boundaries in between, or none at all when the
   swarm already took that round at a step we have since passed (we skip the boundary; its
   steps go into the next Delta). A joiner does the same by taking a donor's step count. A
   peer whose round got no share at all learns from the shares that come late for it: back
   with a smaller H than the others, it begins its rounds before theirs and times each out
   alone, round after round, while its own shares reach them in time; they averaged the set of
   those late shares and ours, so H and the swarm's step come from that set (diloco.py).
   Auto H only: with a fixed H every round is one boundary on every peer, so rounds and steps
   never disagree. Either H meets a peer behind in time on the same steps (a stall, or a
   trainer that waited out rounds alone while the others went on): rounds.py's "Overtaken" rule
   moves it to the round the others are at. With auto H this rule then finds the others'
   boundary step for that round ahead of ours and skips one of our boundaries, which puts the
   peer on their steps as well (tests/test_diloco_overtaken.py, H 32: in step, one copy).

A fixed H may begin with a warm-up (diloco.py, "Warm-up"): boundaries at the multiples of the
warm-up's H up to its end (rounded up to one of them), then every H after it. Still a function
of the step alone, the same on every peer, so rules 2-5 are not needed for it.

Seen in the simulator (bench/diloco_auto_sim.py): peers that differ after a short round meet at
the next boundary of the larger H and agree again from that round on. On a link so slow that
membership probes queue behind the shares long enough for peers to be declared dead (0.02 Mbit/s
there), a peer alone in its view keeps its own H: membership, not this schedule, is what fails.

The schedule (H and the H that the next boundary switches to) is part of DiLoCo's state:
checkpoints, resumes and state-sync joiners take it. A state without it (saved by an older
version) is refused by an ``auto`` peer, which could not tell where the swarm's boundaries are.

Measured: the compute time per inner step, an EWMA over each period between two boundaries less
the time the trainer waited at a gate for the outer round (with overlap a step time that kept
the waits made the exchange look shorter than it was, and H stayed too small), and the
exchange time: DiLoCo's usual wait of its rounds that got every share (diloco.py, "Round
deadlines": the bytes over the link plus the neighbours' skew, which is what has to fit).
Not ``BandwidthMonitor``'s rate: DiLoCo feeds it from repair chunks only (a round share's
timing mostly measures its sender's lead), and in the simulator the chunks' request-to-reply
rate, a floor tried first, sent H to 64 on a link that needed 8. A straggler computing 2x
slower or more makes the others' waits grow with H itself; auto H then climbs to the top rung,
where a fixed H does no better.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

from p2p.averaging.base import state_int
from p2p.bandwidth import ewma

H_MIN, H_MAX = 4, 256
LADDER = tuple(H_MIN << k for k in range(7))  # 4, 8, ..., 256: each rung divides the next (rule 1)
MAX_PROPOSAL = 1 << 30  # a proposal on the wire beyond this is malformed, not merely large
STEP_EWMA_ALPHA = 0.3


def rung(h: int) -> int:
    """The smallest ladder rung >= h, clamped to [H_MIN, H_MAX]: how any proposal is read."""
    return next((r for r in LADDER if r >= h), H_MAX)


def wanted(exchange_s: float, step_s: float) -> int:
    """The smallest rung whose H steps of compute cover one exchange."""
    if step_s <= 0:
        return H_MAX
    return rung(math.ceil(exchange_s / step_s))


def agreed(proposals: Iterable[int], current: int) -> int:
    """The upper median of the proposals (0: none), each read as a rung; ``current`` if none."""
    rungs = sorted(rung(p) for p in proposals if p > 0)
    return rungs[len(rungs) // 2] if rungs else current


def warmup_end(warmup_steps: int, warmup_h: int) -> int:
    """The step where a warm-up of ``warmup_steps`` at ``warmup_h`` ends: the first of its
    boundaries at or after ``warmup_steps`` (0: no warm-up)."""
    return -(-warmup_steps // warmup_h) * warmup_h if warmup_steps > 0 else 0


class InnerSchedule:
    """Where the outer boundaries are: multiples of ``h`` (module docstring), after a warm-up's
    multiples of ``warmup_h`` up to ``warm_end`` when there is one ("Warm-up" in the docstring)."""

    def __init__(self, inner_steps: int | str, overlap: bool, warmup_steps: int = 0, warmup_h: int = 0) -> None:
        """``warmup_steps`` needs a fixed ``inner_steps`` (DiLoCoConfig refuses it with auto)."""
        self.auto = inner_steps == "auto"
        self._h = H_MIN if self.auto else int(inner_steps)  # after the warm-up
        self.warmup_h = warmup_h
        self.warm_end = warmup_end(warmup_steps, warmup_h)  # the warm-up's last boundary (0: none)
        self.h = warmup_h if self.warm_end else self._h  # the H of the period under way
        self.h_next = self.h  # overlap: what the next boundary switches to
        self._from = 0  # the step the period under way began at (or that we resumed at)
        self.overlap = overlap
        self.step_s: Optional[float] = None  # EWMA compute seconds per inner step
        self._last: Optional[tuple[float, int]] = None  # (time, step) of the last boundary
        self._paused = 0.0  # seconds the trainer waited at gates since then
        # (round, the swarm's step at it, h, h_next) as of the last round that ended (rule 5)
        self._anchor: Optional[tuple[int, int, int, int]] = None

    def is_boundary(self, step: int) -> bool:
        if self.auto:
            return step > 0 and step % self.h == 0
        if step <= self.warm_end:
            return step > 0 and step % self.warmup_h == 0
        return (step - self.warm_end) % self._h == 0

    def boundary_candidate(self, step: int) -> bool:
        """A superset of the boundaries, for the trainer's thread, which may see ``h`` a moment
        before the switch at a boundary lands (rungs nest: the smaller one's multiples)."""
        if not self.auto:
            return self.is_boundary(step)
        return step > 0 and step % min(self.h, self.h_next) == 0

    @property
    def first_boundary(self) -> int:
        """Where the first period ends (overlap gates from the second on)."""
        return self.warmup_h if self.warm_end else self.h

    @property
    def warming_up(self) -> bool:
        """The period under way is one of the warm-up's."""
        return self._from < self.warm_end

    def resume_at(self, step: int) -> None:
        """Our step count was just taken (a checkpoint, a donor's): the period under way is the
        one that step falls in (a fixed H; auto takes its H with the state)."""
        self._from = step
        if not self.auto:
            self.h = self.h_next = self.period_after(step)

    def period_after(self, step: int) -> int:
        """The H of the period that begins at boundary ``step`` (a fixed H's, warm-up or not)."""
        return self.warmup_h if step < self.warm_end else self._h

    def at_boundary(self, step: int, now: float) -> None:
        """A boundary was reached: measure the period's compute, switch to ``h_next``."""
        if self._last is not None:
            t0, s0 = self._last
            if step > s0 and now - t0 > self._paused:
                self.step_s = ewma(self.step_s, (now - t0 - self._paused) / (step - s0), STEP_EWMA_ALPHA)
        self._last, self._paused, self._from = (now, step), 0.0, step
        if self.auto:
            self.h = self.h_next
        else:
            self.h = self.h_next = self.period_after(step)

    def paused(self, seconds: float) -> None:
        """The trainer waited this long at a gate for the outer round: not compute."""
        self._paused += seconds

    def proposal(self, exchange_s: Optional[float]) -> int:
        """What our share proposes: the rung our measurements want, 0 before we have both."""
        if not self.auto or exchange_s is None or self.step_s is None:
            return 0
        return wanted(exchange_s, self.step_s)

    def agree(self, proposals: Iterable[int], short: bool = False) -> None:
        """A round ended: H from the proposals of the set it averaged (rules 2 and 4); a round
        short of a share it waited for only raises H (rule 3)."""
        if not self.auto:
            return
        h = agreed(proposals, self.h_next)
        self.h_next = max(h, self.h_next) if short else h
        if not self.overlap:
            self.h = self.h_next

    def anchor(self, round: int, own_step: int, steps: Iterable[int]) -> None:
        """Round ``round`` ended, begun by us at ``own_step`` and by the senders of the set it
        averaged at ``steps``: the swarm's step for it (rule 5). Call after ``agree``."""
        if not self.auto:
            return
        near = sorted([own_step] + [s for s in steps if abs(s - own_step) <= H_MAX])
        self._anchor = (round, near[(len(near) - 1) // 2], self.h, self.h_next)

    def round_at(self, step: int) -> Optional[int]:
        """The round the swarm begins at our boundary ``step`` (rule 5): the last round that
        ended plus the swarm's boundaries after its step, up to ``step``. That last round itself
        when there are none: the swarm took it already, we skip this boundary. None when
        unknown (no round ended yet, or a fixed H)."""
        if self._anchor is None:
            return None
        round, at, h, h_next = self._anchor
        first = (at // h + 1) * h  # the swarm's next boundary, where it switches to h_next
        return round + (0 if step < first else 1 + step // h_next - first // h_next)

    def state_dict(self) -> dict:
        return {"inner_steps": self.h, "inner_steps_next": self.h_next}

    def load_state_dict(self, state: dict) -> None:
        """Take a saved or a donor's schedule (auto only: a fixed H is the configured one)."""
        if not self.auto:
            return
        if "inner_steps" not in state:
            raise ValueError("state has no 'inner_steps' (saved by a p2p without --diloco-inner-steps auto): "
                             "an auto peer cannot tell where the swarm's outer boundaries are")
        h, h_next = state_int(state, "inner_steps", 1), state_int(state, "inner_steps_next", 1)
        if h not in LADDER or h_next not in LADDER:
            raise ValueError(f"state inner steps {h}, {h_next}: want rungs of {list(LADDER)}")
        self.h, self.h_next = h, h_next
        self._anchor = None  # our step count and round were just taken with it
