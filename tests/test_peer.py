"""The composed Peer: routing, merged deadlines, and the memoised neighbour list."""

from __future__ import annotations

import random

import pytest

from p2p.averaging.base import AveragingConfig
from p2p.averaging.registry import make_averager
from p2p.gossip import ALIVE, Gossip, Membership, MembershipConfig
from p2p.peer import Peer
from p2p.protocol import RemoteProtocolError
from p2p.sim.avg_port import ArrayPort
from p2p.topology import get_topology


class CountingTopology:
    def __init__(self, name):
        self.fn, self.calls = get_topology(name), 0

    def __call__(self, me, members, round=0):
        self.calls += 1
        return self.fn(me, members, round)


def make_peer(topology="one-peer-exponential", algorithm="sgp", n=8):
    addrs = [f"h:{i}" for i in range(n)]
    m = Membership(MembershipConfig.local(), "n0", addrs[0], random.Random(0), 0.0)
    m.restore([(ALIVE, f"n{i}", a, 0) for i, a in enumerate(addrs)], 0.0)
    m.start([], 0.0)
    avg = make_averager(algorithm, AveragingConfig(), ArrayPort([0.0, 0.0]), random.Random(0), 0.0)
    topo = CountingTopology(topology)
    return Peer(addrs[0], m, avg, topo), topo


def test_neighbours_are_memoised_on_table_version_and_round():
    peer, topo = make_peer()
    first = peer.neighbours()
    assert first == ["h:1"] and peer.neighbours() == first and topo.calls == 1
    first.append("mutated")  # callers get a copy
    assert peer.neighbours() == ["h:1"]
    peer.averager.after_step(1, 0.0, peer.neighbours())  # SGP's round moves on
    assert peer.neighbours() == ["h:2"] and topo.calls == 2
    version = peer.membership.version
    peer.receive("h:1", Gossip("n1", ((ALIVE, "n9", "h:9", 0, ""),)), 0.1)  # a new member
    assert peer.membership.version > version
    peer.neighbours()
    peer.neighbours()
    assert topo.calls == 3  # recomputed once for the new table, then memoised again


def test_version_is_read_only_and_bumps_on_every_change():
    peer, _ = make_peer()
    m = peer.membership
    with pytest.raises(AttributeError):
        m.version = 0
    v = m.version
    m.receive("h:1", Gossip("n1", ((ALIVE, "n1", "h:1", 3, ""),)), 0.1)
    assert m.version == v + 1


def test_peer_routes_by_type_and_refuses_strangers():
    peer, _ = make_peer(topology="ring", algorithm="dpsgd")
    assert peer.receive("h:1", Gossip("n1", ()), 0.0) == []
    with pytest.raises(RemoteProtocolError, match="unexpected"):
        peer.receive("h:1", object(), 0.0)
    assert peer.next_deadline() == min(peer.membership.next_deadline(), peer.averager.next_deadline())
