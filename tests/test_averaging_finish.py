"""Peers that finished training keep serving the ones still training (SGP, D-PSGD, DiLoCo), and
SGP paces its pushes. Hand-driven averagers over ArrayPorts; no sockets, no sleeps."""


import numpy as np
import pytest

from p2p.averaging.base import AveragingConfig
from p2p.averaging.diloco import DiLoCo, DiLoCoConfig, OuterDone, OuterShare
from p2p.averaging.dpsgd import Dpsgd
from p2p.averaging.rounds import LEAD
from p2p.averaging.sgp import PushSum, SGPConfig
from tests.test_averaging_algorithms import deliver
from tests.test_averaging_algorithms import make as make_averager

KEY = "m/4"
# Toy vectors far apart: robust mixing (tests/test_robust.py) would clip them; off here.
CFG = AveragingConfig(interval_s=0.1, exchange_timeout_s=1.0, round_timeout_s=1.0, robust_mixing=False)
OPTIONS = {PushSum: SGPConfig(push_interval_s=0.02), DiLoCo: DiLoCoConfig(inner_steps=2)}


def make(cls, values, config=CFG, seed=0):
    return make_averager(cls, values, config, seed, options=OPTIONS.get(cls))


# -- SGP -------------------------------------------------------------------------------------
def test_push_sum_pushes_at_most_once_per_push_interval():
    _, a = make(PushSum, [0, 0, 0, 0])
    assert len(a.after_step(1, 0.0, ["b"])) == 1
    assert a.after_step(2, 0.01, ["b"]) == [] and a.weight == 0.5  # paced: weight kept
    assert len(a.after_step(3, 0.03, ["b"])) == 1 and a.weight == 0.25
    assert a.stats["pushes_skipped"] == 1


def test_push_sum_finished_peer_gives_weight_back_and_stays_in_consensus():
    pa, a = make(PushSum, [0, 0, 0, 0])  # still training
    pb, b = make(PushSum, [8, 8, 8, 8])  # finished
    b.training_done(300, 0.0)
    t = 0.0
    for step in range(1, 41):
        t += 0.05
        pa.x -= 0.1  # a training step
        replies = deliver(b, a.after_step(step, t, ["b"]), "a", t)
        assert len(replies) == 1 and replies[0].to == "a"  # every new step is answered
        deliver(a, replies, "b", t)
        assert a.weight + b.weight == pytest.approx(2.0, abs=1e-12)
    assert 0.5 < a.weight < 1.5  # without the answers: 2 ** -40
    assert np.abs(pa.x - pb.x).max() < 1.0  # b follows a (a moved 4.0 meanwhile)


def test_push_sum_finished_peers_push_on_their_timer_without_ping_pong():
    pa, a = make(PushSum, [0, 0, 0, 0])
    pb, b = make(PushSum, [8, 8, 8, 8])
    assert a.next_deadline() == float("inf")  # training peers push from after_step only
    a.training_done(10, 0.0)
    b.training_done(10, 0.0)
    t = 0.0
    for _ in range(30):
        t = max(a.next_deadline(), b.next_deadline(), t)
        for me, other, name in ((a, b, "b"), (b, a, "a")):
            sends = me.tick(t, [name])
            assert len(sends) <= 1
            src = "a" if me is a else "b"
            hops = 0
            while sends:  # answers to answers: each step count is answered once, so this ends
                sends = deliver(other, sends, src, t)
                me, other, src, name = other, me, name, src
                hops += 1
                assert hops <= 3
        assert a.next_deadline() > t and b.next_deadline() > t  # never a busy loop
    assert a.stats["replies"] + b.stats["replies"] <= 2  # the same step count is answered once
    assert a.weight + b.weight == pytest.approx(2.0, abs=1e-12)
    np.testing.assert_allclose(pa.x, pb.x, atol=1e-3)


# -- D-PSGD ------------------------------------------------------------------------------------
def test_dpsgd_finished_peer_answers_rounds_so_trainers_never_time_out():
    pa, a = make(Dpsgd, [0, 0, 0, 0])  # training
    pb, b = make(Dpsgd, [6, 6, 6, 6])  # finished
    b.training_done(5, 0.0)
    assert b.next_deadline() == float("inf")  # nothing to answer
    for step in range(1, 4):
        t = step * 0.01
        sends = a.after_step(step, t, ["b"])
        assert not a.may_step(step + 1, t)
        deliver(b, sends, "a", t, ["a"])
        assert b.next_deadline() <= t and b.topology_round() == step - 1
        answer = b.tick(t, ["a"])  # the round a began
        assert [s.to for s in answer] == ["a"] and answer[0].msg.round == step - 1
        deliver(a, answer, "b", t, ["b"])
        assert a.may_step(step + 1, t)  # at once, not after the round timeout
        pa.x -= 0.5
    assert a.stats["rounds_partial"] == 0 and b.stats["rounds_served"] == 3
    assert np.abs(pa.x - pb.x).max() < 1.0  # mixing went on both ways


def test_dpsgd_finished_peer_far_ahead_pulls_a_late_trainer_forward():
    pa, a = make(Dpsgd, [0, 0, 0, 0])  # joined late: round 0
    pb, b = make(Dpsgd, [6, 6, 6, 6])  # trained alone to round 100, then finished
    for step in range(1, 101):
        b.after_step(step, 0.0, [])
    b.training_done(100, 0.0)
    sends = a.after_step(1, 1.0, ["b"])
    deliver(b, sends, "a", 1.0, ["a"])  # late for b: dropped, but b begins a round ahead
    assert b.stats["late"] == 1 and b.topology_round() == 100 and b.next_deadline() <= 1.0
    nudge = b.tick(1.0, ["a"])
    assert [s.msg.round for s in nudge] == [100]  # >= LEAD ahead of a's round: a jumps
    deliver(a, nudge, "b", 1.0, ["b"])
    assert a.may_step(2, 1.0)  # behind: a's round 0 ends now, not after the timeout
    answer = a.after_step(2, 1.1, ["b"])
    assert answer[0].msg.round == 100 and LEAD <= 100
    deliver(b, answer, "a", 1.1, ["a"])
    b.tick(1.1, ["a"])  # b's nudge round is complete
    assert not b.busy() and b.stats["exchanges_completed"] == 101
    np.testing.assert_allclose(pa.x, 3.0)
    np.testing.assert_allclose(pb.x, 3.0)


def test_finished_peers_never_begin_rounds_among_themselves():
    _, a = make(Dpsgd, [0, 0, 0, 0])
    _, b = make(Dpsgd, [6, 6, 6, 6])
    a.training_done(0, 0.0)
    b.training_done(0, 0.0)
    assert a.tick(5.0, ["b"]) == [] and b.tick(5.0, ["a"]) == []
    assert a.next_deadline() == b.next_deadline() == float("inf")


# -- DiLoCo ------------------------------------------------------------------------------------
def test_diloco_finished_peer_serves_outer_rounds_and_start_copies_agree():
    pa, a = make(DiLoCo, [0, 0, 0, 0])  # training
    pb, b = make(DiLoCo, [0, 0, 0, 0])  # finished after its outer steps
    b.training_done(2, 0.0)
    for outer in range(3):
        pa.x -= 1.0  # two inner steps
        assert a.after_step(2 * outer + 1, 0.0, ["b"]) == []
        sends = a.after_step(2 * outer + 2, 0.0, ["b"])
        assert not a.may_step(2 * outer + 3, 0.0)
        deliver(b, sends, "a", 0.0, ["a"])
        assert b.busy() and b.topology_round() == outer
        answer = b.tick(0.0, ["a"])
        # its share of the round, then (the round complete, its outer step taken) its final sketch
        assert [(type(s.msg), s.msg.round) for s in answer] == [(OuterShare, outer), (OuterDone, outer + 1)]
        deliver(a, answer, "b", 0.0, ["b"])
        assert a.may_step(2 * outer + 3, 0.0) and not b.busy()
        np.testing.assert_allclose(a.outer_parameters, b.outer_parameters)
        np.testing.assert_allclose(pa.x, pb.x)
    assert a.stats["rounds_partial"] == 0 and b.stats["outer_steps"] == 3
    assert pa.x[0] < -1.0  # the outer steps moved both (half of a's pseudo-gradient, with momentum)


# -- the trainer's side ------------------------------------------------------------------------
def test_step_hooks_forward_training_done_to_the_network_side():
    from p2p.training.step_hooks import StepHooks

    for cls in (PushSum, Dpsgd, DiLoCo):
        _, avg = make(cls, [0, 0, 0, 0])
        hooks = StepHooks(avg, gate_timeout_s=1.0)
        try:
            assert hooks.serves_done
            hooks.training_done(7)
            assert hooks.wake_socket.poll(5000)
            hooks.service(0.0, lambda: [])
            assert (avg._rounds.serving if cls is not PushSum else avg._done)
        finally:
            hooks.close_trainer_side()
            hooks.close()
