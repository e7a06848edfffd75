"""libzmq 4.3.5 aborts a process whose ROUTER gets a ZMTP PING it cannot answer (a finding, not fixed).

What this shows: a ROUTER whose receive queue is full (``RCVHWM`` reached: the application is
busy) stops reading the connection with bytes already buffered; when the connection then errors
(the peer resets it), libzmq marks the engine ``_io_error``; when the application reads again,
the engine decodes the buffered bytes, and a ZMTP PING among them makes it write the PONG
(``out_event``), which asserts ``!_io_error`` (src/stream_engine_base.cpp:310 in 4.3.5; the same
code on libzmq's master) and aborts the whole process. Every p2p node has such a ROUTER (its
control port) and peers' control connections send PINGs (p2p/net/transport.py, "Dead
connections"), so a node that was too busy to read while a peer reset its connection can be
aborted. In the lab (tests/test_diloco_lab.py, cut and restored links, load 5-11) 1 of 20 runs
lost a node this way. Any peer that can reach the port, swarm key or not (ZMTP is below the
seal), can send PINGs and reset the connection: a remote crash, not only a rare accident.
Raising RCVHWM only makes the queue fill later; not sending PINGs does not stop a hostile one.

Each trial runs in its own process: a ROUTER (``--hwm``) that does not read while a DEALER in a
child process sends messages interleaved with PINGs, then is killed with unread bytes (a reset);
the trial process then reads. Prints how many trials the process survived.

    python bench/zmq_router_abort.py [--trials 6] [--hwm 32]
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
while r.poll(200):
    r.recv_multipart()
print("survived")
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--hwm", type=int, default=32, help="the ROUTER's RCVHWM (p2p's recv_hwm is 32)")
    args = ap.parse_args(argv)
    import zmq

    aborted = 0
    for k in range(args.trials):
        proc = subprocess.run([sys.executable, "-c", TRIAL, str(args.hwm)], capture_output=True, text=True, timeout=60)
        died = proc.returncode != 0
        aborted += died
        print(f"trial {k + 1}: {'aborted: ' + proc.stderr.strip().splitlines()[-1] if died else 'survived'}", flush=True)
    print(f"libzmq {zmq.zmq_version()}: {aborted} of {args.trials} trials aborted (RCVHWM {args.hwm})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
