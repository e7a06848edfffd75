"""The averaging simulator drives the composed Peer: its own membership view decides the
neighbours, crashes are found by SWIM, joiners join for real, finished peers keep serving."""

from __future__ import annotations

import pytest

from p2p.averaging.dpsgd import Dpsgd
from p2p.averaging.registry import ALGORITHMS
from p2p.gossip.suspicion import suspicion_min_timeout
from p2p.peer import Peer
from p2p.sim.avg_config import AvgSimConfig, sim_averaging_config, sim_membership_config
from p2p.sim.avg_node import DOWN, IDLE
from p2p.sim.avg_sim import AvgSimulation
from p2p.sim.churn import Churn


def simulation(algorithm="dpsgd", topology="ring", **kw):
    kw.setdefault("peers", 6)
    kw.setdefault("steps", 60)
    kw.setdefault("seed", 3)
    return AvgSimulation(AvgSimConfig(algorithm, topology, **kw))


def survivors(sim):
    return [n for n in sim.nodes if n is not None and n.phase != DOWN]


def test_every_simulated_peer_is_the_composed_peer_with_its_own_membership():
    sim = simulation(peers=4, steps=10)
    sim.run()
    peers = [n.peer for n in sim.nodes]
    assert all(isinstance(p, Peer) for p in peers)
    assert len({id(p.membership) for p in peers}) == 4  # no shared member list
    assert all(p.membership.stats.get("recv_Ping", 0) > 0 for p in peers)  # SWIM ran on the network


def test_a_crashed_peer_leaves_the_survivors_views_through_swim_detection():
    sim = simulation(churn=Churn(crashes=1), steps=80)
    r = sim.run()
    (gone,) = r.departures
    assert gone.kind == "crash"
    alive = survivors(sim)
    assert len(alive) == 5 and sorted(gone.noticed) == sorted(n.peer.addr for n in alive)
    # Found out by probes and a suspicion timeout, not told: nobody can know sooner than the
    # minimum suspicion timeout after the crash.
    mc = sim.membership
    floor = suspicion_min_timeout(mc.suspicion_mult, 6, mc.probe_interval)
    assert min(gone.noticed.values()) - gone.at >= floor
    assert max(gone.noticed.values()) - gone.at <= 3 * floor * mc.suspicion_max_timeout_mult
    assert r.membership["suspected"] > 0 and r.membership["declared_dead"] > 0
    assert r.network["dropped"] > 0  # until then its neighbours kept sending to it
    for node in alive:
        assert gone.addr not in node.peer.neighbours()
        assert node.peer.membership.member(sim.ids[sim.index[gone.addr]]).state == "dead"
    assert r.false_positives == 0


def test_a_graceful_leave_is_told_not_detected():
    sim = simulation(churn=Churn(leaves=1), steps=80)
    r = sim.run()
    (gone,) = r.departures
    mc = sim.membership
    assert gone.kind == "leave" and len(gone.noticed) == 5
    assert max(gone.noticed.values()) - gone.at < suspicion_min_timeout(mc.suspicion_mult, 6, mc.probe_interval)
    assert r.membership.get("declared_dead", 0) == 0 and r.membership["declared_left"] >= 5
    for node in survivors(sim):
        assert node.peer.membership.member(sim.ids[sim.index[gone.addr]]).state == "left"


def test_joiners_join_through_a_running_member_and_all_views_agree_at_the_end():
    sim = simulation(algorithm="sgp", topology="one-peer-exponential",
                     churn=Churn(joins=2, crashes=1, leaves=1), steps=100, seed=4)
    r = sim.run()
    alive = survivors(sim)
    addrs = {n.peer.addr for n in alive}
    assert len(alive) == 6 and r.live[-1] == 6
    for node in alive:
        assert {m.addr for m in node.peer.membership.alive()} == addrs - {node.peer.addr}
    joiners = [n for n in sim.nodes[6:]]
    assert all(n.peer.membership.stats["join_attempts"] >= 1 for n in joiners)
    assert all(n.port.step == 100 for n in alive)  # joiners took the step count of their seed


@pytest.mark.parametrize("algorithm", ["dpsgd", "gossipgrad"])
def test_finished_peers_keep_serving_their_neighbours_rounds(algorithm):
    """A straggler slower than the round timeout falls behind; the peers that finished first
    answer its rounds (``training_done``) instead of leaving it to time out every step."""
    compute, steps = 0.05, 40
    sim = simulation(algorithm, steps=steps, stragglers=1, straggler_factor=10.0, compute_s=compute,
                     config=sim_averaging_config(compute, round_timeout_s=4 * compute))
    r = sim.run()
    (slow,) = r.stragglers
    fast = [n for n in sim.nodes if n.peer.addr != slow]
    assert all(n.phase == IDLE and n.finished_at < r.finish_time[slow] for n in fast)
    served = [n.averager.stats["rounds_served"] for n in fast]
    assert min(served) > 0 and sum(served) >= steps / 2
    # served, its rounds never waited a timeout once the others finished: it ran at its own pace
    assert r.finish_time[slow] <= 1.1 * steps * compute * 10.0


def test_training_done_is_called_once_per_peer_after_its_last_step(monkeypatch):
    calls = []

    class Recording(Dpsgd):
        def training_done(self, step, now):
            calls.append((self.port.step, step, now))
            super().training_done(step, now)

    monkeypatch.setitem(ALGORITHMS, "dpsgd", Recording)
    sim = simulation(peers=5, steps=30)
    r = sim.run()
    assert sorted(c[1] for c in calls) == [30] * 5 and all(c[0] == c[1] for c in calls)
    assert sorted(c[2] for c in calls) == sorted(r.finish_time.values())


def test_membership_messages_share_the_network_and_the_wire_codec():
    r = simulation(peers=4, steps=20, wire=True, loss=0.05).run()
    assert 0 < r.network["membership_sent"] < r.network["sent"]
    assert r.network["bytes"] > 0 and r.network["lost"] > 0 and not r.rejected


def test_membership_config_is_scaled_to_the_step_time():
    fast, slow = sim_membership_config(0.05), sim_membership_config(0.5)
    assert fast.probe_interval == pytest.approx(0.1) and slow.probe_interval == pytest.approx(1.0)
    assert slow.suspicion_mult == fast.suspicion_mult
    assert slow.reap_after / fast.reap_after == pytest.approx(10.0)
    assert sim_membership_config(0.05, indirect_checks=1).indirect_checks == 1


def test_same_seed_replays_churn_and_detection_exactly():
    def go(seed):
        r = simulation("sgp", "one-peer-exponential", churn=Churn(joins=1, crashes=1, leaves=1), seed=seed).run()
        return r.consensus, r.network, [(d.addr, d.at, d.noticed) for d in r.departures], r.membership

    assert go(5) == go(5) and go(5) != go(6)
