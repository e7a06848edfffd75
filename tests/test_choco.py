"""CHOCO-gossip driven by hand with a logical clock: compressed gossip reaches consensus on the
initial mean (and naive compressed averaging does not); bootstrap, resync, churn, rejection."""

import random

import numpy as np

from p2p.sim.avg_port import ArrayPort as SimArrayPort
import pytest

from p2p.averaging.base import AveragingConfig
from p2p.averaging.choco import ChocoConfig, ChocoDelta, ChocoGossip, ChocoReset, ChocoResync
from p2p.averaging.diloco import DiLoCoConfig
from p2p.averaging.registry import make_averager
from p2p.topology.weights import metropolis_hastings_weight as metropolis_weight
from p2p.compression import decompress, make_compressor
from p2p.compression.messages import compressed_fields
from p2p.protocol import RemoteProtocolError
from p2p.wire import decode, encode, registered_tags


def ArrayPort(values, key="m"):
    """A ModelPort over a numpy vector whose deltas apply at once (as at a step boundary)."""
    return SimArrayPort(values, key, immediate=True)


def ring(n):
    names = [f"p{i}" for i in range(n)]
    return {names[i]: [names[(i - 1) % n], names[(i + 1) % n]] for i in range(n)}


def full(n):
    names = [f"p{i}" for i in range(n)]
    return {a: [b for b in names if b != a] for a in names}


class Swarm:
    """Peers on a fixed graph, ticked in lockstep rounds (time r), messages delivered between
    rounds through the real wire codec every ``wire_every`` rounds (else as objects)."""

    def __init__(self, graph, compressors, gamma, dim=128, seed=0, wire_every=50):
        self.graph = graph
        self.names = list(graph)
        rng = np.random.default_rng(seed)
        self.ports = {a: ArrayPort(rng.normal(size=dim) * 10) for a in self.names}
        self.initial_mean = self.x().mean(axis=0)
        # CHOCO's exact mean preservation from independent random models; robust mixing (which
        # gives it up when it clips) is tested in tests/test_robust.py.
        cfg = AveragingConfig(interval_s=1.0, exchange_timeout_s=2.0, robust_mixing=False)
        self.peers = {a: ChocoGossip(cfg, self.ports[a], random.Random(i), 0.0, ChocoConfig(gamma),
                                     compressor=compressors[i % len(compressors)])
                      for i, a in enumerate(self.names)}
        self.t = 0
        self.wire_every = wire_every

    def x(self):
        return np.array([self.ports[a].x for a in self.names], dtype=np.float64)

    def consensus_distance(self):
        x = self.x()
        return float(np.sqrt(((x - x.mean(axis=0)) ** 2).sum(axis=1).mean()))

    def mean_error(self):
        return float(np.abs(self.x().mean(axis=0) - self.initial_mean).max())

    def round(self, drop=lambda src, dst, msg: False):
        self.t += 1
        now = float(self.t)
        outbox = [(a, s) for a in self.names for s in self.peers[a].tick(now, self.graph[a])]
        replies = []
        for src, send in outbox:
            if drop(src, send.to, send.msg):
                continue
            msg = send.msg
            if self.t % self.wire_every == 0:
                _, msg = decode([bytes(f) for f in encode(msg, src)])
            replies += [(send.to, r) for r in self.peers[send.to].receive(src, msg, now + 0.5, self.graph[send.to])]
        for src, send in replies:  # ChocoResync: one more hop, same round
            assert self.peers[send.to].receive(src, send.msg, now + 0.6, self.graph[send.to]) == []
        return outbox

    def run(self, rounds, **kw):
        for _ in range(rounds):
            self.round(**kw)
        return self


def initial_distance(swarm):
    x = np.array([p.x for p in swarm.ports.values()])
    return float(np.sqrt(((x - swarm.initial_mean) ** 2).sum(axis=1).mean()))


# -- convergence --------------------------------------------------------------------------------

def converged(swarm):
    return swarm.consensus_distance() < 1e-2 and swarm.mean_error() < 1e-3  # from ~110: 4 orders


@pytest.mark.parametrize("graph, codec, params, rounds", [
    (ring(24), "int8", {"block": 32}, 420),
    (ring(16), "sign", {"block": 32}, 220),
], ids=["ring24-int8", "ring16-sign"])
def test_compressed_choco_reaches_consensus_on_the_initial_mean(graph, codec, params, rounds):
    swarm = Swarm(graph, [make_compressor(codec, **params)], 1.0)
    assert swarm.consensus_distance() > 50
    swarm.run(rounds)
    assert converged(swarm), (swarm.consensus_distance(), swarm.mean_error())
    stats = swarm.peers["p0"].stats
    assert stats["resets_sent"] == 0 and stats["gaps"] == 0  # all started together: no resets
    assert stats["bytes_sent"] == rounds * 2 * make_compressor(codec, **params).compress(swarm.ports["p0"].x).nbytes


def naive_gossip(graph, comp, gamma, rounds, dim=128, seed=0, subtract_own_compressed=False):
    """Compressed gossip without CHOCO's public copies: every peer sends D(Q(x_j)) and mixes
    x_i += γ Σ_j w_ij (D(Q(x_j)) − x_i)  (or − D(Q(x_i)) with subtract_own_compressed).
    Same start as Swarm(seed); returns (consensus distance, mean error)."""
    names = list(graph)
    index = {a: i for i, a in enumerate(names)}
    w = np.zeros((len(names), len(names)))
    for a in names:
        for b in graph[a]:
            w[index[a], index[b]] = metropolis_weight(len(graph[a]), len(graph[b]))
    rng = np.random.default_rng(seed)
    x = np.array([rng.normal(size=dim) * 10 for _ in names], dtype=np.float32)
    mean = x.mean(axis=0, dtype=np.float64)
    for _ in range(rounds):
        sent = np.array([decompress(comp.compress(row), dim) for row in x])
        own = sent if subtract_own_compressed else x
        x = (x + gamma * (w @ sent - w.sum(axis=1)[:, None] * own)).astype(np.float32)
    x = x.astype(np.float64)
    return (float(np.sqrt(((x - x.mean(axis=0)) ** 2).sum(axis=1).mean())),
            float(np.abs(x.mean(axis=0) - mean).max()))


@pytest.mark.parametrize("codec, params, gamma, rounds", [
    ("sign", {"block": 32}, 1.0, 220),
    ("topk", {"fraction": 0.1}, 0.2, 130),
], ids=["sign", "topk"])
def test_choco_converges_where_naive_compressed_gossip_does_not(codec, params, gamma, rounds):
    """Why CHOCO exists. On the same graph, start and budget, mixing decompressed Q(x) directly
    either agrees on the wrong value (the mean drifts by O(|x|)) or keeps the mean but stalls
    far from consensus; CHOCO's public copies reach the initial mean."""
    swarm = Swarm(full(12), [make_compressor(codec, **params)], gamma).run(rounds)
    assert converged(swarm), (swarm.consensus_distance(), swarm.mean_error())
    for subtract_own in (False, True):
        for naive_gamma in (gamma, 1.0):
            distance, mean_error = naive_gossip(full(12), make_compressor(codec, **params), naive_gamma, rounds,
                                                subtract_own_compressed=subtract_own)
            assert distance > 1.0 or mean_error > 1.0, (subtract_own, naive_gamma, distance, mean_error)


def test_uncompressed_choco_is_plain_gossip_and_exact():
    swarm = Swarm(full(8), [make_compressor("none")], 1.0).run(3)
    assert swarm.consensus_distance() < 1e-4  # Metropolis on the full graph: one round after x̂ = x


def test_peers_with_different_codecs_interoperate():
    comps = [make_compressor("int8", block=16), make_compressor("sign", block=16), make_compressor("fp16"),
             make_compressor("bf16")]
    swarm = Swarm(full(8), comps, 1.0).run(150)
    assert swarm.consensus_distance() < 1e-2 and swarm.mean_error() < 1e-3


def test_irregular_graph_keeps_the_mean_with_metropolis_weights():
    graph = {"hub": ["a", "b", "c", "d"], "a": ["hub", "b"], "b": ["hub", "a"], "c": ["hub"], "d": ["hub"]}
    swarm = Swarm(graph, [make_compressor("int8", block=16)], 1.0).run(200)
    assert swarm.consensus_distance() < 1e-2 and swarm.mean_error() < 1e-3


# -- bootstrap, loss, churn ---------------------------------------------------------------------

def test_late_joiner_gets_a_full_precision_reset_then_deltas():
    graph = full(4)
    late = {a: [b for b in n if b != "p3"] for a, n in graph.items() if a != "p3"}
    late["p3"] = []
    swarm = Swarm(late, [make_compressor("sign", block=16)], 1.0)
    swarm.run(20)
    swarm.graph = graph  # p3 joins everyone's neighbour list
    outbox = swarm.round()
    to_p3 = [s.msg for src, s in outbox if s.to == "p3"]
    assert len(to_p3) == 3 and all(isinstance(m, ChocoReset) for m in to_p3)
    from_p3 = [s.msg for src, s in outbox if src == "p3"]
    assert all(isinstance(m, ChocoDelta) and m.seq == 1 for m in from_p3)  # p3 is still at x̂ = 0
    for src in ["p0", "p1", "p2"]:  # p3's copies equal the senders' public copies
        np.testing.assert_array_equal(swarm.peers["p3"].public_copy(src), swarm.peers[src].public_copy())
    outbox = swarm.round()
    assert all(isinstance(s.msg, ChocoDelta) for _, s in outbox)
    swarm.run(300)
    assert swarm.consensus_distance() < 1e-2


def test_lost_delta_triggers_resync_and_recovery():
    swarm = Swarm(full(6), [make_compressor("int8", block=16)], 1.0).run(10)
    lost = []

    def drop_once(src, dst, msg):
        if src == "p1" and dst == "p2" and not lost:
            lost.append(msg)
            return True
        return False

    swarm.round(drop=drop_once)  # p2 misses p1's delta 11
    outbox = swarm.round()  # p2 sees 12 after 10: gap, drops its copy, asks p1 (same round)
    assert swarm.peers["p2"].stats["gaps"] == 1 and swarm.peers["p2"].stats["resyncs_sent"] == 1
    assert "p1" not in swarm.peers["p2"].copies() and swarm.peers["p1"].stats["resyncs_served"] == 1
    outbox = swarm.round()
    resets = [(src, s.to) for src, s in outbox if isinstance(s.msg, ChocoReset)]
    assert resets == [("p1", "p2")]
    np.testing.assert_array_equal(swarm.peers["p2"].public_copy("p1"), swarm.peers["p1"].public_copy())
    swarm.run(150)
    assert swarm.consensus_distance() < 1e-2 and swarm.mean_error() < 0.5  # the lost round cost a little mean


def test_resync_requests_are_rate_limited():
    port = ArrayPort(np.zeros(8))
    peer = ChocoGossip(AveragingConfig(interval_s=1.0, exchange_timeout_s=2.0), port, random.Random(0), 0.0,
                       compressor=make_compressor("fp16"))
    q = make_compressor("fp16").compress(np.ones(8, np.float32))
    delta = lambda seq: ChocoDelta(**compressed_fields(q), stream=5, seq=seq, degree=1, model_key="m")
    first = peer.receive("b", delta(7), 1.0, ["b"])
    assert len(first) == 1 and isinstance(first[0].msg, ChocoResync) and first[0].to == "b"
    assert peer.receive("b", delta(8), 1.5, ["b"]) == []  # asked already, within the window
    assert len(peer.receive("b", delta(9), 5.5, ["b"])) == 1
    np.testing.assert_array_equal(port.x, 0)


def test_leaving_neighbour_is_forgotten_and_restarted_peer_starts_a_new_stream():
    swarm = Swarm(full(3), [make_compressor("int8", block=16)], 1.0).run(5)
    swarm.graph = {"p0": ["p1"], "p1": ["p0"], "p2": []}
    swarm.round()
    assert set(swarm.peers["p0"].copies()) == {"p1"} and "p2" not in swarm.peers["p0"].synced()
    # p1 restarts: a new object, a new stream, seq 1 from x̂ = 0; p0 starts a fresh copy
    old = swarm.peers["p1"]
    swarm.peers["p1"] = ChocoGossip(AveragingConfig(interval_s=1.0, exchange_timeout_s=2.0), swarm.ports["p1"],
                                    random.Random(99), float(swarm.t), compressor=make_compressor("int8", block=16))
    assert swarm.peers["p1"].stream != old.stream
    swarm.round()
    assert swarm.peers["p0"].copies()["p1"] == (swarm.peers["p1"].stream, 1)
    np.testing.assert_array_equal(swarm.peers["p0"].public_copy("p1"), swarm.peers["p1"].public_copy())


def test_silent_neighbour_copy_expires():
    swarm = Swarm(full(3), [make_compressor("int8", block=16)], 1.0).run(3)
    swarm.run(6, drop=lambda src, dst, msg: src == "p2")  # p2 goes silent (still listed)
    assert "p2" not in swarm.peers["p0"].copies()


def test_duplicate_delta_is_ignored():
    swarm = Swarm(full(2), [make_compressor("int8", block=16)], 1.0)
    outbox = swarm.round()
    src, send = outbox[0]
    before = swarm.peers[send.to].public_copy(src)
    assert swarm.peers[send.to].receive(src, send.msg, 1.7, swarm.graph[send.to]) == []
    np.testing.assert_array_equal(swarm.peers[send.to].public_copy(src), before)
    assert swarm.peers[send.to].stats["stale"] == 1


def test_messages_from_non_neighbours_are_ignored():
    port = ArrayPort(np.zeros(8))
    peer = ChocoGossip(AveragingConfig(interval_s=1.0), port, random.Random(0), 0.0, compressor=make_compressor("none"))
    q = make_compressor("none").compress(np.ones(8, np.float32))
    assert peer.receive("x", ChocoDelta(**compressed_fields(q), stream=1, seq=1, degree=1, model_key="m"), 1.0, ["b"]) == []
    assert peer.receive("x", ChocoReset(1, 3, 1, "m", np.ones(8, np.float32)), 1.0, ["b"]) == []
    assert peer.stats["not_neighbour"] == 2 and not peer.copies()


@pytest.mark.parametrize("msg, reason", [
    (ChocoDelta(**compressed_fields(make_compressor("int8").compress(np.ones(9, np.float32))),
                stream=1, seq=1, degree=1, model_key="m"), "bad_tensor"),
    (ChocoDelta(**compressed_fields(make_compressor("int8").compress(np.ones(8, np.float32))),
                stream=1, seq=1, degree=1, model_key="other"), "wrong_model"),
    (ChocoReset(1, 1, 1, "m", np.ones(9, np.float32)), "bad_tensor"),
    (ChocoReset(1, 1, 1, "other", np.ones(8, np.float32)), "wrong_model"),
    (ChocoReset(1, 0, 1, "m", np.ones(8, np.float32)), "malformed"),
    (ChocoDelta(**compressed_fields(make_compressor("sign").compress(np.ones(8, np.float32))),
                stream=1, seq=1, degree=0, model_key="m"), "malformed"),
    ("not a message", "unexpected"),
])
def test_incompatible_messages_are_rejected_and_model_untouched(msg, reason):
    port = ArrayPort(np.full(8, 4.0))
    peer = ChocoGossip(AveragingConfig(interval_s=1.0), port, random.Random(0), 0.0, compressor=make_compressor("none"))
    with pytest.raises(RemoteProtocolError) as info:
        peer.receive("b", msg, 1.0, ["b"])
    assert info.value.reason == reason
    np.testing.assert_array_equal(port.x, 4.0)


def test_no_neighbours_no_round():
    port = ArrayPort(np.ones(8))
    peer = ChocoGossip(AveragingConfig(interval_s=1.0), port, random.Random(0), 0.0, compressor=make_compressor("sign"))
    assert peer.tick(5.0, []) == [] and peer.seq == 0
    assert peer.next_deadline() == pytest.approx(6.0) and not peer.busy()


def test_config_and_defaults():
    peer = ChocoGossip(AveragingConfig(), ArrayPort(np.ones(4)), random.Random(0), 0.0)
    assert peer.name == "choco" and peer.compressor.name == "none" and peer.gamma == 1.0
    assert peer.natural_topology in ("ring", "full")
    with pytest.raises(ValueError):
        ChocoConfig(gamma=0.0)
    with pytest.raises(ValueError):
        make_averager("choco", AveragingConfig(), ArrayPort(np.ones(4)), random.Random(0), 0.0, options=DiLoCoConfig())


def test_tags_are_pinned_and_messages_round_trip():
    tags = registered_tags()
    assert (tags[61], tags[62], tags[63]) == ("ChocoDelta", "ChocoReset", "ChocoResync")
    q = make_compressor("topk", fraction=0.25).compress(np.arange(8, dtype=np.float32))
    for msg in [ChocoDelta(**compressed_fields(q), stream=2**61, seq=3, degree=2, model_key="m"),
                ChocoReset(2**61, 3, 2, "m", np.arange(8, dtype=np.float32)), ChocoResync(-1)]:
        _, back = decode([bytes(f) for f in encode(msg, "a:1")])
        assert type(back) is type(msg)
        assert back.seq == msg.seq if hasattr(msg, "seq") else back.have_seq == -1


def test_codec_and_gamma_come_from_the_config():
    from types import SimpleNamespace

    cfg = SimpleNamespace(interval_s=1.0, max_interval_s=30.0, exchange_timeout_s=2.0, compression="topk", compression_topk_fraction=0.05,
                          robust_mixing=True)
    peer = ChocoGossip(cfg, ArrayPort(np.ones(4)), random.Random(0), 0.0)
    assert peer.compressor.name == "topk" and peer.compressor.fraction == 0.05
    assert peer.gamma == pytest.approx(0.1)  # suggested_gamma: twice the kept fraction
    assert ChocoGossip(cfg, ArrayPort(np.ones(4)), random.Random(0), 0.0, ChocoConfig(0.3)).gamma == 0.3


def sgd_swarm(codec, params, rounds=200, lr=0.05):
    """Peers take a gradient step on f_i(x) = |x - b_i|^2 / 2 before every gossip round."""
    swarm = Swarm(full(8), [make_compressor(codec, **params)], 1.0, dim=64)
    rng = np.random.default_rng(5)
    targets = {a: rng.normal(size=64).astype(np.float32) * 5 for a in swarm.names}
    for _ in range(rounds):
        for a in swarm.names:
            swarm.ports[a].add_delta(-lr * (swarm.ports[a].x - targets[a]))
        swarm.round()
    return swarm, np.mean(list(targets.values()), axis=0)


def test_choco_sgd_with_one_bit_messages_matches_exact_gossip():
    """CHOCO-SGD (Alg. 2): local gradient steps between rounds. The swarm mean reaches
    argmin sum_i f_i = mean(b), and the remaining O(lr) disagreement between peers is the one
    exact (uncompressed) gossip leaves, although every message carries 1 bit per entry."""
    exact, optimum = sgd_swarm("none", {})
    signed, _ = sgd_swarm("sign", {"block": 16})
    assert np.abs(signed.x().mean(axis=0) - optimum).max() < 1e-2  # from ~10
    assert signed.consensus_distance() == pytest.approx(exact.consensus_distance(), rel=0.01)
    np.testing.assert_allclose(signed.x(), exact.x(), atol=1e-2)
