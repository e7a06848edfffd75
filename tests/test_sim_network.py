"""The simulators' shared pieces: the event loop, the network model, the churn schedule."""

from __future__ import annotations

import random

import pytest

from p2p.sim.churn import CRASH, JOIN, LEAVE, Churn, pick
from p2p.sim.loop import DELIVER, INF, TICK, EventLoop, Timers
from p2p.sim.network import Network


def drain(loop):
    out = []
    while len(loop):
        out.append(loop.pop())
    return out


def make(n=3, **kw):
    loop = EventLoop()
    net = Network(loop, random.Random(kw.pop("seed", 0)), n, **kw)
    for i in range(n):
        net.up[i] = True
    return loop, net


# ---------------------------------------------------------------- event loop


def test_loop_orders_by_time_then_insertion_and_moves_the_clock():
    loop = EventLoop()
    loop.push(2.0, TICK, 1)
    loop.push(1.0, TICK, 2, c={"unorderable": object()})
    loop.push(1.0, TICK, 3, c={"unorderable": object()})  # same time: payloads are never compared
    assert loop.peek_time() == 1.0
    times = []
    for _ in range(3):
        t, _, kind, a, _, _ = loop.pop()
        times.append((t, a))
        assert loop.now == t
    assert times == [(1.0, 2), (1.0, 3), (2.0, 1)] and loop.peek_time() == INF


def test_timers_keep_one_live_tick_per_member():
    loop = EventLoop()
    timers = Timers(loop, 2)
    timers.arm(0, 5.0, now=0.0)
    timers.arm(0, 3.0, now=0.0)  # moved earlier: the TICK at 5 goes stale
    timers.arm(0, 3.0, now=0.0)  # unchanged: no second push
    timers.arm(1, -INF, now=1.0)  # overdue: clamped to now
    events = drain(loop)
    assert [(e[0], e[3]) for e in events] == [(1.0, 1), (3.0, 0), (5.0, 0)]
    assert timers.due(1, 1.0) and timers.due(0, 3.0)
    assert not timers.due(0, 5.0)  # the stale one
    timers.arm(1, 9.0, now=1.0)
    timers.cancel(1)
    assert not timers.due(1, 9.0)


# ---------------------------------------------------------------- network


def test_delay_and_jitter_bound_every_arrival():
    loop, net = make(delay_s=0.01, jitter_s=0.004)
    for k in range(200):
        assert net.send(1.0, 0, 1, k)
    arrivals = [e[0] - 1.0 for e in drain(loop)]
    assert all(0.01 <= d < 0.014 for d in arrivals)
    assert max(arrivals) - min(arrivals) > 0.003  # the jitter is drawn, not constant
    net.send(2.0, 2, 0, "x")
    assert loop.pop()[2:] == (DELIVER, 0, 2, "x")  # (time, seq, DELIVER, receiver, sender, payload)


def test_loss_rate_and_counters():
    loop, net = make(loss=0.2, seed=3)
    ok = sum(net.send(0.0, 0, 2, None, size=10) for _ in range(5000))
    assert net.sent == 5000 and net.bytes == 50000
    assert net.lost == 5000 - ok and 0.17 < net.lost / 5000 < 0.23
    assert len(loop) == ok
    for t, _, _, dst, src, _ in drain(loop):
        assert net.arrives(dst, src)
    assert net.delivered == ok and net.dropped == 0
    assert net.counters() == {"sent": 5000, "bytes": 50000, "lost": net.lost, "dropped": 0, "delivered": ok}


def test_unknown_receiver_is_dropped_without_a_draw():
    loop, net = make(loss=0.5, seed=1)
    state = net.rng.getstate()
    assert not net.send(0.0, 0, None, "to nobody")
    assert net.dropped == 1 and net.lost == 0 and net.rng.getstate() == state and not len(loop)


def test_bandwidth_serialises_each_senders_uplink():
    loop, net = make(delay_s=0.0, jitter_s=0.0, bandwidth_bps=8000.0)  # 1000 bytes/s
    for _ in range(3):
        net.send(0.0, 0, 1, "a", size=100)  # 0.1 s each, one after the other
    net.send(0.0, 1, 2, "b", size=100)  # another sender's uplink is free
    net.send(1.0, 0, 1, "c", size=100)  # the link went idle meanwhile
    arrivals = sorted((round(e[0], 9), e[4]) for e in drain(loop))
    assert arrivals == [(0.1, 0), (0.1, 1), (0.2, 0), (0.3, 0), (1.1, 0)]


def test_down_receivers_and_partitions_drop_messages_in_flight():
    loop, net = make(n=4, delay_s=0.01)
    net.send(0.0, 0, 1, "to a crashed member")
    net.send(0.0, 0, 2, "across the cut")
    net.send(0.0, 0, 3, "fine")
    net.up[1] = False  # crashes while the message is in flight
    cut = net.partition(0.5)
    assert len(cut) == 2 and all(net.group[i] == 1 for i in cut)
    assert sorted(i for i in range(4) if net.up[i]) == [0, 2, 3]
    net.set_group([0, 3], 0)
    net.set_group([2], 1)
    fates = {e[5]: net.arrives(e[3], e[4]) for e in drain(loop)}
    assert fates == {"to a crashed member": False, "across the cut": False, "fine": True}
    assert net.dropped == 2 and net.delivered == 1
    group = net.group
    net.heal()
    assert net.group is group and group == [0, 0, 0, 0]  # in place: drivers hold the list
    net.send(1.0, 0, 2, "healed")
    assert all(net.arrives(e[3], e[4]) for e in drain(loop))


def test_partition_never_cuts_everyone_and_add_grows_the_network():
    loop, net = make(n=2)
    net.up[1] = False
    assert net.partition(0.9) == []  # one running member: nothing to cut it apart from
    net.heal()
    net.up[1] = True
    assert len(net.partition(0.99)) == 1  # never all of them
    net.add(2)
    assert len(net.up) == len(net.group) == len(net.link_free) == 4 and net.up[2:] == [False, False]


def test_same_seed_same_fates():
    def fates(seed):
        loop, net = make(seed=seed, loss=0.3, jitter_s=0.01)
        return [net.send(0.0, 0, 1, k) for k in range(50)], [e[0] for e in drain(loop)]

    assert fates(5) == fates(5) and fates(5) != fates(6)


@pytest.mark.parametrize("kw", [{"loss": 1.0}, {"loss": -0.1}, {"delay_s": -1.0}, {"jitter_s": -1.0},
                                {"bandwidth_bps": 0.0}])
def test_bad_network_settings_are_refused(kw):
    with pytest.raises(ValueError):
        Network(EventLoop(), random.Random(0), 2, **kw)


# ---------------------------------------------------------------- churn


def test_churn_schedule_draws_every_event_inside_the_window():
    churn = Churn(joins=3, crashes=4, leaves=2, window=(0.2, 0.6))
    events = churn.schedule(random.Random(1), span_s=100.0)
    kinds = [k for _, k in events]
    assert kinds.count(JOIN) == 3 and kinds.count(CRASH) == 4 and kinds.count(LEAVE) == 2
    assert all(20.0 <= t <= 60.0 for t, _ in events)
    assert churn.schedule(random.Random(1), 100.0) == events  # seeded
    assert churn.schedule(random.Random(2), 100.0) != events
    assert Churn().schedule(random.Random(1), 100.0) == []


def test_churn_victims_are_picked_when_the_event_fires_and_respect_the_floor():
    churn = Churn(crashes=5, floor=2)
    rng = random.Random(0)
    running = [3, 5, 8]
    seen = {churn.victim(rng, running) for _ in range(200)}
    assert seen == {3, 5, 8}  # uniform among the running members
    assert churn.victim(rng, [3, 5]) is None  # would leave fewer than 2 running
    assert Churn(crashes=1).victim(rng, [7]) is None and Churn(crashes=1).victim(rng, [7, 9]) in (7, 9)
    assert pick(rng, []) is None and pick(rng, [4]) == 4


@pytest.mark.parametrize("kw", [{"joins": -1}, {"crashes": 1.5}, {"leaves": True}, {"window": (0.6, 0.2)},
                                {"window": (0.0, 1.5)}, {"floor": 0}])
def test_bad_churn_is_refused(kw):
    with pytest.raises(ValueError):
        Churn(**kw)
