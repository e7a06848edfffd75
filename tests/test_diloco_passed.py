"""A round passed by (p2p/averaging/rounds.py, "Passed by"): a DiLoCo peer cut off and stuck in
a round of its own, whose deadline spans several of the swarm's rounds, ends it as soon as a
neighbour's share shows the swarm two or more rounds on, jumps to that round and is caught up
from there (issue 16: the lab test's cut peer waited out its deadline first). The engine alone,
then three DiLoCo peers on a logical clock, every message through the wire codec, no sleeps."""

from collections import defaultdict

import numpy as np

from p2p.averaging import outer_mending
from p2p.averaging.outer_catchup import LOG_ROUNDS
from p2p.averaging.rounds import NeighbourRounds
from tests.test_diloco_repair import Swarm

V = (np.zeros(4, np.float32),)


def engine(passed_within=LOG_ROUNDS):
    stats = defaultdict(int)
    return NeighbourRounds(60.0, stats, uniform=True, passed_within=passed_within), stats


def stuck_in_round_3(rounds, patience_s=0.5):
    """Rounds 0-2 with both neighbours, then round 3 begun at t=10 (its deadline: t=70)."""
    for r in range(3):
        rounds.begin(float(r), ["a", "b"], V, timeout_s=60.0, wait_for=["a", "b"], patience_s=patience_s)
        for src in "ab":
            rounds.offer(src, r, 2, 0, V)
        assert rounds.ready(float(r))
        rounds.finish(0, now=float(r))
    assert rounds.begin(10.0, ["a", "b"], V, timeout_s=60.0, wait_for=["a", "b"], patience_s=patience_s) == 3


def test_a_neighbour_two_rounds_on_ends_the_round_at_once_and_the_next_begins_at_its_round():
    rounds, stats = engine()
    stuck_in_round_3(rounds)
    rounds.offer("a", 6, 2, 0, V)  # the swarm did rounds 3-5 without us: a's first share since
    assert rounds.ready(12.0) and rounds.wake_at == 70.0  # (b's proof never needed: one member is enough)
    mixed = rounds.finish(0, now=12.0)
    assert mixed.senders == frozenset() and stats["rounds_passed"] == 1 and stats["rounds_partial"] == 1
    assert rounds.behind and rounds.next_round() == 6
    assert rounds.begin(12.0, ["a", "b"], V, timeout_s=60.0, wait_for=["a", "b"], patience_s=0.5) == 6
    assert stats["jumps"] == 1
    rounds.offer("b", 6, 2, 0, V)
    assert rounds.ready(12.0) and rounds.finish(0, now=12.0).senders == {"a", "b"}
    assert stats["rounds_passed"] == 1  # a round that got every share is no round passed by


def test_not_before_the_usual_wait_then_at_once_without_waiting_for_the_deadline():
    rounds, stats = engine()
    stuck_in_round_3(rounds, patience_s=0.5)
    rounds.offer("a", 5, 2, 0, V)
    assert not rounds.ready(10.1)  # an ordinary round's shares may still be on their way
    assert rounds.wake_at == 10.5  # the driver's timer: the end of the patience, not the deadline at 70
    assert rounds.ready(10.5)


def test_a_straggler_one_round_on_a_stranger_or_a_round_past_the_catch_up_end_nothing():
    for offer in (("a", 4), ("stranger", 6), ("a", 3 + LOG_ROUNDS)):
        rounds, stats = engine()
        stuck_in_round_3(rounds)
        rounds.offer(offer[0], offer[1], 2, 0, V)
        assert not rounds.ready(30.0) and rounds.wake_at == 70.0, offer
        assert rounds.ready(70.0)  # the deadline, as before
        rounds.finish(0, now=70.0)
        assert stats["rounds_passed"] == 0, offer


def test_without_patience_or_passed_within_the_rule_is_off():
    rounds, stats = engine(passed_within=0)  # D-PSGD, GossipGraD: as before
    stuck_in_round_3(rounds)
    rounds.offer("a", 6, 2, 0, V)
    assert not rounds.ready(30.0)
    rounds, stats = engine()
    stuck_in_round_3(rounds, patience_s=None)  # no usual wait measured yet
    rounds.offer("a", 6, 2, 0, V)
    assert not rounds.ready(30.0)


def test_the_jump_goes_no_further_than_the_round_that_proved_it():
    rounds, stats = engine()
    stuck_in_round_3(rounds)
    rounds.offer("stranger", 14, 2, 0, V)  # a round far on that no member we wait for vouches for
    rounds.offer("a", 6, 2, 0, V)
    assert rounds.ready(12.0)
    rounds.finish(0, now=12.0)
    assert rounds.next_round() == 6


# -- three DiLoCo peers -----------------------------------------------------------------------

N = 60_000
H = 4
INNER_S = 0.2  # simulated compute per inner period: the swarm's rounds take about this long


class Peers(Swarm):
    """Three DiLoCo peers on a full graph (SparseLoCo, as in the lab test; the codec's own outer
    lr and momentum), test_diloco_repair's network and clock, but each trainer stepping on its
    own (a gate that holds one does not hold the others). Shares are delivered at once unless
    the link is cut, then lost."""

    def __init__(self):
        base = np.random.default_rng(7).standard_normal(N).astype(np.float32)
        super().__init__([base.copy() for _ in range(3)], codec="sparseloco", timeout_s=20.0,
                         outer_lr=None, outer_momentum=None)
        self.ready_at = {n: INNER_S for n in self.names}  # when each trainer ends its inner period
        self.rng = np.random.default_rng(3)

    def run(self, until, dt=0.01):
        """Every trainer steps when its gate lets it; every timer fires when due."""
        while self.now < until:
            self.now = round(self.now + dt, 6)
            for name in self.names:
                port, alg = self.peers[name]
                self.send(name, alg.tick(self.now, self.others(name)) if alg.next_deadline() <= self.now else [])
                if self.now >= self.ready_at[name] and alg.may_step(port.step + 1, self.now):
                    port.x -= self.rng.standard_normal(N).astype(np.float32) * np.float32(0.01)
                    port.step += H
                    self.ready_at[name] = self.now + INNER_S
                    self.send(name, alg.after_step(port.step, self.now, self.others(name)))

    def round_of(self, name):
        return self.alg(name)._rounds.round


def test_a_cut_peer_stuck_in_its_round_jumps_at_the_first_later_share_and_is_caught_up(monkeypatch):
    s = Peers()
    s.run(2.0)  # steady rounds: every peer learns the usual wait
    assert min(s.alg(n).stats["outer_steps"] for n in s.names) >= 5
    s.cut = {"p2"}
    s.run(s.now + 3.0)  # p0, p1: one short timeout, then rounds without p2; p2 alone, waiting each out
    stuck = s.alg("p2")._rounds
    assert stuck.waiting and s.round_of("p0") >= stuck.round + 3, (stuck.round, s.round_of("p0"))
    assert stuck.deadline > s.now + 0.5  # without the rule it would wait here that long yet
    s.cut = set()
    restored, outer_before = s.now, s.alg("p2").stats["outer_steps"]
    s.run(s.now + 2 * INNER_S)  # the others' next shares reach p2: it stops waiting and jumps at once
    p2 = s.alg("p2").stats
    assert p2["rounds_passed"] == 1 and p2["jumps"] >= 1, dict(p2)
    assert s.round_of("p2") >= s.round_of("p0") - 1
    assert p2["outer_steps"] > outer_before
    s.run(s.now + 8 * INNER_S)  # a few of the swarm's rounds: caught up by the rounds' shares
    assert p2["catch_ups_completed"] == 1 and p2["repairs_started"] == 1 and p2["repair_bytes"] < N, dict(p2)
    assert sum(s.alg(n).stats["repairs_started"] for n in s.names) == 1
    ref = s.alg("p0").outer_parameters
    assert all(np.allclose(s.alg(n).outer_parameters, ref, rtol=0, atol=1e-4) for n in s.names)
    assert s.now - restored < 11 * INNER_S


def test_without_the_rule_the_cut_peer_waits_out_its_deadline(monkeypatch):
    monkeypatch.setattr(outer_mending, "PASSED_WITHIN", 0)  # the test above can fail
    s = Peers()
    s.run(2.0)
    s.cut = {"p2"}
    s.run(s.now + 3.0)
    stuck = s.alg("p2")._rounds
    deadline = stuck.deadline
    s.cut = set()
    s.run(min(deadline, s.now + 0.5) - 0.02)
    assert stuck.waiting and s.alg("p2").stats["rounds_passed"] == 0
