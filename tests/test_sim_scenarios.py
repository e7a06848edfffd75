"""Seeded simulation scenarios at small scale: determinism, convergence, detection, partitions."""

from __future__ import annotations

import json
import math
import random

import pytest

from p2p.gossip import ALIVE, DEAD, LEFT, SUSPECT, Gossip, Membership, MembershipConfig, Ping, PushPull
from p2p.gossip.messages import trusted
from p2p.sim import Churn, InvariantChecker, InvariantViolation, SimConfig, Simulation, run
from p2p.sim.wiresize import WireSize
from p2p.wire import encode


def test_same_seed_same_result_and_other_seed_differs():
    cfg = SimConfig(peers=30, seed=11, duration_s=40.0, loss=0.02, churn=Churn(crashes=2, joins=2, leaves=1))
    a, b = run(cfg), run(cfg)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = run(SimConfig(peers=30, seed=12, duration_s=40.0, loss=0.02, churn=Churn(crashes=2, joins=2, leaves=1)))
    assert c["messages"] != a["messages"]


def test_churn_does_not_shift_the_network_draws_before_it_happens():
    """Churn has its own RNG stream: with and without late crashes, the join phase is the same run."""
    calm = run(SimConfig(peers=30, seed=8, duration_s=40.0))
    # crashes at 20-22 s: the 18 s left are 3 suspicion timeouts, time for everyone to see both
    churned = run(SimConfig(peers=30, seed=8, duration_s=40.0, churn=Churn(crashes=2, window=(0.5, 0.55))))
    assert calm["convergence_s"] is not None and calm["convergence_s"] < 30.0
    assert churned["convergence_s"] == calm["convergence_s"] and churned["detection_s"]["count"] == 2


def test_join_through_one_seed_converges_within_3_log2_n_periods():
    r = run(SimConfig(peers=60, seed=1, duration_s=30.0))
    assert r["convergence_periods"] is not None
    assert r["convergence_periods"] <= 3 * math.log2(60)
    assert r["converged_at_end"] and r["false_positives"] == 0 and r["remote_errors"] == 0
    assert r["invariant_checks"] >= 60 * 59  # every row change went through the checkers


def test_crashes_are_detected_by_everyone_within_three_suspicion_timeouts():
    r = run(SimConfig(peers=40, seed=2, duration_s=60.0, churn=Churn(crashes=3)))
    assert r["detection_s"]["count"] == 3 and r["undetected"] == 0
    assert r["detection_s"]["max"] <= 3 * r["suspicion_min_timeout_s"]
    assert r["false_positives"] == 0
    assert r["live_members_at_end"] == 37 and r["converged_at_end"]


def test_no_false_positives_under_modest_loss():
    r = run(SimConfig(peers=40, seed=3, duration_s=120.0, loss=0.05, warm_start=True))
    assert r["false_positives"] == 0
    assert r["lost"] > 0  # the loss model ate messages (dropped: receiver down or cut off)
    assert r["protocol_counters"].get("suspected", 0) > 0  # loss did cause suspicions, all refuted


def test_partition_heals_into_one_view():
    mc = MembershipConfig.lan()
    r = run(SimConfig(peers=30, seed=4, duration_s=120.0, partition=0.5, partition_s=40.0, membership=mc))
    assert r["partition_merge_s"] is not None and r["partition_merge_s"] <= 30.0
    assert r["converged_at_end"]
    counters = r["protocol_counters"]
    assert counters["declared_dead"] > 0 and counters["reconnects"] > 0


def test_graceful_leaves_and_late_joins():
    r = run(SimConfig(peers=25, seed=5, duration_s=40.0, churn=Churn(leaves=2, joins=3)))
    assert r["leave_propagation_s"]["count"] == 2
    # "left" spreads by gossip alone (median ~1.9 s over seeds, max 2.1 s), well inside the
    # suspicion timeout (5.6 s here) that a crash needs
    assert r["leave_propagation_s"]["max"] < 3.0 < r["suspicion_min_timeout_s"]
    assert r["live_members_at_end"] == 26 and r["converged_at_end"]
    assert r["false_positives"] == 0


def test_warm_start_begins_converged_and_single_member_runs():
    assert run(SimConfig(peers=20, seed=6, duration_s=5.0, warm_start=True))["convergence_s"] == 0.0
    solo = run(SimConfig(peers=1, seed=6, duration_s=5.0))
    assert solo["convergence_s"] == 0.0 and solo["messages"] == 0


def test_bandwidth_limit_slows_but_does_not_break():
    fast = run(SimConfig(peers=20, seed=7, duration_s=20.0))
    slow = run(SimConfig(peers=20, seed=7, duration_s=20.0, bandwidth_bps=200_000))
    assert slow["converged_at_end"] and slow["convergence_s"] >= fast["convergence_s"]


@pytest.mark.parametrize("kwargs", [
    {"peers": 0}, {"loss": 1.0}, {"loss": -0.1}, {"partition": 1.0}, {"partition": 0.0},
    {"churn": Churn(crashes=5), "peers": 5}, {"duration_s": 0}, {"partition": 0.5, "partition_s": 100.0, "duration_s": 60.0},
])
def test_bad_sim_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        SimConfig(**kwargs)


# ---------------------------------------------------------------- invariant checkers


@pytest.mark.parametrize("change, words", [
    (("n1", "n1", ALIVE, 0, DEAD, 0), "marked itself dead"),
    (("n1", "n1", ALIVE, 0, LEFT, 0), "marked itself left"),
    (("n1", "n2", ALIVE, 5, ALIVE, 4), "down to 4"),
    (("n1", "n2", DEAD, 3, ALIVE, 3), "back as alive"),
    (("n1", "n2", LEFT, 3, SUSPECT, 3), "back as suspect"),
    (("n1", "n2", ALIVE, 3, None, -1), "reaped n2 while it was alive"),
])
def test_invariant_checker_catches_broken_changes(change, words):
    checker = InvariantChecker(seed=1234)
    observer, member, os, oi, ns, ni = change
    with pytest.raises(InvariantViolation) as err:
        checker.observe(12.5, observer, member, os, oi, ns, ni)
    assert "seed=1234" in str(err.value) and words in str(err.value) and err.value.seed == 1234


def test_invariant_checker_accepts_legal_changes():
    checker = InvariantChecker(seed=1)
    checker.observe(0.0, "n1", "n2", None, -1, ALIVE, 0)
    checker.observe(0.0, "n1", "n2", ALIVE, 0, SUSPECT, 0)
    checker.observe(0.0, "n1", "n2", SUSPECT, 0, DEAD, 0)
    checker.observe(0.0, "n1", "n2", DEAD, 0, ALIVE, 1)
    checker.observe(0.0, "n1", "n1", ALIVE, 0, LEFT, 0, observer_leaving=True)
    checker.observe(0.0, "n1", "n3", DEAD, 0, None, -1)
    assert checker.checked == 6


def test_invariant_checker_sees_a_membership_fed_a_lie_through_its_public_api():
    """Wire a checker to a Membership and feed it crafted messages: the protocol itself must
    keep the invariants (it refutes instead of accepting its own death)."""
    checker = InvariantChecker(seed=99)
    m = Membership(MembershipConfig.lan(), "n1", "h:1", random.Random(0), 0.0)
    m.on_change = lambda *c: checker.observe(0.0, "n1", *c)
    m.start([], 0.0)
    m.receive("h:2", PushPull("n2", True, True, ((ALIVE, "n2", "h:2", 0), (DEAD, "n1", "h:1", 7))), 0.0)
    m.receive("h:2", Gossip("n2", ((DEAD, "n1", "h:1", 8, "n2"), (DEAD, "n2", "h:2", 0, "n3"))), 0.0)
    m.tick(2.0)  # nothing answers our check of the rumour about n2: it stands (after our refutes: 1.5 s)
    m.receive("h:2", Gossip("n2", ((ALIVE, "n2", "h:2", 0, ""),)), 2.0)  # stale: stays dead
    assert m.incarnation == 9 and m.member("n2").state == "dead"
    assert checker.checked >= 4
    # and the checker does fire when a (broken) table change is reported to it
    with pytest.raises(InvariantViolation, match="seed=99"):
        m.on_change("n2", DEAD, 0, ALIVE, 0)


def test_simulation_invariant_failure_names_the_seed():
    sim = Simulation(SimConfig(peers=5, seed=77, duration_s=5.0))
    with pytest.raises(InvariantViolation, match=r"seed=77"):
        sim.checker.observe(1.0, "n00001", "n00001", ALIVE, 0, DEAD, 0)


# ---------------------------------------------------------------- byte accounting


def test_wire_size_estimate_matches_encoding():
    ids = [f"n{i:05d}" for i in range(200)]
    addrs = [f"10.0.{i >> 8}.{i & 255}:7946" for i in range(200)]
    size = WireSize(ids, addrs)
    ups = tuple((ALIVE, i, a, 0, "") for i, a in zip(ids[:40], addrs))
    rows = tuple((ALIVE, i, a, 0) for i, a in zip(ids, addrs))
    for msg in [Ping(5, ids[0], ids[1]), Ping(6, ids[0], ids[1], ups[:3]), Gossip(ids[2], ups),
                trusted(PushPull, ids[3], False, True, rows)]:
        real = len(encode(msg, addrs[0])[0])
        assert abs(size(msg) - real) <= max(2, 0.03 * real), type(msg).__name__
