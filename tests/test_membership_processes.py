"""Membership with real node processes over real ZeroMQ on loopback (SWIM, `--membership local`)."""

import signal
import socket
import time

import msgpack
import pytest
import zmq

from p2p.gossip.config import MembershipConfig
from p2p.harness.local_swarm import LocalSwarm
from p2p.wire import PROTOCOL_VERSION
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

LOCAL = MembershipConfig.local()
# A crash must be seen by everyone within: a few probe periods to notice the silence, the
# longest (Lifeguard) suspicion timeout, and a few gossip rounds to spread the verdict; plus
# slack for six processes sharing two cores.
DETECTION_BOUND_S = 5 * LOCAL.probe_interval + LOCAL.suspicion_max_timeout_mult * LOCAL.suspicion_mult * LOCAL.probe_interval + 10

# ``--slowdown 8``: each peer sleeps 7/8 of its steps, so six processes leave the two cores to
# the start-ups (torch, ~5 CPU-s each) and to the protocol this file is about.
ARGS = ["--task", "synthetic", "--membership", "local", "--log-every", "0", "--eval-every", "10",
        "--avg-interval", "0.3", "--linger", "-1", "--join-timeout", "60", "--slowdown", "8"]


def views(swarm, peers):
    """addr -> {member addr: state} as each running peer sees it (None if one did not answer)."""
    out = {}
    for i in peers:
        s = swarm.status(i, timeout_s=2.0)
        if s is None:
            return None
        out[swarm.addrs[i]] = {m["addr"]: m["state"] for m in s["members"]}
    return out


def all_see(swarm, peers, addr, states):
    v = views(swarm, peers)
    return v is not None and all(v[swarm.addrs[i]].get(addr) in states for i in peers)


def test_crash_join_and_bootstrap_departure(tmp_path):
    swarm = LocalSwarm(6, tmp_path, ARGS)
    try:
        for i in range(5):
            swarm.start_peer(i, [swarm.addrs[i - 1]] if i else [])
        live = [0, 1, 2, 3, 4]
        wait_until(lambda: (v := views(swarm, live)) and all(
            sum(st == "alive" for st in row.values()) == 5 for row in v.values()), 90,
            what="five peers to see each other alive")

        # 1. SIGKILL one: every other member marks it dead within the bound
        swarm.kill(3, signal.SIGKILL)
        killed_at = time.monotonic()
        live = [0, 1, 2, 4]
        wait_until(lambda: all_see(swarm, live, swarm.addrs[3], {"dead"}), DETECTION_BOUND_S,
                   what="the killed peer to be declared dead by all")
        detection = time.monotonic() - killed_at

        # 2. a newcomer joins through a non-bootstrap member; everyone lists it alive
        joined_at = time.monotonic()
        swarm.start_peer(5, [swarm.addrs[2]])
        live = [0, 1, 2, 4, 5]
        wait_until(lambda: all_see(swarm, live, swarm.addrs[5], {"alive"}), 60,
                   what="the newcomer to be alive everywhere")
        join_time = time.monotonic() - joined_at

        # 3. the bootstrap node leaves; the rest see it go and carry on averaging
        swarm.kill(0, signal.SIGTERM)
        live = [1, 2, 4, 5]
        wait_until(lambda: all_see(swarm, live, swarm.addrs[0], {"left", "dead"}), DETECTION_BOUND_S,
                   what="the bootstrap node's departure to be known")
        before = {i: swarm.status(i)["averaging"]["exchanges_completed"] for i in live}
        wait_until(lambda: all(swarm.status(i)["averaging"]["exchanges_completed"] > before[i] + 3 for i in live),
                   60, what="the survivors to keep averaging")
        v = views(swarm, live)
        assert all(sum(st == "alive" for st in row.values()) == 4 for row in v.values()), v
        print(f"detection {detection:.1f}s (bound {DETECTION_BOUND_S:.1f}s), join {join_time:.1f}s")
    finally:
        codes = swarm.stop()
    assert [codes[i] for i in (1, 2, 4, 5)] == [0, 0, 0, 0]


def test_garbage_and_wrong_version_membership_messages_are_counted(tmp_path):
    from p2p.gossip.messages import Ping
    from p2p.wire import encode

    with LocalSwarm(1, tmp_path, ARGS) as swarm:
        swarm.start()
        wait_until(lambda: swarm.status(0), 60, what="node to answer")
        ping = encode(Ping(seq=1, sender="intruder", target=swarm.addrs[0]), "10.9.9.9:1")
        header = msgpack.unpackb(bytes(ping[0]))
        header[0] = PROTOCOL_VERSION + 1  # a future protocol version
        truncated = bytes(ping[0])[:-2]
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 5000)
        sock.connect(f"tcp://{swarm.addrs[0]}")
        sock.send_multipart([msgpack.packb(header)])
        sock.send_multipart([truncated])
        sock.close()
        status = wait_until(lambda: (s := swarm.status(0)) and sum(s["rejected"].values()) >= 2 and s,
                            30, what="rejections to be counted")
        assert status["rejected"] == {"version": 1, "malformed": 1}
        assert status["phase"] in ("training", "lingering")
        assert swarm.stop() == [0]


def test_a_peer_whose_port_was_taken_before_its_first_start_gets_another_and_joins(tmp_path):
    # LocalSwarm chooses every peer's ports up front, from the ephemeral range; a joiner started
    # late can find them taken by then (here: by us), and would exit at once, "address in use".
    swarm = LocalSwarm(2, tmp_path, ARGS)
    taken = swarm.ports[1]
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", taken))
    squatter.listen(1)
    try:
        with swarm:
            swarm.start_peer(0, [])
            swarm.start_peer(1, [swarm.addrs[0]])
            assert swarm.ports[1] != taken and swarm.addrs[1] == f"127.0.0.1:{swarm.ports[1]}"
            both = wait_until(lambda: (v := views(swarm, [0, 1])) and all(len(m) == 2 for m in v.values()) and v,
                              60, what="both peers to see each other")
            assert both[swarm.addrs[0]][swarm.addrs[1]] == "alive"
            # (a restarted peer keeps its address, which the others know: tests/test_resume.py)
    finally:
        squatter.close()
