"""Deterministic simulator for the averaging algorithms: the composed Peer (membership, topology,
averager) on every simulated peer, simulated trainers, the shared network model, a logical clock.

Theory of operation
-------------------
The same machinery as the membership simulator: the event loop (``loop.py``: a heap ordered by
``(time, seq)``, one live TICK per peer at its ``next_deadline()``), the network model
(``network.py``: loss, delay + jitter, uplink bandwidth, down receivers) and the churn schedule
(``churn.py``). One ``random.Random`` for the network, one for the churn schedule and one per
peer, all derived from the seed by string, so the same ``AvgSimConfig`` replays the same run bit
for bit.
Nothing reads the wall clock.

Every peer is a ``SimNode`` (``avg_node.py``): ``Peer(addr, Membership(...), averager,
topology)`` with an ``ArrayPort`` model and a trainer state machine. The simulator is the
peer's driver, as the ZeroMQ daemon is a real one: it hands each arriving message to
``peer.receive`` (which routes membership and averaging messages), runs ``peer.tick`` at
``peer.next_deadline()``, and after every event that touched a peer re-polls its trainer.

Membership is real. The initial peers start together, already holding each other's rows
(``Membership.restore``, so convergence is not about join time); a joiner starts with the step
count of a running member and joins through that member's address (``peer.start``); a crash
stops a peer silently and the others find out by SWIM probes and suspicion timeouts; a leave
announces itself (``peer.leave``) and stops. Neighbours always come from each peer's own view
(``peer.neighbours()``), so views that disagree during churn show up as they would on a real
swarm. Membership and averaging messages share the network (and, with ``wire=True``, the real
codec). ``RemoteProtocolError`` is counted by reason and dropped, as the real driver does.

Events: DELIVER and TICK (shared), COMPUTE_DONE (a trainer's step computed), START (the
initial peers), JOIN, CRASH, LEAVE (churn), SAMPLE (metrics). When every running peer is IDLE
and no join is pending, the run lingers ``linger_s`` more (finished peers keep serving their
neighbours' rounds) and stops.

Invariants, checked after every event (``check_invariants``): push-sum mass, sum of the weights
held by running peers + weight in flight == weight joined - weight lost, to 1e-9 (lost: the
loss model, messages that arrive at a down peer or are rejected, the weight a crashing or
leaving peer held; membership messages carry none); ``tick`` moves ``next_deadline()`` past
now (no busy loop); and on every membership table change the checkers of ``invariants.py``.
A violation raises ``InvariantViolation`` naming the seed.

Metrics, sampled every ``sample_every_s`` over the running peers' models x_i (SGP: z_i):
consensus distance sqrt(mean_i ||x_i - mean x||^2) and optimality gap F_S(mean x) - F_S(x*_S).
For each crash and leave, when each running peer stopped holding the departed one alive.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from p2p.averaging.hostile import Hostile
from p2p.averaging.registry import make_averager, natural_topology
from p2p.averaging.sgp import PushSumShare
from p2p.gossip import ALIVE, DEAD, SUSPECT, Membership
from p2p.gossip.messages import MEMBERSHIP_MESSAGES
from p2p.peer import Peer
from p2p.protocol import RemoteProtocolError, Send
from p2p.sim.avg_config import AvgSimConfig
from p2p.sim.avg_node import DOWN, IDLE, SimNode
from p2p.sim.avg_port import ArrayPort
from p2p.sim.avg_problems import Quadratics
from p2p.sim.churn import CRASH as CHURN_CRASH, JOIN as CHURN_JOIN, Churn, pick
from p2p.sim.invariants import InvariantChecker, InvariantViolation
from p2p.sim.loop import DELIVER, FIRST_KIND, INF, TICK, EventLoop, Timers
from p2p.sim.network import Network
from p2p.topology import get_topology
from p2p.wire import decode, encode

COMPUTE_DONE, START, JOIN, CRASH, LEAVE, SAMPLE = range(FIRST_KIND, FIRST_KIND + 6)
WEIGHT_TOLERANCE = 1e-9
TICKS_AT_ONE_INSTANT = 100  # more ticks of one peer at one simulated instant: a busy loop


@dataclass
class Departure:
    addr: str
    kind: str  # "crash" | "leave"
    at: float  # simulated time it stopped
    noticed: dict[str, float] = field(default_factory=dict)  # observer -> when it stopped holding it alive


@dataclass
class AvgSimResult:
    algorithm: str
    topology: str
    seed: int
    times: list[float] = field(default_factory=list)  # sample times
    consensus: list[float] = field(default_factory=list)  # consensus distance per sample
    gap: list[float] = field(default_factory=list)  # optimality gap of the mean model per sample
    live: list[int] = field(default_factory=list)  # running peers per sample
    total_weight: list[float] = field(default_factory=list)  # push-sum sum of w (running + in flight)
    initial_consensus: float = math.nan
    initial_gap: float = math.nan
    final_consensus: float = math.nan
    final_gap: float = math.nan
    end_time: float = 0.0
    finish_time: dict[str, float] = field(default_factory=dict)  # when each peer finished training
    steps: dict[str, int] = field(default_factory=dict)
    stragglers: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)  # averager stats summed over peers
    membership: dict[str, int] = field(default_factory=dict)  # membership stats summed over peers
    network: dict[str, int] = field(default_factory=dict)  # sent, delivered, lost, dropped, rejected, membership_sent
    rejected: dict[str, int] = field(default_factory=dict)  # RemoteProtocolError reasons
    departures: list[Departure] = field(default_factory=list)  # crashes and leaves, in order
    false_positives: int = 0  # times a peer declared a running peer dead
    weight_lost: float = 0.0  # push-sum weight lost to loss, drops, rejections, crashes and leaves
    weight_in_flight: float = 0.0  # push-sum weight in messages still on the wire at the end
    weights: dict[str, float] = field(default_factory=dict)  # final push-sum weight per running peer
    events: int = 0


class AvgSimulation:
    def __init__(self, cfg: AvgSimConfig) -> None:
        self.cfg = cfg
        self.algorithm, self.seed = cfg.algorithm, cfg.seed
        self.topology_name = cfg.topology or natural_topology(cfg.algorithm)
        self.topology = get_topology(self.topology_name, **(cfg.topology_options or {}))
        self.options = cfg.algorithm_options()
        self.averaging = cfg.averaging_config()
        self.membership = cfg.membership_config()
        self.rng = random.Random(f"{cfg.seed}:avgsim")  # the network's
        self.churn_rng = random.Random(f"{cfg.seed}:churn")  # churn times, victims, joiners' seeds
        total = cfg.peers + cfg.churn.joins
        self.problem = Quadratics(total, cfg.dim, cfg.seed, cfg.heterogeneity)
        init_rng = np.random.default_rng([cfg.seed, 0x1A17])
        self.x0 = init_rng.normal(size=cfg.dim)  # the common initial model (same seed on every peer)
        self.inits = self.x0 + cfg.init_spread * init_rng.normal(size=(total, cfg.dim))
        self.ids = [f"p{i:05d}" for i in range(total)]
        self.addrs = [f"10.0.{i >> 8}.{i & 255}:7000" for i in range(total)]
        self.index = {a: i for i, a in enumerate(self.addrs)}
        self.id_index = {x: i for i, x in enumerate(self.ids)}
        self.nodes: list[Optional[SimNode]] = [None] * total
        self.loop = EventLoop()
        self.timers = Timers(self.loop, total)
        self.net = Network(self.loop, self.rng, total, cfg.loss, cfg.delay_s, cfg.jitter_s, cfg.bandwidth_bps)
        self.checker = InvariantChecker(cfg.seed) if cfg.check_invariants else None
        self.straggler_ids = set(range(cfg.peers - cfg.stragglers, cfg.peers))
        self.tampers: dict[int, Callable[[object], object]] = {}  # hostile peers' message rewriters
        self.max_time = cfg.time_limit_s()
        self.next_joiner = cfg.peers
        self.joins_pending = cfg.churn.joins
        self.rejected: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.membership_stats: Counter[str] = Counter()
        self.membership_sent = 0
        self.departed: dict[str, Departure] = {}  # node id -> its departure record
        self.result = AvgSimResult(cfg.algorithm, self.topology_name, cfg.seed)
        self._maybe_finished = False  # re-check "all finished" (a peer finished, left or crashed)
        self._tick_guard: tuple[float, int, int] = (-1.0, -1, 0)
        # push-sum mass accounting
        self.weight_in_flight = 0.0
        self.weight_expected = 0.0
        self.weight_lost = 0.0
        push = self.loop.push
        push(0.0, START)
        kinds = {CHURN_JOIN: JOIN, CHURN_CRASH: CRASH}
        for t, kind in cfg.churn.schedule(self.churn_rng, cfg.nominal_s):
            push(t, kinds.get(kind, LEAVE))
        push(0.0, SAMPLE)

    @property
    def now(self) -> float:
        return self.loop.now

    def fail(self, text: str) -> None:
        raise InvariantViolation(self.seed, self.now, f"{self.algorithm}/{self.topology_name}: {text}")

    def running(self) -> list[int]:
        """Indices of the peers started and not crashed or departed."""
        return [i for i, nd in enumerate(self.nodes) if nd is not None and nd.phase != DOWN]

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> AvgSimResult:
        loop, end, check = self.loop, INF, self.cfg.check_invariants
        every = self.cfg.sample_every_s
        while loop.heap:
            t = loop.peek_time()
            if t > end or t > self.max_time:
                break
            _, _, kind, a, b, c = loop.pop()
            self.result.events += 1
            if kind == DELIVER:
                self._deliver(a, b, c)
            elif kind == TICK:
                self._tick(a, t)
            elif kind == COMPUTE_DONE:
                node = self.nodes[a]
                if node.phase != DOWN:
                    self._dispatch(a, node.compute_done(t))
                    self._touch(a)
            elif kind == SAMPLE:
                self._sample()
                if end == INF or t + every <= end:
                    loop.push(t + every, SAMPLE)
            elif kind == START:
                self._start_initial()
            elif kind == JOIN:
                self._join()
            else:
                self._depart("crash" if kind == CRASH else "leave")
            if check:
                self._check_weight()
            if end == INF and self._maybe_finished and self._all_finished():
                end = t + self.cfg.linger_s
                loop.push(end, SAMPLE)
        self._finish()
        return self.result

    def _all_finished(self) -> bool:
        self._maybe_finished = False
        live = self.running()
        return bool(live) and not self.joins_pending and all(self.nodes[i].phase == IDLE for i in live)

    # -- peers coming and going -------------------------------------------------------------
    def _start_initial(self) -> None:
        """The initial peers start together, each already holding every initial member's row."""
        rows = {self.ids[i]: (ALIVE, self.ids[i], self.addrs[i], 0) for i in range(self.cfg.peers)}
        for i in range(self.cfg.peers):
            self._start(i, None, rows)

    def _join(self) -> None:
        i = self.next_joiner
        self.next_joiner += 1
        self.joins_pending -= 1
        self._start(i, pick(self.churn_rng, self.running()), None)

    def _start(self, i: int, via: Optional[int], rows: Optional[dict]) -> None:
        """Start peer i; a joiner (``via`` set) copies that member's step count, as a state
        transfer of the step count would give it, and joins through its address."""
        cfg, now = self.cfg, self.now
        port = ArrayPort(self.inits[i], model_key=f"quadratic/{cfg.dim}")
        if via is not None:
            port.step = self.nodes[via].port.step
        membership = Membership(self.membership, self.ids[i], self.addrs[i], random.Random(f"{cfg.seed}:member:{i}"),
                                now)
        if rows:
            membership.restore(rows, now)
        membership.on_change = self._hook(i)
        avg = make_averager(cfg.algorithm, self.averaging, port, random.Random(f"{cfg.seed}:avg:{i}"), now,
                            options=self.options)
        if i in cfg.hostile:
            self.tampers[i] = Hostile(cfg.hostile_mode, avg.MESSAGES, cfg.seed * 1000 + i).tamper
        slow = cfg.straggler_factor if i in self.straggler_ids else 1.0
        node = self.nodes[i] = SimNode(i, Peer(self.addrs[i], membership, avg, self.topology), port, cfg,
                                       self.problem, cfg.compute_s * slow)
        self.net.up[i] = True
        if hasattr(avg, "weight"):
            self.weight_expected += avg.weight
        self._dispatch(i, node.peer.start([] if via is None else [self.addrs[via]], now))
        self._touch(i)

    def _depart(self, kind: str) -> None:
        """A crash (silent) or a leave (announced) of a running peer picked now."""
        i = self.cfg.churn.victim(self.churn_rng, self.running())
        if i is None:
            return
        node, now = self.nodes[i], self.now
        self.departed[self.ids[i]] = rec = Departure(self.addrs[i], kind, now)
        self.result.departures.append(rec)
        if kind == "leave":
            node.leaving = True
            self._dispatch(i, node.peer.leave(now))
        node.phase = DOWN
        self.net.up[i] = False
        self.timers.cancel(i)
        self._maybe_finished = True
        if hasattr(node.averager, "weight"):
            self.weight_lost += node.averager.weight
        self._accumulate_stats(node)

    def _hook(self, o: int):
        """The on_change observer of peer o's membership: invariants, departures noticed,
        false positives."""
        observer, observer_addr, loop, checker = self.ids[o], self.addrs[o], self.loop, self.checker
        nodes, departed, id_index, up = self.nodes, self.departed, self.id_index, self.net.up

        def hook(mid: str, os: Optional[int], oi: int, ns: Optional[int], ni: int) -> None:
            if checker is not None:
                node = nodes[o]
                checker.observe(loop.now, observer, mid, os, oi, ns, ni, node is not None and node.leaving)
            if mid == observer or ns is not None and ns <= SUSPECT:
                return
            rec = departed.get(mid)
            if rec is not None:
                rec.noticed.setdefault(observer_addr, loop.now)
            elif ns == DEAD and os != DEAD and up[id_index.get(mid, o)]:
                self.result.false_positives += 1

        return hook

    # -- network ----------------------------------------------------------------------------
    def _dispatch(self, i: int, sends: list[Send]) -> None:
        if not sends:
            return
        src, now, net, index, wire = self.addrs[i], self.now, self.net, self.index, self.cfg.wire
        sized = wire or self.cfg.bandwidth_bps
        tamper = self.tampers.get(i)
        for s in sends:
            msg = s.msg if tamper is None else tamper(s.msg)
            weight = msg.weight if isinstance(msg, PushSumShare) else 0.0
            if isinstance(msg, MEMBERSHIP_MESSAGES):
                self.membership_sent += 1
            payload, size = msg, 0
            if sized:
                frames = [bytes(f) for f in encode(msg, src)]
                size = sum(len(f) for f in frames)
                if wire:
                    payload = frames
            if net.send(now, i, index.get(s.to), (payload, weight), size):
                self.weight_in_flight += weight
            else:
                self.weight_lost += weight

    def _deliver(self, dst: int, src: int, packet: tuple) -> None:
        payload, weight = packet
        self.weight_in_flight -= weight
        if not self.net.arrives(dst, src):
            self.weight_lost += weight
            return
        node = self.nodes[dst]
        try:
            if self.cfg.wire:
                addr, msg = decode(payload)
            else:
                addr, msg = self.addrs[src], payload
            sends = node.peer.receive(addr, msg, self.now)
        except RemoteProtocolError as exc:
            self.rejected[exc.reason] += 1
            self.weight_lost += weight
            return
        self._dispatch(dst, sends)
        self._touch(dst)

    def _tick(self, i: int, t: float) -> None:
        node = self.nodes[i]
        if not self.timers.due(i, t) or node.phase == DOWN:
            return
        self._dispatch(i, node.peer.tick(t))
        if node.peer.next_deadline() <= t:
            last_t, last_i, count = self._tick_guard
            count = count + 1 if (last_t, last_i) == (t, i) else 1
            self._tick_guard = (t, i, count)
            if count > TICKS_AT_ONE_INSTANT:
                self.fail(f"{node.peer.addr}: tick() keeps next_deadline() at now")
        self._touch(i)

    def _touch(self, i: int) -> None:
        """Re-poll peer i's trainer, then arm its timer at the peer's next deadline (hooks
        called by the trainer may have started a round with a new deadline)."""
        node, now = self.nodes[i], self.now
        was_idle = node.phase == IDLE
        sends, compute_end = node.advance(now)
        self._dispatch(i, sends)
        if compute_end is not None:
            self.loop.push(compute_end, COMPUTE_DONE, i)
        if node.phase == IDLE and not was_idle:
            self._maybe_finished = True
        self.timers.arm(i, node.peer.next_deadline(), now)

    # -- invariants and metrics -------------------------------------------------------------
    def _held_weight(self) -> float:
        return sum(self.nodes[i].averager.weight for i in self.running())

    def _check_weight(self) -> None:
        if not self.weight_expected:
            return
        total = self._held_weight() + self.weight_in_flight
        if abs(total - (self.weight_expected - self.weight_lost)) > WEIGHT_TOLERANCE:
            self.fail(f"push-sum mass {total!r} != {self.weight_expected - self.weight_lost!r} "
                      f"(joined {self.weight_expected}, lost {self.weight_lost})")

    def _metrics(self) -> tuple[float, float, int]:
        """Consensus distance and optimality gap of the live honest peers (hostile ones left out)."""
        live = tuple(i for i in self.running() if i not in self.tampers)
        if not live:
            return math.nan, math.nan, 0
        xs = np.stack([self.nodes[i].port.snapshot().astype(np.float64) for i in live])
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
            r.total_weight.append(self._held_weight() + self.weight_in_flight)
        if len(r.times) == 1:
            r.initial_consensus, r.initial_gap = consensus, gap

    def _accumulate_stats(self, node: SimNode) -> None:
        self.stats.update(node.averager.stats)
        self.membership_stats.update(node.peer.membership.stats)

    def _finish(self) -> None:
        r = self.result
        for i in self.running():
            node = self.nodes[i]
            node.port.apply_pending()
            self._accumulate_stats(node)
            r.finish_time[node.peer.addr] = node.finished_at
            r.steps[node.peer.addr] = node.port.step
            if hasattr(node.averager, "weight"):
                r.weights[node.peer.addr] = node.averager.weight
        r.final_consensus, r.final_gap, _ = self._metrics()
        r.end_time = self.now
        r.stragglers = [self.addrs[i] for i in sorted(self.straggler_ids)]
        r.stats = dict(self.stats)
        r.membership = dict(self.membership_stats)
        rejected = sum(self.rejected.values())
        r.network = {**self.net.counters(), "rejected": rejected, "membership_sent": self.membership_sent}
        r.rejected = dict(self.rejected)
        r.weight_lost = self.weight_lost
        r.weight_in_flight = self.weight_in_flight


def run(algorithm: str, topology: Optional[str] = None, peers: int = 8, steps: int = 200, seed: int = 0,
        loss: float = 0.0, churn: Churn = Churn(), **options: Any) -> AvgSimResult:
    """Simulate ``peers`` peers training ``steps`` steps each with ``algorithm`` over
    ``topology`` (default: the algorithm's natural one). ``options``: see ``AvgSimConfig``."""
    cfg = AvgSimConfig(algorithm, topology, peers, steps, seed, loss=loss, churn=churn, **options)
    return AvgSimulation(cfg).run()
