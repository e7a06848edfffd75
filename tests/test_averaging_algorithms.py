"""Each averaging algorithm as a pure state machine, driven by hand with explicit time."""

import dataclasses
import random

import numpy as np
import pytest

from p2p.averaging.adpsgd import AvgReply, AvgRequest, PairwiseGossip
from p2p.averaging.base import AveragingConfig, staleness_weight
from p2p.averaging.diloco import DiLoCo, DiLoCoConfig, OuterShare
from p2p.averaging.dpsgd import Dpsgd, DpsgdParams
from p2p.averaging.elastic import ElasticConfig, ElasticGossip, ElasticReply, ElasticRequest
from p2p.averaging.gossipgrad import GossipGraD, GossipGraDConfig, GradientModelShare, GradientShare, model_round
from p2p.averaging.registry import ALGORITHMS, SYNCHRONOUS, make_averager, natural_topology
from p2p.averaging.round_deadline import RoundReceipt
from p2p.averaging.rounds import LEAD, MAX_BUFFERED_ROUNDS, NeighbourRounds
from p2p.averaging.sgp import PushSum, PushSumShare, SGPConfig
from p2p.protocol import LocalProtocolError, RemoteProtocolError, Send
from p2p.sim.avg_port import ArrayPort
from p2p.topology import TOPOLOGIES

KEY = "m/4"
CFG = AveragingConfig(interval_s=0.1, exchange_timeout_s=1.0, round_timeout_s=1.0)


def vec(*values):
    return np.array(values, dtype=np.float32)


def make(cls, values, config=CFG, seed=0, options=None):
    # Exact mixing arithmetic between toy vectors far apart (0 and 3 and 6): robust mixing would
    # clip them (it is tested in tests/test_robust.py), so it is off in these state-machine tests.
    port = ArrayPort(values, KEY, immediate=True)
    config = dataclasses.replace(config, robust_mixing=False)
    return port, cls(config, port, random.Random(seed), 0.0, options=options)


def deliver(receiver, sends, src, now, neighbours=()):
    out = []
    for s in sends:
        out += receiver.receive(src, s.msg, now, list(neighbours))
    return out


# Algorithms whose messages carry plain float32 tensors; CHOCO's compressed messages have their
# own rejection tests in tests/test_choco.py.
PLAIN = [name for name in ALGORITHMS if name != "choco"]


# -- registry --------------------------------------------------------------------------------
def test_registry_names_topologies_and_tags():
    assert list(ALGORITHMS) == ["dpsgd", "adpsgd", "sgp", "elastic", "gossipgrad", "diloco", "choco"]
    assert SYNCHRONOUS == {"dpsgd", "gossipgrad", "diloco"}
    tags = set()
    for name, cls in ALGORITHMS.items():
        assert cls.name == name and natural_topology(name) in TOPOLOGIES
        port = ArrayPort(np.zeros(4), KEY)
        avg = make_averager(name, CFG, port, random.Random(1), 0.0)
        assert avg.wants_gradient == (name == "gossipgrad")
        if name == "choco":
            continue  # sends on its own timer; its counters are named for rounds
        assert avg.stats["exchanges_started"] == 0 and "exchanges_completed" in avg.stats
        for msg_type in avg.MESSAGES:
            # averaging owns 20..39; messages carrying compressed tensors live in 60..79
            assert 20 <= msg_type.TAG <= 39 or 60 <= msg_type.TAG <= 79
            if msg_type is not RoundReceipt:  # (shared by the rounds whose deadline follows the link)
                assert msg_type.TAG not in tags
            tags.add(msg_type.TAG)
        assert (RoundReceipt in avg.MESSAGES) == (name in ("dpsgd", "gossipgrad"))
    with pytest.raises(ValueError, match="available"):
        make_averager("allreduce", CFG, ArrayPort(np.zeros(4)), random.Random(0), 0.0)


@pytest.mark.parametrize("config, bad", [
    (AveragingConfig, dict(round_timeout_s=0)), (AveragingConfig, dict(staleness_tau=0)),
    (ElasticConfig, dict(alpha=1.0)), (DiLoCoConfig, dict(inner_steps=0)), (DiLoCoConfig, dict(outer_momentum=1.0)),
    (DiLoCoConfig, dict(outer_lr=float("nan"))), (DiLoCoConfig, dict(outer_lr=float("inf"))),
    (GossipGraDConfig, dict(model_every=-1)), (SGPConfig, dict(push_interval_s=-1))])
def test_configs_validate(config, bad):
    with pytest.raises(ValueError):
        config(**bad)


def test_each_algorithm_takes_its_own_settings():
    assert not AveragingConfig().staleness_aware
    for name, cls in ALGORITHMS.items():
        avg = make_averager(name, CFG, ArrayPort(np.zeros(4)), random.Random(0), 0.0)
        assert isinstance(avg.options, cls.Config)
    with pytest.raises(ValueError, match="DiLoCoConfig"):
        make_averager("diloco", CFG, ArrayPort(np.zeros(4)), random.Random(0), 0.0, options=ElasticConfig())


@pytest.mark.parametrize("codec, given, expected", [
    ("int4", {}, (0.7, 0.9)),  # DiLoCo's outer Nesterov step
    ("sparseloco", {}, (1.0, 0.0)),  # SparseLoCo's: momentum would amplify what error feedback sends late
    ("sparseloco", {"outer_momentum": 0.5}, (1.0, 0.5)),  # what the user set stands
    ("none", {"outer_lr": 0.3}, (0.3, 0.9)),
])
def test_diloco_takes_the_outer_step_its_codec_calls_for_unless_told(codec, given, expected):
    avg = make_averager("diloco", AveragingConfig(compression=codec), ArrayPort(np.zeros(4)), random.Random(0), 0.0,
                        options=DiLoCoConfig(**given))
    assert (avg.options.outer_lr, avg.options.outer_momentum) == expected


# -- D-PSGD ----------------------------------------------------------------------------------
def ring3():
    pa, a = make(Dpsgd, [0, 0, 0, 0])
    pb, b = make(Dpsgd, [3, 3, 3, 3])
    pc, c = make(Dpsgd, [6, 6, 6, 6])
    return (pa, a), (pb, b), (pc, c)


def test_dpsgd_waits_for_all_neighbours_then_mixes_with_metropolis_hastings():
    (pa, a), (pb, b), (pc, c) = ring3()
    assert a.may_step(1, 0.0)
    sa = a.after_step(1, 0.0, ["b", "c"])
    sb = b.after_step(1, 0.0, ["a", "c"])
    sc = c.after_step(1, 0.0, ["a", "b"])
    assert [s.to for s in sa] == ["b", "c"] and sa[0].msg.round == 0 and sa[0].msg.degree == 2
    assert not a.may_step(2, 0.1) and a.busy()
    deliver(a, [s for s in sb if s.to == "a"], "b", 0.1)
    assert not a.may_step(2, 0.1)  # c still missing: D-PSGD waits for stragglers
    deliver(a, [s for s in sc if s.to == "a"], "c", 0.2)
    assert a.may_step(2, 0.2) and not a.busy()
    np.testing.assert_allclose(pa.x, 3.0)  # 0 + (3 - 0)/3 + (6 - 0)/3
    deliver(b, [s for s in sa if s.to == "b"] , "a", 0.2)
    deliver(b, [s for s in sc if s.to == "b"], "c", 0.2)
    deliver(c, [s for s in sa if s.to == "c"], "a", 0.2)
    deliver(c, [s for s in sb if s.to == "c"], "b", 0.2)
    assert pa.x.sum() + pb.x.sum() + pc.x.sum() == pytest.approx(36.0)  # mean preserved
    assert a.stats["exchanges_completed"] == 1 and a.stats["rounds_partial"] == 0


def test_dpsgd_round_timeout_drops_the_missing_neighbour():
    (pa, a), (pb, b), _ = ring3()
    a.after_step(1, 0.0, ["b", "c"])
    sb = b.after_step(1, 0.0, ["a", "c"])
    deliver(a, [s for s in sb if s.to == "a"], "b", 0.1)
    assert a.next_deadline() == pytest.approx(1.0)
    a.tick(0.5, ["b", "c"])
    assert not a.may_step(2, 0.5)
    a.tick(1.0, ["b", "c"])
    assert a.may_step(2, 1.0) and a.stats["rounds_partial"] == 1
    np.testing.assert_allclose(pa.x, 1.0)  # only b's third; c's weight stays on a


def test_dpsgd_buffers_early_rounds_and_drops_late_ones():
    (pa, a), (pb, b), _ = ring3()
    sb = b.after_step(1, 0.0, ["a"])
    deliver(a, sb, "b", 0.0)  # arrives before a begins round 0: buffered
    a.after_step(1, 0.1, ["b"])
    assert a.may_step(2, 0.1)
    np.testing.assert_allclose(pa.x, 1.5)
    late = DpsgdParams(0, 1, 1, KEY, vec(9, 9, 9, 9))
    # dropped, but receipted: the bytes did reach us (the sender's deadline learns the link)
    assert a.receive("c", late, 0.2, ["b"]) == [Send("c", RoundReceipt(0))] and a.stats["late"] == 1
    np.testing.assert_allclose(pa.x, 1.5)


def test_dpsgd_joiner_jumps_to_the_swarms_round():
    pa, a = make(Dpsgd, [0, 0, 0, 0])
    a.after_step(1, 0.0, ["b"])  # a fresh joiner begins round 0; the swarm is at round 40
    a.receive("b", DpsgdParams(40, 400, 1, KEY, vec(2, 2, 2, 2)), 0.1, ["b"])
    assert a.may_step(2, 0.1)  # stops waiting at once (no round timeout)
    assert a.topology_round() == 40
    (s,) = a.after_step(2, 0.2, ["b"])
    assert s.msg.round == 40 and a.may_step(3, 0.2)  # b's round-40 vector was kept
    np.testing.assert_allclose(pa.x, 1.0)
    assert a.stats["jumps"] == 1


def test_dpsgd_alone_never_waits_and_misuse_is_local():
    pa, a = make(Dpsgd, [1, 1, 1, 1])
    assert a.after_step(1, 0.0, []) == [] and a.may_step(2, 0.0)
    a.after_step(2, 0.0, ["b"])
    with pytest.raises(LocalProtocolError):
        a.after_step(3, 0.0, ["b"])


# -- SGP -------------------------------------------------------------------------------------
def test_push_sum_halves_weight_and_mixes_the_debiased_models():
    pa, a = make(PushSum, [0, 0, 0, 0])
    pb, b = make(PushSum, [8, 8, 8, 8])
    (sa,) = a.after_step(1, 0.0, ["b"])
    assert sa.to == "b" and sa.msg.weight == 0.5 and a.weight == 0.5
    np.testing.assert_allclose(pa.x, 0.0)  # keeping half moves x and w together: z unchanged
    b.receive("a", sa.msg, 0.1, ["a"])
    assert b.weight == 1.5
    np.testing.assert_allclose(pb.x, (1.0 * 8 + 0.5 * 0) / 1.5)
    assert a.weight + b.weight == 2.0  # mass conserved exactly
    assert a.weight * pa.x.sum() + b.weight * pb.x.sum() == pytest.approx(32.0)  # and sum w z
    assert a.may_step(2, 0.1) and not a.busy() and a.next_deadline() == float("inf")


def test_push_sum_follows_the_highest_round_heard():
    _, a = make(PushSum, [0, 0, 0, 0])
    a.receive("b", PushSumShare(17, 170, 0.5, KEY, vec(1, 1, 1, 1)), 0.0, [])
    assert a.topology_round() == 17
    (s,) = a.after_step(1, 0.1, ["c"])
    assert s.msg.round == 17 and a.topology_round() == 18


@pytest.mark.parametrize("weight", [0.0, -0.5, float("nan"), float("inf"), 2.0 ** 21])
def test_push_sum_rejects_impossible_weights(weight):
    pa, a = make(PushSum, [1, 1, 1, 1])
    with pytest.raises(RemoteProtocolError) as info:
        a.receive("b", PushSumShare(0, 0, weight, KEY, vec(5, 5, 5, 5)), 0.0, [])
    assert info.value.reason == "bad_value" and a.weight == 1.0
    np.testing.assert_allclose(pa.x, 1.0)


# -- elastic gossip --------------------------------------------------------------------------
def test_elastic_moves_both_ends_alpha_of_the_way_and_is_zero_sum():
    pa, a = make(ElasticGossip, [0, 0, 0, 0], AveragingConfig(interval_s=0.1), options=ElasticConfig(0.25))
    pb, b = make(ElasticGossip, [8, 8, 8, 8], AveragingConfig(interval_s=0.1), options=ElasticConfig(0.1))
    (req,) = a.tick(1.0, ["b"])
    assert isinstance(req.msg, ElasticRequest) and req.msg.alpha == 0.25
    (rep,) = b.receive("a", req.msg, 1.0, ["a"])  # b uses the requester's alpha, not its own
    assert isinstance(rep.msg, ElasticReply)
    a.receive("b", rep.msg, 1.1, ["b"])
    np.testing.assert_allclose(pa.x, 2.0)
    np.testing.assert_allclose(pb.x, 6.0)
    assert a.stats["exchanges_completed"] == 1


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, float("nan")])
def test_elastic_rejects_bad_alpha(alpha):
    pb, b = make(ElasticGossip, [8, 8, 8, 8])
    with pytest.raises(RemoteProtocolError):
        b.receive("a", ElasticRequest(1, 0, alpha, KEY, vec(0, 0, 0, 0)), 0.0, [])
    np.testing.assert_allclose(pb.x, 8.0)


# -- GossipGraD ------------------------------------------------------------------------------
GG = AveragingConfig(round_timeout_s=1.0)
GG_OPTIONS = GossipGraDConfig(model_every=2)


def gg_pair():
    pa, a = make(GossipGraD, [0, 0, 0, 0], GG, options=GG_OPTIONS)
    pb, b = make(GossipGraD, [4, 4, 4, 4], GG, options=GG_OPTIONS)
    pa.grad, pb.grad = vec(1, 1, 1, 1), vec(3, 3, 3, 3)
    return (pa, a), (pb, b)


def test_gossipgrad_averages_gradients_with_the_partner():
    (pa, a), (pb, b) = gg_pair()
    assert not model_round(0, 2)  # round 0: gradients only
    (sa,) = a.on_gradient(1, 0.0, ["b"])
    (sb,) = b.on_gradient(1, 0.0, ["a"])
    assert isinstance(sa.msg, GradientShare) and sa.msg.round == 0
    assert not a.gradient_ready(1, 0.0)
    deliver(a, [sb], "b", 0.1)
    assert a.gradient_ready(1, 0.1)
    np.testing.assert_allclose(pa.grad, 2.0)
    np.testing.assert_allclose(pa.x, 0.0)  # no parameter mix on this round
    assert a.may_step(2, 0.1) and a.after_step(1, 0.1, ["b"]) == []


@pytest.mark.parametrize("every", [1, 2, 3, 4, 8])
def test_gossipgrad_parameter_rounds_cycle_through_every_hypercube_dimension(every):
    rounds = [r for r in range(64 * every) if model_round(r, every)]
    assert 48 <= len(rounds) <= 80 and not any(model_round(r, 0) for r in range(10))
    assert max(b - a for a, b in zip([-1] + rounds, rounds)) <= 6 * every
    for period in range(1, 11):  # log2 n: the partner of round r is dimension r mod period
        assert {r % period for r in rounds[:8 * period]} == set(range(period))


def test_gossipgrad_model_rounds_average_parameters_too():
    (pa, a), (pb, b) = gg_pair()
    for k in (1, 2):  # rounds 0 and 1 alone; round 2 averages parameters
        a.on_gradient(k, 0.0, [])
        b.on_gradient(k, 0.0, [])
    assert model_round(2, 2) and a.topology_round() == 2
    (sa,) = a.on_gradient(3, 0.0, ["b"])
    (sb,) = b.on_gradient(3, 0.0, ["a"])
    assert isinstance(sa.msg, GradientModelShare)
    deliver(a, [sb], "b", 0.1)
    deliver(b, [sa], "a", 0.1)
    assert a.gradient_ready(3, 0.1) and b.gradient_ready(3, 0.1)
    np.testing.assert_allclose(pa.x, 2.0)
    np.testing.assert_allclose(pb.x, 2.0)
    np.testing.assert_allclose(pa.grad, pb.grad)
    assert a.stats["model_rounds"] == 1


def test_gossipgrad_timeout_keeps_own_gradient_and_no_partner_never_waits():
    (pa, a), _ = gg_pair()
    a.on_gradient(1, 0.0, ["b"])
    assert not a.gradient_ready(1, 0.5)
    assert a.tick(1.0, ["b"]) == [] and a.gradient_ready(1, 1.0)
    np.testing.assert_allclose(pa.grad, 1.0)
    assert a.on_gradient(2, 1.1, []) == [] and a.gradient_ready(2, 1.1)


# -- DiLoCo ----------------------------------------------------------------------------------
DL = AveragingConfig(round_timeout_s=1.0)
DL_OPTIONS = DiLoCoConfig(inner_steps=2, outer_lr=0.7, outer_momentum=0.9)


def test_diloco_outer_nesterov_step_on_the_gossip_averaged_pseudo_gradient():
    pa, a = make(DiLoCo, [2, 2, 2, 2], DL, options=DL_OPTIONS)
    pb, b = make(DiLoCo, [2, 2, 2, 2], DL, options=DL_OPTIONS)
    assert a.after_step(1, 0.0, ["b"]) == [] and a.may_step(2, 0.0)
    pa.x -= vec(0.2, 0.2, 0.2, 0.2)  # two inner steps' worth
    pb.x -= vec(0.6, 0.6, 0.6, 0.6)
    (sa,) = a.after_step(2, 0.0, ["b"])
    (sb,) = b.after_step(2, 0.0, ["a"])
    assert isinstance(sa.msg, OuterShare) and not a.may_step(3, 0.0) and a.busy()
    deliver(a, [sb], "b", 0.1)
    deliver(b, [sa], "a", 0.1)
    assert a.may_step(3, 0.1) and b.may_step(3, 0.1)
    start, delta = 2.0, 0.4  # theta_start (shared) and the averaged Delta
    momentum = delta
    expected = start - 0.7 * (delta + 0.9 * momentum)
    np.testing.assert_allclose(pa.x, expected, rtol=1e-6)
    np.testing.assert_allclose(pb.x, expected, rtol=1e-6)
    np.testing.assert_allclose(a.outer_parameters, expected, rtol=1e-6)
    assert a.stats["outer_steps"] == 1


def test_diloco_several_gossip_rounds_continue_through_tick():
    cfg = AveragingConfig(round_timeout_s=1.0)
    options = DiLoCoConfig(inner_steps=1, gossip_rounds=2)
    pa, a = make(DiLoCo, [0, 0, 0, 0], cfg, options=options)
    pb, b = make(DiLoCo, [2, 2, 2, 2], cfg, options=options)
    sa, sb = a.after_step(1, 0.0, ["b"]), b.after_step(1, 0.0, ["a"])
    deliver(a, sb, "b", 0.1)
    deliver(b, sa, "a", 0.1)
    assert not a.may_step(2, 0.1) and a.next_deadline() == pytest.approx(0.1)  # tick: next round
    (sa2,) = a.tick(0.1, ["b"])
    (sb2,) = b.tick(0.1, ["a"])
    assert sa2.msg.round == 1
    deliver(a, [sb2], "b", 0.2)
    deliver(b, [sa2], "a", 0.2)
    assert a.may_step(2, 0.2) and b.may_step(2, 0.2)
    np.testing.assert_allclose(pa.x, pb.x)


@pytest.mark.parametrize("lr", [1.0, 0.5])
def test_diloco_without_momentum_steps_by_lr_times_the_average_and_keeps_it_as_momentum(lr):
    # momentum 0 takes a shorter path (SparseLoCo's rule, the benchmark's best): the same step
    options = DiLoCoConfig(1, outer_lr=lr, outer_momentum=0.0)
    pa, a = make(DiLoCo, [1, 1, 1, 1], AveragingConfig(round_timeout_s=1.0), options=options)
    pb, b = make(DiLoCo, [1, 1, 1, 1], AveragingConfig(round_timeout_s=1.0), options=options)
    pa.x -= np.array([0.5, 0.5, 1.0, 0.0], dtype=np.float32)
    pb.x -= np.array([0.25, 0.75, 0.0, 0.0], dtype=np.float32)
    sa, sb = a.after_step(1, 0.0, ["b"]), b.after_step(1, 0.0, ["a"])
    deliver(a, sb, "b", 0.1)
    deliver(b, sa, "a", 0.1)
    assert a.may_step(2, 0.1) and b.may_step(2, 0.1)
    average = np.array([0.375, 0.625, 0.5, 0.0], dtype=np.float32)
    for port, alg in ((pa, a), (pb, b)):
        np.testing.assert_allclose(port.x, 1 - lr * average, rtol=1e-6)
        np.testing.assert_allclose(alg.state_dict()["momentum"], average, rtol=1e-6)
    a.state_dict()["momentum"][:] = 9  # the buffer is a copy of nobody else's array
    np.testing.assert_allclose(a.outer_parameters, 1 - lr * average, rtol=1e-6)


def test_diloco_alone_steps_with_its_own_pseudo_gradient():
    pa, a = make(DiLoCo, [1, 1, 1, 1], AveragingConfig(), options=DiLoCoConfig(1, outer_lr=1.0, outer_momentum=0.0))
    pa.x -= 0.5
    assert a.after_step(1, 0.0, []) == [] and a.may_step(2, 0.0)
    np.testing.assert_allclose(pa.x, 0.5)  # lr 1, no momentum: plain local SGD


# -- staleness -------------------------------------------------------------------------------
@pytest.mark.parametrize("mine, theirs, tau, factor", [
    (10, 10, 10.0, 1.0), (10, 30, 10.0, 1.0), (30, 10, 10.0, 1 / 3), (20, 10, 10.0, 0.5), (11, 10, 1.0, 0.5),
])
def test_staleness_weight(mine, theirs, tau, factor):
    assert staleness_weight(mine, theirs, tau) == pytest.approx(factor)


def test_staleness_aware_pairwise_moves_less_towards_an_older_model():
    cfg = AveragingConfig(staleness_aware=True, staleness_tau=10.0)
    pb, b = make(PairwiseGossip, [0, 0, 0, 0], cfg)
    pb.step = 30
    b.receive("a", AvgRequest(1, 10, KEY, vec(6, 6, 6, 6)), 0.0, [])
    np.testing.assert_allclose(pb.x, 1.0)  # 6 * 1/2 * 1/(1 + 20/10)
    pc, c = make(PairwiseGossip, [0, 0, 0, 0])  # off by default: plain 1/2
    pc.step = 30
    c.receive("a", AvgRequest(1, 10, KEY, vec(6, 6, 6, 6)), 0.0, [])
    np.testing.assert_allclose(pc.x, 3.0)


def test_staleness_aware_dpsgd_reduces_an_older_neighbours_weight():
    cfg = AveragingConfig(round_timeout_s=1.0, staleness_aware=True, staleness_tau=5.0)
    pa, a = make(Dpsgd, [0, 0, 0, 0], cfg)
    pa.step = 15
    a.after_step(15, 0.0, ["b"])
    a.receive("b", DpsgdParams(0, 10, 1, KEY, vec(6, 6, 6, 6)), 0.0, ["b"])
    assert a.may_step(16, 0.0)
    np.testing.assert_allclose(pa.x, 1.5)  # 6 * 1/2 * 1/(1 + 5/5)


# -- peer nonsense -----------------------------------------------------------------------------
GOOD = vec(1, 2, 3, 4)
BAD_SHAPE = np.zeros(5, dtype=np.float32)


def messages(name, params, key=KEY, round=0):
    return {
        "dpsgd": [DpsgdParams(round, 0, 1, key, params)],
        "adpsgd": [AvgRequest(1, 0, key, params)],
        "sgp": [PushSumShare(round, 0, 0.5, key, params)],
        "elastic": [ElasticRequest(1, 0, 0.3, key, params)],
        "gossipgrad": [GradientShare(round, 0, 1, key, params), GradientModelShare(round, 0, 1, key, GOOD, params)],
        "diloco": [OuterShare(round, 0, 1, key, params, GOOD, GOOD, GOOD), OuterShare(round, 0, 1, key, GOOD, params, GOOD, GOOD),
                   OuterShare(round, 0, 1, key, GOOD, GOOD, GOOD, params)],
    }[name]


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("params, key, reason", [
    (BAD_SHAPE, KEY, "bad_tensor"), (np.zeros(4, dtype=np.float64), KEY, "bad_tensor"),
    (GOOD, "other/4", "wrong_model"),
])
def test_incompatible_tensors_are_rejected_and_model_untouched(name, params, key, reason):
    port = ArrayPort([7, 7, 7, 7], KEY, immediate=True)
    avg = make_averager(name, CFG, port, random.Random(0), 0.0)
    for msg in messages(name, params if key == KEY else GOOD, key):
        with pytest.raises(RemoteProtocolError) as info:
            avg.receive("x", msg, 0.0, ["x"])
        assert info.value.reason == reason
    np.testing.assert_allclose(port.x, 7.0)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_foreign_messages_and_negative_rounds_are_rejected(name):
    port = ArrayPort([7, 7, 7, 7], KEY, immediate=True)
    avg = make_averager(name, CFG, port, random.Random(0), 0.0)
    foreign = DpsgdParams(0, 0, 1, KEY, GOOD) if name != "dpsgd" else PushSumShare(0, 0, 0.5, KEY, GOOD)
    with pytest.raises(RemoteProtocolError) as info:
        avg.receive("x", foreign, 0.0, [])
    assert info.value.reason == "unexpected"
    if name in ("dpsgd", "sgp", "gossipgrad", "diloco"):
        with pytest.raises(RemoteProtocolError):
            avg.receive("x", messages(name, GOOD, round=-1)[0], 0.0, [])
    np.testing.assert_allclose(port.x, 7.0)


@pytest.mark.parametrize("name", PLAIN)
def test_replies_and_rounds_nobody_asked_for_are_counted_not_raised(name):
    port = ArrayPort([7, 7, 7, 7], KEY, immediate=True)
    avg = make_averager(name, CFG, port, random.Random(0), 0.0)
    if name in ("adpsgd", "elastic"):
        reply = (AvgReply if name == "adpsgd" else ElasticReply)(99, 0, KEY, GOOD)
        assert avg.receive("x", reply, 0.0, []) == [] and avg.stats["late_replies"] == 1
    else:
        for r in (3, 5, 3):  # future rounds are buffered (a duplicate is counted), nothing mixed
            avg.receive("x", messages(name, GOOD, round=r)[0], 0.0, [])
    if name in ("dpsgd", "gossipgrad", "diloco"):
        assert avg.stats["duplicates"] == 1
    if name != "sgp":
        np.testing.assert_allclose(port.x, 7.0)


# -- the round engine --------------------------------------------------------------------------
def test_round_engine_buffer_is_bounded_and_keeps_the_newest_rounds():
    stats = {}
    e = NeighbourRounds(1.0, stats)
    one = (vec(1, 1, 1, 1),)
    for r in range(1, LEAD):
        e.offer("p", r, 1, 0, one)
    assert not e.behind and e.next_round() == 0  # a lag shorter than LEAD: not "behind"
    for r in range(LEAD, MAX_BUFFERED_ROUNDS + 3):
        e.offer("p", r, 1, 0, one)
    assert stats["overflow"] == 2 and e.buffered() == list(range(3, MAX_BUFFERED_ROUNDS + 3))
    assert not e.offer("q", 1, 1, 0, one)  # older than everything kept: dropped
    assert e.behind and e.next_round() == MAX_BUFFERED_ROUNDS + 2
    with pytest.raises(RemoteProtocolError):
        e.offer("p", 1, -1, 0, one)


def test_round_engine_partial_round_with_others_ahead_means_behind():
    stats = {}
    e = NeighbourRounds(1.0, stats)
    e.begin(0.0, ["a", "b"], (vec(0, 0, 0, 0),))
    e.offer("a", 0, 2, 0, (vec(3, 3, 3, 3),))
    e.offer("c", 2, 2, 0, (vec(3, 3, 3, 3),))  # two rounds ahead: legitimate on a rotating graph
    assert not e.ready(0.5)
    assert e.ready(1.0)  # timed out with b missing
    mixed = e.finish(0)
    assert (mixed.received, mixed.expected) == (1, 2) and e.behind and e.next_round() == 2


def test_the_trainers_hook_proxy_gates_exactly_what_each_algorithm_uses():
    from p2p.training.step_hooks import StepHooks

    for name in ALGORITHMS:
        avg = make_averager(name, CFG, ArrayPort(np.zeros(4), KEY), random.Random(0), 0.0)
        hooks = StepHooks(avg, gate_timeout_s=1.0)
        try:
            assert hooks.gates_steps == (name in ("dpsgd", "diloco"))
            assert hooks.wants_gradient == (name == "gossipgrad")
            assert hooks.posts_after_step == (name in ("dpsgd", "diloco", "sgp"))
        finally:
            hooks.close()


def test_round_engine_keeps_the_mix_convex_when_more_senders_than_neighbours_arrive():
    e = NeighbourRounds(1.0, {})
    e.begin(0.0, ["a"], (vec(0, 0, 0, 0),))  # one neighbour, degree 1: at most 1/2 from others
    for src in ("a", "b", "c"):
        e.offer(src, 0, 1, 0, (vec(6, 6, 6, 6),))
    mixed = e.finish(0)
    np.testing.assert_allclose(mixed.payload[0], 3.0)
    e.begin(1.0, [], (vec(0, 0, 0, 0),))  # alone: nothing arriving is mixed
    e.offer("a", 1, 1, 0, (vec(6, 6, 6, 6),))
    np.testing.assert_allclose(e.finish(0).payload[0], 0.0)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_steps_an_algorithm_says_it_ignores_never_gate_or_send(name):
    """``gate_wanted``/``after_step_wanted`` let the trainer skip the hooks (and the round trip
    between threads) on steps where they cannot matter: there, may_step is True and after_step
    sends nothing. Checked over several outer periods with a neighbour that answers."""
    port, avg = make(ALGORITHMS[name], [0, 0, 0, 0], options=DiLoCoConfig(inner_steps=3) if name == "diloco" else None)
    _, other = make(ALGORITHMS[name], [1, 1, 1, 1], seed=1,
                    options=DiLoCoConfig(inner_steps=3) if name == "diloco" else None)
    now, skipped = 0.0, 0
    for step in range(1, 13):
        now += 0.01
        if not avg.gate_wanted(step):
            assert avg.may_step(step, now), step
        port.step = step
        sends = avg.after_step(step, now, ["b"])
        if not avg.after_step_wanted(step):
            assert sends == [], step
            skipped += 1
        for s in sends:  # the neighbour answers the round, so the next gate opens
            deliver(other, [s], "a", now, ["a"])
            other_sends = other.after_step(step, now, ["a"]) if other.after_step_wanted(step) else []
            deliver(avg, other_sends, "b", now, ["b"])
    assert skipped == (8 if name == "diloco" else 0)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_estimates_how_far_its_partners_are(name):
    """``disagreement.value``: the relative distance to the partners' models, as exchanges show
    it (status()["consensus"]); None before any exchange."""
    options = DiLoCoConfig(inner_steps=1) if name == "diloco" else None
    pa, a = make(ALGORITHMS[name], [1, 1, 1, 1], options=options)
    pb, b = make(ALGORITHMS[name], [3, 3, 3, 3], seed=1, options=options)
    assert a.disagreement.value is None
    now = 0.0
    for step in range(1, 30):  # run both sides until each has mixed something
        now += 0.2
        pa.step = pb.step = step
        pa.grad = pb.grad = vec(0, 0, 0, 0)
        sa = (a.on_gradient(step, now, ["b"]) if a.wants_gradient else []) + a.after_step(step, now, ["b"]) + a.tick(now, ["b"])
        sb = (b.on_gradient(step, now, ["a"]) if b.wants_gradient else []) + b.after_step(step, now, ["a"]) + b.tick(now, ["a"])
        deliver(a, deliver(b, sa, "a", now, ["a"]), "b", now, ["b"])
        deliver(b, deliver(a, sb, "b", now, ["b"]), "a", now, ["a"])
        a.may_step(step + 1, now), b.may_step(step + 1, now)
        if a.disagreement.value is not None and b.disagreement.value is not None:
            break
    assert a.disagreement.value is not None and b.disagreement.value is not None, name
    assert 0 < a.disagreement.value < 5, (name, a.disagreement.value)  # 2 apart at norm 2..6: ~0.3..1


def test_diloco_skips_a_boundary_reached_while_its_last_round_is_in_flight():
    """A trainer released by the gate's safety net (or stepping after training_done) can reach
    the next boundary before the round ends: that boundary is skipped and counted, not an error
    that would stop the network thread; its steps go into the next boundary's Delta."""
    pa, a = make(DiLoCo, [1, 1, 1, 1], CFG, options=DiLoCoConfig(inner_steps=2))
    assert len(a.after_step(2, 0.0, ["b"])) == 1 and a.busy()  # round 0 waits for b
    pa.x -= 0.5
    assert a.after_step(4, 0.1, ["b"]) == [] and a.stats["boundaries_skipped"] == 1
    assert a.may_step(5, 1.5) and not a.busy()  # the round times out alone: its own Delta
    sent = a.after_step(6, 1.6, ["b"])
    np.testing.assert_allclose(sent[0].msg.delta, a.outer_parameters - pa.x)  # includes the skipped steps
