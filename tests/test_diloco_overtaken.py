"""A round overtaken (p2p/averaging/rounds.py, "Overtaken"): a fixed-H DiLoCo peer whose process
stalled for a couple of outer periods (issue 16's lab test: the cut peer's trainer waited out its
rounds while the others went on) comes back with the same rounds on the same steps as the
others, only later. Every round it begins then finds the others' shares for it, and for the next,
already there: it mixes all three while they, no longer waiting for it, mixed two. Unless it
begins the round they are at, it stays that far behind for good and mends its copy by a replay
every round (seen in the lab: two outer steps behind, ``repairs_replayed`` +1 per round).

Three peers on a logical clock, one inner step at a time (H = 25), shares through the wire codec
with a fixed latency; the stall holds the peer's trainer and timers and queues what is sent to
it. No sleeps."""

import heapq
import itertools
from collections import defaultdict

import numpy as np
import pytest

from p2p.averaging.outer_catchup import LOG_ROUNDS
from p2p.averaging.rounds import NeighbourRounds
from p2p.wire import decode, encode
from tests import test_diloco_repair
from tests.test_diloco_passed import N, Peers

H = 25
STEP_S = 0.04  # one inner period: 1 s, as the lab test's idle one
LATENCY_S = 0.05


class Stepping(Peers):
    """test_diloco_passed's peers, each trainer taking one inner step per ``STEP_S``; a stalled
    peer does nothing and what is sent to it waits until it runs again."""

    def __init__(self):
        super().__init__()
        self.queue, self.order, self.stalled, self.held = [], itertools.count(), set(), []

    def send(self, src, sends):
        for s in sends:
            frames = [bytes(f) for f in encode(s.msg, src)]
            heapq.heappush(self.queue, (self.now + LATENCY_S, next(self.order), src, s.to, frames))

    def run(self, until, dt=0.01):
        while self.now < until - 1e-9:
            self.now = round(self.now + dt, 6)
            while self.queue and self.queue[0][0] <= self.now:
                _, _, src, to, frames = heapq.heappop(self.queue)
                if to in self.stalled:
                    self.held.append((src, to, frames))
                    continue
                self.send(to, self.alg(to).receive(src, decode(frames)[1], self.now, self.others(to)))
            for name in self.names:
                if name in self.stalled:
                    continue
                port, alg = self.peers[name]
                if alg.next_deadline() <= self.now:
                    self.send(name, alg.tick(self.now, self.others(name)))
                if self.now >= self.ready_at[name] and alg.may_step(port.step + 1, self.now):
                    port.x -= self.rng.standard_normal(N).astype(np.float32) * np.float32(0.001)
                    port.step += 1
                    self.ready_at[name] = self.now + STEP_S
                    self.send(name, alg.after_step(port.step, self.now, self.others(name)))

    def stall(self, name, seconds):
        self.stalled.add(name)
        self.run(self.now + seconds)
        self.stalled.discard(name)
        for src, to, frames in self.held:  # queued for it meanwhile: it reads them now
            heapq.heappush(self.queue, (self.now, next(self.order), src, to, frames))
        self.held, self.ready_at[name] = [], self.now


@pytest.mark.parametrize("inner_steps, stall_s", [(H, 3.5), ("auto", 4.0)])
def test_a_peer_that_stalled_for_two_periods_begins_the_round_the_others_are_at(monkeypatch, inner_steps, stall_s):
    # auto: every peer's link wants H 32 (1.3 s periods); outer_schedule.py's rule 5 then also
    # skips a boundary of the stalled peer's, which puts it on the others' steps as well
    monkeypatch.setattr(test_diloco_repair, "H", inner_steps)
    s = Stepping()
    for name in s.names:
        s.alg(name)._schedule.proposal = lambda exchange_s: 32
    s.run(8.3)  # steady rounds: every peer learns the usual wait (its deadline: 2 s)
    assert min(s.alg(n).stats["outer_steps"] for n in s.names) >= 6
    assert {s.alg(n)._schedule.h for n in s.names} == {H if inner_steps == H else 32}
    s.stall("p2", stall_s)
    s.run(s.now + 7.3)  # a few rounds to come back in (a catch-up waits for its last round confirmed)
    before = {n: dict(s.alg(n).stats) for n in s.names}
    s.run(s.now + 5.0)  # five more: in step, one copy
    p0, p2 = (s.alg(n).stats for n in ("p0", "p2"))
    assert p2["rounds_overtaken"] >= 1, dict(p2)
    assert abs(s.round_of("p0") - s.round_of("p2")) <= 1, (s.round_of("p0"), s.round_of("p2"))
    if inner_steps == "auto":  # on the others' steps too (a fixed H needs not: any multiple of H is a boundary)
        assert abs(s.peers["p0"][0].step - s.peers["p2"][0].step) < 32, [s.peers[n][0].step for n in s.names]
    for n in s.names:  # no more repairs of any kind, no copy apart
        now, was = s.alg(n).stats, before[n]
        for key in ("repairs_replayed", "repairs_started", "copies_apart", "rounds_partial"):
            assert now[key] == was[key], (n, key, was[key], now[key])
    assert p0["outer_steps"] - before["p0"]["outer_steps"] >= 4
    ref = s.alg("p0").outer_parameters
    assert all(np.allclose(s.alg(n).outer_parameters, ref, rtol=0, atol=1e-4) for n in s.names)


def test_the_engine_begins_the_latest_round_a_neighbour_it_waits_for_began_within_reach():
    v = (np.zeros(4, np.float32),)
    stats = defaultdict(int)
    rounds = NeighbourRounds(60.0, stats, uniform=True, passed_within=LOG_ROUNDS)
    rounds.offer("a", 0, 2, 0, v)
    assert rounds.overtaken(frozenset("ab")) == 0  # its vector for our next round: no proof
    rounds.offer("stranger", 2, 2, 0, v)  # not one we wait for
    rounds.offer("a", LOG_ROUNDS, 2, 0, v)  # too far on: LEAD or the deadline decide
    assert rounds.overtaken(frozenset("ab")) == 0 and stats["rounds_overtaken"] == 0
    rounds.offer("b", 1, 2, 0, v)
    assert rounds.overtaken(frozenset("ab")) == 1 and stats["rounds_overtaken"] == 1
    assert rounds.begin(0.0, ["a", "b"], v, round=1, wait_for=["a", "b"]) == 1 and stats["jumps"] == 1
    for off in (NeighbourRounds(60.0, stats, uniform=False, passed_within=LOG_ROUNDS),  # sparse graphs
                NeighbourRounds(60.0, stats, uniform=True)):  # D-PSGD, GossipGraD
        off.offer("b", 1, 2, 0, v)
        assert off.overtaken(frozenset("ab")) == 0
