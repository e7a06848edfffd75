"""Settings of an averaging simulation: one frozen dataclass, and the protocol configs scaled to
the simulated step time.

Every timer in the simulated swarm is expressed in simulated steps (``compute_s`` seconds
each), so a run of a few hundred steps exercises the same protocol phases as hours of real
training: averaging exchanges about once per step and rounds that time out after 10 steps
(``sim_averaging_config``), a SWIM protocol period of two steps (``sim_membership_config``),
and the algorithms' own periods shortened to fit (``sim_algorithm_options``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from p2p.averaging.base import AveragingConfig
from p2p.averaging.registry import config_class
from p2p.gossip.config import MembershipConfig
from p2p.sim.churn import Churn

SIM_OPTIONS = {"diloco": dict(inner_steps=10), "gossipgrad": dict(model_every=4)}  # scaled to short runs
# MembershipConfig fields that are durations (seconds): scaled together by sim_membership_config.
MEMBERSHIP_DURATIONS = ("probe_interval", "probe_timeout", "gossip_interval", "gossip_to_the_dead",
                        "push_pull_interval", "reconnect_interval", "reconnect_window", "reap_after",
                        "reconnect_fast_interval", "reconnect_fast_window", "nudge_interval",
                        "join_retry_initial", "join_retry_max")


def sim_algorithm_options(algorithm: str, **overrides: Any) -> Any:
    """The algorithm's own settings for short simulated runs (DiLoCo H = 10, GossipGraD models
    every 4 rounds), with ``overrides``."""
    return config_class(algorithm)(**{**SIM_OPTIONS.get(algorithm, {}), **overrides})


def sim_averaging_config(compute_s: float = 0.05, algorithm: Optional[str] = None, options: Any = None,
                         **overrides: Any) -> AveragingConfig:
    """AveragingConfig scaled to the simulator's step time: one exchange per step or so, rounds
    time out after 10 steps; DiLoCo's after 2 H steps (its boundary wait must absorb the time
    lag between peers, which grows up to H steps of speed difference)."""
    steps = 10
    if algorithm == "diloco":
        h = (options or sim_algorithm_options("diloco")).inner_steps
        steps = 2 * (SIM_OPTIONS["diloco"]["inner_steps"] if h == "auto" else h)
    base = dict(interval_s=compute_s, exchange_timeout_s=10 * compute_s, round_timeout_s=steps * compute_s)
    base.update(overrides)
    return AveragingConfig(**base)


def sim_membership_config(compute_s: float = 0.05, **overrides: Any) -> MembershipConfig:
    """``MembershipConfig.local()`` with every duration scaled so that the protocol period is two
    simulated steps (0.1 s at the default 0.05 s step: probe timeout 50 ms, well above the
    simulated round trip of 10-20 ms; suspicion timeout 3 periods, about 6 steps, for a small
    swarm). So a crash is found within tens of steps, as a real swarm finds one within a few
    seconds while its steps take a few hundred milliseconds."""
    base = MembershipConfig.local()
    factor = 2.0 * compute_s / base.probe_interval
    scaled = {name: getattr(base, name) * factor for name in MEMBERSHIP_DURATIONS}
    return dataclasses.replace(base, **{**scaled, **overrides})


@dataclass(frozen=True)
class AvgSimConfig:
    algorithm: str  # a name in p2p.averaging.registry.ALGORITHMS
    topology: Optional[str] = None  # a name in p2p.topology.TOPOLOGIES (None: the algorithm's natural one)
    peers: int = 8  # peers at the start; they start together, already knowing each other
    steps: int = 200  # training steps per peer
    seed: int = 0  # the run's seed: every random choice derives from it
    loss: float = 0.0  # probability that any one message (membership or averaging) is lost, in [0, 1)
    delay_s: float = 0.005  # one-way base latency ...
    jitter_s: float = 0.005  # ... plus a uniform random extra in [0, jitter_s)
    bandwidth_bps: Optional[float] = None  # per-peer uplink in bits/s (None: unlimited); sizes are encoded sizes
    churn: Churn = Churn()  # joins/crashes/leaves; its window is in fractions of steps * compute_s
    stragglers: int = 0  # the last this many initial peers compute straggler_factor times slower
    straggler_factor: float = 4.0
    compute_s: float = 0.05  # simulated time of one training step (forward + backward)
    compute_jitter: float = 0.1  # each step takes compute_s * (1 +- this), uniformly
    lr: float = 0.2  # learning rate at step 0 ...
    lr_decay_steps: float = 30.0  # ... lr / (1 + k / lr_decay_steps) at step k
    dim: int = 8  # parameters per model
    heterogeneity: float = 1.0  # spread of the peers' own optima (avg_problems.Quadratics)
    init_spread: float = 1.0  # spread of the peers' initial models around the common one
    noise: float = 0.0  # std of Gaussian noise added to every gradient
    hostile: tuple[int, ...] = ()  # these peers corrupt what they send (p2p/averaging/hostile.py); metrics leave them out
    hostile_mode: str = "scale100"  # scale100 | noise | signflip
    config: Optional[AveragingConfig] = None  # None: sim_averaging_config(compute_s, algorithm, options)
    options: Any = None  # the algorithm's own config (None: sim_algorithm_options(algorithm))
    topology_options: Optional[dict] = None  # bound into the topology (random: degree, seed)
    membership: Optional[MembershipConfig] = None  # None: sim_membership_config(compute_s)
    linger_s: float = 0.5  # after every peer finished, keep averaging this long, then stop
    sample_every_s: float = 0.25  # consensus / gap samples this often
    wire: bool = False  # every message goes through p2p.wire encode/decode
    check_invariants: bool = True  # push-sum mass after every event; membership rows on every change
    max_time_s: Optional[float] = None  # hard stop (None: 50x the nominal training time + 10 s)

    def __post_init__(self) -> None:
        if self.peers < 1 or self.steps < 1 or not 0 <= self.loss < 1:
            raise ValueError("need peers >= 1, steps >= 1 and loss in [0, 1)")
        if self.compute_s <= 0 or self.delay_s < 0 or self.jitter_s < 0:
            raise ValueError("need compute_s > 0, delay_s >= 0 and jitter_s >= 0")
        if not isinstance(self.churn, Churn):
            raise ValueError("churn must be a Churn")
        if not 0 <= self.stragglers <= self.peers:
            raise ValueError(f"stragglers must be in [0, peers], got {self.stragglers}")

    @property
    def nominal_s(self) -> float:
        """Simulated time of the training itself: steps * compute_s (the churn window's span)."""
        return self.steps * self.compute_s

    def algorithm_options(self) -> Any:
        return self.options if self.options is not None else sim_algorithm_options(self.algorithm)

    def averaging_config(self) -> AveragingConfig:
        return self.config or sim_averaging_config(self.compute_s, self.algorithm, self.algorithm_options())

    def membership_config(self) -> MembershipConfig:
        return self.membership or sim_membership_config(self.compute_s)

    def time_limit_s(self) -> float:
        if self.max_time_s is not None:
            return self.max_time_s
        return 50 * self.nominal_s * max(1.0, self.straggler_factor) + 10
