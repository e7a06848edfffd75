"""DiLoCo at the end of training: a copy of theta_start that the last outer round left apart is
mended after every peer finished (p2p/averaging/diloco.py, "Finished peers": ``OuterDone``)."""

import numpy as np
import pytest

from p2p.averaging.diloco import OuterDone
from p2p.protocol import RemoteProtocolError
from p2p.sim.avg_config import AvgSimConfig, sim_algorithm_options, sim_averaging_config, sim_membership_config
from p2p.sim.avg_sim import AvgSimulation
from p2p.wire import decode, encode
from tests.test_diloco_auto import COMPUTE_S, SLOW, auto_peer

# No membership flapping here (tests/test_diloco_auto.py, PATIENT: the simulator's FIFO uplink
# queues probes behind the shares at this link speed): only the lost shares put copies apart.
PATIENT = sim_membership_config(COMPUTE_S, suspicion_mult=40)


def lossy_run(seed, linger_s):
    options = sim_algorithm_options("diloco", inner_steps="auto")
    cfg = AvgSimConfig("diloco", "full", 4, 256, seed, loss=0.02, bandwidth_bps=SLOW, dim=300, compute_s=COMPUTE_S,
                       options=options, lr_decay_steps=100, membership=PATIENT, linger_s=linger_s,
                       config=sim_averaging_config(COMPUTE_S, "diloco", options, round_timeout_s=30.0))
    return AvgSimulation(cfg).run()


@pytest.mark.parametrize("seed", range(8))
def test_a_copy_the_last_rounds_left_apart_is_mended_after_every_peer_finished(seed):
    # 2% of the messages lost: a share lost in the last rounds leaves one peer's copy apart once
    # every peer finished, and no round follows to compare the copies. Before OuterDone, seeds
    # 1, 3 and 7 ended 0.37, 0.84 and 0.33x the initial consensus distance apart with the default
    # 0.5 s linger, 3 and 7 still after 10 s (7 after 60 s). The linger (10 s) leaves room for
    # the final sketches (sent again after 2, 4 s if lost) and a pull of theta_start at 0.05
    # Mbit/s (~1 s, more after a lost chunk): at 4 s one seed of 8 had not mended yet.
    r = lossy_run(seed, linger_s=10.0)
    assert set(r.steps.values()) == {256} and not r.rejected and not r.false_positives
    assert r.final_consensus / r.initial_consensus <= 0.01


def three_peers_lose_one_share_of_the_last_round(steps=8, h=4):
    """a, b and c train ``steps`` steps at H ``h``, every message delivered at once through the
    wire but b's share of the last round to c. Returns the peers and their ports after 30 s of
    lingering (ticks every 50 ms)."""
    names = ("a", "b", "c")
    made = {n: auto_peer() for n in names}
    ports, peers = {n: p for n, (p, _) in made.items()}, {n: d for n, (_, d) in made.items()}
    view = {n: [m for m in names if m != n] for n in names}
    target = {"a": 1.0, "b": 1.3, "c": 1.1}  # b's Delta is not the mean of a's and c's
    last_round = steps // h - 1
    for n in names:
        peers[n].self_addr = n
        peers[n]._schedule.h = peers[n]._schedule.h_next = h  # a fixed H on this schedule: no link measured
        peers[n]._schedule.proposal = lambda exchange_s: h

    def deliver(src, sends):
        for s in sends:
            if src == "b" and s.to == "c" and getattr(s.msg, "round", None) == last_round and hasattr(s.msg, "delta"):
                continue
            _, msg = decode(encode(s.msg, src))
            deliver(s.to, peers[s.to].receive(src, msg, now, view[s.to]))

    now, done = 0.0, set()
    while now < 30.0:
        now += COMPUTE_S
        for n in names:
            deliver(n, peers[n].tick(now, view[n]))
            port = ports[n]
            if n in done or not peers[n].may_step(port.step + 1, now):
                continue
            if port.step == steps:
                done.add(n)
                peers[n].training_done(steps, now)
                continue
            port.x -= np.float32(0.1) * (port.x - target[n])  # each its own inner progress
            port.step += 1
            deliver(n, peers[n].after_step(port.step, now, view[n]))
    return peers, ports


def test_a_share_lost_in_the_last_round_leaves_no_copy_apart():
    peers, ports = three_peers_lose_one_share_of_the_last_round()
    starts = {n: p.outer_parameters for n, p in peers.items()}
    assert peers["c"].stats["rounds_partial"] == 1  # c's last round averaged a and c only
    assert np.array_equal(starts["a"], starts["b"]) and peers["c"].stats["repairs_completed"] == 1
    assert np.allclose(starts["c"], starts["a"], rtol=0, atol=1e-6)
    assert np.allclose(ports["c"].snapshot(), starts["a"], rtol=0, atol=1e-6)  # the model, not only the copy


def done(**changes):
    fields = dict(round=2, step=8, model_key="m/6", sketch=np.zeros(6, np.float32), mixed=("a", "b"))
    return OuterDone(**{**fields, **changes})


@pytest.mark.parametrize("bad, reason", [(dict(sketch=np.zeros(5, np.float32)), "bad_tensor"),
                                         (dict(sketch=np.zeros(6, np.float64)), "bad_tensor"),
                                         (dict(mixed=(1,)), "bad_value"), (dict(round=-1), "bad_value"),
                                         (dict(model_key="m/7"), "wrong_model")])
def test_a_malformed_final_sketch_is_refused(bad, reason):
    _, peer = auto_peer()
    _, msg = decode(encode(done(), "b"))
    assert peer.receive("b", msg, 0.0, ["b"]) == []
    with pytest.raises(RemoteProtocolError) as e:
        peer.receive("b", decode(encode(done(**bad), "b"))[1], 0.0, ["b"])
    assert e.value.reason == reason


def test_the_final_sketch_tag_is_pinned():
    from p2p.wire import registered_tags

    assert registered_tags()[35] == "OuterDone"
