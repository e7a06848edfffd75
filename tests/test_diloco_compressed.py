"""DiLoCo with a compressed pseudo-gradient; theta_start stays home while the copies agree."""

import random

import numpy as np
import pytest

from p2p.averaging.base import AveragingConfig
from p2p.averaging.diloco import DiLoCo, DiLoCoConfig, OuterDone, OuterShare, OuterShareQ
from p2p.averaging.outer_copies import SKETCH_SIZE, sketch_positions, sketches_differ
from p2p.averaging.registry import check_combination
from p2p.averaging.rounds import NeighbourRounds
from p2p.cli.status_view import dense_line, warm_line
from p2p.compression import decompress, make_compressor
from p2p.compression.messages import compressed_fields
from p2p.ops.metrics import SwarmCollector
from p2p.protocol import LocalProtocolError, RemoteProtocolError
from p2p.sim.avg_port import ArrayPort
from p2p.wire import decode, encode

N = 1000
KEY = f"m/{N}"
EMPTY = np.empty(0, np.float32)


def make(values, options=DiLoCoConfig(inner_steps=1), **cfg):
    # The sketch/repair protocol between toy copies far apart (a copy at 4 among copies at ~0):
    # robust mixing would refuse the lone far copy (tests/test_robust.py), so it is off here.
    config = AveragingConfig(round_timeout_s=1.0, robust_mixing=False, **cfg)
    port = ArrayPort(np.asarray(values, dtype=np.float32), KEY, immediate=True)
    return port, DiLoCo(config, port, random.Random(0), 0.0, options)


def outer_round(peers, now):
    """One outer step of every peer on a full graph: each steps, sends, receives all."""
    names = [f"p{i}" for i in range(len(peers))]
    sends = {}
    for name, (_, alg) in zip(names, peers):
        sends[name] = alg.after_step(alg_step(alg), now, [n for n in names if n != name])
    for name, (_, alg) in zip(names, peers):
        for src, out in sends.items():
            for s in out:
                if s.to == name:
                    alg.receive(src, s.msg, now + 0.01, [n for n in names if n != name])
    for _, alg in peers:
        assert alg.may_step(alg_step(alg) + 1, now + 0.01)
    return sends


def alg_step(alg):
    return alg.port.step


def inner_steps(peers, rng):
    for port, _ in peers:
        port.x -= rng.standard_normal(N).astype(np.float32) * 0.1
        port.step += 1


def test_int8_outer_steps_agree_exactly_and_track_the_uncompressed_average():
    rng = np.random.default_rng(0)
    start = rng.standard_normal(N).astype(np.float32)
    peers = [make(start, compression="int8") for _ in range(4)]
    exact = [make(start) for _ in range(4)]
    for k in range(3):
        drift = np.random.default_rng(k)
        inner_steps(peers, drift)
        inner_steps(exact, np.random.default_rng(k))
        sends = outer_round(peers, float(k))
        outer_round(exact, float(k))
        assert all(isinstance(s.msg, OuterShareQ) for out in sends.values() for s in out)
    # Every peer mixed the same decoded pseudo-gradients: the same models up to float rounding
    # (each sums in its own order), not apart by the int8 error.
    for port, _ in peers[1:]:
        np.testing.assert_allclose(port.x, peers[0][0].x, rtol=0, atol=1e-5)
    # ... and close to the uncompressed run (int8 error is ~1/254 of a block's largest entry).
    assert np.abs(peers[0][0].x - exact[0][0].x).max() < 0.02


def params_carried(sends):
    """{(sender, receiver): theta_start entries carried} for one outer round's sends."""
    return {(src, x.to): x.msg.params.size for src, out in sends.items() for x in out}


@pytest.mark.parametrize("codec", ["none", "int8", "int4", "sparseloco"])
def test_theta_start_stays_home_while_the_copies_agree(codec):
    rng = np.random.default_rng(1)
    peers = [make(np.zeros(N), compression=codec) for _ in range(3)]
    for k in range(6):
        inner_steps(peers, rng)
        sends = outer_round(peers, float(k))
        assert set(params_carried(sends).values()) == {0}
        assert all(s.msg.sketch.size == SKETCH_SIZE for out in sends.values() for s in out)
    assert all(alg.stats["params_sent"] == alg.stats["copies_apart"] == 0 for _, alg in peers)
    sent = sends["p0"][0].msg
    if codec == "int4":
        assert len(sent.data) < N * 4 / 7  # int4 Delta: about an eighth of the float32 bytes
    if codec == "sparseloco":  # one chunk of 1000: ceil(82 * 1000 / 4096) = 21 entries, 2 levels; on the
        # wire (sparse_wire.py) a 21 + 1000 / 2^5 bit bitmap, 5 planes of low bits and 2 of values
        assert sent.data.nbytes + sent.aux.nbytes == -(-(21 + 32) // 8) + (5 + 2) * -(-21 // 8) + 8
    for port, alg in peers[1:]:  # the same decoded pseudo-gradients: the same copies
        np.testing.assert_allclose(alg.outer_parameters, peers[0][1].outer_parameters, rtol=0, atol=1e-6)


def drift_rounds(peers, drifts, rounds):
    """Outer rounds in which peer i's inner steps move it by drifts[i] (whatever its model);
    each round's sends (outer_round's)."""
    sent = []
    for k in range(rounds):
        for (port, _), d in zip(peers, drifts):
            port.x -= d
            port.step += 1
        sent.append(outer_round(peers, float(k)))
    return sent


@pytest.mark.parametrize("overlap", [False, True])
def test_sparseloco_error_feedback_sends_every_deltas_mass_but_its_residual(overlap):
    """SparseLoCo's Alg. 1 with lr 1, no momentum: the outer parameters move by the sum of the
    averaged decoded Deltas, which error feedback makes the sum of the averaged Deltas minus
    the peers' residuals (tests/test_compression.py: the codec alone sends ~2% of them). With
    overlap the model swaps the Delta it shipped, in full precision, for the swarm's."""
    rng = np.random.default_rng(7)
    drifts = [rng.standard_normal(N).astype(np.float32) * 0.01 + 0.01 for _ in range(3)]
    options = DiLoCoConfig(inner_steps=1, outer_lr=1.0, outer_momentum=0.0, overlap=overlap)
    peers = [make(np.zeros(N), options, compression="sparseloco", compression_topk_fraction=0.1)
             for _ in range(3)]
    rounds = 40
    drift_rounds(peers, drifts, rounds)
    meant = -rounds * np.mean(drifts, axis=0)  # where the uncompressed run would be
    residual = np.mean([alg.state_dict()["residual"] for _, alg in peers], axis=0)
    for port, alg in peers:
        np.testing.assert_allclose(alg.outer_parameters, meant + residual, rtol=0, atol=1e-4)
        np.testing.assert_allclose(port.x, alg.outer_parameters, rtol=0, atol=1e-6)
    gap = np.linalg.norm(peers[0][1].outer_parameters - meant) / np.linalg.norm(meant)
    assert gap < 0.2  # the residual is a few rounds' worth, not forty
    drift_rounds(peers, drifts, rounds)  # ... and it does not grow
    assert np.linalg.norm(np.mean([alg.state_dict()["residual"] for _, alg in peers], axis=0)) \
        < 1.5 * np.linalg.norm(residual)


def test_sparseloco_sends_its_first_rounds_as_dense_int4_and_a_peer_counting_otherwise_still_agrees():
    """Dense first rounds (diloco.py): with dense_rounds 4 the swarm's rounds 0-3 carry int4 and
    round 4 on sparseloco; a peer set to 0 (the default: sparseloco from the first) mixes with
    them and the copies stay one, error feedback covering both kinds."""
    rng = np.random.default_rng(3)
    drifts = [rng.standard_normal(N).astype(np.float32) * 0.01 for _ in range(3)]
    peers = [make(np.zeros(N), DiLoCoConfig(inner_steps=1, dense_rounds=4), compression="sparseloco") for _ in range(2)]
    peers.append(make(np.zeros(N), DiLoCoConfig(inner_steps=1), compression="sparseloco"))
    # per round: the codec of each peer's shares
    codecs = [[{s.msg.codec for s in sends[f"p{i}"]} for i in range(3)] for sends in drift_rounds(peers, drifts, 6)]
    assert codecs[:4] == [[{"int4"}, {"int4"}, {"sparseloco"}]] * 4
    assert codecs[4:] == [[{"sparseloco"}] * 3] * 2
    for _, alg in peers[1:]:  # one copy, up to the rounding of sums taken in another order
        np.testing.assert_allclose(alg.outer_parameters, peers[0][1].outer_parameters, rtol=0, atol=1e-6)
        assert alg.stats["copies_apart"] == 0
    # int4 keeps every entry: after its rounds the outer parameters moved on all of them, where
    # sparseloco's 2% would have left most at zero
    moved = {}
    for dense in (4, 0):
        pair = [make(np.zeros(N), DiLoCoConfig(inner_steps=1, dense_rounds=dense), compression="sparseloco")
                for _ in range(2)]
        drift_rounds(pair, drifts[:2], 1)
        moved[dense] = np.count_nonzero(pair[0][1].outer_parameters)
    assert moved[4] > 0.9 * N and moved[0] < 0.1 * N, moved


def test_the_warm_up_s_rounds_keep_their_own_density_and_later_rounds_the_codec_s():
    """warmup_topk_fraction (diloco.py, "Warm-up"): the rounds whose boundary falls in the
    warm-up keep 10% of each chunk, the later ones sparseloco's 2%; a peer without it sends 2%
    throughout, and the copies stay one (each share decodes by the k it carries)."""
    rng = np.random.default_rng(4)
    drifts = [rng.standard_normal(N).astype(np.float32) * 0.01 for _ in range(3)]
    warm = DiLoCoConfig(inner_steps=1, warmup_steps=3, warmup_inner_steps=1, warmup_topk_fraction=0.1)
    peers = [make(np.zeros(N), warm, compression="sparseloco", compression_block=500) for _ in range(2)]
    peers.append(make(np.zeros(N), DiLoCoConfig(inner_steps=1), compression="sparseloco", compression_block=500))
    # per round: the k of each peer's shares
    kept = [[{s.msg.meta[1] for s in sends[f"p{i}"]} for i in range(3)] for sends in drift_rounds(peers, drifts, 5)]
    assert kept[:3] == [[{50}, {50}, {10}]] * 3  # steps 1-3: the warm-up's, ceil(0.1 * 500)
    assert kept[3:] == [[{10}] * 3] * 2
    for _, alg in peers[1:]:
        np.testing.assert_allclose(alg.outer_parameters, peers[0][1].outer_parameters, rtol=0, atol=1e-6)
        assert alg.stats["copies_apart"] == 0
    with pytest.raises(LocalProtocolError, match="warmup_topk_fraction is sparseloco's density"):
        make(np.zeros(N), warm, compression="int4")


def test_a_warm_up_density_is_refused_without_a_warm_up_or_outside_0_1():
    with pytest.raises(ValueError, match="warmup_topk_fraction needs warmup_steps"):
        DiLoCoConfig(warmup_topk_fraction=0.1)
    for bad in (0, 1.5, True, "0.1"):
        with pytest.raises(ValueError, match="warmup_topk_fraction must be a number in"):
            DiLoCoConfig(warmup_steps=10, warmup_topk_fraction=bad)


def timed_rounds(waits, step_s=0.5, options=DiLoCoConfig(inner_steps=2, dense_rounds=4),
                 label=lambda msg: msg.codec):
    """Two sparseloco peers (H 2 by default) as the trainer drives them: every inner step takes
    ``step_s``, the gates come where the algorithm wants them, and at each boundary the trainer
    waits at the gate until every share is in, ``waits[r]`` after round r began. What each
    round carried (``label`` of every share: its codec)."""
    rng = np.random.default_rng(5)
    peers = [make(np.zeros(N), options, compression="sparseloco", compression_block=500) for _ in range(2)]
    names, now, codecs, k = ["p0", "p1"], 0.0, [], 0
    while len(codecs) < len(waits):
        k, now = k + 1, now + step_s
        sends = {}
        for name, (port, alg) in zip(names, peers):
            port.x -= rng.standard_normal(N).astype(np.float32) * 0.01
            port.step = k
            sends[name] = alg.after_step(k, now, [n for n in names if n != name]) if alg.after_step_wanted(k) else []
            if alg.gate_wanted(k + 1):
                assert alg.may_step(k + 1, now) == (not sends[name])  # the trainer waits after a boundary
        if not any(sends.values()):
            continue
        codecs.append({label(s.msg) for out in sends.values() for s in out})
        now += waits[len(codecs) - 1]
        for name, (port, alg) in zip(names, peers):
            for src, out in sends.items():
                for s in out:
                    if s.to == name:
                        alg.receive(src, s.msg, now, [n for n in names if n != name])
            assert alg.may_step(k + 1, now)
    return codecs, peers


def overlapped_rounds(lengths, step_s=0.5):
    """As timed_rounds, with overlap: round r's shares arrive ``lengths[r]`` after it began,
    while the trainer takes the next period's steps; it waits only at the gate before the step
    that closes that period, if the round is still out."""
    rng = np.random.default_rng(6)
    options = DiLoCoConfig(inner_steps=2, dense_rounds=4, overlap=True)
    peers = [make(np.zeros(N), options, compression="sparseloco") for _ in range(2)]
    names, now, codecs, k, out = ["p0", "p1"], 0.0, [], 0, []

    def deliver():
        nonlocal now
        now, sends = out.pop(0)
        for name, (_, alg) in zip(names, peers):
            for src, sent in sends.items():
                for s in sent:
                    if s.to == name:
                        alg.receive(src, s.msg, now, [n for n in names if n != name])

    while len(codecs) < len(lengths) or out:
        k, now = k + 1, now + step_s
        while out and out[0][0] <= now:
            deliver()
        sends = {}
        for name, (port, alg) in zip(names, peers):
            port.x -= rng.standard_normal(N).astype(np.float32) * 0.01
            port.step = k
            sends[name] = alg.after_step(k, now, [n for n in names if n != name]) if alg.after_step_wanted(k) else []
        if any(sends.values()):
            codecs.append({s.msg.codec for sent in sends.values() for s in sent})
            out.append((now + lengths[len(codecs) - 1], sends))
        # every trainer at its gate (from now), waiting until the round's shares are in
        while not all([alg.may_step(k + 1, now) for _, alg in peers if alg.gate_wanted(k + 1)]):
            deliver()
    return codecs, peers


def test_with_overlap_dense_rounds_stop_on_the_trainer_s_wait_not_the_round_s_length():
    # rounds of 1.2 s, longer than the period's 1 s of compute, but beside the next period:
    # the trainer waits 0.7 s at its gate (one 0.5 s step went on beside the round), so every
    # dense round goes out
    codecs, peers = overlapped_rounds([1.2] * 6)
    assert codecs == [{"int4"}] * 4 + [{"sparseloco"}] * 2
    assert all(alg.stats["dense_rounds"] == 4 for _, alg in peers)
    # a round of 2 s: the trainer waits 1.5 s, more than the period's compute: no more dense
    codecs, _ = overlapped_rounds([1.2, 2.0, 1.2, 1.2])
    assert codecs == [{"int4"}] * 2 + [{"sparseloco"}] * 2


def test_the_dense_rounds_sent_show_in_status_and_in_the_metrics():
    _, peers = overlapped_rounds([1.2, 2.0, 1.2, 1.2])  # two sent, then the link did not carry them
    info = {"step": 8, "averaging": dict(peers[0][1].stats)}
    assert dense_line(info).startswith("diloco dense first rounds: 2 sent as int4")
    assert dense_line({"averaging": {"dense_rounds": 0}}) == "" and dense_line({}) == ""
    sent = [s.value for m in SwarmCollector(lambda: info).collect() if m.name == "p2p_diloco_dense_rounds"
            for s in m.samples]
    assert sent == [2]


def test_dense_rounds_stop_once_one_takes_longer_than_the_compute_it_saves():
    # a link that carries them: every dense round (4), then sparseloco
    codecs, peers = timed_rounds([0.3] * 6)
    assert codecs == [{"int4"}] * 4 + [{"sparseloco"}] * 2
    assert all(alg.stats["dense_rounds"] == 4 for _, alg in peers)
    # the first took 1.5 s against 1 s of compute: sparseloco from the next
    codecs, peers = timed_rounds([1.5, 0.3, 0.3])
    assert codecs == [{"int4"}, {"sparseloco"}, {"sparseloco"}]
    assert all(alg.stats["dense_rounds"] == 1 for _, alg in peers)
    # a later one: measured against H x the seconds per inner step, the gate's wait left out
    codecs, _ = timed_rounds([0.3, 0.3, 1.5, 0.3])
    assert codecs == [{"int4"}] * 3 + [{"sparseloco"}]


def warm_rounds(waits):
    """timed_rounds with a warm-up: H 2 for 20 steps at 10% (k 50 of 500), then H 4 at 2% (10):
    the k each round's shares kept. A period's compute is 1 s in the warm-up."""
    options = DiLoCoConfig(inner_steps=4, warmup_steps=20, warmup_inner_steps=2, warmup_topk_fraction=0.1)
    return timed_rounds(waits, options=options, label=lambda msg: msg.meta[1])


@pytest.mark.parametrize("waits", [[0.3] * 12,  # 0.3 of the period's compute
                                   [0.2, 0.2, 1.5] + [0.2] * 9,  # one slow round is not a slow link
                                   [0.2, 0.2, 1.5, 0.2, 0.2, 1.5] + [0.2] * 6])  # nor are two (their mean is 0.63)
def test_the_warm_up_s_denser_rounds_go_on_while_the_trainer_s_median_wait_is_within_half_the_compute(waits):
    kept, peers = warm_rounds(waits)
    assert kept == [{50}] * 10 + [{10}] * 2  # the warm-up's boundaries 2, 4, ..., 20, then H 4's
    assert all(alg.stats["warmup_dense_rounds"] == 10 and not alg.stats["warmup_dense_stopped"]
               for _, alg in peers)
    assert all(alg.stats["warmup_wait_pct"] == round(100 * waits[1]) for _, alg in peers)


def test_the_warm_up_s_denser_rounds_stop_once_the_median_wait_passes_half_the_compute():
    # 0.6 s of 1 s: the first round is not judged (no period measured yet), rounds 2-7 are, and
    # from round 8 the warm-up goes on at the codec's 2%, for good (a faster link later does
    # not bring 10% back)
    kept, peers = warm_rounds([0.6] * 7 + [0.1] * 5)
    assert kept == [{50}] * 7 + [{10}] * 5
    assert all(alg.stats["warmup_dense_rounds"] == 7 and alg.stats["warmup_dense_stopped"] for _, alg in peers)
    # a link that slows down later: the median passes half at round 8 (three waits of 0.3, four of 0.7)
    kept, _ = warm_rounds([0.3] * 4 + [0.7] * 8)
    assert kept == [{50}] * 8 + [{10}] * 4
    info = {"step": 14, "averaging": dict(peers[0][1].stats)}
    assert warm_line(info) == ("diloco warm-up rounds: 7 sent at --diloco-warmup-topk-fraction's density, the "
                               "trainer's wait for them 60% of the period's compute (median); stopped: over 50%, "
                               "the link does not carry them")
    assert warm_line({"averaging": {"warmup_dense_rounds": 0}}) == "" and warm_line({}) == ""
    sent = [s.value for m in SwarmCollector(lambda: info).collect() if m.name == "p2p_diloco_warmup_dense_rounds"
            for s in m.samples]
    assert sent == [7]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4", None])
def test_dense_rounds_must_be_a_count(bad):
    with pytest.raises(ValueError, match="dense_rounds"):
        DiLoCoConfig(dense_rounds=bad)


def test_sparseloco_residual_is_checkpointed_but_never_taken_from_a_donor():
    options = DiLoCoConfig(inner_steps=1)
    peers = [make(np.zeros(N), options, compression="sparseloco") for _ in range(2)]
    drift_rounds(peers, [np.full(N, 0.01, np.float32), np.linspace(0, 0.02, N, dtype=np.float32)], 3)
    state = peers[0][1].state_dict()
    assert np.abs(state["residual"]).max() > 0
    port, restored = make(peers[0][0].x, options, compression="sparseloco")
    restored.load_state_dict(state, "checkpoint")
    np.testing.assert_array_equal(restored.state_dict()["residual"], state["residual"])
    _, joiner = make(peers[0][1].outer_parameters, options, compression="sparseloco")
    joiner.load_state_dict(state, "peer")
    assert not joiner.state_dict()["residual"].any()
    assert "residual" not in peers[0][1].state_for_joiner()[0]
    old = {k: v for k, v in state.items() if k != "residual"}  # written by a run without feedback
    restored.load_state_dict(old, "checkpoint")
    assert not restored.state_dict()["residual"].any()
    with pytest.raises(ValueError, match="residual"):
        restored.load_state_dict({**state, "residual": np.full(N, np.nan, np.float32)}, "checkpoint")
    _, dense = make(np.zeros(N), options, compression="int4")
    assert "residual" not in dense.state_dict()


# Copies apart are repaired by a pull from one donor: tests/test_diloco_repair.py.


def test_sketches_ignore_float_rounding_but_not_a_missed_pseudo_gradient():
    x = np.random.default_rng(4).standard_normal(100_000).astype(np.float32)
    pos = sketch_positions(x.size)
    assert pos.size == SKETCH_SIZE and pos[0] == 0 and pos[-1] == x.size - 1
    rounded = x * np.float32(1 + 3e-7)  # a few ulps: another summation order
    assert not sketches_differ(x[pos], rounded[pos])
    assert sketches_differ(x[pos], (x + 1e-2 * np.sign(x))[pos])
    assert sketch_positions(3).tolist() == [0, 1, 2] and sketch_positions(0).size == 0


def test_a_left_out_vector_is_mixed_as_equal_to_ours():
    rounds = NeighbourRounds(1.0, {})
    own = (np.full(4, 1.0, np.float32), np.full(4, 1.0, np.float32))
    rounds.begin(0.0, ["x"], own)
    rounds.offer("x", 0, 1, 0, (None, np.full(4, 3.0, np.float32)))
    mixed = rounds.finish(0)
    np.testing.assert_allclose(mixed.payload[0], 1.0)  # nothing moved
    np.testing.assert_allclose(mixed.payload[1], 2.0)  # weight 1/2 towards 3


def test_compressed_shares_round_trip_the_wire_and_bad_ones_are_rejected():
    _, a = make(np.zeros(N), compression="int8")
    packed = make_compressor("int8").compress(np.linspace(-1, 1, N, dtype=np.float32))
    sketch = np.zeros(SKETCH_SIZE, np.float32)
    msg = OuterShareQ(**compressed_fields(packed), round=0, step=1, degree=1, model_key=KEY,
                      params=np.empty(0, np.float32), sketch=sketch, momentum=EMPTY)
    _, back = decode(encode(msg, "p0"))
    assert isinstance(back, OuterShareQ) and back.params.size == 0
    np.testing.assert_array_equal(decompress(back.payload(), N), decompress(packed, N))
    a.after_step(1, 0.0, ["p0"])
    a.receive("p0", back, 0.1, ["p0"])  # accepted
    short = make_compressor("int8").compress(np.zeros(N // 2, np.float32))
    with pytest.raises(RemoteProtocolError) as err:
        a.receive("p1", OuterShareQ(**compressed_fields(short), round=0, step=1, degree=1, model_key=KEY,
                                    params=np.empty(0, np.float32), sketch=sketch, momentum=EMPTY), 0.1, ["p1"])
    assert err.value.reason == "bad_tensor"
    with pytest.raises(RemoteProtocolError) as err:
        a.receive("p1", OuterShareQ(**compressed_fields(packed), round=0, step=1, degree=1, model_key="other/1",
                                    params=np.empty(0, np.float32), sketch=sketch, momentum=EMPTY), 0.1, ["p1"])
    assert err.value.reason == "wrong_model"
    with pytest.raises(RemoteProtocolError) as err:  # a theta_start of the wrong size
        a.receive("p1", OuterShare(0, 1, 1, KEY, np.zeros(3, np.float32), np.zeros(N, np.float32), sketch, np.zeros(3, np.float32)), 0.1, ["p1"])
    assert err.value.reason == "bad_tensor"
    with pytest.raises(RemoteProtocolError) as err:  # theta_start without its momentum
        a.receive("p1", OuterShareQ(**compressed_fields(packed), round=0, step=1, degree=1, model_key=KEY,
                                    params=np.zeros(N, np.float32), sketch=sketch, momentum=EMPTY), 0.1, ["p1"])
    assert err.value.reason == "bad_tensor"
    for bad in (np.zeros(SKETCH_SIZE - 1, np.float32), np.zeros(SKETCH_SIZE, np.float64)):
        with pytest.raises(RemoteProtocolError) as err:  # a sketch of the wrong size or dtype
            a.receive("p1", OuterShareQ(**compressed_fields(packed), round=0, step=1, degree=1, model_key=KEY,
                                        params=np.empty(0, np.float32), sketch=bad, momentum=EMPTY), 0.1, ["p1"])
        assert err.value.reason == "bad_tensor"


def test_codecs_diloco_accepts_and_refuses():
    for codec in ("fp16", "bf16", "int8", "int4", "sparseloco"):
        check_combination("diloco", "full", codec)
    for codec in ("topk", "sign", "auto"):
        with pytest.raises(ValueError, match="diloco does not support"):
            check_combination("diloco", "full", codec)
    with pytest.raises(LocalProtocolError):
        make(np.zeros(N), compression="topk")
    with pytest.raises(LocalProtocolError, match="one gossip round"):  # feedback covers our own Delta only
        make(np.zeros(N), DiLoCoConfig(gossip_rounds=2), compression="sparseloco")


def test_tag_is_pinned():
    from p2p.wire import registered_tags

    assert registered_tags()[66] == "OuterShareQ"
    assert registered_tags()[67] == "OuterSlice" and registered_tags()[68] == "OuterGather"
    assert registered_tags()[69] == "CatchUpShare"


def test_a_finished_sparseloco_peer_serves_exact_zero_deltas_and_keeps_its_residual():
    options = DiLoCoConfig(inner_steps=1)
    peers = [make(np.zeros(N), options, compression="sparseloco") for _ in range(2)]
    drift_rounds(peers, [np.linspace(0, 0.02, N, dtype=np.float32)] * 2, 2)
    (port0, done), (port1, alg) = peers
    residual = done.state_dict()["residual"]
    done.training_done(port0.step, 5.0)
    port1.x -= 0.01
    port1.step += 1
    for s in alg.after_step(port1.step, 5.0, ["p0"]):
        done.receive("p1", decode(encode(s.msg, "p1"))[1], 5.0, ["p1"])
    served = done.tick(5.0, ["p1"])
    # the served share, then (the round complete, its outer step taken) the final sketch again
    assert [type(s.msg) for s in served] == [OuterShareQ, OuterDone] and done.stats["rounds_served"] == 1
    assert not decompress(served[0].msg.payload(), N).any()
    np.testing.assert_array_equal(done.state_dict()["residual"], residual)
