"""The synchronous rounds' deadline follows the link (p2p/averaging/round_deadline.py, issue 16):
pure state, time passed explicitly, no processes, no sleeps."""

import dataclasses
import heapq
import random

import numpy as np
import pytest

from p2p.averaging.base import AveragingConfig
from p2p.averaging.dpsgd import Dpsgd
from p2p.averaging.gossipgrad import GossipGraD, GossipGraDConfig, model_round
from p2p.averaging.round_deadline import RoundDeadline, round_wait_cap
from p2p.averaging.rounds import NeighbourRounds
from p2p.bandwidth import TIMEOUT_FACTOR, link_timeout
from p2p.sim.avg_port import ArrayPort

FLOOR, CAP = 5.0, 30.0
NEIGHBOURS = ["b", "c", "d"]


def test_link_timeout_is_the_factor_times_the_expected_transfer_within_floor_and_cap():
    assert link_timeout(None, FLOOR, CAP) == FLOOR  # not measured: the configured constant
    assert link_timeout(0.1, FLOOR, CAP) == FLOOR  # a fast link never waits less than before
    assert link_timeout(3.0, FLOOR, CAP) == pytest.approx(TIMEOUT_FACTOR * 3.0)
    assert link_timeout(100.0, FLOOR, CAP) == CAP
    assert link_timeout(100.0, FLOOR, 1.0) == FLOOR  # a cap below the floor never cuts the floor


def test_the_deadline_follows_the_bytes_over_the_measured_rate():
    stats = {}
    d = RoundDeadline(FLOOR, CAP, stats)
    assert d.begin(0.0, ["b"], 1000) == FLOOR and stats["round_deadline_ms"] == 5000  # nothing measured yet
    d.arrived("b", 2.0)  # 1000 bytes each way in 2 s
    d.finished(2.0, ["b"], timed_out=False)
    assert d.begin(10.0, ["b"], 1000) == pytest.approx(TIMEOUT_FACTOR * 2.0)
    d.finished(10.0, [], timed_out=False)
    # a round that moves twice the bytes (GossipGraD's parameter rounds) waits twice as long
    assert d.begin(20.0, ["b"], 2000) == pytest.approx(TIMEOUT_FACTOR * 4.0)


def test_a_vector_buffered_before_the_round_began_says_nothing_about_the_link():
    d = RoundDeadline(FLOOR, CAP, {})
    d.begin(5.0, ["b"], 1000)
    d.arrived("b", 5.0)  # (the engine only reports arrivals during the round; at 0 s: no information)
    d.finished(5.0, ["b"], timed_out=False)
    assert "b" not in d.monitor.links and d.begin(6.0, ["b"], 1000) == FLOOR


def test_a_timed_out_round_counts_as_a_measurement_and_the_deadline_grows_to_the_cap():
    d = RoundDeadline(FLOOR, CAP, {})
    deadlines, now = [], 0.0
    for _ in range(6):
        timeout = d.begin(now, NEIGHBOURS, 1000)
        deadlines.append(timeout)
        now += timeout
        d.finished(now, [], timed_out=True)  # nobody came: they took at least this long
    assert deadlines[0] == FLOOR and deadlines[1] > FLOOR
    assert deadlines == sorted(deadlines) and deadlines[-1] == CAP


def test_a_neighbour_missing_while_others_came_is_dropped_not_waited_for_longer():
    """A straggler or a crashed neighbour: the link carried the others' vectors in time."""
    d = RoundDeadline(FLOOR, CAP, {})
    d.begin(0.0, ["b", "c"], 1000)
    d.arrived("b", 0.5)
    d.finished(FLOOR, ["b"], timed_out=True)
    assert d.monitor.links["b"].exchange_s == pytest.approx(0.5) and "c" not in d.monitor.links
    assert d.begin(10.0, ["b", "c"], 1000) == FLOOR  # (4 x 0.5 s < the floor)
    # a round that ended early with nothing (we fell behind and jump) measures no one either
    d.finished(11.0, [], timed_out=False)
    assert d.monitor.links["b"].samples == 1 and "c" not in d.monitor.links


def run_rounds(link_deadline, rounds=15, round_link_s=10.4, compute_s=0.1):
    """One peer's D-PSGD rounds with three neighbours in step with it, over links that take
    ``round_link_s`` to deliver a neighbour's round vector (20 Mbit/s, nodes.wide: 3 x 8.7 MB
    through each peer's uplink): a vector sent while the last one is still on the link queues
    behind it. Returns the engine's counters."""
    stats: dict[str, int] = {}
    engine = NeighbourRounds(FLOOR, stats, link_deadline=link_deadline)
    vector = np.zeros(1000, dtype=np.float32)
    link_free = {j: 0.0 for j in NEIGHBOURS}
    wire: list[tuple[float, str, int]] = []
    now = 0.0
    for _ in range(rounds):
        r = engine.begin(now, NEIGHBOURS, (vector,))
        for j in NEIGHBOURS:  # each neighbour begins the same round and sends us its vector
            link_free[j] = max(now, link_free[j]) + round_link_s
            heapq.heappush(wire, (link_free[j], j, r))
        while not engine.ready(now):
            if wire and wire[0][0] <= engine.deadline:
                now, j, sent_round = heapq.heappop(wire)
                engine.offer(j, sent_round, len(NEIGHBOURS), 0, (vector,), now)
            else:
                now = engine.deadline
        engine.finish(0, now=now)
        now += compute_s
    stats["elapsed_ms"] = int(now * 1e3)
    return stats


def test_rounds_complete_on_a_link_slower_than_the_constant_deadline():
    """Fails with the constant 5 s deadline: every round of a 10.4 s link ends short and every
    vector comes too late, each one model-sized bytes thrown away."""
    constant = run_rounds(None)
    assert constant["rounds_partial"] == 15 and constant["late"] >= 3 * 6  # (the rest still queued at the end)
    adaptive = run_rounds(RoundDeadline(FLOOR, CAP, {}))
    assert adaptive["rounds_partial"] <= 1 and adaptive["late"] <= len(NEIGHBOURS)
    assert adaptive["exchanges_completed"] == 15


def test_a_link_that_needs_more_than_the_cap_still_ends_every_round_by_the_cap():
    stats = run_rounds(RoundDeadline(FLOOR, CAP, {}), rounds=5, round_link_s=40.0)
    assert stats["rounds_partial"] == 5 and stats["elapsed_ms"] <= 1000 * (FLOOR + 4 * CAP + 1)


def make(cls, config, options=None):
    port = ArrayPort(np.zeros(1000), "m/1000", immediate=True)
    return port, cls(dataclasses.replace(config, robust_mixing=False), port, random.Random(0), 0.0, options=options)


def test_dpsgd_after_a_timeout_waits_longer_but_sends_exactly_what_it_sent_before():
    cfg = AveragingConfig(round_timeout_s=FLOOR)
    _, a = make(Dpsgd, cfg)
    first = a.after_step(1, 0.0, NEIGHBOURS)
    assert a.next_deadline() == FLOOR
    a.tick(FLOOR, NEIGHBOURS)
    assert a.may_step(2, FLOOR) and a.stats["rounds_partial"] == 1
    second = a.after_step(2, 6.0, NEIGHBOURS)
    assert a.next_deadline() - 6.0 > FLOOR  # the timeout was a measurement: the deadline grew
    assert [(s.to, s.msg.params.nbytes) for s in second] == [(s.to, s.msg.params.nbytes) for s in first]
    assert round_wait_cap(cfg) == cfg.max_interval_s == CAP


def test_gossipgrad_waits_longer_for_a_round_that_carries_the_parameters_too():
    pa, a = make(GossipGraD, AveragingConfig(round_timeout_s=0.1), GossipGraDConfig(model_every=2))
    pb, b = make(GossipGraD, AveragingConfig(round_timeout_s=0.1), GossipGraDConfig(model_every=2))
    assert not model_round(0, 2) and not model_round(1, 2) and model_round(2, 2)
    deadlines = []
    for k, now in enumerate((0.0, 10.0, 20.0)):
        pa.grad, pb.grad = np.ones(1000, np.float32), np.ones(1000, np.float32)
        (sa,) = a.on_gradient(k + 1, now, ["b"])
        (sb,) = b.on_gradient(k + 1, now, ["a"])
        deadlines.append(a.next_deadline() - now)
        a.receive("b", sb.msg, now + 1.0, ["b"])  # one round's vectors each way in 1 s
        b.receive("a", sa.msg, now + 1.0, ["a"])
        assert a.gradient_ready(k + 1, now + 1.0) and b.gradient_ready(k + 1, now + 1.0)
        assert a.stats["rounds_partial"] == 0
    assert deadlines[0] == pytest.approx(0.1)
    assert deadlines[2] == pytest.approx(2 * deadlines[1])  # gradient + parameters: twice the bytes


def test_a_receipt_measures_the_link_and_not_the_neighbours_lag():
    d = RoundDeadline(FLOOR, CAP, {})
    d.begin(0.0, ["b"], 1000)
    d.received("b", 0.5)  # our vector reached b in 0.5 s ...
    d.arrived("b", 4.0)  # ... b's own came 4 s in: it was computing, not waiting on the link
    d.finished(4.0, ["b"], timed_out=False)
    assert d.monitor.links["b"].exchange_s == pytest.approx(0.5)
    assert d.begin(10.0, ["b"], 1000) == FLOOR  # from the arrival alone: 4 x 4 s = 16 s
    # a round that timed out with no vector but with the receipt: the link carried our bytes
    d.received("b", 10.5)
    d.finished(10.0 + FLOOR, [], timed_out=True)
    assert d.monitor.links["b"].exchange_s < 0.6 and d.begin(20.0, ["b"], 1000) == FLOOR


def straggler_deadlines(deliver_receipts: bool, rounds: int = 6, lag_s: float = 4.0):
    """GossipGraD peer ``a`` and a straggling partner ``b`` whose gradient is ready ``lag_s``
    after a's each round (both links carry a share in 0.2 s). Returns a's round deadlines and
    how many of its rounds ended short."""
    cfg = AveragingConfig(round_timeout_s=FLOOR)
    pa, a = make(GossipGraD, cfg, GossipGraDConfig(model_every=0))
    pb, b = make(GossipGraD, cfg, GossipGraDConfig(model_every=0))
    deadlines, now = [], 0.0
    for k in range(1, rounds + 1):
        pa.grad, pb.grad = np.ones(1000, np.float32), np.full(1000, 3.0, np.float32)
        (share_a,) = a.on_gradient(k, now, ["b"])
        deadlines.append(a.next_deadline() - now)
        replies = b.receive("a", share_a.msg, now + 0.2, ["a"])  # b's network thread has a's share
        assert [type(s.msg).__name__ for s in replies] == ["RoundReceipt"] and replies[0].to == "a"
        if deliver_receipts:
            a.receive("b", replies[0].msg, now + 0.4, ["b"])
        (share_b,) = b.on_gradient(k, now + lag_s, ["a"])  # b's trainer catches up
        assert b.gradient_ready(k, now + lag_s)  # (a's share was already there)
        a.receive("b", share_b.msg, now + lag_s + 0.2, ["b"])
        assert a.gradient_ready(k, now + lag_s + 0.2)
        now += lag_s + 1.0
    return deadlines, a.stats["rounds_partial"]


def test_a_straggling_gossipgrad_partner_does_not_raise_the_deadline_when_it_sends_receipts():
    """The issue-16 finding: with one partner, arrival times read a straggler's lag as a slow
    link, and each round waited longer for it, towards the 30 s cap."""
    with_receipts, partial = straggler_deadlines(deliver_receipts=True)
    assert with_receipts == [FLOOR] * len(with_receipts) and partial == 0
    from_arrivals, _ = straggler_deadlines(deliver_receipts=False)  # an older peer sends none
    assert from_arrivals[0] == FLOOR and from_arrivals[-1] >= 3 * FLOOR
