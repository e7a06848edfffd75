"""CHOCO on links slower than its rounds (issue 16): a lost record must make traffic rarer, not
denser. Pure protocol on a logical clock, every message through the real wire codec, no sleeps;
the links behave as the transport's: each peer's egress carries ``RATE`` bytes/s in order, and a
large message finding two of its destination's already queued is dropped (p2p/net/transport.py,
``max_pending_per_peer``); small ones (ChocoResync) travel on the control channel at once."""

import heapq
import random

import numpy as np

from p2p.averaging.base import AveragingConfig
from p2p.averaging.choco import ChocoDelta, ChocoGossip
from p2p.compression import make_compressor
from p2p.compression.messages import compressed_fields
from p2p.sim.avg_port import ArrayPort
from p2p.wire import decode, encode

N = 50_000  # parameters: an int8 delta ~50 KB, a float32 reset ~200 KB
RATE = 50_000.0  # bytes/s of each peer's egress: one delta takes ~1 s, rounds come every 0.05 s
MAX_PENDING = 2  # large messages queued per destination before the transport drops (its default)
SMALL = 4096  # bytes: below this a message goes on the control channel
LATENCY = 0.01


class SlowSwarm:
    """Three CHOCO peers on a triangle behind rate-limited egress links."""

    def __init__(self, seed=0):
        self.names = ["p0", "p1", "p2"]
        rng = np.random.default_rng(seed)
        cfg = AveragingConfig(interval_s=0.05, exchange_timeout_s=2.0, robust_mixing=False, compression="int8")
        self.ports = {a: ArrayPort(rng.normal(size=N).astype(np.float32) * 10, f"m/{N}", immediate=True)
                      for a in self.names}
        self.peers = {a: ChocoGossip(cfg, self.ports[a], random.Random(i), 0.0, compressor=make_compressor("int8"))
                      for i, a in enumerate(self.names)}
        self.free_at = {a: 0.0 for a in self.names}  # when a peer's egress finishes what it holds
        self.queued = {}  # (src, dst) -> finish times of the large messages in that queue
        self.events = []  # (time, n, src, dst, frames): deliveries
        self.n = 0
        self.bytes = {"ChocoDelta": 0, "ChocoReset": 0}  # put on the links (dropped ones not)
        self.dropped = 0

    def neighbours(self, a):
        return [b for b in self.names if b != a]

    def send(self, now, src, sends):
        for s in sends:
            frames = [bytes(f) for f in encode(s.msg, src)]
            size = sum(len(f) for f in frames)
            if size < SMALL:
                at = now + LATENCY
            else:
                pending = [t for t in self.queued.get((src, s.to), []) if t > now]
                if len(pending) >= MAX_PENDING:
                    self.dropped += 1
                    self.queued[(src, s.to)] = pending
                    self.peers[src].send_dropped(s.to, s.msg, now)  # as the driver reports the transport's drops
                    continue
                at = self.free_at[src] = max(now, self.free_at[src]) + size / RATE
                self.queued[(src, s.to)] = pending + [at]
                self.bytes[type(s.msg).__name__] += size
                at += LATENCY
            self.n += 1
            heapq.heappush(self.events, (at, self.n, src, s.to, frames))

    def run(self, until):
        now = 0.0
        while True:
            tick_at, name = min((self.peers[a].next_deadline(), a) for a in self.names)
            deliver_at = self.events[0][0] if self.events else float("inf")
            now = min(tick_at, deliver_at)
            if now > until:
                return
            if deliver_at <= tick_at:
                _, _, src, dst, frames = heapq.heappop(self.events)
                _, msg = decode(frames)
                self.send(now, dst, self.peers[dst].receive(src, msg, now, self.neighbours(dst)))
            else:
                self.send(now, name, self.peers[name].tick(now, self.neighbours(name)))

    def stat(self, key):
        return sum(p.stats[key] for p in self.peers.values())

    def spread(self):
        x = np.array([p.x for p in self.ports.values()], dtype=np.float64)
        return float(np.sqrt(((x - x.mean(axis=0)) ** 2).sum(axis=1).mean()))


def test_lost_records_slow_publishing_down_instead_of_feeding_resets():
    swarm = SlowSwarm()
    start = swarm.spread()
    swarm.run(90.0)
    resets, dropped = swarm.stat("resets_sent"), swarm.dropped
    sent, applied = swarm.stat("deltas_sent"), swarm.stat("deltas_applied")
    swarm.run(180.0)
    # Before the fix the rounds stayed at 0.05 s against ~2 s of link time: ~99% of the records
    # were dropped, every loss cost a float32 reset (4x a delta), ~1 reset a second went on for
    # ever and 7 of 13 000 deltas were ever applied. Now the interval has found the link's pace
    # by 90 s: from then on almost every delta lands; a drop (and the reset it costs) is the rare
    # probe of a pace that has crept back up, and the signal that slows it again.
    late_sent, late_applied = swarm.stat("deltas_sent") - sent, swarm.stat("deltas_applied") - applied
    late_resets, late_dropped = swarm.stat("resets_sent") - resets, swarm.dropped - dropped
    assert late_resets <= 0.05 * late_sent and late_dropped <= 0.05 * late_sent, (late_resets, late_dropped, late_sent)
    assert late_sent >= 50 and late_applied >= 0.9 * late_sent, (late_sent, late_applied)
    assert all(p.interval < 10.0 for p in swarm.peers.values()), [p.interval for p in swarm.peers.values()]
    assert swarm.spread() < 0.01 * start, (swarm.spread(), start)


def test_a_reset_still_crossing_the_link_is_not_asked_for_twice():
    """The receiver's asks back off (2 s, 4 s, 8 s, ...) while no reset arrives."""
    swarm = SlowSwarm()
    p0 = swarm.peers["p0"]
    q = make_compressor("int8").compress(np.ones(N, np.float32))
    delta = lambda seq: ChocoDelta(**compressed_fields(q), stream=7, seq=seq, degree=2, model_key=f"m/{N}")
    asks = [t for t in np.arange(0.0, 15.0, 0.25) if p0.receive("p1", delta(5 + int(t * 4)), float(t), ["p1", "p2"])]
    assert asks == [0.0, 2.0, 6.0, 14.0]
