"""Bandwidth awareness: per-neighbour link estimates and the policy that adapts to them.

Pure: fed observations (``observe``: an exchange with peer p moved b bytes in s seconds;
``observe_rtt``: a small message round trip took s seconds; ``observe_cpu``: CPU seconds spent
on the network thread and on training so far); it never reads a clock. Every node keeps its
own estimates from its own transfers; nothing is shared.

Policy, to keep communication at most ``comm_fraction`` f of wall time (so that, on a shared
link, averaging never crowds out what training needs) and of the compute (so that, on a shared
CPU, it does not slow the steps down by more than that share either):

- **average less often**: with an expected exchange time t_x, an interval i between exchanges
  gives a busy fraction t_x / (t_x + i); so i >= t_x (1 - f) / f. And with c CPU seconds spent on
  the network thread per exchange cycle (its own exchange, the requests it served, the copies
  and the kernel's share of the transfers) while training gets u CPU seconds per second, a cycle
  must last c / (f u): on a 2-core machine running 4 peers, an exchange that moves 17 MB costs
  as much CPU as a few training steps, so the wall-time rule alone let exchanges take as much
  CPU as the steps;
- **choose faster partners**: pick partners with probability proportional to estimated
  throughput (peers not measured yet get the best known estimate, so they get explored);
- **compress harder**: when even ``max_interval_s`` cannot meet the budget, step up a ladder
  of compressors (each roughly 2-4x fewer bytes); step down again when there is slack.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional, Sequence


@dataclass(frozen=True)
class BandwidthConfig:
    comm_fraction: float = 0.5  # target share of wall time spent in exchanges
    ewma_alpha: float = 0.3  # weight of the newest observation in the moving averages
    min_interval_s: float = 0.0  # never average more often than this
    max_interval_s: float = 30.0  # never wait longer than this between exchanges
    prefer_fast_partners: bool = True  # throughput-weighted partner choice
    compression_ladder: tuple[str, ...] = ("none", "fp16", "int8", "topk")  # mildest first

    def __post_init__(self) -> None:
        if not 0 < self.comm_fraction <= 1:
            raise ValueError("comm_fraction must be in (0, 1]")
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError("ewma_alpha must be in (0, 1]")
        if self.min_interval_s < 0 or self.max_interval_s < self.min_interval_s:
            raise ValueError("need 0 <= min_interval_s <= max_interval_s")


def ewma(old: Optional[float], new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


TIMEOUT_FACTOR = 4.0  # a transfer waits this many times its measured duration (``link_timeout``)


def link_timeout(expected_s: Optional[float], floor_s: float, cap_s: float) -> float:
    """How long to wait for a transfer expected to take ``expected_s`` (None: not measured yet):
    ``TIMEOUT_FACTOR`` times that, never below the configured ``floor_s`` nor above ``cap_s``.
    Shared by AD-PSGD's exchanges and the synchronous rounds (p2p/averaging/round_deadline.py),
    which both count a timed-out transfer as one that took at least its timeout, so a link too
    slow for the floor raises the next timeout instead of timing out forever."""
    if expected_s is None:
        return floor_s
    return min(max(floor_s, TIMEOUT_FACTOR * expected_s), max(floor_s, cap_s))


def required_interval(exchange_s: float, fraction: float) -> float:
    """The pause after an exchange of ``exchange_s`` that keeps the busy share <= fraction."""
    return exchange_s * (1 - fraction) / fraction


@dataclass
class LinkEstimate:
    throughput_bps: Optional[float] = None  # bytes per second, both directions together
    exchange_s: Optional[float] = None  # duration of one exchange
    rtt_s: Optional[float] = None  # small-message round trip
    samples: int = 0


@dataclass
class CpuShare:
    """What an exchange cycle costs the CPU, next to what training gets of it (EWMAs)."""

    cycle_cpu_s: Optional[float] = None  # network-thread CPU seconds per exchange cycle
    compute_rate: Optional[float] = None  # training's CPU seconds per wall second
    last: Optional[tuple[float, float, float]] = None  # (now, network, compute) at the last observation

    def cycle_s(self, fraction: float) -> Optional[float]:
        """The shortest exchange cycle whose network CPU stays within ``fraction`` of training's."""
        if self.cycle_cpu_s is None or not self.compute_rate:
            return None
        return self.cycle_cpu_s / (fraction * self.compute_rate)


@dataclass
class BandwidthMonitor:
    config: BandwidthConfig = field(default_factory=BandwidthConfig)
    links: dict[str, LinkEstimate] = field(default_factory=dict)
    level: int = 0  # index into config.compression_ladder
    cpu: CpuShare = field(default_factory=CpuShare)

    def observe(self, peer: str, nbytes: int, seconds: float) -> None:
        """An exchange with ``peer`` moved ``nbytes`` (both ways) in ``seconds``."""
        if seconds <= 0 or nbytes < 0:
            return
        link = self.links.setdefault(peer, LinkEstimate())
        a = self.config.ewma_alpha
        link.throughput_bps = ewma(link.throughput_bps, nbytes / seconds, a)
        link.exchange_s = ewma(link.exchange_s, seconds, a)
        link.samples += 1

    def observe_rtt(self, peer: str, seconds: float) -> None:
        if seconds > 0:
            link = self.links.setdefault(peer, LinkEstimate())
            link.rtt_s = ewma(link.rtt_s, seconds, self.config.ewma_alpha)

    def observe_cpu(self, now: float, network_s: Optional[float], compute_s: Optional[float]) -> None:
        """At the end of an exchange cycle: CPU seconds so far spent on the network thread and on
        everything else (training). None while not training (lingering): nothing to protect, and
        the estimates start afresh once training resumes."""
        cpu = self.cpu
        if network_s is None or compute_s is None:
            cpu.last = None
            return
        last, cpu.last = cpu.last, (now, network_s, compute_s)
        if last is None or now <= last[0]:
            return
        a = self.config.ewma_alpha
        cpu.cycle_cpu_s = ewma(cpu.cycle_cpu_s, max(0.0, network_s - last[1]), a)
        cpu.compute_rate = ewma(cpu.compute_rate, max(0.0, compute_s - last[2]) / (now - last[0]), a)

    def forget(self, live: Sequence[str]) -> None:
        """Drop estimates of peers that are no longer members."""
        keep = set(live)
        for peer in [p for p in self.links if p not in keep]:
            del self.links[peer]

    def expected_exchange_s(self, neighbours: Sequence[str]) -> Optional[float]:
        times = [self.links[p].exchange_s for p in neighbours if p in self.links and self.links[p].exchange_s]
        return sum(times) / len(times) if times else None

    def interval(self, base_s: float, neighbours: Sequence[str]) -> float:
        """Pause before the next exchange: the base, stretched to meet the budget."""
        cfg = self.config
        expected = self.expected_exchange_s(neighbours)
        wanted = base_s if expected is None else max(base_s, required_interval(expected, cfg.comm_fraction))
        cycle = self.cpu.cycle_s(cfg.comm_fraction)
        if cycle is not None:  # the cycle is the exchange and the pause after it
            wanted = max(wanted, cycle - (expected or 0.0))
        return min(max(wanted, cfg.min_interval_s), cfg.max_interval_s)

    def choose(self, neighbours: Sequence[str], rng: random.Random) -> str:
        """A partner, throughput-weighted when configured (unmeasured peers get explored)."""
        if not neighbours:
            raise ValueError("no neighbours to choose from")
        if not self.config.prefer_fast_partners:
            return neighbours[rng.randrange(len(neighbours))]
        known = [self.links[p].throughput_bps for p in neighbours
                 if p in self.links and self.links[p].throughput_bps]
        best = max(known) if known else 1.0
        weights = [(self.links[p].throughput_bps if p in self.links and self.links[p].throughput_bps else best)
                   for p in neighbours]
        return rng.choices(list(neighbours), weights=weights, k=1)[0]

    def compression(self, neighbours: Sequence[str], base_s: float) -> str:
        """Step the compression ladder up when the budget cannot be met even at the longest
        interval, and down when exchanges take well under half of what the budget allows."""
        cfg = self.config
        expected = self.expected_exchange_s(neighbours)
        if expected is not None:
            needed = required_interval(expected, cfg.comm_fraction)
            if needed > cfg.max_interval_s and self.level < len(cfg.compression_ladder) - 1:
                self.level += 1
                self._reset_times()
            elif needed < 0.25 * max(base_s, cfg.max_interval_s) and self.level > 0 and needed < base_s:
                self.level -= 1
                self._reset_times()
        return cfg.compression_ladder[self.level]

    def _reset_times(self) -> None:
        # exchange times measured at the old compression no longer predict the new ones
        for link in self.links.values():
            link.exchange_s = None

    def report(self) -> dict[str, dict[str, Optional[float]]]:
        """For status output: per-peer estimates."""
        return {p: {"throughput_mbit_s": None if l.throughput_bps is None else round(l.throughput_bps * 8 / 1e6, 2),
                    "exchange_ms": None if l.exchange_s is None else round(l.exchange_s * 1e3, 1),
                    "rtt_ms": None if l.rtt_s is None else round(l.rtt_s * 1e3, 2), "samples": l.samples}
                for p, l in sorted(self.links.items())}
