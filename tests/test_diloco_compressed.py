"""DiLoCo with a compressed pseudo-gradient and theta_start shared only every few rounds."""

import random

import numpy as np
import pytest

from p2p.averaging.base import AveragingConfig
from p2p.averaging.diloco import PARAMS_EVERY_COMPRESSED, DiLoCo, OuterShare, OuterShareQ
from p2p.averaging.registry import check_combination
from p2p.averaging.rounds import NeighbourRounds
from p2p.compression import decompress, make_compressor
from p2p.compression.messages import compressed_fields
from p2p.protocol import LocalProtocolError, RemoteProtocolError
from p2p.sim.avg_port import ArrayPort
from p2p.wire import decode, encode

N = 1000
KEY = f"m/{N}"


def make(values, **cfg):
    config = AveragingConfig(round_timeout_s=1.0, diloco_inner_steps=1, **cfg)
    port = ArrayPort(np.asarray(values, dtype=np.float32), KEY, immediate=True)
    return port, DiLoCo(config, port, random.Random(0), 0.0)


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


def test_theta_start_travels_only_every_few_rounds_when_compressed():
    rng = np.random.default_rng(1)
    peers = [make(np.zeros(N), compression="int8") for _ in range(2)]
    carried = []
    for k in range(PARAMS_EVERY_COMPRESSED + 1):
        inner_steps(peers, rng)
        sends = outer_round(peers, float(k))
        carried.append(sends["p0"][0].msg.params.size)
    assert carried == [N] + [0] * (PARAMS_EVERY_COMPRESSED - 1) + [N]
    sent = sends["p0"][0].msg
    assert len(sent.data) < N * 4 / 3  # int8 Delta: about a quarter of the float32 bytes


def test_uncompressed_sends_theta_start_every_round_by_default_and_honours_the_setting():
    _, a = make(np.ones(N))
    _, b = make(np.ones(N), diloco_params_every=2)
    for k in range(2):
        a.port.step = b.port.step = k + 1
        (sa,) = a.after_step(k + 1, float(k), ["x"])
        (sb,) = b.after_step(k + 1, float(k), ["x"])
        assert isinstance(sa.msg, OuterShare) and sa.msg.params.size == N
        assert sb.msg.params.size == (N if k % 2 == 0 else 0)
        a.tick(k + 5.0, ["x"]), b.tick(k + 5.0, ["x"])  # round timeout: alone, step on


def test_a_params_round_pulls_apart_outer_copies_back_together():
    # Peer 1 missed a round (its theta_start is off); the next params round repairs it.
    p0, a = make(np.zeros(N), compression="int8", diloco_params_every=1)
    p1, b = make(np.full(N, 4.0), compression="int8", diloco_params_every=1)
    outer_round([(p0, a), (p1, b)], 0.0)
    np.testing.assert_allclose(a.outer_parameters, b.outer_parameters)
    np.testing.assert_allclose(a.outer_parameters, 2.0, atol=1e-5)


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
    msg = OuterShareQ(**compressed_fields(packed), round=0, step=1, degree=1, model_key=KEY,
                      params=np.empty(0, np.float32))
    _, back = decode(encode(msg, "p0"))
    assert isinstance(back, OuterShareQ) and back.params.size == 0
    np.testing.assert_array_equal(decompress(back.payload(), N), decompress(packed, N))
    a.after_step(1, 0.0, ["p0"])
    a.receive("p0", back, 0.1, ["p0"])  # accepted
    short = make_compressor("int8").compress(np.zeros(N // 2, np.float32))
    with pytest.raises(RemoteProtocolError) as err:
        a.receive("p1", OuterShareQ(**compressed_fields(short), round=0, step=1, degree=1, model_key=KEY,
                                    params=np.empty(0, np.float32)), 0.1, ["p1"])
    assert err.value.reason == "bad_tensor"
    with pytest.raises(RemoteProtocolError) as err:
        a.receive("p1", OuterShareQ(**compressed_fields(packed), round=0, step=1, degree=1, model_key="other/1",
                                    params=np.empty(0, np.float32)), 0.1, ["p1"])
    assert err.value.reason == "wrong_model"
    with pytest.raises(RemoteProtocolError) as err:  # a theta_start of the wrong size
        a.receive("p1", OuterShare(0, 1, 1, KEY, np.zeros(3, np.float32), np.zeros(N, np.float32)), 0.1, ["p1"])
    assert err.value.reason == "bad_tensor"


def test_codecs_diloco_accepts_and_refuses():
    for codec in ("fp16", "bf16", "int8"):
        check_combination("diloco", "full", codec)
    for codec in ("topk", "sign", "auto"):
        with pytest.raises(ValueError, match="diloco does not support"):
            check_combination("diloco", "full", codec)
    with pytest.raises(LocalProtocolError):
        make(np.zeros(N), compression="topk")
    with pytest.raises(ValueError, match="diloco_params_every"):
        AveragingConfig(diloco_params_every=0)


def test_tag_is_pinned():
    from p2p.wire import registered_tags

    assert registered_tags()[66] == "OuterShareQ"
