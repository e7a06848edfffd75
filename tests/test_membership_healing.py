"""A brief cut heals at once (p2p/gossip/membership.py, "Healing a brief cut"): members dead for
a short while are push-pulled every fast interval on a fresh connection, and a member held
dead that speaks is answered at once, fresh, rate-limited per member. Sans-I/O, with
the instant network of test_gossip_membership (``Net.fresh`` lists the sends asked to go fresh)."""

from __future__ import annotations

from p2p.gossip import MembershipConfig, Ping, PushPull
from tests.test_gossip_membership import cluster, state


def test_a_brief_cut_heals_within_one_fast_reconnect_interval():
    cfg = MembershipConfig(reconnect_interval=30.0)  # the old, slow reconnect cannot explain a heal
    net, (a, b, c) = cluster(3, cfg)
    net.groups = {"c:7946": 1}  # c's link is cut: all three go on, nothing crosses
    deadline = net.now + 60.0
    while not state(a, "c")[0] == state(b, "c")[0] == state(c, "a")[0] == state(c, "b")[0] == "dead":
        assert net.now < deadline, "the cut was not noticed"
        net.run_until(net.now + 0.5)  # a and b declare c dead, c them (suspicion ~4-24 s at lan timers)
    net.groups = {}
    net.fresh.clear()
    restored = net.now
    net.run_until(restored + cfg.reconnect_fast_interval + 0.01)
    assert state(a, "c")[0] == state(b, "c")[0] == "alive"
    assert [state(c, x)[0] for x in "ab"] == ["alive", "alive"]
    assert any("c:7946" in (s, d) for s, d, m in net.fresh), net.fresh  # on fresh connections


def test_fast_reconnects_are_bounded_in_rate_and_window():
    cfg = MembershipConfig(reconnect_fast_interval=1.0, reconnect_fast_window=5.0, reconnect_interval=1000.0,
                           reconnect_window=1000.0, reap_after=2000.0)
    net, (a, b) = cluster(2, cfg)
    net.down.add("b:7946")
    net.run_until(net.now + 120.0)  # dead since well over the fast window
    assert state(a, "b")[0] == "dead"
    tries = [m for s, d, m in net.fresh if s == "a:7946" and d == "b:7946" and type(m) is PushPull]
    assert 1 <= len(tries) <= 6, len(tries)  # one per interval within the window, then none


def b_held_dead():
    """Two members; b's link went down a minute ago and a holds it dead. Its fast and slow
    reconnects are far off: only hearing from b can bring it back now."""
    cfg = MembershipConfig(reconnect_fast_interval=500.0, reconnect_interval=500.0)
    net, (a, b) = cluster(2, cfg)
    net.down.add("b:7946")
    net.run_until(net.now + 60.0)
    assert state(a, "b")[0] == "dead"
    return cfg, net, a


def test_a_member_held_dead_that_speaks_is_answered_fresh_and_readmitted_at_once():
    _, net, a = b_held_dead()
    net.down.clear()
    net.fresh.clear()
    sends = a.receive("b:7946", Ping(99, "b", "a", ()), net.now)  # b's probe gets through
    assert [(type(s.msg).__name__, s.fresh) for s in sends] == [("Ack", True), ("PushPull", False)]
    assert sends[1].msg.reply  # it learns that we hold it dead, refutes, and answers
    net.deliver("a:7946", sends)
    assert state(a, "b")[0] == "alive" and state(a, "b")[1] >= 1
    assert a.stats["readmit_nudges"] == 1


def test_answers_to_a_member_held_dead_are_rate_limited():
    cfg, net, a = b_held_dead()
    t0 = net.now
    for i in range(20):  # b (or someone using its id) keeps talking; b itself hears nothing back
        sends = a.receive("b:7946", Ping(100 + i, "b", "a", ()), t0 + i * 0.01)
        assert [type(s.msg).__name__ for s in sends][0] == "Ack"
    assert a.stats["readmit_nudges"] == 1
    later = a.receive("b:7946", Ping(200, "b", "a", ()), t0 + cfg.nudge_interval)
    assert [(type(s.msg).__name__, s.fresh) for s in later] == [("Ack", True), ("PushPull", False)]
    assert a.stats["readmit_nudges"] == 2


def test_a_suspect_is_probed_and_answered_on_its_connection():
    # A suspect is most often slow, not cut off: a fresh connection would drop a live transfer.
    net, (a, b) = cluster(2, MembershipConfig())
    net.down.add("b:7946")
    net.fresh.clear()
    deadline = net.now + 60.0
    while state(a, "b")[0] != "suspect":
        assert net.now < deadline, "b was never suspected"
        net.run_until(net.now + 0.1)
    net.run_until(net.now + 1.0)  # a probes its suspect meanwhile
    assert state(a, "b")[0] == "suspect"
    net.down.clear()
    sends = a.receive("b:7946", Ping(99, "b", "a", ()), net.now)
    assert sends and not any(s.fresh for s in sends), sends
    assert not [m for s, d, m in net.fresh if d == "b:7946"], net.fresh
    assert a.stats.get("readmit_nudges", 0) == 0
