"""What per-node identities cost (p2p/net/identity.py): per control message, and in control
messages per second through the real transport.

- ``per message``: seal + open a SWIM Ping (the commonest control message) with the swarm key
  alone, then with an identity's signature inside the seal (sign + verify added), in CPU
  microseconds per message (process time: on a shared machine, wall time mostly measures the
  neighbours), no sockets;
- ``throughput``: two Transports in this process over loopback ZeroMQ: one sends Pings in
  batches of 8 (under its send high-water mark), the other receives and opens them; messages
  per wall-clock second and per CPU second of the process (both ends), for open, sealed and
  sealed + signed (each round interleaves the three; medians).

    python bench/identity_cost.py [--messages 3000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from p2p.gossip.messages import Ping
from p2p.net.identity import Identity
from p2p.net.keyring import Keyring
from p2p.net.ports import bind_transport
from p2p.net.seal import ReplayGuard, open_message, open_signed, seal_message
from p2p.net.transport import TransportConfig
from p2p.wire import encode

KEYRING = Keyring((bytes(range(32)),))
ME = Identity.generate()
ALLOWED = frozenset({ME.public})


def ping_frames():
    return [bytes(memoryview(f).cast("B")) for f in encode(Ping(7, "127.0.0.1:9000", "127.0.0.1:9002"), "127.0.0.1:9000")]


def per_message_us(n: int) -> dict[str, float]:
    frames = ping_frames()
    out = {}
    for name, identity in (("sealed", None), ("sealed+signed", ME)):
        guard = ReplayGuard(capacity=10 * n)
        t0 = time.process_time()
        for _ in range(n):
            sealed = seal_message(KEYRING, frames, time.time(), identity=identity)
            if identity is None:
                open_message(KEYRING, guard, sealed, time.time())
            else:
                open_signed(KEYRING, guard, sealed, time.time(), ALLOWED)
        out[name] = (time.process_time() - t0) / n * 1e6
    t0 = time.process_time()
    for _ in range(n):
        ME.sign(b"x" * 32)
    out["ed25519 sign"] = (time.process_time() - t0) / n * 1e6
    signature, public = ME.sign(b"x" * 32), ME._private.public_key()
    t0 = time.process_time()
    for _ in range(n):
        public.verify(signature, b"x" * 32)
    out["ed25519 verify"] = (time.process_time() - t0) / n * 1e6
    return out


def throughput(mode: str, n: int) -> tuple[float, float]:
    """(messages per wall second, messages per CPU second)."""
    kw = {}
    if mode != "open":
        kw["keyring"] = KEYRING
    if mode == "sealed+signed":
        kw.update(identity=ME, allowed=ALLOWED)
    sender, _ = bind_transport(TransportConfig(), "127.0.0.1:0", **kw)
    receiver, addr = bind_transport(TransportConfig(), "127.0.0.1:0", **kw)
    frames = ping_frames()
    try:
        got, sent = 0, 0
        t0, c0 = time.perf_counter(), time.process_time()
        while got < n:
            batch = min(8, n - sent)
            for _ in range(batch):
                sent += sender.send(addr, frames, time.monotonic())
            target = sent
            deadline = time.monotonic() + 5
            while got < target:
                incoming = receiver.receive(0.1, time.monotonic())
                bad = [m for m in incoming if m.error is not None]
                if bad:
                    raise RuntimeError(f"{mode}: rejected {bad[0].error}")
                got += len(incoming)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{mode}: {target - got} messages lost")
        return n / (time.perf_counter() - t0), n / (time.process_time() - c0)
    finally:
        sender.close()
        receiver.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    costs = [per_message_us(args.messages) for _ in range(args.rounds)]
    modes = ("open", "sealed", "sealed+signed")
    rates = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            rates[m].append(throughput(m, args.messages))
    result = {"per_message_cpu_us": {k: statistics.median(c[k] for c in costs) for k in costs[0]},
              "messages_per_s": {m: statistics.median(r[0] for r in v) for m, v in rates.items()},
              "messages_per_cpu_s": {m: statistics.median(r[1] for r in v) for m, v in rates.items()}}
    result["signed_over_sealed"] = {k: result[k]["sealed+signed"] / result[k]["sealed"]
                                    for k in ("messages_per_s", "messages_per_cpu_s")}
    if args.json:
        print(json.dumps(result))
        return
    for k, v in result["per_message_cpu_us"].items():
        print(f"{k:>16}: {v:8.1f} CPU us per message")
    for m in modes:
        print(f"{m:>16}: {result['messages_per_s'][m]:8.0f} control messages/s, "
              f"{result['messages_per_cpu_s'][m]:8.0f} per CPU second (loopback, one process)")
    ratio = result["signed_over_sealed"]
    print(f"signed / sealed: {ratio['messages_per_s']:.2f} (wall), {ratio['messages_per_cpu_s']:.2f} (CPU)")


if __name__ == "__main__":
    main()
