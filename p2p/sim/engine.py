"""Deterministic discrete-event simulator driving real ``Membership`` objects.

Theory of operation
-------------------
The shared event loop (``loop.py``: a heap ordered by ``(time, seq)``, a logical clock that
only the heap advances, one live TICK per member); one ``random.Random`` per run for the
network, the partition and the start times, one for churn, and one per member, all derived
from the seed by string (never ``hash()``), so the same ``SimConfig`` replays the same run bit
for bit. Churn has its own stream so that adding crashes or joins to a scenario leaves the
network's draws before the first churn event unchanged. Nothing reads the wall clock.

Events (``loop.py``): DELIVER (a message reaches a member) and TICK (a member's
``next_deadline`` came), and scenario actions (START, JOIN, CRASH, LEAVE, PARTITION, HEAL).
Churn (``churn.py``, shared with the averaging simulator): the k-th JOIN starts member
``peers + k`` through a running member; CRASH and LEAVE pick their victim among the running
members when they fire. The network model (``network.py``: loss, delay + jitter, per-sender
uplink serialisation, partition groups, down receivers) is shared with the averaging simulator
too.

Ground truth vs. views: ``up[i]`` says whether member i runs. Every member's table changes are
observed through ``Membership.on_change``; from them the simulator keeps, incrementally,

- ``alive_known[o]``: how many running members observer o holds ALIVE, and ``n_full``, the
  number of running observers that hold every other running member ALIVE (converged iff
  ``n_full == n_up``);
- for each crashed (or departed) member, how many running observers hold it not alive;
- false positives: a running, never-crashed member declared DEAD by an observer that could
  reach it (same partition group).

Invariant checkers (``invariants.py``) see every change; a violation stops the run.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Optional

from p2p.gossip.membership import Membership
from p2p.gossip.messages import ALIVE, DEAD, SUSPECT
from p2p.gossip.suspicion import suspicion_min_timeout
from p2p.protocol import RemoteProtocolError
from p2p.sim.churn import CRASH as CHURN_CRASH, JOIN as CHURN_JOIN, pick
from p2p.sim.config import SimConfig
from p2p.sim.invariants import InvariantChecker, InvariantViolation
from p2p.sim.loop import DELIVER, FIRST_KIND, INF, TICK, EventLoop, Timers
from p2p.sim.network import Network
from p2p.sim.wiresize import WireSize

START, JOIN, CRASH, LEAVE, PARTITION, HEAL = range(FIRST_KIND, FIRST_KIND + 6)


class Simulation:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(f"{cfg.seed}:sim")  # the network's, and the initial start times
        self.churn_rng = random.Random(f"{cfg.seed}:churn")  # churn times, victims, joiners' seeds
        n = cfg.peers + cfg.churn.joins
        self.n = n
        self.ids = [f"n{i:05d}" for i in range(n)]
        self.addrs = [f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}:7946" for i in range(n)]
        self.addr_index = {a: i for i, a in enumerate(self.addrs)}
        self.id_index = {x: i for i, x in enumerate(self.ids)}
        self.nodes: list[Optional[Membership]] = [None] * n
        self.loop = EventLoop()
        self.timers = Timers(self.loop, n)
        self.net = Network(self.loop, self.rng, n, cfg.loss, cfg.delay_ms / 1000.0, cfg.jitter_ms / 1000.0,
                           cfg.bandwidth_bps)
        self.up = self.net.up  # the network's list: whether member i runs
        self.leaving = [False] * n
        self.crashed = [False] * n
        self.size = WireSize(self.ids, self.addrs)
        self.checker = InvariantChecker(cfg.seed) if cfg.check_invariants else None
        # ground truth and view tracking
        self.n_up = 0
        self.alive_known = [0] * n
        self.n_full = 0
        self.initial_pending = cfg.peers
        self.converged_at: Optional[float] = None
        self.pending: dict[int, list] = {}  # gone member -> [kind, since, observers holding it not alive]
        self.detections: list[float] = []
        self.leave_times: list[float] = []
        self.false_positive: dict[int, float] = {}
        self.heal_at: Optional[float] = None
        self.merged_at: Optional[float] = None
        self.partition_started: Optional[float] = None
        self.member_seconds = 0.0
        self._last_change = 0.0
        self.remote_errors = 0
        self.events = 0
        self.next_joiner = cfg.peers  # the member the next JOIN starts

    # ------------------------------------------------------------------ scenario

    def schedule(self) -> None:
        cfg, rng = self.cfg, self.rng
        if cfg.warm_start:
            self._push(0.0, START, -1)
        else:
            self._push(0.0, START, 0)
            for i in range(1, cfg.peers):
                self._push(rng.random() * cfg.join_spread_s, START, i)
        kinds = {CHURN_JOIN: JOIN, CHURN_CRASH: CRASH}
        for t, kind in cfg.churn.schedule(self.churn_rng, cfg.duration_s):
            self._push(t, kinds.get(kind, LEAVE), 0)
        if cfg.partition is not None:
            start = cfg.partition_start
            self._push(start, PARTITION, 0)
            self._push(start + cfg.partition_s, HEAL, 0)

    def _push(self, t: float, kind: int, a: int, b: int = 0, c: object = None) -> None:
        self.loop.push(t, kind, a, b, c)

    @property
    def now(self) -> float:
        return self.loop.now

    # ------------------------------------------------------------------ main loop

    def run(self) -> dict:
        self.schedule()
        loop, nodes, at = self.loop, self.nodes, self.timers.at
        heap, addrs, end, dispatch = loop.heap, self.addrs, self.cfg.duration_s, self._dispatch
        pop, push, arrives = heapq.heappop, loop.push, self.net.arrives
        up = self.up
        events = 0
        while heap:
            t, _, kind, a, b, c = pop(heap)
            if t > end:
                break
            events += 1
            if kind == DELIVER:
                if not arrives(a, b):
                    continue
                loop.now = t
                node = nodes[a]
                try:
                    sends = node.receive(addrs[b], c, t)
                except RemoteProtocolError:
                    self.remote_errors += 1
                    continue
                if sends:
                    dispatch(a, sends, t)
                d = node.next_deadline()  # Timers.arm, inlined: one live TICK per member
                if d < t:
                    d = t
                if d != at[a]:
                    at[a] = d
                    if d < INF:
                        push(d, TICK, a)
            elif kind == TICK:
                if at[a] != t or not up[a]:
                    continue
                loop.now = t
                at[a] = INF
                node = nodes[a]
                sends = node.tick(t)
                if sends:
                    dispatch(a, sends, t)
                d = node.next_deadline()
                if d <= t:
                    raise InvariantViolation(self.cfg.seed, t, f"{self.ids[a]}: tick() left next_deadline() at {d}")
                if d < INF:
                    at[a] = d
                    push(d, TICK, a)
            else:
                loop.now = t
                self._action(kind, a, t)
        self.events = events
        loop.now = end
        self._account(end)
        return self.result()

    def _reschedule(self, i: int, t: float) -> None:
        self.timers.arm(i, self.nodes[i].next_deadline(), t)

    def _dispatch(self, i: int, sends: list, t: float) -> None:
        send, size_of, index = self.net.send, self.size, self.addr_index
        for s in sends:
            msg = s.msg
            send(t, i, index.get(s.to), msg, size_of(msg))

    def _action(self, kind: int, i: int, t: float) -> None:
        if kind == START:
            if i < 0:
                self._warm_start(t)
            else:
                self._start(i, t)
        elif kind == JOIN:
            self.next_joiner += 1
            self._start(self.next_joiner - 1, t)
        elif kind in (CRASH, LEAVE):
            i = self.cfg.churn.victim(self.churn_rng, [j for j in range(self.n) if self.up[j]])
            if i is None:
                return
            if kind == LEAVE:
                self.leaving[i] = True
                sends = self.nodes[i].leave(t)
                self._dispatch(i, sends, t)
            else:
                self.crashed[i] = True
            self._account(t)
            self._gone(i, t, "crash" if kind == CRASH else "leave")
        elif kind == PARTITION:
            self.net.partition(self.cfg.partition)
            self.partition_started = t
        elif kind == HEAL:
            self.net.heal()
            self.heal_at = t
            self._check_full(t)

    # ------------------------------------------------------------------ members coming and going

    def _make(self, i: int, t: float) -> Membership:
        m = Membership(self.cfg.membership, self.ids[i], self.addrs[i], random.Random(f"{self.cfg.seed}:{i}"), t)
        self.nodes[i] = m
        return m

    def _start(self, i: int, t: float) -> None:
        m = self._make(i, t)
        if i == 0:
            seeds: list[str] = []
        elif i < self.cfg.peers:
            seeds = [self.addrs[0]]
        else:
            via = pick(self.churn_rng, [j for j in range(self.n) if self.up[j]])
            seeds = [] if via is None else [self.addrs[via]]
        self._account(t)
        self.up[i] = True
        self.n_up += 1
        if i < self.cfg.peers:
            self.initial_pending -= 1
        # a brand-new id: nobody holds it yet, so every other running observer just lost fullness
        self.alive_known[i] = 0
        self.n_full = 1 if self.n_up == 1 else 0
        for rec in self.pending.values():
            rec[2] += 1  # the newcomer does not know the gone member
        m.on_change = self._hook(i)
        self._dispatch(i, m.start(seeds, t), t)
        self._reschedule(i, t)
        self._check_full(t)

    def _warm_start(self, t: float) -> None:
        """Start every initial member already holding the full table, as if each had just
        completed a join push-pull (skips the join phase for large runs)."""
        peers = self.cfg.peers
        rows = {self.ids[i]: (ALIVE, self.ids[i], self.addrs[i], 0) for i in range(peers)}
        for i in range(peers):
            m = self._make(i, t)
            m.restore(rows, t)
            m.start([], t)
            self.up[i] = True
            self.alive_known[i] = peers - 1
            m.on_change = self._hook(i)
            self._reschedule(i, t)
        self.n_up = self.n_full = peers
        self.initial_pending = 0
        self._check_full(t)

    def _gone(self, i: int, t: float, kind: str) -> None:
        """Member i stopped running (crash or leave): fix every counter that involved it."""
        self.up[i] = False
        self.n_up -= 1
        mid = self.ids[i]
        up, nodes = self.up, self.nodes
        observers = [p for p in range(self.n) if up[p]]
        for p in observers:
            if nodes[p].state_of(mid) == ALIVE:
                self.alive_known[p] -= 1
        target = self.n_up - 1
        self.n_full = sum(1 for p in observers if self.alive_known[p] == target)
        for g, rec in list(self.pending.items()):
            rec[2] = self._not_alive_count(g, observers)
        self.pending[i] = [kind, t, self._not_alive_count(i, observers)]
        for g in list(self.pending):
            self._check_gone(g, t)
        self._check_full(t)

    def _not_alive_count(self, g: int, observers: list[int]) -> int:
        gid, nodes = self.ids[g], self.nodes
        count = 0
        for p in observers:
            s = nodes[p].state_of(gid)
            if s is None or s > SUSPECT:
                count += 1
        return count

    def _check_gone(self, g: int, t: float) -> None:
        rec = self.pending.get(g)
        if rec is not None and rec[2] >= self.n_up:
            del self.pending[g]
            (self.detections if rec[0] == "crash" else self.leave_times).append(t - rec[1])

    def _check_full(self, t: float) -> None:
        if self.n_full == self.n_up and self.initial_pending == 0:
            if self.converged_at is None:
                self.converged_at = t
            if self.heal_at is not None and self.merged_at is None:
                self.merged_at = t

    def _account(self, t: float) -> None:
        self.member_seconds += self.n_up * (t - self._last_change)
        self._last_change = t

    def _hook(self, o: int):
        """The on_change observer for member o: invariants, convergence, detection, false positives."""
        oid, id_index, checker, sim, loop = self.ids[o], self.id_index, self.checker, self, self.loop
        up, alive_known, group, crashed, pending = self.up, self.alive_known, self.net.group, self.crashed, self.pending

        def hook(mid: str, os: Optional[int], oi: int, ns: Optional[int], ni: int) -> None:
            if checker is not None:
                checker.observe(loop.now, oid, mid, os, oi, ns, ni, sim.leaving[o])
            m = id_index.get(mid)
            if m is None or m == o or not up[o]:
                return
            if up[m]:
                was, now_alive = os == ALIVE, ns == ALIVE
                if was != now_alive:
                    k = alive_known[o] + (1 if now_alive else -1)
                    alive_known[o] = k
                    target = sim.n_up - 1
                    if k == target:
                        sim.n_full += 1
                        sim._check_full(loop.now)
                    elif was and k == target - 1:
                        sim.n_full -= 1
                if ns == DEAD and os != DEAD and not crashed[m] and group[o] == group[m]:
                    sim.false_positive.setdefault(m, loop.now)
            elif m in pending:
                was_up = os is not None and os <= SUSPECT
                is_up = ns is not None and ns <= SUSPECT
                if was_up != is_up:
                    pending[m][2] += 1 if was_up else -1
                    sim._check_gone(m, loop.now)

        return hook

    # ------------------------------------------------------------------ results

    def result(self) -> dict:
        cfg, net = self.cfg, self.net
        mc = cfg.membership
        period = mc.probe_interval
        conv = self.converged_at
        det = sorted(self.detections)
        susp_min = suspicion_min_timeout(mc.suspicion_mult, self.n, period)
        member_s = max(self.member_seconds, 1e-9)
        merge = None
        if self.heal_at is not None and self.merged_at is not None:
            merge = self.merged_at - self.heal_at
        out = {
            "seed": cfg.seed,
            "peers": cfg.peers,
            "duration_s": cfg.duration_s,
            "loss": cfg.loss,
            "delay_ms": cfg.delay_ms,
            "crash": cfg.churn.crashes,
            "join": cfg.churn.joins,
            "leave": cfg.churn.leaves,
            "partition": cfg.partition,
            "partition_s": cfg.partition_s if cfg.partition is not None else None,
            "warm_start": cfg.warm_start,
            "probe_interval_s": period,
            "convergence_s": _r(conv),
            "convergence_periods": _r(None if conv is None else conv / period),
            "converged_at_end": self.n_full == self.n_up,
            "detection_s": _summary(det),
            "undetected": sum(1 for r in self.pending.values() if r[0] == "crash"),
            "suspicion_min_timeout_s": _r(susp_min),
            "detection_max_in_suspicion_timeouts": _r(det[-1] / susp_min) if det else None,
            "leave_propagation_s": _summary(sorted(self.leave_times)) if cfg.churn.leaves else None,
            "false_positives": len(self.false_positive),
            "partition_merge_s": _r(merge),
            "msgs_per_member_s": _r(net.sent / member_s),
            "bytes_per_member_s": _r(net.bytes / member_s),
            "messages": net.sent,
            "lost": net.lost,
            "dropped": net.dropped,
            "remote_errors": self.remote_errors,
            "events": self.events,
            "live_members_at_end": self.n_up,
            "invariant_checks": self.checker.checked if self.checker else 0,
        }
        totals: dict[str, int] = {}
        for m in self.nodes:
            if m is not None:
                for k, v in m.stats.items():
                    totals[k] = totals.get(k, 0) + v
        out["protocol_counters"] = {k: totals[k] for k in sorted(totals)}
        return out


def _r(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(float(x), 4)


def _summary(values: list[float]) -> Optional[dict]:
    if not values:
        return None
    p99 = values[max(0, math.ceil(0.99 * len(values)) - 1)]
    return {"mean": _r(sum(values) / len(values)), "p99": _r(p99), "max": _r(values[-1]), "count": len(values)}


def run(cfg: SimConfig) -> dict:
    """Run one scenario; returns the metrics as a JSON-ready dict. Raises InvariantViolation."""
    return Simulation(cfg).run()
