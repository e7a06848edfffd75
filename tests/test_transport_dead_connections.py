"""A control connection to a peer that stops answering is dropped and re-dialled, not left to
TCP's backoff (p2p/net/transport.py, "Dead connections"). The peer is a real process, frozen
with SIGSTOP: its kernel still acknowledges every byte, so only the ZMTP heartbeat can tell."""

import os
import signal
import subprocess
import sys
import time

import zmq
import zmq.utils.monitor

from p2p.net.ports import free_ports
from p2p.net.transport import Transport, TransportConfig

PEER = """
import sys, zmq
router = zmq.Context.instance().socket(zmq.ROUTER)
router.bind(sys.argv[1])
print("ready", flush=True)
router.recv_multipart()
print("got", flush=True)
while True:
    router.recv_multipart()
"""


def _events(monitor, until_s):
    """Monitor events until ``until_s`` (monotonic), as (event, seconds since the call)."""
    start, out = time.monotonic(), []
    while time.monotonic() < until_s:
        if monitor.poll(100):
            ev = zmq.utils.monitor.recv_monitor_message(monitor)
            out.append((ev["event"], time.monotonic() - start))
    return out


def test_a_peer_that_stops_answering_loses_its_connection_within_the_heartbeat_timeout():
    own, peer_port = free_ports(2)
    peer = subprocess.Popen([sys.executable, "-c", PEER, f"tcp://127.0.0.1:{peer_port}"], stdout=subprocess.PIPE)
    config = TransportConfig(heartbeat_ivl_ms=200, heartbeat_timeout_ms=1000)
    transport = Transport(config, f"127.0.0.1:{own}")
    try:
        assert peer.stdout.readline().strip() == b"ready"
        addr = f"127.0.0.1:{peer_port}"
        assert transport.send(addr, [b"hello"], time.monotonic())
        monitor = transport._socket(addr).get_monitor_socket()
        assert peer.stdout.readline().strip() == b"got"  # connected, greeted, delivered
        os.kill(peer.pid, signal.SIGSTOP)  # its kernel keeps acknowledging; its ZeroMQ says nothing
        after = _events(monitor, time.monotonic() + 5.0)
        dropped = [t for e, t in after if e == zmq.EVENT_DISCONNECTED]
        assert dropped, f"the connection to a silent peer was kept: {after}"
        assert dropped[0] < 3.0  # heartbeat timeout 1 s, plus one interval and scheduling
        assert zmq.EVENT_CONNECT_RETRIED in [e for e, _ in after] or zmq.EVENT_CONNECTED in [e for e, _ in after]
        # Stop the events first: a closed monitor that is still fed blocks the context's I/O
        # thread once its pipe fills (every later socket of Context.instance() in this process hangs).
        transport._socket(addr).disable_monitor()
        monitor.close()
    finally:
        os.kill(peer.pid, signal.SIGCONT)
        peer.kill()
        peer.wait()
        transport.close()


def test_redial_drops_the_old_connection_and_the_next_send_dials_afresh():
    """Membership asks for a fresh connection to a member it held unreachable (``Send.fresh``):
    the old one may sit in TCP's backoff. A ROUTER names each connection by its own routing id,
    so a new id on the peer's side proves the message came on a new connection."""
    own, peer_port = free_ports(2)
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{peer_port}")
    transport = Transport(TransportConfig(), f"127.0.0.1:{own}")
    addr = f"127.0.0.1:{peer_port}"
    try:
        assert router.poll(0) == 0
        assert transport.send(addr, [b"one"], time.monotonic())
        assert router.poll(5000)
        first, body = router.recv_multipart()
        assert body == b"one"
        transport.redial(addr)
        transport.redial("127.0.0.1:1")  # a peer with no sockets: nothing to close, not counted
        assert transport.redials == 1 and transport.peer_sockets == 0
        assert transport.send(addr, [b"two"], time.monotonic())
        assert router.poll(5000)
        second, body = router.recv_multipart()
        assert body == b"two" and second != first
    finally:
        transport.close()
        router.close(linger=0)
