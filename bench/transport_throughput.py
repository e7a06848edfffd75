"""Transport benchmark: a 64 MiB tensor moved 20 times between two processes over loopback.

Compares, in one run (the machine is shared and noisy, so only ratios within a run count):
- ``tcp``: a plain TCP socket, sendall / recv_into a preallocated buffer (the ceiling);
- ``zmq``: a naive pyzmq zero-copy PUSH/PULL of the raw buffer;
- ``p2p``: our real path: AvgRequest encoded by p2p.wire, sent by p2p.net.transport (its bulk TCP
  stream), received and decoded (all validation, NaN/Inf check included) by the receiver;
- ``sealed``: the same with a swarm key (p2p/net/seal.py: AES-256-GCM records, both ends), and
  its ratio to ``p2p`` (issue 12 asks for >= 0.8 on loopback).

    python bench/transport_throughput.py [--mib 64] [--repeats 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import secrets
import socket
import time

import numpy as np


def _tcp_receiver(port_q, done_q, nbytes, repeats):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(nbytes)
    view = memoryview(buf)
    for _ in range(repeats):
        got = 0
        while got < nbytes:
            n = conn.recv_into(view[got:], nbytes - got)
            if not n:
                raise RuntimeError("sender closed early")
            got += n
    conn.sendall(b"k")
    done_q.put(time.perf_counter())
    conn.close()


def bench_tcp(arr: np.ndarray, repeats: int) -> float:
    port_q, done_q = mp.Queue(), mp.Queue()
    proc = mp.Process(target=_tcp_receiver, args=(port_q, done_q, arr.nbytes, repeats))
    proc.start()
    sock = socket.create_connection(("127.0.0.1", port_q.get()))
    t0 = time.perf_counter()
    for _ in range(repeats):
        sock.sendall(memoryview(arr).cast("B"))
    sock.recv(1)
    elapsed = time.perf_counter() - t0
    sock.close()
    proc.join()
    return arr.nbytes * repeats / elapsed


def _zmq_receiver(port_q, repeats):
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    ack = ctx.socket(zmq.PUSH)
    port_q.put(port)
    ack.connect(f"tcp://127.0.0.1:{port_q.get()}")
    for _ in range(repeats):
        pull.recv(copy=False)
    ack.send(b"k")
    ack.close(linger=1000)
    pull.close()
    ctx.term()


def bench_zmq(arr: np.ndarray, repeats: int) -> float:
    import zmq

    ctx = zmq.Context()
    port_q = mp.Queue()
    proc = mp.Process(target=_zmq_receiver, args=(port_q, repeats))
    proc.start()
    port = port_q.get()
    ack = ctx.socket(zmq.PULL)
    ack_port = ack.bind_to_random_port("tcp://127.0.0.1")
    port_q.put(ack_port)
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(0.2)  # let the connection come up (benchmark only)
    t0 = time.perf_counter()
    for _ in range(repeats):
        push.send(memoryview(arr).cast("B"), copy=False)
    ack.recv()
    elapsed = time.perf_counter() - t0
    push.close(linger=0)
    ack.close()
    proc.join()
    ctx.term()
    return arr.nbytes * repeats / elapsed


def _keyring(key):
    from p2p.net.keyring import Keyring

    return None if key is None else Keyring((key,))


def _p2p_receiver(addr_q, repeats, numel, key):
    from p2p.averaging.adpsgd import AvgRequest
    from p2p.net.transport import Transport, TransportConfig
    from p2p.net.ports import free_ports
    from p2p.wire import DEFAULT_LIMITS, decode, encode

    (port,) = free_ports(1)
    me = f"127.0.0.1:{port}"
    transport = Transport(TransportConfig(), me, _keyring(key))
    addr_q.put(me)
    sender = addr_q.get()
    got = 0
    while got < repeats:
        for incoming in transport.receive(1.0, time.monotonic()):
            assert incoming.error is None, incoming.error
            src, msg = decode(incoming.frames, incoming.limits(DEFAULT_LIMITS))  # as p2p/net/driver.py
            assert isinstance(msg, AvgRequest) and msg.params.shape == (numel,)
            del msg
            transport.done(incoming)
            got += 1
    from p2p.net.control import StatusRequest

    transport.send(sender, encode(StatusRequest(), me), time.monotonic())
    time.sleep(0.5)
    transport.close(linger_s=1.0)


def bench_p2p(arr: np.ndarray, repeats: int, key: bytes | None = None) -> float:
    from p2p.averaging.adpsgd import AvgRequest
    from p2p.net.control import StatusRequest  # noqa: F401 (registers the receiver's "done" message)
    from p2p.net.ports import free_ports
    from p2p.net.transport import Transport, TransportConfig
    from p2p.wire import decode, encode

    (port,) = free_ports(1)
    me = f"127.0.0.1:{port}"
    transport = Transport(TransportConfig(), me, _keyring(key))
    addr_q = mp.Queue()
    proc = mp.Process(target=_p2p_receiver, args=(addr_q, repeats, arr.size, key))
    proc.start()
    peer = addr_q.get()
    addr_q.put(me)
    time.sleep(0.2)
    t0 = time.perf_counter()
    sent = 0
    done = False
    while not done:  # the node's loop: send when the pending queue has room, pump, receive
        if sent < repeats and transport.send(peer, encode(AvgRequest(sent, 0, "bench", arr), me), time.monotonic()):
            sent += 1
        for incoming in transport.receive(0.05, time.monotonic()):
            decode(incoming.frames)
            done = True
    elapsed = time.perf_counter() - t0
    transport.close()
    proc.join()
    return arr.nbytes * repeats / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    arr = np.random.default_rng(0).standard_normal(args.mib * 1024 * 1024 // 4).astype(np.float32)
    key = secrets.token_bytes(32)
    methods = (("tcp", bench_tcp), ("zmq", bench_zmq), ("p2p", bench_p2p),
               ("sealed", lambda a, r: bench_p2p(a, r, key)))
    rounds = []
    for _ in range(args.rounds):  # interleaved, so load changes hit every method alike
        rounds.append({name: fn(arr, args.repeats) / 1e6 for name, fn in methods})
    median = {name: float(np.median([r[name] for r in rounds])) for name, _ in methods}
    ratio = {name: float(np.median([r[name] / r["tcp"] for r in rounds])) for name, _ in methods}
    sealed_vs_plain = float(np.median([r["sealed"] / r["p2p"] for r in rounds]))
    out = {"mib": args.mib, "repeats": args.repeats, "rounds": args.rounds,
           "throughput_mb_s": {k: round(v, 1) for k, v in median.items()},
           "ratio_vs_tcp": {k: round(v, 3) for k, v in ratio.items()},
           "sealed_vs_p2p": round(sealed_vs_plain, 3)}
    if args.json:
        print(json.dumps(out))
    else:
        for name, _ in methods:
            print(f"{name:6s} {median[name]:9.1f} MB/s   {ratio[name]:.2f}x tcp (median of {args.rounds} rounds)")
        print(f"sealed / p2p: {sealed_vs_plain:.2f}x (the cost of --swarm-key; median of per-round ratios)")


if __name__ == "__main__":
    main()
