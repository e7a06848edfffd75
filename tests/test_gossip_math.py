"""Table-driven tests of the pure SWIM/Lifeguard arithmetic and the broadcast queue."""

import math

import pytest

from p2p.gossip.broadcast import BroadcastQueue
from p2p.gossip.config import MembershipConfig
from p2p.gossip.suspicion import (
    Awareness, Suspicion, awareness_delta, expected_confirmations, push_pull_interval,
    retransmit_limit, suspicion_min_timeout, suspicion_timeout,
)


@pytest.mark.parametrize("mult, n, interval, expected", [
    (4, 0, 1.0, 4.0),  # log10 floor at 1
    (4, 1, 1.0, 4.0),
    (4, 10, 1.0, 4.0),
    (4, 100, 1.0, 8.0),
    (4, 1000, 1.0, 12.0),
    (4, 10000, 1.0, 16.0),
    (5, 1000, 0.5, 7.5),
    (3, 100, 0.2, 1.2),
])
def test_suspicion_min_timeout(mult, n, interval, expected):
    assert suspicion_min_timeout(mult, n, interval) == pytest.approx(expected)


# memberlist suspicion_test.go TestSuspicion_remainingSuspicionTime, as totals from the start
@pytest.mark.parametrize("n, k, lo, hi, expected", [
    (0, 3, 2.0, 30.0, 30.0),
    (1, 3, 2.0, 30.0, 16.0),  # memberlist: 14 s left after 2 s
    (2, 3, 2.0, 30.0, 7.81),  # memberlist: 4.81 s left after 3 s
    (3, 3, 2.0, 30.0, 2.0),
    (4, 3, 2.0, 30.0, 2.0),
    (5, 3, 2.0, 30.0, 2.0),
    (0, 0, 2.0, 30.0, 2.0),  # no confirmations expected: straight to min
    (0, 2, 12.0, 72.0, 72.0),
    (1, 2, 12.0, 72.0, 34.144),
    (2, 2, 12.0, 72.0, 12.0),
])
def test_suspicion_timeout(n, k, lo, hi, expected):
    assert suspicion_timeout(n, k, lo, hi) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("mult, n, expected", [(4, 1, 0), (4, 3, 0), (4, 4, 2), (4, 1000, 2), (6, 5, 0), (6, 6, 4)])
def test_expected_confirmations(mult, n, expected):
    assert expected_confirmations(mult, n) == expected


@pytest.mark.parametrize("mult, n, expected", [
    (4, 0, 0), (4, 1, 4), (4, 9, 4), (4, 10, 8), (4, 99, 8), (4, 100, 12), (4, 999, 12),
    (4, 1000, 16), (4, 10000, 20), (3, 50, 6),
])
def test_retransmit_limit(mult, n, expected):
    assert retransmit_limit(mult, n) == expected


@pytest.mark.parametrize("n, expected", [(1, 30.0), (32, 30.0), (33, 60.0), (64, 60.0), (65, 90.0),
                                         (1000, 180.0), (10000, 300.0)])
def test_push_pull_interval_scales_with_log2_n(n, expected):
    assert push_pull_interval(30.0, n) == expected


@pytest.mark.parametrize("expected_nacks, nacks, delta", [(0, 0, 1), (3, 0, 3), (3, 2, 1), (3, 3, 0), (3, 5, 0)])
def test_awareness_delta(expected_nacks, nacks, delta):
    assert awareness_delta(expected_nacks, nacks) == delta


def test_awareness_is_clamped_and_scales_timeouts():
    a = Awareness(8)
    assert a.scale(0.5) == 0.5
    a.apply(3)
    assert a.scale(0.5) == 2.0
    a.apply(100)
    assert a.score == 7 and a.scale(1.0) == 8.0
    a.apply(-100)
    assert a.score == 0


def test_suspicion_confirmations_shorten_the_timer_once_per_member():
    s = Suspicion("a", k=2, min_s=12.0, max_s=72.0, now=100.0, incarnation=0)
    assert s.deadline == 172.0
    assert not s.confirm("a")  # the original suspector does not count
    assert s.confirm("b")
    assert s.deadline == pytest.approx(100.0 + 34.144, abs=1e-3)
    assert not s.confirm("b")
    assert s.confirm("c")
    assert s.deadline == pytest.approx(112.0)
    assert not s.confirm("d")  # k reached: nothing more to gain
    assert s.confirmations == 2


def test_suspicion_without_expected_confirmations_uses_min():
    s = Suspicion("a", k=0, min_s=4.0, max_s=24.0, now=0.0, incarnation=0)
    assert s.deadline == 4.0


def _u(node, inc=0):
    return (0, node, node + ":1", inc, "")


def test_queue_least_sent_then_newest_first_and_limit():
    q = BroadcastQueue()
    for name in "abc":
        q.push(name, _u(name), 10)
    assert [u[1] for u in q.take(25, limit=2)] == ["c", "b"]  # budget fits two, newest first
    assert [u[1] for u in q.take(100, limit=2)] == ["a", "c", "b"]  # a was never sent: first
    assert [u[1] for u in q.take(100, limit=2)] == ["a"]  # b and c hit the limit of 2
    assert len(q) == 0 and q.take(100, limit=2) == []


def test_queue_newer_update_replaces_older_about_same_member():
    q = BroadcastQueue()
    q.push("a", _u("a", 0), 10)
    q.take(100, limit=5)
    q.push("a", _u("a", 1), 10)
    assert q.pending() == [_u("a", 1)]
    assert len(q) == 1


def test_queue_skips_oversized_and_prunes():
    q = BroadcastQueue()
    q.push("big", _u("big"), 500)
    q.push("small", _u("small"), 20)
    assert [u[1] for u in q.take(100, limit=10)] == ["small"]
    q.take(1000, limit=10)
    q.prune(1)
    assert q.pending() == []


@pytest.mark.parametrize("kwargs", [
    {"probe_timeout": 2.0},  # longer than the period
    {"probe_interval": 0},
    {"reap_after": 10.0, "reconnect_window": 20.0},
    {"join_retry_initial": 5.0, "join_retry_max": 1.0},
    {"indirect_checks": -1},
    {"packet_budget_bytes": 10},
    {"gossip_nodes": math.nan},
])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        MembershipConfig(**kwargs)


def test_presets():
    lan, local, wan = MembershipConfig.lan(), MembershipConfig.local(), MembershipConfig.wan()
    assert (lan.probe_interval, lan.probe_timeout, lan.indirect_checks, lan.suspicion_mult) == (1.0, 0.5, 3, 4)
    assert (lan.retransmit_mult, lan.push_pull_interval, lan.gossip_interval, lan.gossip_nodes) == (4, 30.0, 0.2, 3)
    assert local.probe_interval < lan.probe_interval < wan.probe_interval
    assert local.push_pull_interval == 2.0
