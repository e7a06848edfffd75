"""Trials for the closes the Transport makes under a flood (p2p/net/control_port.py, "Floods"): can
closing a socket whose connection is mid-flood, with ZMTP PINGs buffered and the peer resetting
it, hit libzmq's ``!_io_error`` assertion and abort the node?

``--side router``: two attackers connect to the node's control port, speak ZMTP by hand and send
messages each followed by a PING, for a random 5-300 ms, then reset (SO_LINGER 0) and connect
again; the flood makes the node rebind its ROUTER over and over. ``--side dealer``: the node
sends to a hostile listener every turn (so it re-dials at once after a close); the listener
floods each connection the same way for 0-200 ms and resets it, and the node closes the flooded
DEALER (its heartbeat every ``--heartbeat-ms``, so a PING of its own is often due). The node is
a child process: an abort shows as its exit status.

    python bench/flood_close_abort.py [--side router|dealer] [--seconds 30] [--heartbeat-ms 20]

On the 2-core dev box, 30 s each: router, 72 rebinds, 240 resets by the two attackers, exit 0
(load 4.4-5.0); dealer with 5 ms heartbeats, 280 DEALERs closed, 150 resets by the listener,
exit 0 (load 5.0-5.3). Earlier runs of the same (scratch) code: router 71 rebinds, 119 resets;
dealer with 20 ms heartbeats 275 closed, 127 resets; all exit 0.
"""

from __future__ import annotations

import argparse
import random
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # p2p, and bench as a package for the child

from p2p.harness.zmtp import PING, frame, hello  # noqa: E402

NODE = """
import json, sys, time
from p2p.net.transport import Transport, TransportConfig
port, seconds, heartbeat_ms, peer = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t = Transport(TransportConfig(heartbeat_ivl_ms=heartbeat_ms), f"127.0.0.1:{port}")
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    now = time.monotonic()
    if peer != "-":
        t.send(peer, [b"x"], now)
    for incoming in t.receive(0.01, now):
        t.done(incoming)
print(json.dumps({"recv_drops": t.recv_drops, "router_rebinds": t.router_rebinds,
                  "dealers_flooded": t.dealers_flooded}), flush=True)
"""

ATTACKER = """
import sys
from bench.flood_close_abort import attack
attack(int(sys.argv[1]), float(sys.argv[2]))
"""


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = sock.recv(n - len(data))
        if not got:
            raise ConnectionResetError("closed")
        data += got
    return data


def _flood_then_reset(sock: socket.socket, socket_type: bytes, seconds: float) -> bool:
    """Greet, send messages each with a PING for ``seconds``, reset; False if the node closed first."""
    chunk = (frame(b"m" * 20) + PING) * 5000
    try:
        sock.settimeout(2.0)
        sock.sendall(hello(socket_type))
        _read(sock, 64)  # its greeting, then its READY
        flags, size = _read(sock, 2)
        _read(sock, size if not flags & 0x02 else int.from_bytes(bytes([size]) + _read(sock, 7), "big"))
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            sock.sendall(chunk)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def attack(port: int, seconds: float) -> None:
    """One attacker on the node's control port (``--side router``)."""
    end, resets, connections = time.monotonic() + seconds, 0, 0
    while time.monotonic() < end:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=1.0)
        except OSError:  # between the ROUTER's close and the new bind
            time.sleep(0.01)
            continue
        connections += 1
        resets += _flood_then_reset(sock, b"DEALER", random.uniform(0.005, 0.3))
    print(f"attacker: {connections} connections, {resets} reset by it", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", choices=("router", "dealer"), default="router")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--heartbeat-ms", type=int, default=20)
    args = ap.parse_args(argv)
    from p2p.net.ports import free_ports

    (port,) = free_ports(1)
    listener = socket.create_server(("127.0.0.1", 0)) if args.side == "dealer" else None
    peer = f"127.0.0.1:{listener.getsockname()[1]}" if listener else "-"
    node = subprocess.Popen([sys.executable, "-c", NODE, str(port), str(args.seconds), str(args.heartbeat_ms), peer],
                            stdout=subprocess.PIPE, text=True)
    attackers = []
    try:
        assert node.stdout.readline().strip() == "ready"
        if listener is None:
            attackers = [subprocess.Popen([sys.executable, "-c", ATTACKER, str(port), str(args.seconds - 1)])
                         for _ in range(2)]
        else:
            listener.settimeout(0.5)
            end, connections, resets = time.monotonic() + args.seconds - 0.5, 0, 0
            while time.monotonic() < end:
                try:
                    sock, _ = listener.accept()
                except socket.timeout:
                    continue
                connections += 1
                resets += _flood_then_reset(sock, b"ROUTER", random.uniform(0.0, 0.2))
            print(f"listener: {connections} connections, {resets} reset by it", flush=True)
        out = node.stdout.read()
        node.wait()
        for a in attackers:
            a.wait()
    finally:
        node.kill()
        for a in attackers:
            a.kill()
    print(f"node exit status {node.returncode} (an abort: -6): {out.strip()}")
    return 0 if node.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
