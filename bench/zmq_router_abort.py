"""libzmq 4.3.5 aborts a process whose ROUTER gets a ZMTP PING it cannot answer; p2p's
Transport no longer can be (fixed in p2p/net/control_port.py, "Never pause a connection").

What this shows: a ROUTER whose receive queue is full (``RCVHWM`` reached: the application is
busy) stops reading the connection with bytes already buffered; when the connection then errors
(the peer resets it), libzmq marks the engine ``_io_error``; when the application reads again,
the engine decodes the buffered bytes, and a ZMTP PING among them makes it write the PONG
(``out_event``), which asserts ``!_io_error`` (src/stream_engine_base.cpp:310 in 4.3.5; the same
code on libzmq's master; issues #3937, #4364, #4767) and aborts the whole process. Every p2p
node has such a ROUTER (its control port) and peers' control connections send PINGs, so a node
that was too busy to read while a peer reset its connection could be aborted (in the lab, 1 of
20 runs of tests/test_diloco_lab.py lost a node this way), and any host that can reach the port
(ZMTP is below the seal) could do it on purpose. The node's DEALERs had the same flaw, worse: a
listener the node dials could flood one (nothing reads it) and reset it, and the DEALER's own
next heartbeat aborted the node (tests/test_transport_no_pause.py does both, deterministically).

The fix: no receive limit on any socket (RCVHWM 0: libzmq never stops a connection's input, so
there is no paused engine to mark broken), and the memory bound kept by reading: every turn the
network thread reads the ROUTER until it is empty, hands the node at most ``recv_budget``
messages per connection, and drops (counts: ``recv_drops``) the rest.

Each trial runs in its own process: a ROUTER that does not read while a DEALER in a child
process sends messages interleaved with PINGs, then is killed with unread bytes (a reset); the
trial process then reads. ``--hwm N``: a bare ROUTER with that RCVHWM (p2p's was 32: aborts
some trials); ``--transport``: p2p's Transport as configured (reads with ``receive``). Prints
how many trials the process survived.

    python bench/zmq_router_abort.py [--trials 6] [--hwm 32 | --transport]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

TRIAL = r'''
import os, signal, subprocess, sys, time, zmq
hwm = int(sys.argv[1])
DEALER = """
import sys, time, zmq
d = zmq.Context().socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0); d.setsockopt(zmq.RCVHWM, 1)
d.setsockopt(zmq.HEARTBEAT_IVL, 10); d.setsockopt(zmq.HEARTBEAT_TIMEOUT, 100000)
d.connect(sys.argv[1])
for i in range(2000):
    d.send(b"x" * 100); time.sleep(0.0005)
print("sent", flush=True)
time.sleep(60)
"""
if hwm < 0:  # p2p's Transport, as the daemon configures it
    from p2p.net.ports import free_ports
    from p2p.net.transport import Transport, TransportConfig
    (port,) = free_ports(1)
    t = Transport(TransportConfig(), f"127.0.0.1:{port}")
    r = t.router
    r.setsockopt(zmq.SNDHWM, 100000)  # (only to fill the child's side below: the test's own doing)
else:
    r = zmq.Context().socket(zmq.ROUTER)
    r.setsockopt(zmq.RCVHWM, hwm); r.setsockopt(zmq.LINGER, 0); r.setsockopt(zmq.SNDHWM, 100000)
    port = r.bind_to_random_port("tcp://127.0.0.1")
child = subprocess.Popen([sys.executable, "-c", DEALER, f"tcp://127.0.0.1:{port}"], stdout=subprocess.PIPE)
child.stdout.readline()
peer = r.recv_multipart()[0]
for _ in range(20000):  # fill the child's side: it never reads, so its kernel keeps unread bytes
    try:
        r.send_multipart([peer, b"y" * 1000], flags=zmq.NOBLOCK)
    except zmq.Again:
        break
time.sleep(2.5)  # PINGs wait behind our stopped input
os.kill(child.pid, signal.SIGKILL)  # closed with unread bytes: a reset
child.wait()
time.sleep(0.5)
if hwm < 0:
    got = 0
    while True:
        batch, drops = t.receive(0.2, time.monotonic()), t.recv_drops
        got += len(batch)
        if not batch and drops == t.recv_drops:
            break
    print(f"survived: {got} delivered, {t.recv_drops} dropped over the budget")
else:
    while r.poll(200):
        r.recv_multipart()
    print("survived")
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--hwm", type=int, default=32, help="a bare ROUTER's RCVHWM (p2p's was 32)")
    ap.add_argument("--transport", action="store_true", help="p2p's Transport instead of a bare ROUTER")
    args = ap.parse_args(argv)
    import zmq

    aborted = 0
    for k in range(args.trials):
        hwm = -1 if args.transport else args.hwm
        proc = subprocess.run([sys.executable, "-c", TRIAL, str(hwm)], capture_output=True, text=True, timeout=60)
        died = proc.returncode != 0
        aborted += died
        said = proc.stdout.strip().splitlines()[-1:] or [""]
        print(f"trial {k + 1}: {'aborted: ' + proc.stderr.strip().splitlines()[-1] if died else said[0]}", flush=True)
    what = "p2p's Transport" if args.transport else f"RCVHWM {args.hwm}"
    print(f"libzmq {zmq.zmq_version()}: {aborted} of {args.trials} trials aborted ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
