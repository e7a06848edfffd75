"""Deterministic simulator for the averaging algorithms: real Averager objects, simulated
trainers, a modelled network, a logical clock.

Theory of operation
-------------------
One event heap ordered by ``(time, seq)``; a logical clock only the heap advances; one
``random.Random`` for the network and scenario and one per peer, all derived from the seed by
string, so the same arguments replay the same run bit for bit. Nothing reads the wall clock.

Every peer has an ``ArrayPort`` (the FlatParams semantics: deltas queue and land at the next
step boundary), an averager from ``p2p.averaging.registry``, and a simulated trainer that runs
the loop of the real one (p2p/training/trainer.py with p2p/training/step_hooks.py):

    READY      -- may_step(k+1)? -- apply queued deltas, compute grad f_i(x) ----> COMPUTING
    COMPUTING  -- after compute_s: wants_gradient? on_gradient(k+1) ------------> GRAD_WAIT
    GRAD_WAIT  -- gradient_ready(k+1)? optimizer step x -= lr_k g; after_step(k+1) -> READY
    after the last step: READY until may_step(steps+1) (finish the round in flight) -> IDLE,
    where queued deltas keep landing (the real trainer's linger phase).

Hooks are re-polled after every event that touches the peer (a delivery or a tick), so a
waiting trainer resumes at the simulated instant its averager allows it. The neighbours passed
to every call are ``topology(me, live members, averager.topology_round())``; the member view is
the ground-truth live set, where a crashed peer stays listed for ``churn.detect_s`` (failure
detection delay) and a joiner appears when it starts.

Network: each message is lost with probability ``loss``, else delivered after ``delay_s`` plus
uniform jitter; a message to a peer that is down is dropped. With ``wire=True`` every message is
encoded and decoded by ``p2p.wire`` on the way. ``RemoteProtocolError`` from an averager is
counted by reason and dropped, as the real driver does.

Churn: ``churn.joins`` peers start and ``churn.crashes`` peers crash at seeded times inside
``churn.window`` (fractions of the nominal training time). A joiner starts from the common
initial model (plus its init noise), with the step counter of the live peer it joins through (as
a state transfer of the step count would give it), so every peer trains to about the same final
step. Stragglers compute
``straggler_factor`` times slower.

Invariants (checked after every event): push-sum mass, sum_i w_i + weight in flight ==
initial + joined - lost to crashes / loss / drops, to 1e-9; tick() moves next_deadline() past
now (no busy loop). A violation raises ``InvariantViolation`` naming the seed.

Metrics, sampled every ``sample_every_s`` over the live peers' models x_i (SGP: z_i):
consensus distance sqrt(mean_i ||x_i - mean x||^2) and optimality gap F_S(mean x) - F_S(x*_S).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from p2p.averaging.base import AveragingConfig
from p2p.averaging.registry import config_class, make_averager, natural_topology
from p2p.averaging.sgp import PushSumShare
from p2p.protocol import RemoteProtocolError, Send
from p2p.sim.avg_port import ArrayPort
from p2p.sim.avg_problems import Quadratics
from p2p.sim.invariants import InvariantViolation
from p2p.topology import TIME_VARYING, get_topology
from p2p.wire import decode, encode

INF = float("inf")
DELIVER, TICK, COMPUTE_DONE, JOIN, CRASH, DETECT, SAMPLE = range(7)
READY, COMPUTING, GRAD_WAIT, IDLE, DOWN = range(5)
WEIGHT_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Churn:
    joins: int = 0  # peers that join during the run
    crashes: int = 0  # peers that crash during the run (never below 2 live)
    window: tuple[float, float] = (0.2, 0.5)  # when, as fractions of the nominal training time
    detect_s: float = 0.2  # a crashed peer stays in the others' member lists this long


SIM_OPTIONS = {"diloco": dict(inner_steps=10), "gossipgrad": dict(model_every=4)}  # scaled to short runs


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
        steps = 2 * (options or sim_algorithm_options("diloco")).inner_steps
    base = dict(interval_s=compute_s, exchange_timeout_s=10 * compute_s, round_timeout_s=steps * compute_s)
    base.update(overrides)
    return AveragingConfig(**base)


@dataclass
class AvgSimResult:
    algorithm: str
    topology: str
    seed: int
    times: list[float] = field(default_factory=list)  # sample times
    consensus: list[float] = field(default_factory=list)  # consensus distance per sample
    gap: list[float] = field(default_factory=list)  # optimality gap of the mean model per sample
    live: list[int] = field(default_factory=list)  # live peers per sample
    total_weight: list[float] = field(default_factory=list)  # push-sum sum of w (live + in flight)
    initial_consensus: float = math.nan
    initial_gap: float = math.nan
    final_consensus: float = math.nan
    final_gap: float = math.nan
    end_time: float = 0.0
    finish_time: dict[str, float] = field(default_factory=dict)  # when each peer finished training
    steps: dict[str, int] = field(default_factory=dict)
    stragglers: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)  # averager stats summed over peers
    network: dict[str, int] = field(default_factory=dict)  # sent, delivered, lost, dropped, rejected
    rejected: dict[str, int] = field(default_factory=dict)  # RemoteProtocolError reasons
    weight_lost: float = 0.0  # push-sum weight lost to loss, drops and crashes
    weights: dict[str, float] = field(default_factory=dict)  # final push-sum weight per live peer
    events: int = 0


@dataclass
class _Peer:
    addr: str
    avg: Any
    port: ArrayPort
    rng: np.random.Generator
    compute_s: float
    target: int  # steps to train
    phase: int = READY
    grad: Optional[np.ndarray] = None
    sched: float = INF
    finished_at: float = INF


class AvgSimulation:
    def __init__(self, algorithm: str, topology: Optional[str], peers: int, steps: int, seed: int,
                 loss: float = 0.0, delay_s: float = 0.005, jitter_s: float = 0.005,
                 churn: Churn = Churn(), stragglers: int = 0, straggler_factor: float = 4.0,
                 compute_s: float = 0.05, compute_jitter: float = 0.1, lr: float = 0.2,
                 lr_decay_steps: float = 30.0, dim: int = 8, heterogeneity: float = 1.0,
                 init_spread: float = 1.0, noise: float = 0.0, config: Optional[AveragingConfig] = None,
                 options: Any = None, topology_options: Optional[dict] = None, linger_s: float = 0.5,
                 sample_every_s: float = 0.25, wire: bool = False, check_invariants: bool = True,
                 max_time_s: Optional[float] = None) -> None:
        if peers < 1 or steps < 1 or not 0 <= loss < 1:
            raise ValueError("need peers >= 1, steps >= 1 and loss in [0, 1)")
        self.algorithm = algorithm
        self.topology_name = topology or natural_topology(algorithm)
        self.topology = get_topology(self.topology_name, **(topology_options or {}))
        self.time_varying = self.topology_name in TIME_VARYING
        self.seed, self.steps, self.loss = seed, steps, loss
        self.delay_s, self.jitter_s = delay_s, jitter_s
        self.churn, self.compute_s, self.compute_jitter = churn, compute_s, compute_jitter
        self.lr, self.lr_decay_steps, self.noise = lr, lr_decay_steps, noise
        self.options = options if options is not None else sim_algorithm_options(algorithm)
        self.config = config or sim_averaging_config(compute_s, algorithm, self.options)
        self.linger_s, self.sample_every_s, self.wire = linger_s, sample_every_s, wire
        self.check_invariants = check_invariants
        self.rng = random.Random(f"{seed}:avgsim")
        total = peers + churn.joins
        self.problem = Quadratics(total, dim, seed, heterogeneity)
        init_rng = np.random.default_rng([seed, 0x1A17])
        self.x0 = init_rng.normal(size=dim)  # the common initial model (same seed on every peer)
        self.inits = self.x0 + init_spread * init_rng.normal(size=(total, dim))
        self.addrs = [f"10.0.{i >> 8}.{i & 255}:7000" for i in range(total)]
        self.index = {a: i for i, a in enumerate(self.addrs)}
        self.peers: list[Optional[_Peer]] = [None] * total
        self.crashed: set[int] = set()
        self.members: list[str] = []  # the shared member view (sorted)
        self._nbr_cache: dict[tuple[int, int], list[str]] = {}
        self._membership_changed = True  # re-check "all finished" (also set when a peer finishes)
        self.straggler_ids = set(range(peers - stragglers, peers)) if stragglers else set()
        self.straggler_factor = straggler_factor
        self.heap: list[tuple] = []
        self.seq = 0
        self.now = 0.0
        self.net: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.result = AvgSimResult(algorithm, self.topology_name, seed)
        # push-sum mass accounting
        self.weight_in_flight = 0.0
        self.weight_expected = 0.0
        self.weight_lost = 0.0
        self._tick_guard: tuple[float, int, int] = (-1.0, -1, 0)
        nominal = steps * compute_s
        self.max_time = max_time_s if max_time_s is not None else 50 * nominal * max(1.0, straggler_factor) + 10
        for i in range(peers):
            self._push(0.0, JOIN, i)
        lo, hi = churn.window
        for k in range(churn.joins):
            self._push(nominal * self.rng.uniform(lo, hi), JOIN, peers + k)
        for _ in range(churn.crashes):
            self._push(nominal * self.rng.uniform(lo, hi), CRASH, None)
        self._push(0.0, SAMPLE, None)

    # -- plumbing ---------------------------------------------------------------------------
    def _push(self, t: float, kind: int, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, data))

    def fail(self, text: str) -> None:
        raise InvariantViolation(self.seed, self.now, f"{self.algorithm}/{self.topology_name}: {text}")

    def _live(self) -> list[int]:
        return [i for i, p in enumerate(self.peers) if p is not None and p.phase != DOWN]

    def _neighbours(self, i: int) -> list[str]:
        p = self.peers[i]
        key = (i, p.avg.topology_round() if self.time_varying else 0)
        found = self._nbr_cache.get(key)
        if found is None:  # topologies are pure functions of (me, members, round): memoise
            found = self._nbr_cache[key] = self.topology(p.addr, self.members, p.avg.topology_round())
        return list(found)

    def _set_members(self, members: list[str]) -> None:
        self.members = members
        self._nbr_cache = {}
        self._membership_changed = True

    def _lr(self, k: int) -> float:
        return self.lr / (1.0 + k / self.lr_decay_steps)

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> AvgSimResult:
        end = INF
        while self.heap:
            t, _, kind, data = heapq.heappop(self.heap)
            if t > end or t > self.max_time:
                break
            self.now = t
            self.result.events += 1
            if kind == DELIVER:
                self._deliver(*data)
            elif kind == TICK:
                self._tick(data, t)
            elif kind == COMPUTE_DONE:
                self._compute_done(data)
            elif kind == JOIN:
                self._join(data)
            elif kind == CRASH:
                self._crash()
            elif kind == DETECT:
                self._detect(data)
            elif kind == SAMPLE:
                self._sample()
                if end == INF or t + self.sample_every_s <= end:
                    self._push(t + self.sample_every_s, SAMPLE, None)
            if self.check_invariants:
                self._check_weight()
            if end == INF and self._membership_changed and self._all_finished():
                end = self.now + self.linger_s
                self._push(end, SAMPLE, None)
        self._finish()
        return self.result

    def _all_finished(self) -> bool:
        self._membership_changed = False
        live = self._live()
        pending_joins = any(p is None for p in self.peers)
        return bool(live) and not pending_joins and all(self.peers[i].phase == IDLE for i in live)

    # -- scenario events --------------------------------------------------------------------
    def _join(self, i: int) -> None:
        live = self._live()  # the joiner copies the step count of the peer it joins through
        step0 = self.peers[live[self.rng.randrange(len(live))]].port.step if live else 0
        port = ArrayPort(self.inits[i], model_key=f"quadratic/{self.problem.dim}")
        port.step = step0
        now = self.now
        avg = make_averager(self.algorithm, self.config, port, random.Random(f"{self.seed}:avg:{i}"), now,
                            options=self.options)
        slow = self.straggler_factor if i in self.straggler_ids else 1.0
        self.peers[i] = _Peer(self.addrs[i], avg, port, np.random.default_rng([self.seed, 7, i]),
                              self.compute_s * slow, self.steps)
        self._set_members(sorted(set(self.members) | {self.addrs[i]}))
        if hasattr(avg, "weight"):
            self.weight_expected += avg.weight
        self._touch(i)

    def _crash(self) -> None:
        live = self._live()
        if len(live) <= 2:
            return
        i = live[self.rng.randrange(len(live))]
        p = self.peers[i]
        p.phase = DOWN
        self._membership_changed = True
        self.crashed.add(i)
        if hasattr(p.avg, "weight"):
            self.weight_lost += p.avg.weight
        self._accumulate_stats(p)
        self._push(self.now + self.churn.detect_s, DETECT, i)

    def _detect(self, i: int) -> None:
        self._set_members([m for m in self.members if m != self.addrs[i]])

    # -- network ----------------------------------------------------------------------------
    def _dispatch(self, i: int, sends: list[Send]) -> None:
        src = self.addrs[i]
        for s in sends:
            self.net["sent"] += 1
            weight = s.msg.weight if isinstance(s.msg, PushSumShare) else 0.0
            dst = self.index.get(s.to)
            if dst is None or self.rng.random() < self.loss:
                self.net["lost"] += 1
                self.weight_lost += weight
                continue
            self.weight_in_flight += weight
            payload = encode(s.msg, src) if self.wire else s.msg
            if self.wire:
                payload = [bytes(f) for f in payload]
            delay = self.delay_s + self.jitter_s * self.rng.random()
            self._push(self.now + delay, DELIVER, (dst, src, payload, weight))

    def _deliver(self, dst: int, src: str, payload: Any, weight: float) -> None:
        self.weight_in_flight -= weight
        p = self.peers[dst]
        if p is None or p.phase == DOWN:
            self.net["dropped"] += 1
            self.weight_lost += weight
            return
        try:
            if self.wire:
                src, msg = decode(payload)
            else:
                msg = payload
            sends = p.avg.receive(src, msg, self.now, self._neighbours(dst))
        except RemoteProtocolError as exc:
            self.rejected[exc.reason] += 1
            self.net["rejected"] += 1
            self.weight_lost += weight
            return
        self.net["delivered"] += 1
        self._dispatch(dst, sends)
        self._touch(dst)

    def _touch(self, i: int) -> None:
        """Re-poll the peer's trainer, then make sure its averager's next deadline is scheduled
        (hooks called by the trainer may have started a round with a new deadline)."""
        self._advance(i)
        self._reschedule(i)

    def _reschedule(self, i: int) -> None:
        p = self.peers[i]
        d = max(p.avg.next_deadline(), self.now)
        if d < p.sched:
            p.sched = d
            self._push(d, TICK, i)

    def _tick(self, i: int, t: float) -> None:
        p = self.peers[i]
        if p is None or p.phase == DOWN or t != p.sched:
            return
        p.sched = INF
        if self.now >= p.avg.next_deadline():
            self._dispatch(i, p.avg.tick(self.now, self._neighbours(i)))
            if p.avg.next_deadline() <= self.now:
                last_t, last_i, count = self._tick_guard
                count = count + 1 if (last_t, last_i) == (self.now, i) else 1
                self._tick_guard = (self.now, i, count)
                if count > 100:
                    self.fail(f"{p.addr}: tick() keeps next_deadline() at now")
        self._touch(i)

    # -- the simulated trainer --------------------------------------------------------------
    def _advance(self, i: int) -> None:
        p = self.peers[i]
        while True:
            if p.phase == READY:
                k = p.port.step
                if not p.avg.may_step(k + 1, self.now):
                    return
                p.port.apply_pending()
                if k >= p.target:
                    p.phase, p.finished_at = IDLE, self.now
                    self._membership_changed = True
                    return
                g = self.problem.grad(i, p.port.x.astype(np.float64))
                if self.noise:
                    g = g + self.noise * p.rng.normal(size=g.shape)
                p.grad = g.astype(np.float32)
                p.phase = COMPUTING
                spread = 1.0 + self.compute_jitter * (2 * self.rng.random() - 1)
                self._push(self.now + p.compute_s * spread, COMPUTE_DONE, i)
                return
            if p.phase == GRAD_WAIT:
                if not p.avg.gradient_ready(p.port.step + 1, self.now):
                    return
                self._optimizer_step(i, p.port.grad)
                continue
            if p.phase == IDLE:
                p.port.apply_pending()
            return

    def _compute_done(self, i: int) -> None:
        p = self.peers[i]
        if p.phase != COMPUTING:
            return  # crashed meanwhile
        if p.avg.wants_gradient:
            p.port.grad = p.grad
            p.phase = GRAD_WAIT
            self._dispatch(i, p.avg.on_gradient(p.port.step + 1, self.now, self._neighbours(i)))
        else:
            self._optimizer_step(i, p.grad)
        self._touch(i)

    def _optimizer_step(self, i: int, grad: np.ndarray) -> None:
        p = self.peers[i]
        p.port.x -= np.float32(self._lr(p.port.step)) * grad
        p.port.step += 1
        p.port.grad = None
        p.phase = READY
        self._dispatch(i, p.avg.after_step(p.port.step, self.now, self._neighbours(i)))

    # -- invariants and metrics -------------------------------------------------------------
    def _check_weight(self) -> None:
        if not self.weight_expected:
            return
        held = sum(self.peers[i].avg.weight for i in self._live())
        total = held + self.weight_in_flight
        if abs(total - (self.weight_expected - self.weight_lost)) > WEIGHT_TOLERANCE:
            self.fail(f"push-sum mass {total!r} != {self.weight_expected - self.weight_lost!r} "
                      f"(joined {self.weight_expected}, lost {self.weight_lost})")

    def _metrics(self) -> tuple[float, float, int]:
        live = tuple(self._live())
        if not live:
            return math.nan, math.nan, 0
        xs = np.stack([self.peers[i].port.snapshot().astype(np.float64) for i in live])
        mean = xs.mean(axis=0)
        consensus = float(np.sqrt(((xs - mean) ** 2).sum(axis=1).mean()))
        _, best = self.problem.optimum(live)
        return consensus, self.problem.loss(live, mean) - best, len(live)

    def _sample(self) -> None:
        consensus, gap, n = self._metrics()
        r = self.result
        r.times.append(self.now)
        r.consensus.append(consensus)
        r.gap.append(gap)
        r.live.append(n)
        if self.weight_expected:
            r.total_weight.append(sum(self.peers[i].avg.weight for i in self._live()) + self.weight_in_flight)
        if len(r.times) == 1:
            r.initial_consensus, r.initial_gap = consensus, gap

    def _accumulate_stats(self, p: _Peer) -> None:
        self.stats.update({k: v for k, v in p.avg.stats.items()})

    def _finish(self) -> None:
        r = self.result
        for i in self._live():
            p = self.peers[i]
            p.port.apply_pending()
            self._accumulate_stats(p)
            r.finish_time[p.addr] = p.finished_at
            r.steps[p.addr] = p.port.step
            if hasattr(p.avg, "weight"):
                r.weights[p.addr] = p.avg.weight
        r.final_consensus, r.final_gap, _ = self._metrics()
        r.end_time = self.now
        r.stragglers = [self.addrs[i] for i in sorted(self.straggler_ids)]
        r.stats = dict(self.stats)
        r.network = dict(self.net)
        r.rejected = dict(self.rejected)
        r.weight_lost = self.weight_lost


def run(algorithm: str, topology: Optional[str] = None, peers: int = 8, steps: int = 200, seed: int = 0,
        loss: float = 0.0, churn: Churn = Churn(), **options: Any) -> AvgSimResult:
    """Simulate ``peers`` peers training ``steps`` steps each with ``algorithm`` over
    ``topology`` (default: the algorithm's natural one). ``options``: see ``AvgSimulation``."""
    return AvgSimulation(algorithm, topology, peers, steps, seed, loss=loss, churn=churn, **options).run()
