"""Membership simulation scenario settings: one frozen dataclass, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from p2p.gossip.config import MembershipConfig
from p2p.sim.churn import Churn


@dataclass(frozen=True)
class SimConfig:
    peers: int = 100  # members at the start; member 0 is the seed the others join through
    seed: int = 0  # the run's seed: every random choice derives from it
    duration_s: float = 60.0  # simulated seconds
    loss: float = 0.0  # probability that any one message is dropped, in [0, 1)
    delay_ms: float = 5.0  # one-way base latency
    jitter_ms: float = 2.0  # plus a uniform random extra in [0, jitter_ms)
    bandwidth_bps: Optional[float] = None  # per-member uplink in bits/s (None: unlimited)
    churn: Churn = Churn()  # joins, crashes and leaves, at seeded times in churn.window of the run
    partition: Optional[float] = None  # fraction of live members cut off from the rest, in (0, 1)
    partition_s: float = 60.0  # how long the partition lasts
    partition_at_s: Optional[float] = None  # when it starts (default: (duration - partition_s) / 3)
    join_spread_s: float = 0.0  # the initial members start at uniform times in [0, this)
    warm_start: bool = False  # the initial members start already knowing each other
    membership: MembershipConfig = field(default_factory=MembershipConfig.lan)
    check_invariants: bool = True  # run the invariant checkers on every table change

    def __post_init__(self) -> None:
        def need(ok: bool, text: str) -> None:
            if not ok:
                raise ValueError(text)

        need(isinstance(self.peers, int) and self.peers >= 1, f"peers must be >= 1, got {self.peers}")
        need(0.0 <= self.loss < 1.0, f"loss must be in [0, 1), got {self.loss}")
        need(self.duration_s > 0, f"duration must be > 0 s, got {self.duration_s}")
        need(self.delay_ms >= 0 and self.jitter_ms >= 0, "delay and jitter must be >= 0 ms")
        need(self.bandwidth_bps is None or self.bandwidth_bps > 0, "bandwidth must be > 0 bits/s")
        need(isinstance(self.churn, Churn), "churn must be a Churn")
        gone = self.churn.crashes + self.churn.leaves
        need(gone <= max(0, self.peers - self.churn.floor),
             f"crash + leave ({gone}) must leave at least {self.churn.floor} of {self.peers} peers")
        if self.partition is not None:
            need(0.0 < self.partition < 1.0, f"partition must be in (0, 1), got {self.partition}")
            need(0 < self.partition_s < self.duration_s,
                 f"partition-s must be in (0, duration), got {self.partition_s}")
            need(self.partition_at_s is None or 0 <= self.partition_at_s <= self.duration_s - self.partition_s,
                 "partition must start and end within the run")
        need(self.join_spread_s >= 0, "join_spread_s must be >= 0")

    @property
    def partition_start(self) -> Optional[float]:
        if self.partition is None:
            return None
        if self.partition_at_s is not None:
            return self.partition_at_s
        return (self.duration_s - self.partition_s) / 3.0
