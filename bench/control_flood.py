"""How the Transport's control port holds up to a flood now that nothing pauses a connection
(p2p/net/control_port.py, "Never pause a connection" and "Floods"): libzmq reads every connection
as fast as it can, and the network thread reads and drops what is over the budget; a flood
faster than that drain makes the node close its ROUTER (with all libzmq queued) and bind a fresh
one. Flooding DEALERs in child processes send messages of ``--size`` bytes as fast as libzmq
lets them; this process runs the receive loop (``receive`` and nothing else: a node also
handles what comes out, at most ``recv_budget`` a connection a turn) and prints, each second,
messages delivered and dropped, ROUTER rebinds and this process's RSS; at the end its peak RSS.

    python bench/control_flood.py [--senders 1] [--size 100] [--seconds 6] [--no-rebind]

On the 2-core dev box (the sender on the same machine), 10 s each: 100-byte messages, 21
rebinds, peak RSS 173 MB (load 3.1-3.4); 1-byte messages, 22 rebinds, peak 81 MB (load 3.1-3.4);
with --no-rebind, 1-byte messages: 365 MB (load 3.4-3.8), 100-byte messages: 490 MB after 5 s
(load 4.8-5.3), growing all along. (Before the receive limits were lifted, RCVHWM 32: 46 MB
throughout.) 64 KiB messages: 7-8k delivered a second, none dropped, RSS flat at 49-50 MB.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from dataclasses import replace

SENDER = """
import sys, zmq
d = zmq.Context().socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0); d.setsockopt(zmq.SNDHWM, 0)
d.connect(sys.argv[1])
payload = b"x" * int(sys.argv[2])
while True:
    d.send(payload)
"""


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", type=int, default=1)
    ap.add_argument("--size", type=int, default=100, help="bytes per message")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--no-rebind", action="store_true", help="never replace the ROUTER (as before it did)")
    args = ap.parse_args(argv)
    from p2p.net.ports import free_ports
    from p2p.net.transport import Transport, TransportConfig

    (port,) = free_ports(1)
    config = TransportConfig()
    if args.no_rebind:
        config = replace(config, router_rebind_turns=sys.maxsize)
    t = Transport(config, f"127.0.0.1:{port}")
    senders = [subprocess.Popen([sys.executable, "-c", SENDER, f"tcp://127.0.0.1:{port}", str(args.size)])
               for _ in range(args.senders)]
    try:
        start = last = time.monotonic()
        delivered = last_delivered = last_drops = 0
        cpu = time.thread_time()
        print(f"start: RSS {rss_mb():.0f} MB", flush=True)
        while time.monotonic() - start < args.seconds:
            now = time.monotonic()
            for incoming in t.receive(0.05, now):
                t.done(incoming)
                delivered += 1
            if now - last >= 1.0:
                print(f"{now - start:4.1f} s: delivered {delivered - last_delivered:6d}/s, dropped "
                      f"{t.recv_drops - last_drops:8d}/s, ROUTER rebinds {t.router_rebinds:3d}, "
                      f"RSS {rss_mb():6.0f} MB", flush=True)
                last, last_delivered, last_drops = now, delivered, t.recv_drops
        print(f"receive loop CPU {time.thread_time() - cpu:.1f} s in {args.seconds:.0f} s; "
              f"{delivered} delivered, {t.recv_drops} dropped, {t.router_rebinds} rebinds; max RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB", flush=True)
    finally:
        for s in senders:
            s.kill()
            s.wait()
        t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
