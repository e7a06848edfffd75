"""DiLoCo's repair of copies that fell apart (issue 16): a pull from one donor, bounded, in the
background, that cannot feed on itself. Pure protocol on a logical clock, every message
through the real wire codec, no sleeps."""

import random

import numpy as np
import pytest

from p2p.averaging.base import AveragingConfig
from p2p.averaging.diloco import MIN_ROUND_TIMEOUT_S, DiLoCo, DiLoCoConfig
from p2p.averaging.outer_copies import sketches_differ
from p2p.averaging.outer_repair import (CHUNK_ENTRIES, STALE, RepairChunk, RepairRequest,
                                        chunk_bounds, propagate, reference_group)
from p2p.protocol import RemoteProtocolError
from p2p.sim.avg_port import ArrayPort
from p2p.sim.loop import EventLoop
from p2p.sim.network import Network
from p2p.wire import decode, encode

N = 300_000  # parameters: one chunk of theta_start, one of momentum
KEY = f"m/{N}"
H = 4


class Swarm:
    """Peers on a full graph, a logical clock and a network that can cut a peer off. Every
    message goes through encode/decode; ``sent`` counts the bytes each peer put on the wire.
    Delivery is instant, or with ``latency_s`` through the simulators' network model
    (p2p/sim/network.py: each sender's uplink at ``rate_bps``, then the latency plus up to as
    much again of jitter, seeded by ``seed``).
    ``views_drop_cut``: the others' views leave a cut peer out (membership declared it dead)."""

    def __init__(self, starts, codec="int4", drop=lambda src, dst, msg: False, timeout_s=10.0, robust=False,
                 outer_lr=0.7, outer_momentum=0.9, dense_rounds=0, overlap=False, latency_s=0.0,
                 rate_bps=20e6, seed=0, views_drop_cut=False, staleness_tau=None):
        # dense_rounds 0: sparseloco from the first round, whose small shares the catch-ups here need
        self.names = [f"p{i}" for i in range(len(starts))]
        self.peers = {}
        for name, start in zip(self.names, starts):
            config = AveragingConfig(round_timeout_s=timeout_s, robust_mixing=robust, compression=codec,
                                     staleness_aware=staleness_tau is not None, staleness_tau=staleness_tau or 10.0)
            port = ArrayPort(np.asarray(start, np.float32), KEY, immediate=True)
            self.peers[name] = (port, DiLoCo(config, port, random.Random(0), 0.0,
                                             DiLoCoConfig(inner_steps=H, outer_lr=outer_lr,
                                                          outer_momentum=outer_momentum, dense_rounds=dense_rounds,
                                                          overlap=overlap)))
            self.peers[name][1].self_addr = name  # as p2p.peer.Peer sets it
        self.now = 0.0
        self.cut: set[str] = set()
        self.drop = drop
        self.sent = {n: 0 for n in self.names}
        self.kinds = {n: {} for n in self.names}
        self.gate_waits = {n: 0.0 for n in self.names}  # simulated seconds a trainer waited at the gate
        self.latency_s, self.wire = latency_s, EventLoop()  # with latency: the messages in flight
        self.net = Network(self.wire, random.Random(seed), len(self.names), delay_s=latency_s, jitter_s=latency_s,
                           bandwidth_bps=rate_bps)
        self.views_drop_cut = views_drop_cut

    def alg(self, name):
        return self.peers[name][1]

    def others(self, name):
        cut = self.cut if self.views_drop_cut and name not in self.cut else ()
        return [n for n in self.names if n != name and n not in cut]

    def send(self, src, sends):
        queue = [(src, s) for s in sends]
        while queue:
            src, s = queue.pop(0)
            frames = encode(s.msg, src)
            nbytes = sum(len(bytes(f)) for f in frames)
            self.sent[src] += nbytes
            kind = type(s.msg).__name__
            self.kinds[src][kind] = self.kinds[src].get(kind, 0) + nbytes
            if src in self.cut or s.to in self.cut or self.drop(src, s.to, s.msg):
                continue
            if self.latency_s:
                self.net.send(self.now, self.names.index(src), self.names.index(s.to), frames, nbytes)
                continue
            queue += [(s.to, x) for x in self.deliver(src, s.to, frames)]

    def deliver(self, src, dst, frames):
        _, msg = decode([bytes(f) for f in frames])
        return self.alg(dst).receive(src, msg, self.now, self.others(dst))

    def settle(self, until):
        """Run every peer's timers and the deliveries up to ``until``, in time order. Returns
        early at a trainer's gate release (with overlap): the trainer decides, in ``may_step``."""
        while True:
            due = [(self.alg(n).next_deadline(), n) for n in self.names]
            t, name = min(due)
            if self.wire.peek_time() <= min(t, until):
                arrival, _, _, dst, src, frames = self.wire.pop()
                src, dst = self.names[src], self.names[dst]
                self.now = max(self.now, arrival)
                if src not in self.cut and dst not in self.cut:
                    self.send(dst, self.deliver(src, dst, frames))
                continue
            if t > until:
                self.now = until
                return
            self.now = max(self.now, t)
            alg = self.alg(name)
            if t == alg._gate.release_at(alg._began_at, alg._wait_ewma, alg.stats["outer_steps"]):
                return
            self.send(name, alg.tick(self.now, self.others(name)))

    def outer_round(self, rng, inner_s=1.0, scale=None):
        """H inner steps on every peer (``inner_s`` of simulated compute), then the boundary:
        every trainer waits at its gate until its round ended; the clock runs meanwhile.
        ``scale``: {peer: factor} on that peer's inner progress (a pseudo-gradient that stands out)."""
        for name, (port, _) in self.peers.items():
            port.x -= rng.standard_normal(N).astype(np.float32) * np.float32(0.01 * (scale or {}).get(name, 1.0))
            port.step += H
        self.settle(self.now + inner_s)
        for name in self.names:
            port, alg = self.peers[name]
            self.send(name, alg.after_step(port.step, self.now, self.others(name)))
        began = self.now
        waiting = set(self.names)
        while waiting:
            for name in sorted(waiting):
                if self.alg(name).may_step(self.peers[name][0].step + 1, self.now):
                    waiting.discard(name)
                    self.gate_waits[name] += self.now - began
            if waiting:
                self.settle(self.now + 0.05)

    def overlap_round(self, rng, inner_s=1.0):
        """With ``overlap`` (and latency): H inner steps on every peer, in two halves of
        ``inner_s / 2``, while the round begun at the last boundary runs beside them; then every
        trainer waits at its gate before the boundary step (while the round runs at its usual
        pace: outer_gate.py), takes it, and begins the next round."""
        for part in (H // 2, H - 1 - H // 2):
            for port, _ in self.peers.values():
                port.x -= rng.standard_normal(N).astype(np.float32) * np.float32(0.01 / 2)
                port.step += part
            self.settle(self.now + inner_s / 2)
        waiting = set(self.names)
        while waiting:
            for name in sorted(waiting):
                port, alg = self.peers[name]
                if not alg.gate_wanted(port.step + 1) or alg.may_step(port.step + 1, self.now):
                    waiting.discard(name)
            if waiting:
                self.settle(self.now + 0.05)
        for name in self.names:
            port, alg = self.peers[name]
            port.step += 1
            self.send(name, alg.after_step(port.step, self.now, self.others(name)))

    def bytes_now(self):
        return dict(self.sent)


def starts(k, apart=()):
    base = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    return [base + (1.0 if i in apart else 0.0) for i in range(k)]


def agree(swarm, names):
    ref = swarm.alg(names[0]).outer_parameters
    return all(np.allclose(swarm.alg(n).outer_parameters, ref, rtol=0, atol=1e-4) for n in names[1:])


# Payload bytes of one round share, pseudo-gradient plus ~4 KB of sketch and header: int4 (N/2
# and a scale per 64), sparseloco (2 bytes per kept entry, 2% of N, and 8 per chunk of 4096).
SHARE = {"int4": N // 2 + 4096, "sparseloco": 2 * (N // 50 + 82) + 8 * (N // 4096 + 1) + 4096}


@pytest.mark.parametrize("codec", ["int4", "sparseloco"])
def test_a_copy_apart_is_pulled_from_one_donor_and_rounds_return_to_compressed_deltas(codec):
    rng = np.random.default_rng(0)
    s = Swarm(starts(4, apart={3}), codec=codec)
    per_round = []
    for _ in range(6):
        before = s.bytes_now()
        s.outer_round(rng)
        per_round.append({n: s.sent[n] - before[n] for n in s.names})
    p3 = s.alg("p3")
    assert p3.stats["repairs_started"] == p3.stats["repairs_completed"] == 1
    assert all(s.alg(n).stats["repairs_started"] == 0 for n in ("p0", "p1", "p2"))  # only the minority repairs
    # ONE donor served it, exactly theta_start in float32 and the momentum in float16 (6 bytes a parameter).
    served = [s.alg(n).stats["repair_bytes_served"] for n in ("p0", "p1", "p2")]
    assert sorted(served) == [0, 0, 6 * N] and p3.stats["repair_bytes"] == 6 * N
    assert agree(s, s.names)
    # No theta_start in any round share; the last rounds carry compressed Deltas only.
    assert all(b < 3 * SHARE[codec] * 1.3 for b in per_round[-1].values())
    assert s.kinds["p3"].get("RepairRequest", 0) < 2000


def test_without_outer_momentum_the_pull_carries_theta_start_only():
    # SparseLoCo's outer step (lr 1, momentum 0): the momentum buffer never enters an outer step,
    # so the pull leaves it out: 4 bytes a parameter, and the copies still end as one.
    rng = np.random.default_rng(0)
    s = Swarm(starts(4, apart={3}), codec="sparseloco", outer_lr=1.0, outer_momentum=0.0)
    for _ in range(4):
        s.outer_round(rng)
    p3 = s.alg("p3")
    assert p3.stats["repairs_started"] == p3.stats["repairs_completed"] == 1
    served = [s.alg(n).stats["repair_bytes_served"] for n in ("p0", "p1", "p2")]
    assert sorted(served) == [0, 0, 4 * N] and p3.stats["repair_bytes"] == 4 * N
    assert agree(s, s.names)


def test_the_repaired_model_keeps_its_inner_progress():
    rng = np.random.default_rng(1)
    s = Swarm(starts(3, apart={2}))
    s.outer_round(rng)  # sketches compared: p2 pulls after this outer step
    port, alg = s.peers["p2"]
    progress = port.x - alg.outer_parameters
    s.settle(s.now + 5.0)  # the pull runs between outer rounds: the trainer is not gated
    assert alg.stats["repairs_completed"] == 1 and not alg.busy()
    np.testing.assert_allclose(port.x - alg.outer_parameters, progress, atol=1e-5)
    np.testing.assert_allclose(alg.outer_parameters, s.alg("p0").outer_parameters, atol=1e-4)


@pytest.mark.parametrize("codec", ["int4", "sparseloco"])
def test_a_peer_cut_off_for_two_rounds_is_repaired_and_the_others_do_not_wait_for_it_each_round(codec):
    rng = np.random.default_rng(2)
    s = Swarm(starts(4), codec=codec)
    for _ in range(3):
        s.outer_round(rng)
    usual = {n: s.gate_waits[n] for n in s.names}
    s.cut = {"p3"}
    for _ in range(3):
        s.outer_round(rng)
    waited = {n: s.gate_waits[n] - usual[n] for n in ("p0", "p1", "p2")}
    # One short timeout (a few times the usual wait, not round_timeout_s per round), then no wait.
    assert all(w <= MIN_ROUND_TIMEOUT_S + 0.5 for w in waited.values()), waited
    assert agree(s, ["p0", "p1", "p2"])  # the same shares arrived: the same plain average
    assert not agree(s, s.names)
    s.cut = set()
    per_round = []
    for _ in range(5):
        before = s.bytes_now()
        s.outer_round(rng)
        per_round.append(sum(s.sent[n] - before[n] for n in s.names))
    assert agree(s, s.names)
    p3 = s.alg("p3").stats
    assert p3["repairs_completed"] == 1
    assert sum(s.alg(n).stats["repairs_started"] for n in s.names) == 1
    assert all(b < 4 * 3 * SHARE[codec] * 1.3 for b in per_round[-2:]), per_round
    if codec == "sparseloco":  # the rounds missed, replayed from one donor's log: a few rounds' shares
        assert p3["catch_ups_completed"] == 1 and p3["repair_bytes"] < N  # the pull: 6 N
    else:  # int4: four shares a round outweigh theta_start's half: the pull
        assert p3["catch_ups_started"] == 0 and p3["repair_bytes"] == 6 * N


def cut_and_restore(s, rng, before=3, cut=3, after=5, at_restore=lambda: None):
    for _ in range(before):
        s.outer_round(rng)
    s.cut = {s.names[-1]}
    for _ in range(cut):
        s.outer_round(rng)
    at_restore()
    s.cut = set()
    for _ in range(after):
        s.outer_round(rng)


def test_a_catch_up_replays_the_rounds_with_robust_mixing_clipping_as_the_rounds_did():
    rng = np.random.default_rng(5)
    s = Swarm(starts(4), codec="sparseloco", robust=True, outer_lr=1.0, outer_momentum=0.0)
    cut_and_restore(s, rng)
    p3 = s.alg("p3").stats
    assert p3["catch_ups_completed"] == 1 and p3["repairs_started"] == 1
    # float rounding apart at most (each peer sums its own share first, the replay by sender)
    assert agree(s, s.names) and not sketches_differ(s.alg("p0").outer_parameters, s.alg("p3").outer_parameters)


def test_a_donor_without_the_rounds_says_so_and_the_next_round_pulls_once():
    rng = np.random.default_rng(6)
    s = Swarm(starts(4), codec="sparseloco")

    def forget():  # the donors lost their logs (a restart, say): every catch-up round is missing
        for n in ("p0", "p1", "p2"):
            s.alg(n)._mend.log._sealed.clear()

    cut_and_restore(s, rng, after=6, at_restore=forget)
    p3 = s.alg("p3").stats
    assert p3["catch_ups_started"] == 1 and p3["catch_ups_completed"] == 0 and p3["repair_stale"] == 1
    # Never a second catch-up from the same base: the full pull, once.
    assert p3["repairs_started"] == 2 and p3["repairs_completed"] == 1 and p3["repair_bytes"] == 6 * N
    assert agree(s, s.names)


def test_a_cut_longer_than_the_log_pulls():
    from p2p.averaging.outer_catchup import LOG_ROUNDS
    rng = np.random.default_rng(7)
    s = Swarm(starts(4), codec="sparseloco")
    cut_and_restore(s, rng, cut=LOG_ROUNDS + 1)
    p3 = s.alg("p3").stats
    assert p3["catch_ups_started"] == 0 and p3["repairs_completed"] == 1 and p3["repair_bytes"] == 6 * N
    assert agree(s, s.names)


def test_lost_catch_up_answers_are_asked_again_a_bounded_number_of_times_then_pulled():
    from p2p.averaging.donor_pull import MAX_ATTEMPTS
    from p2p.averaging.outer_catchup import CatchUpRange, CatchUpShare
    rng = np.random.default_rng(8)
    asks = []
    s = Swarm(starts(4), codec="sparseloco",
              drop=lambda src, dst, msg: isinstance(msg, CatchUpShare) or (isinstance(msg, CatchUpRange)
                                                                           and asks.append((msg.first, msg.last))))
    cut_and_restore(s, rng, after=45)  # four attempts, backing off (seconds of simulated time)
    p3 = s.alg("p3").stats
    assert p3["catch_ups_started"] == 1 and p3["catch_ups_completed"] == 0
    # The same range asked again after a deadline (nothing came: never a wider one), at most
    # MAX_ATTEMPTS times; then the pull.
    assert 2 <= len(asks) <= MAX_ATTEMPTS and len(set(asks)) == 1 and asks[0][1] > asks[0][0]
    assert p3["repairs_completed"] == 1 and p3["repair_bytes"] == 6 * N  # then the pull
    assert agree(s, s.names)


def test_a_hostile_or_unasked_catch_up_share_is_rejected_or_dropped():
    from p2p.averaging.outer_catchup import CatchUpShare
    from p2p.compression import make_compressor
    from p2p.compression.messages import compressed_fields
    s = Swarm(starts(2), codec="sparseloco")
    alg = s.alg("p1")
    q = compressed_fields(make_compressor("sparseloco").compress(np.ones(N, np.float32)))
    unasked = CatchUpShare(**q, round=0, sender="p0", mixed=("p0", "p1"), model_key=KEY)
    alg.receive("p0", unasked, 0.0, ["p0"])
    assert alg.stats["repair_chunks_unasked"] == 1
    alg._mend.catchup.note_begin(0, alg.outer_parameters, np.zeros(N, np.float32))
    alg._mend.catchup.note_agreed(0)
    assert alg._mend.catchup.begin("p0", 2, (alg.outer_parameters, np.zeros(N, np.float32)), 0.0, 1000, 2, 1.0)
    for bad in (dict(sender="p9"), dict(mixed=("p1", "p0")), dict(mixed=())):
        with pytest.raises(RemoteProtocolError):
            alg.receive("p0", CatchUpShare(**{**q, **dict(round=0, sender="p0", mixed=("p0", "p1"),
                                                         model_key=KEY), **bad}), 0.0, ["p0"])
    short = compressed_fields(make_compressor("sparseloco").compress(np.ones(N // 2, np.float32)))
    with pytest.raises(RemoteProtocolError):
        alg.receive("p0", CatchUpShare(**short, round=0, sender="p0", mixed=("p0", "p1"), model_key=KEY), 0.0, ["p0"])
    assert alg._mend.catchup.pull is not None and not alg._mend.catchup.pull.got  # nothing taken from them


def test_a_failed_repair_never_grows_and_backs_off():
    rng = np.random.default_rng(3)
    # The donors never answer a repair: every chunk misses its deadline.
    s = Swarm(starts(3, apart={2}), drop=lambda src, dst, msg: isinstance(msg, RepairChunk), timeout_s=2.0)
    asks = []
    real_send = s.send

    def spy(src, sends):
        for x in sends:
            if isinstance(x.msg, RepairRequest):
                asks.append((s.now, x.msg.round, x.msg.offset, x.msg.count))
        real_send(src, sends)

    s.send = spy
    for _ in range(30):
        s.outer_round(rng, inner_s=3.0)
    alg = s.alg("p2")
    assert alg.stats["repairs_failed"] >= 3 and alg.stats["repairs_completed"] == 0
    # One ask per attempt, always the first chunk (a late chunk is waited for, not asked for
    # twice; a retry never asks for more than the attempt before), each attempt further apart.
    assert {(o, c) for _, _, o, c in asks} == {chunk_bounds(N)[0]}
    assert len(asks) == alg.stats["repairs_failed"] + alg._mend.puller.asking
    gaps = np.diff([t for t, _, _, _ in asks])
    assert len(gaps) >= 2 and all(b >= a for a, b in zip(gaps, gaps[1:]))
    assert s.gate_waits["p2"] <= s.gate_waits["p0"] + 1.0  # training never waited for it


def test_a_stale_or_wrong_chunk_is_dropped_and_a_hostile_one_rejected():
    s = Swarm(starts(2, apart={1}))
    rng = np.random.default_rng(4)
    s.outer_round(rng)
    alg = s.alg("p1")
    assert alg._mend.puller.pull is not None or alg.stats["repairs_completed"] == 1
    donor = alg._mend.puller.pull.donor if alg._mend.puller.pull else "p0"
    with pytest.raises(RemoteProtocolError) as err:
        alg.receive(donor, RepairChunk(0, 0, "other/1", np.zeros(4, np.float32)), s.now, ["p0"])
    assert err.value.reason == "wrong_model"
    with pytest.raises(RemoteProtocolError) as err:
        s.alg("p0").receive("p1", RepairRequest(0, 2 * N, 10, KEY), s.now, ["p1"])
    assert err.value.reason == "bad_value"
    with pytest.raises(RemoteProtocolError):  # a chunk spanning theta_start and the momentum
        s.alg("p0").receive("p1", RepairRequest(0, N - 5, 10, KEY), s.now, ["p1"])
    before = dict(alg.stats)
    alg.receive("p0", RepairChunk(0, 0, KEY, np.zeros(4, np.float32)), s.now, ["p0"])  # nobody asked
    assert alg.stats["repair_chunks_unasked"] == before["repair_chunks_unasked"] + 1


def test_a_donor_past_the_round_says_so_and_one_not_there_yet_answers_when_it_is():
    s = Swarm(starts(2))
    donor = s.alg("p0")
    r = donor._rounds.round
    stale = donor.receive("p1", RepairRequest(r - 1, 0, 10, KEY), 0.0, ["p1"]) if r else []
    if r:
        assert stale[0].msg.offset == STALE
    assert donor.receive("p1", RepairRequest(r + 1, 0, 10, KEY), 0.0, ["p1"]) == []  # waits for round r + 1
    rng = np.random.default_rng(5)
    s.drop = lambda src, dst, msg: isinstance(msg, RepairChunk)  # keep the answer for us
    s.outer_round(rng)
    out = donor.tick(s.now, ["p1"]) if donor.next_deadline() == -np.inf else []
    assert out == [] or out[0].msg.round == r + 1  # served at the outer step (tick flushed it)
    assert donor.stats["repair_bytes_served"] == 40


def test_reference_is_the_largest_group_and_ties_go_the_same_way_for_everyone():
    a, b = np.zeros(8, np.float32), np.ones(8, np.float32)
    assert reference_group({"x": (a, 90), "y": (b, 10), "z": (b.copy(), 10)}, sketches_differ) == {"y", "z"}
    # Every copy apart (joiners that synced at different moments): the most trained one.
    apart = {k: (a + np.float32(0.01 * i), 10 + i) for i, k in enumerate(("p", "q", "r"))}
    assert reference_group({**apart, "s": (b * 5, 99)}, sketches_differ) == {"s"}
    # A tie goes to the most trained copy ...
    assert reference_group({"p": (a, 5), "q": (b, 7)}, sketches_differ) == {"q"}
    # ... and among copies equally trained, to the lowest address, whatever the copies hold:
    # the answer must not flip when the next outer step moves both copies (it did with the
    # smallest sketch as the tie-break, and two peers pulled from each other).
    for shift in (0.0, -3.0, 7.5):
        assert reference_group({"10.0.0.2:7000": (a + shift, 5), "10.0.0.3:7000": (b - shift, 5)},
                               sketches_differ) == {"10.0.0.2:7000"}
        assert reference_group({"10.0.0.3:7000": (a - shift, 5), "10.0.0.2:7000": (b + shift, 5)},
                               sketches_differ) == {"10.0.0.2:7000"}


def test_two_copies_apart_equally_trained_one_pulls_from_the_other_and_never_back():
    # Three peers, three copies equally trained: the ties go to the lowest address, so p1 and
    # p2 pull from p0 once each (never p0 from them), and one copy is left.
    base = starts(3)
    s = Swarm([base[0], base[1] + 0.5, base[2] - 0.5])
    rng = np.random.default_rng(21)
    for _ in range(5):
        s.outer_round(rng)
    assert s.alg("p0").stats["repairs_started"] == 0
    assert all(s.alg(n).stats["repairs_started"] == s.alg(n).stats["repairs_completed"] == 1 for n in ("p1", "p2"))
    assert agree(s, s.names)


def test_with_overlap_a_tie_between_two_groups_still_goes_the_same_way_for_everyone():
    """With overlap a round ends while the trainers are steps past the boundary it began at. The
    tie-break ranks copies by the step each sketch was taken at; one that ranked our own copy by
    our step now put it first in every tie, so each side of a 2-2 split kept its copy and the
    split never mended (seen in a simulated cut with link latency: copies_apart rising on every
    peer for 20 rounds, no repair)."""
    base = starts(4)  # shares arrive ~0.2-0.4 s into a 1-s period: the trainers are H/2 steps on
    s = Swarm([base[0], base[1], base[2] + 0.5, base[3] + 0.5], overlap=True, latency_s=0.2)
    rng = np.random.default_rng(4)
    for _ in range(12):  # p2's and p3's pulls share p0's 20 Mbit/s uplink
        s.overlap_round(rng)
    assert s.alg("p0").stats["copies_apart"] > 0  # the split was seen
    assert [s.alg(n).stats["repairs_started"] for n in s.names] == [0, 0, 1, 1]
    assert all(s.alg(n).stats["repairs_completed"] == 1 for n in ("p2", "p3"))
    assert agree(s, s.names)


def test_with_overlap_peers_at_the_same_boundary_are_not_stale_to_each_other():
    """Staleness-aware mixing weighs a share by how many steps older than ours it is. With
    overlap the round ends H/2 steps past the boundary here: measured from our step now, every
    neighbour looked 2 steps stale, each peer kept more of its own pseudo-gradient, and the
    copies parted at every round. From the boundary (the step its share carries): none is."""
    s = Swarm(starts(3), overlap=True, latency_s=0.2, staleness_tau=1.0)
    rng = np.random.default_rng(8)
    for _ in range(4):
        s.overlap_round(rng)
    assert all(s.alg(n).stats["outer_steps"] == 3 for n in s.names)
    assert agree(s, s.names)


def test_through_a_network_with_latency_a_cut_peers_catch_up_lands_on_the_swarms_copy():
    """A peer cut for two rounds comes back and catches up from its donor's log (p0, the lowest
    address of the reference). Here the donor's round after the restore took the restored
    peer's share too late, and p0 replayed that round one round later. Served at once, it
    landed the catch-up apart by that round's difference: a second catch-up from there, then
    the full pull, as in 4 of 15 runs of the lab's overlap test (stop 39). Served once the next
    round confirmed it (outer_catchup.py, "Only confirmed rounds are served"): one catch-up.
    (Seed and latency chosen so the donor's replay happens; the assertion on it says so.)"""
    rng = np.random.default_rng(4)
    s = Swarm(starts(4), codec="sparseloco", robust=True, outer_lr=1.0, outer_momentum=0.0, overlap=True,
              latency_s=0.2, seed=4, views_drop_cut=True)
    for _ in range(3):
        s.overlap_round(rng)
    s.cut = {"p3"}
    for _ in range(2):
        s.overlap_round(rng)
    s.cut = set()
    for _ in range(8):
        s.overlap_round(rng)
    assert s.alg("p0").stats["repairs_replayed"] == 1  # the case: the donor replayed a round
    p3 = s.alg("p3").stats
    assert p3["catch_ups_started"] == p3["catch_ups_completed"] == p3["repairs_started"] == 1  # no pull
    assert sum(s.alg(n).stats["repairs_started"] for n in ("p0", "p1", "p2")) == 0
    assert agree(s, s.names)


def test_propagate_matches_two_copies_stepped_with_the_same_pseudo_gradients():
    rng = np.random.default_rng(6)
    lr, mu = 0.7, 0.9
    t1, m1 = rng.standard_normal(50).astype(np.float32), rng.standard_normal(50).astype(np.float32)
    t2, m2 = rng.standard_normal(50).astype(np.float32), rng.standard_normal(50).astype(np.float32)
    d_t, d_m = t2 - t1, m2 - m1
    for _ in range(5):
        delta = rng.standard_normal(50).astype(np.float32)
        m1 = mu * m1 + delta
        t1 = t1 - lr * (delta + mu * m1)
        m2 = mu * m2 + delta
        t2 = t2 - lr * (delta + mu * m2)
    propagate(d_t, d_m, 5, lr, mu)
    np.testing.assert_allclose(d_t, t2 - t1, atol=1e-4)
    np.testing.assert_allclose(d_m, m2 - m1, atol=1e-4)


def test_chunks_cover_both_halves_and_stay_under_the_limit():
    bounds = chunk_bounds(N)
    assert all(c <= CHUNK_ENTRIES for _, c in bounds)
    assert sum(c for o, c in bounds if o < N) == N and sum(c for o, c in bounds if o >= N) == N
    assert all((o < N) == (o + c <= N) for o, c in bounds)


def test_a_pull_whose_donor_left_is_dropped_at_once_and_the_next_round_picks_another():
    # Seen in the simulator: a joiner pulling from a peer that then crashed asked it again after
    # ever longer backoffs and ended the run with its copy still apart.
    s = Swarm(starts(3, apart={2}), drop=lambda src, dst, msg: isinstance(msg, RepairChunk))
    rng = np.random.default_rng(5)
    s.outer_round(rng)
    alg = s.alg("p2")
    pull = alg._mend.puller.pull
    assert pull is not None and pull.donor in ("p0", "p1")
    alive = [n for n in ("p0", "p1") if n != pull.donor]
    failed = alg.stats["repairs_failed"]
    alg.tick(s.now, alive)  # the membership no longer lists the donor
    assert alg._mend.puller.pull is None and not alg._mend.puller.active
    assert alg.stats["repair_donors_gone"] == 1 and alg.stats["repairs_failed"] == failed + 1
    alg.tick(s.now, alive + [pull.donor])  # nothing to drop: counters unchanged
    assert alg.stats["repair_donors_gone"] == 1


def test_a_share_that_came_late_is_replayed_not_pulled():
    # p3's share of round 0 reaches p2 only after p2's round timed out: p2 averaged three
    # Deltas, the others four. In round 1 p2 sees its copy apart, recomputes their average
    # from the Deltas it kept (the late one included) and corrects itself: no model moves.
    held = []

    def hold(src, dst, msg):
        if src == "p3" and dst == "p2" and getattr(msg, "round", None) == 0 and not isinstance(msg, RepairChunk):
            held.append(msg)
            return True
        return False

    s = Swarm(starts(4), drop=hold, timeout_s=2.0)
    rng = np.random.default_rng(11)
    s.outer_round(rng)
    assert held and not agree(s, s.names)  # p2 took another average
    for msg in held:  # the late share arrives
        s.alg("p2").receive("p3", msg, s.now, s.others("p2"))
    before = dict(s.sent)
    s.outer_round(rng)
    s.outer_round(rng)
    p2 = s.alg("p2")
    assert p2.stats["repairs_replayed"] == 1 and p2.stats["repairs_started"] == 0 and p2.stats["repair_bytes"] == 0
    assert agree(s, s.names)  # one copy again, up to float rounding
    assert all(k not in ("RepairRequest", "RepairChunk") for kinds in s.kinds.values() for k in kinds)
    assert s.sent["p2"] - before["p2"] <= s.sent["p0"] - before["p0"] + 1000  # p2 sent no more than the others


def test_a_share_that_never_came_is_pulled():
    # The same, but p3's share of round 0 never reaches p2: replay cannot rebuild the average
    # (counted), so p2 pulls the swarm's copy from one donor.
    s = Swarm(starts(4), drop=lambda src, dst, msg: src == "p3" and dst == "p2" and getattr(msg, "round", None) == 0
              and not isinstance(msg, RepairChunk), timeout_s=2.0)
    rng = np.random.default_rng(12)
    for _ in range(4):
        s.outer_round(rng)
    p2 = s.alg("p2")
    assert p2.stats["repairs_replayed"] == 0 and p2.stats["replays_missing"] >= 1
    assert p2.stats["repairs_completed"] == 1 and p2.stats["repair_bytes"] > 0
    assert agree(s, s.names)


def test_a_pull_takes_at_most_its_share_of_the_link():
    # A chunk that took 1 s is followed by 1 / PULL_SHARE - 1 s of quiet before the next ask, so
    # the donor's uplink keeps room for its round shares (unpaced, the lab's rounds stretched).
    from p2p.averaging.outer_repair import PULL_SHARE, RepairPuller
    from p2p.bandwidth import BandwidthMonitor

    stats = {k: 0 for k in ("repairs_started", "repair_bytes", "repair_chunks_missed", "repairs_failed",
                            "repair_chunks_unasked", "repair_stale")}
    puller = RepairPuller(N, KEY, BandwidthMonitor(), stats)
    own = (np.zeros(N, np.float32), np.zeros(N, np.float32))
    assert puller.begin("d", 3, own, now=0.0)
    (first,) = puller.tick(10.0)
    offset, count = first.msg.offset, first.msg.count
    puller.receive("d", RepairChunk(3, offset, KEY, np.ones(count, np.float32)), 11.0)
    quiet = 1.0 * (1 / PULL_SHARE - 1)
    assert puller.next_deadline() == pytest.approx(11.0 + quiet)
    assert puller.tick(11.0 + quiet - 0.01) == []
    (second,) = puller.tick(11.0 + quiet)
    assert second.msg.offset == chunk_bounds(N)[1][0]


def test_a_clipped_pseudo_gradient_leaves_the_peers_that_got_it_with_one_copy():
    # A peer back from a cut sends a pseudo-gradient several rounds long (here 3x the others'
    # norm): robust mixing clips it. Clipped around each peer's own Delta with each peer's own
    # radius (ClippedGossip), the three others took three different outer steps and each then
    # needed a repair. Clipped as a function of the set (robust.py), they take one step.
    s = Swarm(starts(4), codec="none", robust=True)
    rng = np.random.default_rng(31)
    s.outer_round(rng)
    s.outer_round(rng, scale={"p3": 3.0})
    assert all(s.alg(n).stats["robust_clipped"] >= 1 for n in s.names)
    assert all(s.alg(n).stats["robust_refused"] == 0 for n in s.names)
    assert agree(s, s.names)
    for _ in range(2):
        s.outer_round(rng)
    assert sum(s.alg(n).stats["repairs_started"] + s.alg(n).stats["repairs_replayed"] for n in s.names) == 0
    assert agree(s, s.names)


def test_a_share_that_came_late_to_a_clipped_round_is_replayed_with_the_same_clipping():
    # As test_a_share_that_came_late_is_replayed_not_pulled, with the late share the one the
    # others clipped: the replay clips it the same way, and one copy is left with no pull.
    held = []

    def hold(src, dst, msg):
        if src == "p3" and dst == "p2" and getattr(msg, "round", None) == 1 and not isinstance(msg, RepairChunk):
            held.append(msg)
            return True
        return False

    s = Swarm(starts(4), codec="none", drop=hold, timeout_s=2.0, robust=True)
    rng = np.random.default_rng(32)
    s.outer_round(rng)
    s.outer_round(rng, scale={"p3": 3.0})
    assert held and not agree(s, s.names)
    for msg in held:
        s.alg("p2").receive("p3", msg, s.now, s.others("p2"))
    s.outer_round(rng)
    s.outer_round(rng)
    p2 = s.alg("p2")
    assert p2.stats["repairs_replayed"] == 1 and p2.stats["repairs_started"] == 0
    assert agree(s, s.names)


def test_a_pull_whose_outer_steps_no_longer_match_the_donors_is_dropped_not_landed():
    # p3 starts apart and pulls from one donor. While the pull is in flight (its second chunk
    # is lost for a while), p3 misses p1's share of round 1: its outer step there is not the
    # donor's, so the donor's state carried to ours would land apart again. The donor's next
    # share names whose Deltas it averaged; p3 sees the sets differ and drops the pull (counted),
    # and the next pull, whose rounds match, lands one copy.
    held = {"until": 0.0}

    def drop(src, dst, msg):
        if dst == "p3" and isinstance(msg, RepairChunk) and msg.offset >= N and held["until"] > 0 and s.now < held["until"]:
            return True
        return src == "p1" and dst == "p3" and getattr(msg, "round", None) == 1 and not isinstance(msg, RepairChunk)

    s = Swarm(starts(4, apart={3}), drop=drop, timeout_s=2.0)
    rng = np.random.default_rng(41)
    held["until"] = s.now + 4.9  # the second chunk comes after round 2's shares named round 1's sets
    for _ in range(6):
        s.outer_round(rng)
    p3 = s.alg("p3")
    assert p3.stats["repairs_diverged"] == 1, p3.stats
    assert p3.stats["repairs_completed"] == 1
    assert agree(s, s.names)


def test_a_finished_peer_serves_rounds_with_an_exactly_zero_pseudo_gradient():
    # Its model is theta_start up to the last outer step's rounding; a near-zero Delta would
    # pull the consistent screen's median to ~0 and get every peer still training refused
    # (robust.py, median_of_nonzero). Exact zeros are left out of the radius.
    s = Swarm(starts(2), codec="none", robust=True)
    rng = np.random.default_rng(51)
    s.outer_round(rng)
    p0, p1 = s.alg("p0"), s.alg("p1")
    p0.training_done(s.peers["p0"][0].step, s.now)
    port1 = s.peers["p1"][0]
    port1.x -= rng.standard_normal(N).astype(np.float32) * np.float32(0.01)
    port1.step += H
    shares = p1.after_step(port1.step, s.now, ["p0"])
    served = []
    for share in shares:
        p0.receive("p1", decode([bytes(f) for f in encode(share.msg, "p1")])[1], s.now, ["p1"])
    served += [x.msg for x in p0.tick(s.now, ["p1"])]
    deltas = [m.delta for m in served if hasattr(m, "delta")]
    assert deltas and all(not d.any() for d in deltas)
    assert p0.stats["rounds_served"] == 1


def test_a_finished_peer_whose_copy_is_apart_repairs_it_while_it_serves():
    # It finished before the others' rounds ended (a late joiner's, say): serving rounds on a
    # copy apart, it took every outer step on the wrong theta_start and ended far below the
    # others (seen in CI). It pulls the reference's copy like a peer still training.
    s = Swarm(starts(3, apart={0}))
    rng = np.random.default_rng(52)
    p0 = s.alg("p0")
    p0.training_done(s.peers["p0"][0].step, s.now)
    training = ("p1", "p2")
    for _ in range(4):
        for name in training:
            port = s.peers[name][0]
            port.x -= rng.standard_normal(N).astype(np.float32) * np.float32(0.01)
            port.step += H
        s.settle(s.now + 1.0)
        for name in training:
            s.send(name, s.alg(name).after_step(s.peers[name][0].step, s.now, s.others(name)))
        while not all(s.alg(n).may_step(s.peers[n][0].step + 1, s.now) for n in training):
            s.settle(s.now + 0.05)
    s.settle(s.now + 10.0)
    assert p0.stats["rounds_served"] >= 3 and p0.stats["repairs_completed"] == 1
    assert all(s.alg(n).stats["repairs_started"] == 0 for n in training)
    assert agree(s, s.names)
    np.testing.assert_allclose(s.peers["p0"][0].x, p0.outer_parameters, atol=1e-4)  # its model is the swarm's



def test_a_donors_log_follows_its_copy_a_replayed_round_serves_the_swarms_set():
    # As above with SparseLoCo's shares: p2 averaged round 0 without p3's late share, then
    # replayed the others' average. Its log (what a catch-up replays from it) must say so too:
    # round 0 serves all four shares, the late one included, not the set it first took.
    from p2p.averaging.outer_catchup import CatchUpRequest, CatchUpShare
    held = []

    def hold(src, dst, msg):
        if src == "p3" and dst == "p2" and getattr(msg, "round", None) == 0:
            held.append(msg)
            return True
        return False

    s = Swarm(starts(4), codec="sparseloco", drop=hold, timeout_s=2.0)
    rng = np.random.default_rng(11)
    s.outer_round(rng)
    p2 = s.alg("p2")

    def served(alg, round, asker="p9"):
        return alg._mend.log.receive(asker, CatchUpRequest(round, KEY), alg._rounds.round)

    # What it averaged is logged, but not served before the next round's sketches vouch for it
    # (outer_catchup.py, "Only confirmed rounds are served"; asked by p3, which ignores the
    # answer it did not ask for)
    assert p2._mend.log._sealed[0][0] == ("p0", "p1", "p2")
    assert served(p2, 0, asker="p3") == []
    for msg in held:
        p2.receive("p3", msg, s.now, s.others("p2"))
    s.outer_round(rng)
    assert p2.stats["repairs_replayed"] == 1
    out = served(p2, 0)
    assert all(isinstance(x.msg, CatchUpShare) for x in out)
    assert [x.msg.sender for x in out] == ["p0", "p1", "p2", "p3"] and out[0].msg.mixed == ("p0", "p1", "p2", "p3")


def test_a_pulled_state_drops_the_rounds_before_it_from_the_log():
    from p2p.averaging.outer_catchup import CatchUpMissing, CatchUpRequest
    rng = np.random.default_rng(0)
    s = Swarm(starts(4, apart={3}), codec="sparseloco")  # apart from the start: no base, a pull
    for _ in range(4):
        s.outer_round(rng)
    p3 = s.alg("p3")
    assert p3.stats["repairs_completed"] == 1 and p3.stats["catch_ups_started"] == 0
    missing = p3._mend.log.receive("p9", CatchUpRequest(0, KEY), p3._rounds.round)
    assert [type(x.msg) for x in missing] == [CatchUpMissing]  # its round 0 was not the swarm's
    assert s.alg("p0")._mend.log.receive("p9", CatchUpRequest(2, KEY), 4)  # the others' still are


def test_a_round_missed_right_after_a_catch_up_landed_is_mended_by_another_catch_up_not_the_pull(monkeypatch):
    """The lab's case (bench/diloco_repair.py, stop 36): the cut peer's catch-up lands, and the
    round under way then misses its outer step (there, rounds.py's "Overtaken"; here, the link
    cut again at the landing, for the rest of that round). No round agreed since the cut, so the
    only base was the one already tried, and the full pull (4 N bytes, ~24 rounds at 20 Mbit/s)
    mended one round. The landed state is a base (outer_catchup.py, "When"): a second catch-up."""
    rng = np.random.default_rng(0)
    s = Swarm(starts(4), codec="sparseloco", outer_lr=1.0, outer_momentum=0.0)
    cut_and_restore(s, rng, after=0)
    mend = s.alg("p3")._mend
    take = mend.take

    def cut_at_the_landing():
        out = take()
        if out and mend.stats["catch_ups_completed"] == 1 and not s.recut:
            s.cut, s.recut = {"p3"}, True
        return out

    s.recut = False
    monkeypatch.setattr(mend, "take", cut_at_the_landing)
    for _ in range(3):  # the catch-up's last round is served once the donor's next round confirms it
        s.outer_round(rng)
        if s.recut:
            break
    assert s.recut
    s.cut = set()
    for _ in range(5):
        s.outer_round(rng)
    p3 = s.alg("p3").stats
    assert p3["repairs_started"] == p3["repairs_completed"] == 2
    assert p3["catch_ups_completed"] == 2 and p3["repair_bytes"] < N  # the pull alone: 4 N
    assert agree(s, s.names)
