"""AD-PSGD pairwise gossip as a pure state machine, driven by hand with explicit time."""

import random

import numpy as np

from p2p.sim.avg_port import ArrayPort as SimArrayPort
import pytest

from p2p.averaging.adpsgd import AvgReply, AvgRequest, PairwiseGossip
from p2p.averaging.base import AveragingConfig
from p2p.protocol import RemoteProtocolError


def ArrayPort(values, key="m/4"):
    """A ModelPort over a numpy vector whose deltas apply at once (as at a step boundary)."""
    return SimArrayPort(values, key, immediate=True)


# Exact mixing arithmetic and mean preservation between toy vectors far apart: robust mixing
# (which clips far vectors and then gives up exact zero-sum exchanges) is tested in tests/test_robust.py.
CFG = AveragingConfig(interval_s=0.1, exchange_timeout_s=1.0, robust_mixing=False)


def make(values, seed=0, key="m/4"):
    port = ArrayPort(values, key)
    return port, PairwiseGossip(CFG, port, random.Random(seed), now=0.0)


def start_exchange(avg, now, neighbours):
    sends = avg.tick(now, neighbours)
    assert len(sends) == 1 and isinstance(sends[0].msg, AvgRequest)
    return sends[0]


def test_exchange_moves_both_to_the_average_and_preserves_the_mean():
    pa, a = make([0, 0, 0, 0])
    pb, b = make([4, 8, 12, 16])
    req = start_exchange(a, 1.0, ["b"])
    assert req.to == "b"
    (rep,) = b.receive("a", req.msg, 1.01, ["a"])
    assert rep.to == "a" and isinstance(rep.msg, AvgReply)
    assert a.receive("b", rep.msg, 1.02, ["b"]) == []
    np.testing.assert_allclose(pa.x, [2, 4, 6, 8])
    np.testing.assert_allclose(pb.x, [2, 4, 6, 8])
    assert a.stats["exchanges_completed"] == 1 and b.stats["requests_served"] == 1
    assert not a.busy()


def test_local_steps_during_an_exchange_are_kept_and_mean_still_preserved():
    pa, a = make([0, 0, 0, 0])
    pb, b = make([4, 4, 4, 4])
    req = start_exchange(a, 1.0, ["b"])
    pa.x += 1.0  # a local SGD step lands while the request is in flight
    (rep,) = b.receive("a", req.msg, 1.01, ["a"])
    a.receive("b", rep.msg, 1.02, ["b"])
    np.testing.assert_allclose(pa.x, [3, 3, 3, 3])  # average (2) + own step (1)
    np.testing.assert_allclose(pb.x, [2, 2, 2, 2])
    assert pa.x.sum() + pb.x.sum() == pytest.approx(0 + 16 + 4)


def test_concurrent_exchanges_through_a_shared_peer_preserve_the_mean():
    ports, peers = zip(*(make(np.full(4, v), seed=i) for i, v in enumerate([0.0, 10.0, 20.0])))
    total = sum(p.x.sum() for p in ports)
    r0 = start_exchange(peers[0], 1.0, ["p1"])
    r2 = start_exchange(peers[2], 1.0, ["p1"])
    (rep0,) = peers[1].receive("p0", r0.msg, 1.01, [])
    (rep2,) = peers[1].receive("p2", r2.msg, 1.01, [])
    peers[2].receive("p1", rep2.msg, 1.02, [])
    peers[0].receive("p1", rep0.msg, 1.03, [])
    assert sum(p.x.sum() for p in ports) == pytest.approx(total)


def test_no_reply_times_out_and_training_never_waits():
    pa, a = make([1, 1, 1, 1])
    start_exchange(a, 1.0, ["b"])
    assert a.busy() and a.next_deadline() == pytest.approx(2.0)
    assert a.tick(1.5, ["b"]) == []  # still waiting, sends nothing new
    assert a.tick(2.0, ["b"]) == []
    assert not a.busy() and a.stats["exchanges_timed_out"] == 1
    np.testing.assert_allclose(pa.x, [1, 1, 1, 1])  # untouched


def test_late_reply_to_the_last_timed_out_exchange_is_still_mixed_zero_sum():
    pa, a = make([0, 0, 0, 0])
    pb, b = make([4, 4, 4, 4])
    req = start_exchange(a, 1.0, ["b"])
    (rep,) = b.receive("a", req.msg, 1.01, [])  # b mixed when it answered
    a.tick(2.5, ["b"])  # timed out
    assert not a.busy()
    assert a.receive("b", rep.msg, 2.6, ["b"]) == []
    assert a.stats["late_completed"] == 1 and a.stats["late_replies"] == 0
    np.testing.assert_allclose(pa.x, [2, 2, 2, 2])  # the pair is zero-sum again
    np.testing.assert_allclose(pb.x, [2, 2, 2, 2])
    assert a.receive("b", rep.msg, 2.7, ["b"]) == []  # a duplicate is not mixed twice
    assert a.stats["late_replies"] == 1
    np.testing.assert_allclose(pa.x, [2, 2, 2, 2])


def test_reply_to_an_older_timed_out_exchange_is_dropped():
    pa, a = make([0, 0, 0, 0])
    pb, b = make([4, 4, 4, 4])
    first = start_exchange(a, 1.0, ["b"])
    (old_reply,) = b.receive("a", first.msg, 1.01, [])
    a.tick(2.5, ["b"])  # the first times out
    a.tick(a.next_deadline(), ["b"])  # the second starts ...
    a.tick(a.next_deadline(), ["b"])  # ... and times out too: only its reply may still be mixed
    assert a.stats["exchanges_timed_out"] == 2
    assert a.receive("b", old_reply.msg, 20.0, ["b"]) == []
    assert a.stats["late_replies"] == 1 and a.stats["late_completed"] == 0
    np.testing.assert_allclose(pa.x, [0, 0, 0, 0])


def test_a_timeout_stretches_the_pause_and_the_next_timeout():
    """A link too slow for the configured timeout: without this, no exchange ever completes, none
    is measured, and a new model-sized transfer starts right after every timeout."""
    cfg = AveragingConfig(interval_s=0.1, exchange_timeout_s=1.0, comm_fraction=0.5, robust_mixing=False)
    a = PairwiseGossip(cfg, ArrayPort([0, 0, 0, 0]), random.Random(0), now=0.0)
    start_exchange(a, 1.0, ["b"])
    a.tick(2.0, ["b"])  # timed out after 1 s: it took at least that
    assert a.next_deadline() >= 2.0 + 1.0  # half the time busy at most: a pause >= 1 s, not 0.1 s
    start_exchange(a, a.next_deadline(), ["b"])
    assert a.next_deadline() - a._in_flight.started >= 4.0  # waits 4x the measured duration now


def test_the_timeout_follows_the_measured_exchange_time_within_bounds():
    pa, a, pb, b = pair(make_cfg(max_interval_s=30.0), make_cfg())
    (req,) = a.tick(1.0, ["b"])
    (rep,) = b.receive("a", req.msg, 1.5, ["a"])
    a.receive("b", rep.msg, 4.0, ["b"])  # 3 s, within the configured 5 s
    (req,) = a.tick(a.next_deadline(), ["b"])
    assert a.next_deadline() == pytest.approx(a._in_flight.started + 12.0)  # 4 x 3 s
    (rep,) = b.receive("a", req.msg, a._in_flight.started, ["a"])
    a.receive("b", rep.msg, a._in_flight.started + 60.0, ["b"])  # a very slow one
    (req,) = a.tick(a.next_deadline(), ["b"])
    assert a.next_deadline() == pytest.approx(a._in_flight.started + 30.0)  # capped at max_interval_s


def test_reply_from_the_wrong_peer_is_dropped():
    pa, a = make([0, 0, 0, 0])
    req = start_exchange(a, 1.0, ["b"])
    forged = AvgReply(req.msg.exchange, 0, "m/4", np.full(4, 100, dtype=np.float32))
    assert a.receive("mallory", forged, 1.1, ["b"]) == []
    np.testing.assert_allclose(pa.x, [0, 0, 0, 0])
    assert a.busy()


def test_no_neighbours_no_exchange():
    _, a = make([0, 0, 0, 0])
    assert a.tick(5.0, []) == []
    assert not a.busy()


@pytest.mark.parametrize("params, key, reason", [
    (np.zeros(5, dtype=np.float32), "m/4", "bad_tensor"),
    (np.zeros(4, dtype=np.float64), "m/4", "bad_tensor"),
    (np.zeros(4, dtype=np.float32), "other/4", "wrong_model"),
])
def test_incompatible_params_are_rejected_and_model_untouched(params, key, reason):
    pb, b = make([4, 4, 4, 4])
    with pytest.raises(RemoteProtocolError) as info:
        b.receive("a", AvgRequest(1, 0, key, params), 1.0, [])
    assert info.value.reason == reason
    np.testing.assert_allclose(pb.x, [4, 4, 4, 4])


def test_random_gossip_converges_to_the_initial_mean():
    rng = np.random.default_rng(0)
    ports, peers = zip(*(make(rng.normal(size=4) * 10, seed=i) for i in range(6)))
    names = [f"p{i}" for i in range(6)]
    mean = np.mean([p.x for p in ports], axis=0)
    now = 0.0
    for _ in range(300):  # deliver each exchange instantly, peers in turn
        now += 0.2
        for i, peer in enumerate(peers):
            others = [n for n in names if n != names[i]]
            for send in peer.tick(now, others):
                j = names.index(send.to)
                for reply in peers[j].receive(names[i], send.msg, now, []):
                    peer.receive(send.to, reply.msg, now, others)
    for p in ports:
        np.testing.assert_allclose(p.x, mean, atol=1e-4)


# -- compression and bandwidth awareness ----------------------------------------------------
from p2p.averaging.adpsgd import AvgReplyQ, AvgRequestQ  # noqa: E402
from p2p.protocol import LocalProtocolError  # noqa: E402
from p2p.wire import decode, encode  # noqa: E402


def make_cfg(**kw):
    return AveragingConfig(interval_s=0.1, exchange_timeout_s=5.0, robust_mixing=False, **kw)


def pair(cfg_a, cfg_b, n=1000):
    rng = np.random.default_rng(3)
    pa, pb = ArrayPort(rng.normal(size=n)), ArrayPort(rng.normal(size=n) + 5)
    pa.model_key = pb.model_key = f"m/{n}"
    return pa, PairwiseGossip(cfg_a, pa, random.Random(0), 0.0), pb, PairwiseGossip(cfg_b, pb, random.Random(1), 0.0)


@pytest.mark.parametrize("codec, tolerance", [("fp16", 5e-3), ("bf16", 3e-2), ("int8", 5e-2)])
def test_compressed_exchange_is_zero_sum_and_lands_near_the_average(codec, tolerance):
    pa, a, pb, b = pair(make_cfg(compression=codec), make_cfg(compression=codec))
    total, average = pa.x + pb.x, (pa.x + pb.x) / 2
    (req,) = a.tick(1.0, ["b"])
    assert isinstance(req.msg, AvgRequestQ)
    _, wire_req = decode([bytes(f) for f in encode(req.msg, "a:1")])  # through the real codec
    (rep,) = b.receive("a", wire_req, 1.1, ["a"])
    assert isinstance(rep.msg, AvgReplyQ)
    assert rep.msg.data.nbytes < pa.x.nbytes / 1.9  # actually smaller on the wire
    a.receive("b", rep.msg, 1.2, ["b"])
    np.testing.assert_allclose(pa.x + pb.x, total, atol=1e-5)  # the swarm mean is preserved exactly
    assert np.abs(pa.x - average).max() < tolerance * 10 and np.abs(pb.x - average).max() < tolerance * 10
    assert a.stats["exchanges_completed"] == 1


def test_peers_with_different_codecs_still_mix():
    pa, a, pb, b = pair(make_cfg(compression="int8"), make_cfg())  # b sends plain float32
    total = pa.x + pb.x
    (req,) = a.tick(1.0, ["b"])
    (rep,) = b.receive("a", req.msg, 1.1, ["a"])
    assert isinstance(rep.msg, AvgReply)
    a.receive("b", rep.msg, 1.2, ["b"])
    np.testing.assert_allclose(pa.x + pb.x, total, atol=1e-5)
    assert a.stats["exchanges_completed"] == 1


@pytest.mark.parametrize("codec", ["topk", "sign", "zip"])
def test_codecs_that_cannot_average_parameters_are_refused(codec):
    with pytest.raises(LocalProtocolError, match="cannot average"):
        PairwiseGossip(make_cfg(compression=codec), ArrayPort([0, 0, 0, 0]), random.Random(0), 0.0)


def test_slow_exchanges_stretch_the_interval_to_the_budget():
    pa, a, pb, b = pair(make_cfg(comm_fraction=0.25), make_cfg())
    (req,) = a.tick(1.0, ["b"])
    (rep,) = b.receive("a", req.msg, 1.5, ["a"])
    a.receive("b", rep.msg, 3.0, ["b"])  # the exchange took 2 s
    # busy 2 s out of every 2 + pause: a quarter means a 6 s pause, not the 0.1 s base
    assert a.next_deadline() == pytest.approx(3.0 + 6.0)
    report = a.bandwidth_report()
    assert report["links"]["b"]["exchange_ms"] == pytest.approx(2000.0)
    assert report["links"]["b"]["throughput_mbit_s"] > 0


def test_bandwidth_awareness_can_be_turned_off():
    pa, a, pb, b = pair(make_cfg(bandwidth_aware=False), make_cfg())
    (req,) = a.tick(1.0, ["b"])
    (rep,) = b.receive("a", req.msg, 1.5, ["a"])
    a.receive("b", rep.msg, 3.0, ["b"])
    assert a.next_deadline() == pytest.approx(3.1)


def test_auto_compression_climbs_when_the_link_cannot_keep_up():
    pa, a, pb, b = pair(make_cfg(compression="auto", comm_fraction=0.5, max_interval_s=1.0), make_cfg())
    now = 1.0
    codecs = []
    for _ in range(3):
        (req,) = a.tick(now, ["b"])
        (rep,) = b.receive("a", req.msg, now, ["a"])
        now += 4.0  # every exchange takes 4 s: a 4 s pause would be needed, more than the 1 s cap
        a.receive("b", rep.msg, now, ["b"])
        codecs.append(a.codec)
        now = a.next_deadline()
    assert codecs == ["fp16", "int8", "int8"]


class CpuPort(SimArrayPort):
    """An ArrayPort that reports CPU seconds as the real one does (network thread, the rest)."""

    def __init__(self, values):
        super().__init__(values, "m/4", immediate=True)
        self.cpu = (0.0, 0.0)

    def cpu_seconds(self):
        return self.cpu


def test_exchanges_are_paced_against_the_compute_not_only_wall_time():
    port = CpuPort([0, 0, 0, 0])
    a = PairwiseGossip(make_cfg(comm_fraction=0.5), port, random.Random(0), now=0.0)
    b = PairwiseGossip(make_cfg(), ArrayPort([4, 4, 4, 4]), random.Random(1), now=0.0)
    now, pauses = 1.0, []
    for cycle in range(3):
        (req,) = a.tick(now, ["b"])
        (rep,) = b.receive("a", req.msg, now, ["a"])
        now += 0.1  # a fast link: 0.1 s exchanges, the link rule alone pauses 0.1 s
        # each cycle costs the network thread 0.3 CPU s; training gets 0.5 CPU s per second
        port.cpu = (0.3 * (cycle + 1), 0.5 * now)
        a.receive("b", rep.msg, now, ["b"])
        pauses.append(a.next_deadline() - now)
        now = a.next_deadline()
    assert pauses[0] == pytest.approx(0.1)  # the first cycle only starts the CPU window
    # 0.3 CPU s per cycle at half of 0.5 CPU s/s of compute: cycles of 1.2 s, pauses of 1.1 s
    assert pauses[-1] == pytest.approx(1.1, rel=0.05)
