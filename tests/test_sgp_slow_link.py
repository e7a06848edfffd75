"""SGP on a link slower than its pushes (issue 16): a share the driver drops unsent (its queue
to that peer is full) comes back home, so the push-sum weight is conserved instead of halving
away with every dropped push. Pure protocol, messages through the wire codec, no sleeps."""

import random

import numpy as np

from p2p.averaging.base import AveragingConfig
from p2p.averaging.sgp import PushSum, PushSumShare, SGPConfig
from p2p.peer import Peer
from p2p.sim.avg_port import ArrayPort
from p2p.wire import decode, encode

KEY = "m/16"


def make(values, seed=0):
    port = ArrayPort(np.asarray(values, np.float32), KEY, immediate=True)
    return port, PushSum(AveragingConfig(robust_mixing=False), port, random.Random(seed), 0.0, SGPConfig(0.0))


def test_a_dropped_share_comes_back_whole():
    port, sgp = make(np.ones(16))
    [send] = sgp.after_step(1, 0.0, ["b"])
    assert sgp.weight == 0.5
    port.add_delta(np.full(16, 2.0, np.float32))  # a training step lands before the drop is known
    sgp.send_dropped("b", send.msg, 0.1)
    assert sgp.weight == 1.0 and sgp.stats["shares_dropped"] == 1
    # z = (w z_now + w' z_pushed) / (w + w') = (0.5 * 3 + 0.5 * 1) / 1
    np.testing.assert_allclose(port.x, 2.0)


def test_weight_is_conserved_when_most_pushes_are_dropped():
    """Three peers on a ring; like the transport at 20 Mbit/s (70 of 73 pushes dropped), only
    one push in ten gets through. Without taking dropped shares back, the weights halved on
    every dropped push (2^-180 after 200 steps) and would underflow to 0 after ~1100."""
    rng = np.random.default_rng(0)
    peers = {a: make(rng.normal(size=16), i) for i, a in enumerate(["a", "b", "c"])}
    ring = {"a": ["b"], "b": ["c"], "c": ["a"]}
    z0 = np.mean([p.x for p, _ in peers.values()], axis=0)
    n = 0
    for step in range(1, 201):
        for name, (port, sgp) in peers.items():
            for send in sgp.after_step(step, float(step), ring[name]):
                n += 1
                if n % 10:
                    sgp.send_dropped(send.to, send.msg, float(step))
                    continue
                _, msg = decode([bytes(f) for f in encode(send.msg, name)])
                peers[send.to][1].receive(name, msg, float(step), ring[send.to])
    weights = [sgp.weight for _, sgp in peers.values()]
    assert abs(sum(weights) - 3.0) < 1e-9, weights
    # and the weighted mean of the models (push-sum's invariant) stayed where it started
    mean = sum(sgp.weight * port.x.astype(np.float64) for port, sgp in peers.values()) / 3.0
    np.testing.assert_allclose(mean, z0, atol=1e-4)


class _Membership:
    def owns(self, msg):
        return False


def test_peer_hands_only_averaging_drops_to_the_averager():
    seen = []

    class Averager:
        MESSAGES = (PushSumShare,)

        def send_dropped(self, to, msg, now):
            seen.append((to, type(msg).__name__))

    from p2p.protocol import Send
    peer = Peer("me:1", _Membership(), Averager(), lambda addr, members: [])
    share = PushSumShare(0, 1, 0.5, KEY, np.zeros(16, np.float32))
    peer.send_dropped(Send("b:1", share), 0.0)
    peer.send_dropped(Send("b:1", object()), 0.0)  # not an averaging message: not handed on
    assert seen == [("b:1", "PushSumShare")]
