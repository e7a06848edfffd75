"""State-machine tests: a handful of Membership objects driven by hand with explicit `now`.

The little driver below delivers messages instantly (through the real wire codec) and runs each
member's tick() when its next_deadline() comes; `down` addresses neither receive nor tick.
"""

from __future__ import annotations

import random

import pytest

from p2p.gossip import (
    ALIVE, DEAD, LEFT, SUSPECT, Ack, Gossip, Membership, MembershipConfig, Nack, Ping, PingReq, PushPull,
)
from p2p.protocol import LocalProtocolError, RemoteProtocolError, Send
from p2p.wire import decode, encode

CFG = MembershipConfig.lan()


class Net:
    def __init__(self, cfg: MembershipConfig = CFG) -> None:
        self.cfg = cfg
        self.nodes: dict[str, Membership] = {}
        self.down: set[str] = set()
        self.log: list[tuple[str, str, object]] = []
        self.timed: list[tuple[float, str, object]] = []  # (when, from, message)
        self.fresh: list[tuple[str, str, object]] = []  # the sends asked to go on a fresh connection
        self.now = 0.0
        self.groups: dict[str, int] = {}  # partition: addresses in different groups cannot talk

    def add(self, node_id: str, seeds=(), incarnation: int = 0) -> Membership:
        m = Membership(self.cfg, node_id, f"{node_id}:7946", random.Random(node_id), self.now, incarnation)
        self.nodes[m.addr] = m
        self.deliver(m.addr, m.start([f"{s}:7946" for s in seeds], self.now))
        return m

    def deliver(self, src: str, sends: list[Send]) -> None:
        queue = [(src, s) for s in sends]
        while queue:
            src, s = queue.pop(0)
            self.log.append((src, s.to, s.msg))
            self.timed.append((self.now, src, s.msg))
            if s.fresh:
                self.fresh.append((src, s.to, s.msg))
            dst = self.nodes.get(s.to)
            if dst is None or s.to in self.down or src in self.down:
                continue
            if self.groups.get(src, 0) != self.groups.get(s.to, 0):
                continue
            wire_src, msg = decode(encode(s.msg, src))
            queue.extend((s.to, r) for r in dst.receive(wire_src, msg, self.now))

    def run_until(self, t_end: float) -> None:
        while True:
            live = [m for a, m in self.nodes.items() if a not in self.down]
            t = min(m.next_deadline() for m in live)
            if t > t_end:
                self.now = t_end
                return
            self.now = t
            for m in live:
                if m.next_deadline() <= t:
                    sends = m.tick(t)
                    assert m.next_deadline() > t  # (a reply it then receives may bring it back to t)
                    self.deliver(m.addr, sends)

    def gossip_times(self, src: str) -> list[float]:
        return [t for t, s, m in self.timed if s == src and type(m) is Gossip]

    def sent(self, kind, src=None, dst=None):
        return [(s, d, m) for s, d, m in self.log if type(m) is kind
                and (src is None or s == src) and (dst is None or d == dst)]


def state(m: Membership, node_id: str):
    row = m.member(node_id)
    return None if row is None else (row.state, row.incarnation)


def cluster(n: int, cfg: MembershipConfig = CFG) -> tuple[Net, list[Membership]]:
    net = Net(cfg)
    first = net.add("a")
    nodes = [first] + [net.add(chr(ord("a") + i), seeds=["a"]) for i in range(1, n)]
    net.run_until(10.0)
    for m in nodes:
        assert len(m.alive()) == n - 1, m.node_id
    return net, nodes


def test_first_member_is_joined_at_once():
    net = Net()
    a = net.add("a")
    assert a.joined and net.log == []
    assert [(r.id, r.state) for r in a.table()] == [("a", "alive")]
    assert a.alive() == []


def test_join_through_seed():
    net = Net()
    a = net.add("a")
    b = net.add("b", seeds=["a"])
    assert b.joined
    joins = net.sent(PushPull, src="b:7946")
    assert joins and joins[0][2].join and joins[0][2].reply
    assert [(r.id, r.state) for r in a.alive()] == [("b", "alive")]
    assert [(r.id, r.addr, r.state, r.incarnation) for r in b.alive()] == [("a", "a:7946", "alive", 0)]
    assert b.member("a").last_heard == 0.0
    assert a.member("b").last_heard == 0.0


def test_join_retries_with_exponential_backoff_until_a_seed_answers():
    net = Net()
    net.down.add("a:7946")
    a = net.add("a")
    b = net.add("b", seeds=["a"])
    assert not b.joined
    net.run_until(20.0)
    attempts = [m for s, d, m in net.sent(PushPull, src="b:7946") if m.join]
    assert len(attempts) == 5  # at 0 s, then retries 1, 2, 4 and 8 s apart: 1, 3, 7, 15 s
    assert b.stats["join_attempts"] == 5
    net.down.clear()
    net.run_until(40.0)  # the next retry (16 s later, capped at 30 s) gets through
    assert b.joined and a.member("b").state == "alive"


def test_join_via_a_non_seed_member_reaches_everyone():
    net, (a, b) = cluster(2)
    c = net.add("c", seeds=["b"])  # a is not c's seed
    net.run_until(15.0)
    assert [r.id for r in a.alive()] == ["b", "c"]
    assert [r.id for r in c.alive()] == ["a", "b"]


def test_a_chain_launched_together_knows_everyone_before_the_first_gossip_tick():
    # Nodes launched together, each joining the one before (the lab, LocalSwarm): a member waits
    # for --min-members before its first step, so a join's news must not wait a gossip tick per
    # hop. One tick (0.2 s on lan) is the bound; instant delivery makes it all happen at t = 0.
    net = Net()
    nodes = [net.add("a")] + [net.add(chr(ord("a") + i), seeds=[chr(ord("a") + i - 1)]) for i in range(1, 5)]
    net.run_until(CFG.gossip_interval / 2)
    assert all(m.num_live() == 5 for m in nodes), [m.num_live() for m in nodes]
    # Joins through one member, 10 ms apart, still share gossip rounds: one now, then at most one
    # per JOIN_GOSSIP_GAP of the interval (rounds at 0, 0.05 and 0.1 s here, not one per join).
    hub = Net()
    seed = hub.add("a")
    for i in range(9):
        hub.run_until(i * 0.01)
        hub.add(f"j{i}", seeds=["a"])
    hub.run_until(0.1)
    rounds = sorted({round(t, 3) for t in hub.gossip_times("a:7946")})
    assert rounds == [0.0, 0.05, 0.1], rounds
    assert seed.num_live() == 10


def test_probe_gets_ack_and_no_suspicion():
    net, (a, b, c) = cluster(3)
    net.log.clear()
    net.run_until(20.0)
    pings = net.sent(Ping, src="a:7946")
    acks = net.sent(Ack, dst="a:7946")
    assert len(pings) >= 9 and len(acks) == len(pings)
    assert {m.seq for _, _, m in pings} == {m.seq for _, _, m in acks}
    assert not net.sent(PingReq)
    assert a.stats.get("suspected", 0) == 0 and a.local_health() == 0


def test_missed_ack_then_ping_req_then_suspect_then_dead():
    net, nodes = cluster(4)
    a, b, c, d = nodes
    net.down.add("d:7946")  # d crashes
    net.log.clear()
    t0 = net.now
    # run until a's own probe of d has failed (b or c may have suspected d first)
    while not net.sent(PingReq, src="a:7946") or a.stats.get("probe_failures", 0) == 0:
        net.run_until(net.now + 0.05)
        assert net.now < t0 + 10
    reqs = net.sent(PingReq, src="a:7946")
    seq = reqs[0][2].seq
    assert {m.target for _, _, m in reqs} == {"d"} and all(m.seq == seq for _, _, m in reqs)
    assert [m for _, _, m in net.sent(Ping, src="a:7946", dst="d:7946") if m.seq == seq]
    helpers = {dst for _, dst, _ in reqs}
    assert helpers == {"b:7946", "c:7946"}
    nacks = [(s, m) for s, _, m in net.sent(Nack, dst="a:7946") if m.seq == seq]
    assert {s for s, _ in nacks} == helpers  # Lifeguard: helpers say they got nothing either
    assert a.local_health() == 0  # every helper answered: our own links are fine
    assert state(a, "d") == ("suspect", 0)
    assert [r.id for r in a.alive()] == ["b", "c", "d"]  # suspects still count as alive
    net.run_until(net.now + 30.0)  # min suspicion timeout is 4 s here, max 24 s
    for m in (a, b, c):
        assert state(m, "d") == ("dead", 0)
        assert [r.id for r in m.alive()] == sorted({"b", "c", "a"} - {m.node_id})


def test_suspect_refutes_with_higher_incarnation():
    net, (a, b, c) = cluster(3)
    # c tells a that b is suspect at incarnation 0
    net.deliver("c:7946", [Send("a:7946", Gossip("c", ((SUSPECT, "b", "b:7946", 0, "c"),)))])
    assert state(a, "b") == ("suspect", 0)
    while b.incarnation == 0:  # gossip reaches b, which refutes
        net.run_until(net.now + 0.01)
    assert b.local_health() == 1  # having to refute counts against our own health
    net.run_until(net.now + 3.0)  # its alive@1 spreads
    assert b.incarnation == 1 and b.stats["false_suspicions_refuted"] == 1
    assert state(a, "b") == ("alive", 1) and state(c, "b") == ("alive", 1)


def test_ping_to_a_suspect_carries_the_suspicion_and_the_ack_the_refutation():
    net, (a, b, c) = cluster(3)
    net.deliver("c:7946", [Send("a:7946", Gossip("c", ((SUSPECT, "b", "b:7946", 0, "c"),)))])
    net.down |= {"b:7946", "c:7946"}  # b hears nothing for now; only a probes
    net.log.clear()
    assert state(a, "b") == ("suspect", 0)
    while not net.sent(Ping, src="a:7946", dst="b:7946"):
        net.run_until(net.now + 0.05)
    ping = net.sent(Ping, src="a:7946", dst="b:7946")[0][2]
    assert ping.updates[0] == (SUSPECT, "b", "b:7946", 0, "a")  # Lifeguard buddy system
    assert sum(u[1] == "b" for u in ping.updates) == 1
    net.down.clear()
    (reply,) = b.receive("a:7946", ping, net.now)
    assert type(reply.msg) is Ack and (ALIVE, "b", "b:7946", 1, "") in reply.msg.updates
    a.receive("b:7946", reply.msg, net.now)
    assert state(a, "b") == ("alive", 1)


def test_graceful_leave_is_seen_within_one_probe_timeout():
    net, (a, b, c) = cluster(3)
    net.deliver("b:7946", b.leave(net.now))
    # A LEFT is checked like any rumoured death (a Ping b no longer answers), not taken on trust.
    assert state(a, "b") == ("alive", 0) and a.stats["rumours_checked"] == 1
    net.run_until(net.now + CFG.probe_timeout)
    assert state(a, "b") == ("left", 0) and state(c, "b") == ("left", 0)
    assert b.has_left and b.next_deadline() == float("inf") and b.tick(net.now + 5) == []
    assert b.receive("a:7946", Ping(99, "a", "b"), net.now) == []
    assert [r.id for r in a.alive()] == ["c"]
    assert b.leave(net.now) == []


def test_restarted_member_refutes_its_death_and_is_accepted():
    net, (a, b, c) = cluster(3)
    # b crashed long ago and was declared dead at incarnation 3 (after some refutations)
    net.down.add("b:7946")
    net.deliver("c:7946", [Send("a:7946", Gossip("c", ((ALIVE, "b", "b:7946", 3, ""),)))])
    net.deliver("c:7946", [Send("a:7946", Gossip("c", ((DEAD, "b", "b:7946", 3, "c"),)))])
    net.run_until(net.now + CFG.probe_timeout)  # a's own Ping to b goes unanswered: the rumour stands
    assert state(a, "b") == ("dead", 3)
    net.down.discard("b:7946")
    del net.nodes["b:7946"]
    c.leave(net.now)  # keep the picture simple: only a and the new b
    del net.nodes["c:7946"]
    b2 = net.add("b", seeds=["a"])  # same id, incarnation starts at 0 again
    assert b2.incarnation == 4  # a's table said dead@3; b refuted with 4
    net.run_until(net.now + 3.0)
    # (a's probe of the crashed b, still open when b2 came, may cost b2 one more refutation)
    assert state(a, "b") == ("alive", b2.incarnation) and b2.incarnation >= 4
    assert state(b2, "a") == ("alive", 0)


@pytest.mark.parametrize("rumour", [DEAD, LEFT])
def test_a_member_that_answers_is_not_declared_dead_or_left_on_a_rumour(rumour):
    # A hostile member (it may hold the swarm key) says b died or left: a pings b first, b
    # answers, and b stays alive in a's view without having to refute anything.
    net, (a, b, c) = cluster(3)
    lie = (rumour, "b", "b:7946", 0, "c" if rumour == DEAD else "b")
    pings = len(net.sent(Ping, "a:7946", "b:7946"))
    for _ in range(5):  # repeated: one check, and none again while b's answer is fresh
        net.deliver("c:7946", [Send("a:7946", Gossip("c", (lie,)))])
    assert len(net.sent(Ping, "a:7946", "b:7946")) == pings + 1
    net.now += CFG.probe_interval  # a probe interval on, the next lie is checked again
    net.deliver("c:7946", [Send("a:7946", Gossip("c", (lie,)))])
    assert len(net.sent(Ping, "a:7946", "b:7946")) == pings + 2
    net.run_until(net.now + 5 * CFG.probe_timeout)
    assert state(a, "b") == ("alive", 0) and b.incarnation == 0
    assert a.stats["rumours_checked"] == 2 and a.stats["rumours_refuted"] >= 5
    # A pushed table that lists b as left is checked the same way.
    net.deliver("c:7946", [Send("a:7946", PushPull("c", False, False, ((ALIVE, "c", "c:7946", 0),
                                                                        (LEFT, "b", "b:7946", 0))))])
    net.run_until(net.now + 5 * CFG.probe_timeout)
    assert state(a, "b") == ("alive", 0) and a.stats["rumours_checked"] == 3


def test_left_member_can_rejoin_later():
    net, (a, b) = cluster(2)
    net.deliver("b:7946", b.leave(net.now))
    net.run_until(net.now + CFG.probe_timeout)
    assert state(a, "b") == ("left", 0)
    del net.nodes["b:7946"]
    b2 = net.add("b", seeds=["a"])
    net.run_until(net.now + 3.0)
    assert state(a, "b") == ("alive", b2.incarnation) and b2.incarnation >= 1


def test_dead_members_are_retried_then_reaped():
    cfg = MembershipConfig(reconnect_interval=5.0, reconnect_window=60.0, reap_after=120.0)
    net, (a, b) = cluster(2, cfg)
    net.down.add("b:7946")
    net.run_until(net.now + 20.0)
    assert state(a, "b")[0] == "dead"
    net.log.clear()
    net.run_until(net.now + 40.0)
    retries = [m for s, d, m in net.sent(PushPull, src="a:7946", dst="b:7946")]
    assert len(retries) >= 4 and all(m.reply and not m.join for m in retries)
    net.run_until(net.now + 150.0)
    assert a.member("b") is None and a.stats["reaped"] == 1
    assert [r.id for r in a.table()] == ["a"]


def test_views_merge_after_a_partition_heals():
    cfg = MembershipConfig(reconnect_interval=2.0)
    net, nodes = cluster(4, cfg)
    net.groups = {"c:7946": 1, "d:7946": 1}
    net.run_until(net.now + 120.0)
    a, b, c, d = nodes
    assert [state(a, x)[0] for x in "bcd"] == ["alive", "dead", "dead"]
    assert [state(d, x)[0] for x in "abc"] == ["dead", "dead", "alive"]
    net.groups = {}
    net.run_until(net.now + 30.0)
    for m in nodes:
        assert [r.state for r in m.alive()] == ["alive"] * 3, m.node_id


def test_ping_for_another_node_id_is_not_acked():
    net, (a, b) = cluster(2)
    assert b.receive("a:7946", Ping(5, "a", "zz"), net.now) == []
    assert b.stats["ignored_wrong_target"] == 1


@pytest.mark.parametrize("msg, reason", [
    (Ping(1, "b", "b"), "id_conflict"),  # someone else uses our id
    (PingReq(1, "a", "b", "b:7946"), "bad_ping_req"),  # asked to probe ourselves
    (PushPull("z", True, True, ((ALIVE, "a", "a:7946", 0),)), "bad_join"),  # joiner missing itself
    (PushPull("z", True, True, ((DEAD, "z", "z:7946", 0),)), "bad_join"),
])
def test_bad_messages_raise_remote_protocol_error(msg, reason):
    net, (a, b) = cluster(2)
    with pytest.raises(RemoteProtocolError) as err:
        b.receive("a:7946", msg, net.now)
    assert err.value.reason == reason


def test_local_misuse_raises_local_protocol_error():
    m = Membership(CFG, "a", "a:1", random.Random(0), 0.0)
    with pytest.raises(LocalProtocolError):
        m.receive("b:1", Send("x", None), 0.0)
    with pytest.raises(LocalProtocolError):
        m.start("b:1", 0.0)  # a string, not a list of seeds
    m.start([], 0.0)
    with pytest.raises(LocalProtocolError):
        m.start([], 0.0)
    with pytest.raises(LocalProtocolError):
        m.restore([(ALIVE, "b", "b:1", 0)], 0.0)  # only before start
    with pytest.raises(LocalProtocolError):
        Membership(CFG, "", "a:1", random.Random(0), 0.0)
    with pytest.raises(LocalProtocolError):
        Membership(CFG, "a", "a:1", random.Random(0), 0.0, incarnation=-1)


def test_owns_routes_only_membership_messages():
    m = Membership(CFG, "a", "a:1", random.Random(0), 0.0)
    assert m.owns(Ping(1, "b", "a")) and m.owns(Gossip("b", ()))
    assert not m.owns(Send("x", None))


def test_stale_updates_never_lower_incarnations():
    net, (a, b, c) = cluster(3)
    net.deliver("c:7946", [Send("a:7946", Gossip("c", ((ALIVE, "b", "b:7946", 5, ""),)))])
    assert state(a, "b") == ("alive", 5)
    net.deliver("c:7946", [Send("a:7946", Gossip("c", ((ALIVE, "b", "b:7946", 2, ""),
                                                        (SUSPECT, "b", "b:7946", 4, "c"),
                                                        (DEAD, "b", "b:7946", 3, "c"))))])
    assert state(a, "b") == ("alive", 5)
    net.deliver("c:7946", c.leave(net.now))
    net.run_until(net.now + CFG.probe_timeout)
    assert state(a, "c") == ("left", 0)
    net.deliver("b:7946", [Send("a:7946", Gossip("b", ((ALIVE, "c", "c:7946", 0, ""),)))])
    assert state(a, "c") == ("left", 0)  # a stale alive rumour does not resurrect it


def test_restore_preloads_a_table_quietly():
    m = Membership(CFG, "a", "a:1", random.Random(0), 0.0)
    m.restore([(ALIVE, "a", "a:1", 0), (ALIVE, "b", "b:1", 2), (DEAD, "c", "c:1", 0)], 0.0)
    assert m.start([], 0.0) == []
    assert [(r.id, r.incarnation) for r in m.alive()] == [("b", 2)]
    assert m.num_live() == 2


def test_deadlines_always_move_forward_under_random_traffic():
    rng = random.Random(5)
    net, nodes = cluster(5, MembershipConfig.local())
    for _ in range(200):
        if rng.random() < 0.05:
            net.down ^= {rng.choice(sorted(net.nodes))}
        net.run_until(net.now + rng.random() * 0.3)
    for m in nodes:
        assert m.next_deadline() > net.now or m.addr in net.down
        assert m.state_of(m.node_id) == ALIVE

