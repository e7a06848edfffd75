"""Robust mixing: clip or refuse a peer's vector that is far from ours, shun repeat offenders.

After ClippedGossip (He, Karimireddy, Jaggi, "Byzantine-robust decentralized learning via
ClippedGossip", arXiv:2202.01545, 2022; ICLR 2023). Their update replaces the gossip step
x_i += sum_j w_ij (x_j - x_i) by

    x_i += sum_j w_ij CLIP(x_j - x_i, tau_i),   CLIP(z, tau) = min(1, tau / ||z||) z,

so a neighbour moves us by at most w_ij tau_i however far its vector is: a Byzantine peer's
influence is bounded, and an honest one within tau_i passes unchanged. Their adaptive
clipping radius picks tau_i from the distances themselves, so that only the farthest
neighbours are clipped. We do the same with what a peer can see
locally and cheaply: tau = ``factor`` x the median of the recent distances (a window of
the exchanges not refused, clipped ones counted as tau, plus the vectors of the round at hand:
a minority of far ones cannot move a median), never below ``floor`` x our own norm (at consensus honest distances are ~0 and
must not clip everything). With fewer than ``warmup`` distances seen there is nothing to take a
median of; tau is then a guess, ``warmup_relative`` x our own norm, and what lies beyond
``warmup_refuse_relative`` x our own norm is refused: honest models of one run start from one
seed and stay far closer than that, while a negated model (-x) is 2 x away and a scaled one
farther. Updates (pseudo-gradients, gradients) differ more between honest peers: their
channels get ``update_warmup_scale`` times both. A refusal on the guess alone is no strike
(models that legitimately started apart, a joiner without state sync, must not be shunned).

Beyond clipping, a vector farther than ``refuse_factor`` x tau (and farther than
``refuse_relative`` x our own norm, so rounding noise near consensus never counts; with a zero
own vector there is no scale to judge by, and nothing is refused) is refused:
not mixed at all, and a strike against its sender (ClippedGossip would clip it; refusing is the
cheaper limit of the same rule and lets us count offenders). ``strikes`` refusals in a row
exclude the sender from our neighbour choice for ``cooldown_s`` (doubling for each further
exclusion, up to ``max_cooldown_s``); messages from an excluded peer are dropped unread
(p2p/peer.py). One clean exchange clears the strikes.

Distances are kept per *channel*: an algorithm that mixes several vectors (DiLoCo's outer
parameters, pseudo-gradient and momentum) screens each against its own history, since their
scales differ by orders of magnitude. The cost on the hot path is one norm of the difference,
which the algorithms compute anyway for the consensus estimate (``Disagreement``).

Pure state, no I/O: ``now`` is an argument. A clipped vector is not a strike: ClippedGossip
clips honest peers too when they are the farthest of the round.

One answer for one set (DiLoCo on ``full``, rounds.py ``uniform``). DiLoCo's peers each hold a
copy of the outer parameters and keep them equal by taking the same outer step: the mean of
the same pseudo-gradients. ClippedGossip clips around each peer's *own* vector with each
peer's own radius, so two honest peers that got the same shares take different steps whenever
anything is clipped, and their copies fall apart (seen in the lab: a peer back from a cut link
sends a pseudo-gradient of several rounds, both survivors clip it, each its own way, and each
then needs a 13 MB repair; issue 16). For these rounds the rule is a function of the set of
vectors alone, after centered clipping (Karimireddy, He, Jaggi, "Learning from History for
Byzantine Robust Optimization", ICML 2021, Sec. 3) with the centre at zero and the radius from
the round's own median: first refuse any vector whose norm is beyond ``refuse_factor`` x tau
(tau = ``factor`` x the median norm of all of them, ours included, zeros left out: a finished
peer's; a strike, as above), then clip the rest to ``factor`` x the median norm of what is
left; leave out a minority of vectors that point against the sum of the others (a negative dot
product); and take the mean of the rest (``robust_mean``). The direction test is FLTrust's
trust score (Cao, Fang, Liu, Gong, "FLTrust: Byzantine-robust Federated Learning via Trust
Bootstrapping", NDSS 2021, Sec. 4: weight ReLU(cos(g_i, g_0)), so a negative cosine weighs
nothing) with the sum of the other shares standing in for the server's root gradient g_0, and
0/1 weights so that the honest ones still count equally (the mean stays the mean when nobody
is left out). Every peer that got the same shares computes the same step, bit for bit (the
vectors are summed in an order that depends on them alone, and each one is judged on its own
against that sum), and a peer that missed one can recompute the reference's step from the
senders it names (DiLoCo's replay repair).

Why the direction test. A pseudo-gradient scaled by 100 is refused by norm. A sign flip has
exactly an honest norm, and clipping let it through: with 1 of 5 sign-flipped the mean shrank
to (4 - 1) / 5 = 0.6x the honest one, with 2 of 8 to 0.5x, every outer step. Against the sum
of the others it points the wrong way however noisy the honest pseudo-gradients are (on the
synthetic task, 5 workers, H = 20, they are 0.4x their mean's norm apart early and 1.3x late),
as long as the honest ones are a majority (only a minority may be left out). In one process
(bench/hostile_offline.py: bench/hostile.py's setup without the network, 5 workers, 300
steps, seed 0) held-out accuracy was 0.801 clean, 0.774 with one sign-flipper under the
clipped mean, and 0.801 under this rule (noise instead: 0.799).

Not a coordinate-wise trimmed mean (Yin et al., ICML 2018), although it also drops the sign
flip wherever the honest values agree: on i.i.d. shards it cost nothing (0.803), but where the
peers' optima differ (the simulator's quadratics, tests/test_robust.py) it pulled the outer
step towards the median optimum and doubled the optimality gap of an honest swarm of 8 (0.095
against 0.045), while the direction test left it as it was (0.046). Noise of an honest norm
passes (its direction is random), clipped like any share; it moved the honest swarms less
than a sign flip did (bench/hostile.py). With 1 hostile of 3 the others' sum of an honest
vector cancels out, and nothing protects beyond clipping.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from p2p.compression import sparse
from p2p.compression.sparse import Vector


@dataclass(frozen=True)
class RobustConfig:
    """The clipping rule's constants (module docstring)."""

    enabled: bool = True
    factor: float = 2.0  # tau = factor x median of recent distances
    window: int = 64  # recent distances kept per channel
    warmup: int = 3  # fewer distances than this: tau = warmup_relative x own norm
    warmup_relative: float = 0.5  # the radius before ``warmup`` distances were seen, x own norm ...
    warmup_refuse_relative: float = 1.7  # ... and what is refused then (x own norm; -x is 2 away)
    update_channels: tuple[str, ...] = ("delta", "grad")  # updates, not models: peers' differ more ...
    update_warmup_scale: float = 4.0  # ... so their warm-up radius and refusal are this many times wider
    floor: float = 0.01  # tau never below floor x own norm
    refuse_factor: float = 4.0  # beyond refuse_factor x tau ...
    refuse_relative: float = 1.0  # ... and farther from us than our own norm: refused
    strikes: int = 3  # refusals in a row that exclude a peer
    cooldown_s: float = 30.0  # first exclusion; doubles per further exclusion
    max_cooldown_s: float = 600.0

    def __post_init__(self) -> None:
        if not (self.factor > 0 and self.window >= 1 and self.warmup >= 1 and self.warmup_relative > 0
                and self.floor >= 0 and self.refuse_factor >= 1 and self.refuse_relative >= 0
                and self.strikes >= 1 and 0 < self.cooldown_s <= self.max_cooldown_s):
            raise ValueError(f"inconsistent robust mixing settings: {self}")


REFUSED = 0.0  # the factor ``screen`` returns for a refused vector


class RobustMixing:
    """One per averager: the radius per channel, the strikes and exclusions per peer."""

    def __init__(self, config: RobustConfig | bool, stats: dict[str, int]) -> None:
        if isinstance(config, bool):  # AveragingConfig.robust_mixing: the default rule, on or off
            config = RobustConfig(enabled=config)
        self.config = config
        self.enabled = config.enabled
        self.stats = stats
        for key in ("robust_clipped", "robust_refused", "robust_exclusions", "robust_dropped", "robust_opposed"):
            stats.setdefault(key, 0)
        self._history: dict[str, deque] = {}
        self._strikes: dict[str, int] = {}
        self._exclusions: dict[str, int] = {}  # peer -> times excluded (cool-down doubles)
        self._excluded_until: dict[str, float] = {}
        self.tau: dict[str, float] = {}  # the last radius per channel (status)
        self.version = 0  # bumped when the excluded set changes (p2p/peer.py memoises on it)
        # Whether the peer drops an excluded sender's messages unread (p2p/peer.py). Push-sum
        # must not: a dropped share takes its weight with it, so SGP screens them instead
        # (``screen`` refuses an excluded sender's vector and its weight is kept).
        self.drops_excluded = True

    # -- the clipping rule ------------------------------------------------------------------
    def radius(self, channel: str, own_norm: float, current: Sequence[float] = ()) -> tuple[float, bool]:
        """(tau, whether it rests on measured distances rather than the warm-up guess)."""
        cfg = self.config
        pool = list(self._history.get(channel, ())) + list(current)
        if len(pool) < cfg.warmup:
            scale = cfg.update_warmup_scale if channel in cfg.update_channels else 1.0
            tau = scale * cfg.warmup_relative * own_norm if own_norm > 0 else float("inf")
            return tau, False
        tau = max(cfg.factor * float(np.median(pool)), cfg.floor * own_norm)
        self.tau[channel] = tau
        return tau, True

    def screen(self, src: str, channel: str, distance: float, own_norm: float, now: float) -> float:
        """The factor on ``x_j - x_i`` (``distance`` = its norm): 1 passes it, in (0, 1) clips
        it to tau, ``REFUSED`` (0) refuses it."""
        return self.screen_round(channel, [(src, distance)], own_norm, now)[0]

    def screen_round(self, channel: str, entries: Sequence[tuple[str, float]], own_norm: float,
                     now: float) -> list[float]:
        """``screen`` for several neighbours' vectors of one round at once: the round's own
        distances take part in the median, so a round with an honest majority is screened
        correctly from the first round on."""
        if not self.enabled or not entries:
            return [1.0] * len(entries)
        cfg = self.config
        tau, settled = self.radius(channel, own_norm, [d for _, d in entries])
        history = self._history.setdefault(channel, deque(maxlen=cfg.window))
        factors = []
        for src, distance in entries:
            if src in self._excluded_until:
                factors.append(REFUSED)
                self.stats["robust_dropped"] += 1
                continue
            if settled:
                refuse = distance > cfg.refuse_factor * tau and distance > cfg.refuse_relative * own_norm
            else:
                refuse = distance > tau / cfg.warmup_relative * cfg.warmup_refuse_relative
            if not np.isfinite(distance) or (refuse and own_norm > 0):
                factors.append(REFUSED)
                self.stats["robust_refused"] += 1
                if settled or not np.isfinite(distance):  # a guess alone strikes nobody
                    self._strike(src, now)
                continue
            # A clipped distance is kept as tau: a far vector that is clipped, not refused, must
            # not inflate the radius (each one it let through would move us further out, and
            # then the next one looks nearer). Honest distances that grow still raise the median,
            # by up to ``factor`` per half window. Refused ones stay out.
            history.append(min(distance, tau))
            if distance > tau:
                factors.append(tau / distance)
                self.stats["robust_clipped"] += 1
            else:
                factors.append(1.0)
                self._strikes.pop(src, None)
        return factors

    def screen_set(self, channel: str, norms: Sequence[tuple[str, float]], now: float) -> set[str]:
        """The refusals of a *consistent* round (``robust_mean``, module docstring "One answer
        for one set"): the senders whose vector's norm is beyond ``refuse_factor`` x tau, tau
        taken from every norm of the round, ours included (``norms`` lists ours too, under a key
        that is never refused: the caller leaves it out of the result). Strikes and exclusions as
        ``screen_round``; a vector that is not refused clears its sender's strikes."""
        if not self.enabled or len(norms) < 3:  # no majority to judge by
            return set()
        cfg = self.config
        tau = cfg.factor * median_of_nonzero([n for _, n in norms if np.isfinite(n)])
        self.tau[channel] = tau
        refused = set()
        for src, norm in norms:
            if src in self._excluded_until:
                refused.add(src)
                self.stats["robust_dropped"] += 1
            elif not np.isfinite(norm) or (tau > 0 and norm > cfg.refuse_factor * tau):
                refused.add(src)
                self.stats["robust_refused"] += 1
                self._strike(src, now)
            else:
                self._strikes.pop(src, None)
        return refused

    def _strike(self, src: str, now: float) -> None:
        strikes = self._strikes.get(src, 0) + 1
        if strikes < self.config.strikes:
            self._strikes[src] = strikes
            return
        self._strikes.pop(src, None)
        times = self._exclusions.get(src, 0)
        self._exclusions[src] = times + 1
        cooldown = min(self.config.cooldown_s * 2 ** times, self.config.max_cooldown_s)
        self._excluded_until[src] = now + cooldown
        self.stats["robust_exclusions"] += 1
        self.version += 1

    # -- exclusion --------------------------------------------------------------------------
    def is_excluded(self, src: str) -> bool:
        return src in self._excluded_until

    def drop(self, src: str) -> bool:
        """True (and counted) when a message from ``src`` must be dropped unread."""
        if self.drops_excluded and src in self._excluded_until:
            self.stats["robust_dropped"] += 1
            return True
        return False

    def allowed(self, neighbours: Iterable[str]) -> list[str]:
        return [n for n in neighbours if n not in self._excluded_until]

    def expire(self, now: float) -> None:
        """End the cool-downs that are over (called from the peer's timer)."""
        over = [p for p, until in self._excluded_until.items() if now >= until]
        for p in over:
            del self._excluded_until[p]
        if over:
            self.version += 1

    def next_deadline(self) -> float:
        return min(self._excluded_until.values(), default=float("inf"))

    def report(self, now: float) -> dict:
        """For status: on/off, the radius per channel, offenders and their cool-downs."""
        offenders = {p: {"exclusions": n, "excluded_for_s": round(max(self._excluded_until.get(p, now) - now, 0.0), 1)}
                     for p, n in self._exclusions.items()}
        return {"enabled": self.enabled, "tau": {k: float(f"{v:.4g}") for k, v in self.tau.items()},
                "offenders": offenders}


def robust_mean(vectors: Sequence[Vector], factor: float, direction: bool = True) -> tuple[np.ndarray, int, int]:
    """The consistent rounds' aggregate (module docstring, "One answer for one set"): each
    vector clipped to norm tau = ``factor`` x the median of their norms; a minority of them that
    point against the sum of the others (a negative dot product) left out; the mean of the rest.
    Returns it (dense), how many vectors were clipped and how many left out as opposed. A function of
    the set alone: the vectors are summed in an order of their own (``_canonical``), so whoever
    holds the same set, in whatever order it came (the round's, a replay's), gets the same bits.
    ``direction=False`` skips the direction test: for the slices a reduce-scatter owner averages
    (outer_scatter.py), where one slice's direction against the others' slices says little when
    the peers' data differ (with it, tests/test_avgsim_scatter.py's swarm through joins and
    crashes ended with a larger optimality gap: 0.087 of the initial, against <= 0.08).
    Sparse vectors (sparseloco's, p2p/compression/sparse.py) are summed, scaled and dotted on
    their kept entries only: the same values as dense, up to the norms' last bits."""
    vectors = sparse.one_kind(vectors)
    norms = [sparse.norm(v) for v in vectors]
    tau = factor * median_of_nonzero(norms)
    scales = [tau / n if n > tau > 0 else None for n in norms]
    clipped = [v if s is None else np.float32(s) * v for v, s in zip(vectors, scales)]
    order = _canonical(clipped, norms)
    total = _sum(clipped, order)
    # <v_k, total - v_k> = <v_k, total> - |v_k|^2: one pass over v_k and no model-sized
    # temporary per vector (a round on 2.2 M parameters spent ~12 of its 23 ms here)
    sq = [(n if s is None else tau) ** 2 for n, s in zip(norms, scales)]
    opposed = {k for k in order if sparse.dot(clipped[k], total) - sq[k] < 0} if direction else set()
    if opposed and 2 * len(opposed) < len(vectors):
        total = _sum(clipped, [k for k in order if k not in opposed])
    else:
        opposed = set()
    total /= np.float32(len(vectors) - len(opposed))  # in place: the same bits as total / n
    return total, sum(s is not None for s in scales), len(opposed)


def _canonical(vectors: Sequence[Vector], norms: Sequence[float]) -> list[int]:
    """An order that depends on the vectors alone: by norm, then by their first entries (equal
    keys: equal vectors in practice, a copy of ours for each sender that left its vector out,
    whose order changes no sum)."""
    return sorted(range(len(vectors)), key=lambda k: (norms[k], sparse.head(vectors[k])))


def _sum(vectors: Sequence[Vector], order: Sequence[int]) -> np.ndarray:
    total = np.zeros(vectors[0].shape, dtype=np.float32)
    for k in order:
        sparse.accumulate(total, vectors[k])
    return total


def median_of_nonzero(norms: Sequence[float]) -> float:
    """The median of the norms that are not zero (0.0 if none). A DiLoCo peer that finished
    training serves rounds with a zero pseudo-gradient: counted in the median, a swarm where
    most peers had finished took a radius of ~0 and refused every peer still training (seen
    with bench/hostile.py: 20 honest shares refused in a clean run). Zeros move nobody, so
    they are left out of the radius, not out of the mean; a minority cannot move a median."""
    live = [n for n in norms if n > 0]
    return float(np.median(live)) if live else 0.0
