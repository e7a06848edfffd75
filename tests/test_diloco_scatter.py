"""DiLoCo's reduce-scatter outer round (p2p/averaging/outer_scatter.py): slicing and ownership,
bytes per peer, and what a missing contributor, a missing owner or a cut link leave behind.
Peers driven by hand, every message through p2p.wire (no sockets)."""

import random
from collections import deque

import numpy as np
import pytest

from p2p.averaging.base import AveragingConfig
from p2p.averaging.diloco import DiLoCo, DiLoCoConfig, OuterShare
from p2p.averaging.outer_scatter import OuterGather, OuterSlice, Plan, hold, slice_bounds
from p2p.compression import make_compressor
from p2p.compression.messages import compressed_fields
from p2p.config import SettingError, swarm_config
from p2p.protocol import LocalProtocolError, RemoteProtocolError
from p2p.sim.avg_port import ArrayPort
from p2p.wire import decode, encode

ADDRS = [f"10.0.0.{i}:7000" for i in range(1, 5)]  # sorted: slice k belongs to ADDRS[k]


class Swarm:
    """N DiLoCo peers on a full graph, one outer step per inner step (H = 1), outer lr 1 and no
    momentum (so theta_start' = theta_start - average Delta). Every send is encoded and decoded
    by p2p.wire and its bytes counted for its sender; ``drop(src, to, msg)`` loses one."""

    def __init__(self, n=4, numel=1000, codec="none", reduce_scatter=True, seed=0):
        self.rng = np.random.default_rng(seed)
        self.start = self.rng.normal(size=numel).astype(np.float32)
        config = AveragingConfig(compression=codec, round_timeout_s=5.0, robust_mixing=False)
        options = DiLoCoConfig(inner_steps=1, reduce_scatter=reduce_scatter, outer_lr=1.0, outer_momentum=0.0)
        self.addrs = ADDRS[:n]
        self.peers = {}
        for i, a in enumerate(self.addrs):
            port = ArrayPort(self.start, f"m/{numel}", immediate=True)
            self.peers[a] = DiLoCo(config, port, random.Random(i), 0.0, options)
            self.peers[a].self_addr = a
        self.bytes = dict.fromkeys(self.addrs, 0)
        self.now = 0.0
        self.views = {}  # peer -> its neighbours, where it does not see all the others

    def neighbours(self, a):
        return self.views.get(a, [b for b in self.addrs if b != a])

    def outer_round(self, drop=lambda src, to, msg: False, late=(), before_late=lambda: None):
        """Every peer takes an inner step (Delta = a random vector) and the outer round runs to
        its end (past every deadline when messages are lost). Returns {peer: its Delta}. The
        ``late`` peers step only after the others' messages were delivered (``before_late()``
        runs just before they do)."""
        queue, deltas = deque(), {}
        for group in ([a for a in self.addrs if a not in late], list(late)):
            if group and group[0] in late:
                while queue:  # the others' slices reach the late peers before they begin the round
                    src, to, msg = queue.popleft()
                    self._post(to, self.peers[to].receive(src, msg, self.now, self.neighbours(to)), queue, drop)
                before_late()
            for a in group:
                p = self.peers[a]
                deltas[a] = self.rng.normal(size=p.port.numel).astype(np.float32)
                p.port.x -= deltas[a]
                p.port.step += 1
                self._post(a, p.after_step(p.port.step, self.now, self.neighbours(a)), queue, drop)
        for _ in range(50):
            while queue:
                src, to, msg = queue.popleft()
                self._post(to, self.peers[to].receive(src, msg, self.now, self.neighbours(to)), queue, drop)
            for a, p in self.peers.items():
                self._post(a, p.tick(self.now, self.neighbours(a)), queue, drop)
            if not queue and not any(p.next_deadline() <= self.now for p in self.peers.values()):
                if not any(p.busy() for p in self.peers.values()):
                    return deltas
                self.now = min(p.next_deadline() for p in self.peers.values())  # the next timer
        raise AssertionError("the round never ended")

    def _post(self, src, sends, queue, drop):
        for s in sends:
            frames = [bytes(f) for f in encode(s.msg, src)]
            self.bytes[src] += sum(map(len, frames))
            if not drop(src, s.to, s.msg):
                queue.append((src, s.to, decode(frames)[1]))

    def starts(self):
        return {a: p.outer_parameters for a, p in self.peers.items()}


def owner(msg):
    return msg.members[msg.index]


# -- slicing and ownership (pure) ------------------------------------------------------------

def test_slices_cover_the_vector_once_and_every_peer_cuts_it_alike():
    for numel, n in ((10, 3), (7, 7), (5, 8), (100_003, 4)):
        bounds = slice_bounds(numel, n)
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(b[1] == c[0] for b, c in zip(bounds, bounds[1:]))
        assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
    plans = [Plan.of(a, random.Random(i).sample(ADDRS, 4), 1000) for i, a in enumerate(ADDRS)]
    assert {p.members for p in plans} == {tuple(ADDRS)}  # the order the views come in is irrelevant
    assert [p.index for p in plans] == [0, 1, 2, 3]  # slice k belongs to the k-th sorted member


def test_hold_restores_the_skipped_ranges_only():
    new, old = np.arange(6, dtype=np.float32), -np.ones(6, dtype=np.float32)
    hold([(1, 3)], (new, old))
    assert new.tolist() == [0, -1, -1, 3, 4, 5]
    hold([(4, 6)], (new, 0.0))
    assert new.tolist() == [0, -1, -1, 3, 0, 0]


# -- bytes per peer ---------------------------------------------------------------------------

@pytest.mark.parametrize("codec", ["none", "int8"])
def test_a_four_peer_round_sends_two_n_minus_one_over_n_models_per_peer_instead_of_n_minus_one(codec):
    numel = 100_000
    sent = {}
    for rs in (False, True):
        swarm = Swarm(numel=numel, codec=codec, reduce_scatter=rs)
        swarm.outer_round()
        sent[rs] = swarm.bytes
    payload = numel * 4 if codec == "none" else numel + 4 * numel // 256  # int8: a byte and a scale per block
    for a in ADDRS:
        # all-to-all: N - 1 = 3 models; reduce-scatter: 2 (N - 1) / N = 1.5 models, plus headers
        # (a 256-float sketch per phase-1 message, addresses) of a few kB
        assert 3 * payload <= sent[False][a] <= 3 * payload + 6 * 2048, sent
        assert 1.5 * payload <= sent[True][a] <= 1.5 * payload + 6 * 2048, sent
    print(codec, {a: round(sent[True][a] / sent[False][a], 4) for a in ADDRS})


# -- the outer step ---------------------------------------------------------------------------

def test_every_copy_takes_the_exact_average_as_the_all_to_all_round_does():
    swarm, reference = Swarm(), Swarm(reduce_scatter=False)
    for _ in range(3):
        deltas = swarm.outer_round()
        reference.outer_round()
        starts = swarm.starts()
        for a in ADDRS:
            np.testing.assert_allclose(starts[a], reference.starts()[a], atol=1e-5)
            np.testing.assert_array_equal(starts[a], starts[ADDRS[0]])  # one owner's numbers: bit-equal
            np.testing.assert_allclose(swarm.peers[a].port.x, starts[a], atol=1e-6)  # x + (start - x)
        expected = swarm.start - np.mean(list(deltas.values()), axis=0)
        swarm.start = starts[ADDRS[0]].copy()
        np.testing.assert_allclose(starts[ADDRS[0]], expected, atol=1e-5)
    stats = swarm.peers[ADDRS[0]].stats
    assert stats["scatter_rounds"] == 3 and stats["scatter_slices_skipped"] == 0 and stats["outer_steps"] == 3


def test_int8_copies_agree_bit_for_bit_and_track_the_exact_average():
    swarm, exact = Swarm(codec="int8", seed=1), Swarm(seed=1)
    swarm.outer_round()
    exact.outer_round()
    starts = swarm.starts()
    for a in ADDRS:
        np.testing.assert_array_equal(starts[a], starts[ADDRS[0]])
    assert np.abs(starts[ADDRS[0]] - exact.starts()[ADDRS[0]]).max() < 0.05


def test_a_missing_contributor_is_left_out_of_its_slice_on_every_peer_alike():
    swarm = Swarm()
    lost = lambda src, to, msg: isinstance(msg, OuterSlice) and src == ADDRS[3] and to == ADDRS[0]
    start = swarm.start.copy()
    deltas = swarm.outer_round(drop=lost)
    starts = swarm.starts()
    for a in ADDRS:
        np.testing.assert_array_equal(starts[a], starts[ADDRS[0]])  # the copies stay equal
    lo, hi = slice_bounds(1000, 4)[0]
    # slice 0: the average of the three Deltas its owner got (it said whose); the rest: all four
    np.testing.assert_allclose(starts[ADDRS[0]][lo:hi], (start - np.mean([deltas[a] for a in ADDRS[:3]], axis=0))[lo:hi],
                               atol=1e-5)
    np.testing.assert_allclose(starts[ADDRS[0]][hi:], (start - np.mean(list(deltas.values()), axis=0))[hi:], atol=1e-5)
    assert swarm.peers[ADDRS[0]].stats["scatter_contributors_missing"] == 1


def test_a_missing_owner_leaves_its_slice_unstepped_on_every_peer_that_lacks_it():
    # the owner of slice 2 dies after phase 1: nobody gets its averaged slice
    swarm = Swarm()
    dead = ADDRS[2]
    lost = lambda src, to, msg: isinstance(msg, OuterGather) and owner(msg) == dead
    start = swarm.start.copy()
    deltas = swarm.outer_round(drop=lost)
    lo, hi = slice_bounds(1000, 4)[2]
    live = [a for a in ADDRS if a != dead]
    for a in live:
        s, peer = swarm.starts()[a], swarm.peers[a]
        np.testing.assert_array_equal(s, swarm.starts()[live[0]])
        np.testing.assert_array_equal(s[lo:hi], start[lo:hi])  # no outer step on the slice ...
        np.testing.assert_array_equal(peer.port.x[lo:hi], (start - deltas[a])[lo:hi])  # ... its progress kept
        np.testing.assert_allclose(s[:lo], (start - np.mean(list(deltas.values()), axis=0))[:lo], atol=1e-5)
        assert peer.stats["scatter_slices_skipped"] == 1
    # the next round's Delta (theta_start - x) carries that progress again: nothing is lost
    assert np.allclose((swarm.peers[live[0]].outer_parameters - swarm.peers[live[0]].port.x)[lo:hi],
                       deltas[live[0]][lo:hi])


def test_a_cut_link_is_bridged_by_a_relay_and_the_copies_stay_equal():
    swarm = Swarm()
    cut = {ADDRS[0], ADDRS[1]}
    lost = lambda src, to, msg: {src, to} == cut
    for _ in range(2):
        swarm.outer_round(drop=lost)
        starts = swarm.starts()
        for a in ADDRS:
            np.testing.assert_array_equal(starts[a], starts[ADDRS[0]])
    stats = [swarm.peers[a].stats for a in ADDRS]
    assert sum(s["scatter_relayed"] for s in stats) >= 4  # both gathers across the cut, each round
    assert sum(s["scatter_slices_skipped"] for s in stats) == 0
    assert sum(s["scatter_contributors_missing"] for s in stats) == 4  # 0 lacks 1's slice and 1 lacks 0's


# -- wire validation --------------------------------------------------------------------------

def gather_msg(numel=250, **kw):
    fields = dict(round=0, model_key="m/1000", members=tuple(ADDRS), index=1, included=tuple(ADDRS))
    fields.update(kw)
    return OuterGather(**compressed_fields(make_compressor("none").compress(np.ones(numel, np.float32))), **fields)


@pytest.mark.parametrize("msg, reason", [
    (gather_msg(numel=249), "bad_tensor"),
    (gather_msg(members=tuple(reversed(ADDRS))), "bad_value"),  # unsorted
    (gather_msg(members=(ADDRS[0],) * 4), "bad_value"),  # not unique
    (gather_msg(index=4), "bad_value"),
    (gather_msg(included=("9.9.9.9:1",)), "bad_value"),  # not a member
    (gather_msg(model_key="m/999"), "wrong_model"),
])
def test_malformed_gathers_are_refused(msg, reason):
    swarm = Swarm()
    msg = decode([bytes(f) for f in encode(msg, ADDRS[1])])[1]
    with pytest.raises(RemoteProtocolError) as e:
        swarm.peers[ADDRS[0]].receive(ADDRS[1], msg, 0.0, ADDRS[1:])
    assert e.value.reason == reason


def test_late_gathers_are_counted_and_dropped_and_the_other_round_kind_is_refused():
    swarm = Swarm()
    swarm.outer_round()
    peer = swarm.peers[ADDRS[0]]
    assert peer.receive(ADDRS[1], gather_msg(round=0), 1.0, ADDRS[1:]) == [] and peer.stats["scatter_late"] == 1
    assert peer.receive(ADDRS[1], gather_msg(round=100), 1.0, ADDRS[1:]) == [] and peer.stats["scatter_overflow"] == 1
    assert peer._scatter._got == {}  # neither kept
    share = OuterShare(0, 0, 3, "m/1000", np.empty(0, np.float32), np.zeros(1000, np.float32),
                       np.zeros(peer._positions.size, np.float32), np.empty(0, np.float32))
    with pytest.raises(RemoteProtocolError, match="reduce-scatter"):
        peer.receive(ADDRS[1], share, 1.0, ADDRS[1:])
    plain = Swarm(reduce_scatter=False).peers[ADDRS[0]]
    with pytest.raises(RemoteProtocolError, match="reduce-scatter"):
        plain.receive(ADDRS[1], gather_msg(), 1.0, ADDRS[1:])


def test_a_slice_cut_for_another_member_set_is_counted_and_not_mixed():
    swarm = Swarm()
    peer = swarm.peers[ADDRS[0]]
    three = tuple(ADDRS[:3])  # the sender does not know the fourth peer yet
    q = compressed_fields(make_compressor("none").compress(np.ones(333, np.float32)))
    msg = OuterSlice(**q, round=0, step=1, degree=2, model_key="m/1000", sketch=np.zeros(peer._positions.size, np.float32),
                     mixed=(), inner_steps=0, members=three, index=0)
    # before we begin the round, it is kept with its vote: one for three peers, ours for four
    assert peer.receive(ADDRS[1], msg, 0.0, ADDRS[1:]) == []
    assert peer.stats["scatter_view_mismatch"] == 0 and peer._rounds.buffered() == [0]
    peer.port.step += 1
    peer.after_step(1, 0.0, ADDRS[1:])  # a tie: our view, the four of us, and the slice is dropped
    assert peer._scatter._plans[0].members == tuple(ADDRS)
    assert peer.stats["scatter_view_mismatch"] == 1 and ADDRS[1] not in peer._rounds._inbox.get(0, {})
    # once we began, a slice cut for another set is dropped at once
    assert peer.receive(ADDRS[2], msg, 0.0, ADDRS[1:]) == []
    assert peer.stats["scatter_view_mismatch"] == 2 and ADDRS[2] not in peer._rounds._inbox.get(0, {})


def peer_0_late_with_a_partial_view(sees_all_when_it_begins: bool):
    """Round 0 with peer 0 seeing only peer 1, the others' slices reaching it before it begins
    (the start-up race of tests/test_diloco_scatter_real.py); with ``sees_all_when_it_begins``
    it sees peer 2 too by then. Every peer must mix all three Deltas, nothing dropped."""
    swarm = Swarm(n=3)
    swarm.views[ADDRS[0]] = [ADDRS[1]]
    start = swarm.start.copy()
    deltas = swarm.outer_round(late=[ADDRS[0]],
                               before_late=swarm.views.clear if sees_all_when_it_begins else lambda: None)
    assert swarm.peers[ADDRS[0]]._scatter._plans[0].members == tuple(swarm.addrs)
    stats = [swarm.peers[a].stats for a in swarm.addrs]
    assert [s["scatter_view_mismatch"] for s in stats] == [0, 0, 0]
    assert [s["scatter_slices_skipped"] for s in stats] == [0, 0, 0]
    starts = swarm.starts()
    for a in swarm.addrs:
        np.testing.assert_array_equal(starts[a], starts[ADDRS[0]])
    np.testing.assert_allclose(starts[ADDRS[0]], start - np.mean(list(deltas.values()), axis=0), atol=1e-5)


def test_a_peer_that_hears_from_the_others_before_it_knows_them_all_takes_their_set():
    # peer 0 is still waiting for --min-members when the others' slices come; by the time it
    # begins the round it sees peer 2 too. The round's set is settled then, not at the first slice.
    peer_0_late_with_a_partial_view(sees_all_when_it_begins=True)


def test_a_peer_that_begins_before_it_knows_them_all_takes_the_set_most_slices_were_cut_for():
    # peer 0 still sees only peer 1 when it begins round 0: the others' two slices vote for the
    # three of us, its own view for two; peer 2 is a member it has not heard of yet
    peer_0_late_with_a_partial_view(sees_all_when_it_begins=False)


# -- settings ---------------------------------------------------------------------------------

def test_the_setting_takes_the_dense_codecs_and_one_gossip_round():
    assert swarm_config(algorithm="diloco", diloco_reduce_scatter=True, compression="int4").options.reduce_scatter
    with pytest.raises(SettingError, match="dense codecs"):
        swarm_config(algorithm="diloco", diloco_reduce_scatter=True, compression="sparseloco")
    with pytest.raises(SettingError, match="gossip_rounds 1"):
        swarm_config(algorithm="diloco", diloco_reduce_scatter=True, diloco_gossip_rounds=2)
    with pytest.raises(SettingError, match="needs --topology full"):
        swarm_config(algorithm="diloco", diloco_reduce_scatter=True, topology="ring")
    with pytest.raises(LocalProtocolError, match="dense codecs"):
        DiLoCo(AveragingConfig(compression="sparseloco"), ArrayPort(np.zeros(8)), random.Random(0), 0.0,
               DiLoCoConfig(reduce_scatter=True))


def test_the_setting_comes_from_a_config_file_too(tmp_path):
    import typing

    from p2p.cli.sources import merge
    from p2p.cli.start import start

    path = tmp_path / "swarm.toml"
    path.write_text('algorithm = "diloco"\ndiloco_reduce_scatter = true\ncompression = "int4"\n')
    values = merge({}, typing.get_type_hints(start), str(path), environ={}).values
    assert swarm_config(**values).options.reduce_scatter
