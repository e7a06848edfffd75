"""Fuzz a live node over loopback: hostile traffic on both channels while an honest peer trains
with it, watching the node's counters, memory and file descriptors (tests/test_fuzz_live.py,
bench/fuzz_node.py).

What is sent (p2p/harness/fuzz.py makes the inputs and says what the node must make of them):

- ``control`` hostile ZeroMQ messages to the node's ROUTER, through a few DEALERs;
- ``bulk`` hostile bulk streams, one TCP connection each (connect, write, hang up, wait for the
  node to close: so every one has been read when the run ends, and the counts add up);
- ``slow`` senders that open a bulk connection and trickle a byte a second, and
  ``slow_control`` that do the same to the ZeroMQ port, until the node closes them (then
  again, until the run ends);
- ``floods`` times, ``flood`` connections opened at once to each port, held a moment, then closed (a few of
  the ZeroMQ ones write junk instead of a greeting; the bulk ones write nothing, so that the
  node's rejection counts stay those of the bulk streams above).

The node is read from outside: its status (rejections by reason, transport counters,
exchanges; p2p/net/client.py), and its RSS and open file descriptors from /proc.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import zmq

from p2p.harness.fuzz import Mutator, expect_bulk, expect_control
from p2p.net.addresses import bulk_address, parse_address, to_endpoint
from p2p.net.client import QueryError, status
from p2p.net.keyring import Keyring


@dataclass(frozen=True)
class Budget:
    control: int = 100_000
    bulk: int = 10_000
    slow: int = 20  # bulk connections trickling a byte a second (each reconnects when closed, until the end)
    slow_control: int = 5  # the same on the ZeroMQ port
    slow_max_s: float = 45.0  # a slow connection gives up (and counts as not closed) after this
    flood: int = 500  # connections opened at once to each port
    flood_hold_s: float = 1.0
    floods: int = 1  # floods in all, ``flood_every_s`` apart while the run lasts
    flood_every_s: float = 5.0
    bulk_workers: int = 16  # bulk connections in flight at once
    settle_s: float = 5.0  # after the last rejection is counted, before the final sample (RSS, fds)
    dealers: int = 4  # DEALER sockets the control messages are spread over


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """``VmRSS``: all resident memory; ``RssAnon``: less the pages of mapped files (the libraries'
    code, which the kernel drops and reads back at will: other work on the machine moves it)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def exchanges(info: dict) -> int:
    """Averaging exchanges a node took part in (started by it or by its partner). Of the honest
    peer's, all are with the fuzzed node (the node's own count includes fuzzed requests it served)."""
    avg = info.get("averaging") or {}
    return int(avg.get("exchanges_completed", 0)) + int(avg.get("requests_served", 0))


@dataclass
class Sample:
    t: float
    rss: int
    fds: int
    info: Optional[dict]  # the node's status (None: it did not answer in time)
    honest: Optional[dict] = None  # the honest peer's status, likewise
    anon: int = 0  # RssAnon


class Monitor:
    """Samples the node's RSS, fds and status (and the honest peer's status) every
    ``interval_s`` on a thread of its own."""

    def __init__(self, pid: int, addr: str, keyring: Optional[Keyring], honest: Optional[str] = None,
                 interval_s: float = 0.5) -> None:
        self.pid, self.addr, self.keyring, self.interval_s = pid, addr, keyring, interval_s
        self.honest = honest
        self.samples: list[Sample] = []
        self.max_fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fuzz-monitor", daemon=True)

    def _status(self, addr: Optional[str], timeout_s: float) -> Optional[dict]:
        if addr is None:
            return None
        try:
            return status(addr, timeout_s, self.keyring)
        except QueryError:
            return None

    def sample(self, status_timeout_s: float = 2.0) -> Sample:
        info = self._status(self.addr, status_timeout_s)
        s = Sample(time.monotonic(), rss_bytes(self.pid), open_fds(self.pid), info,
                   self._status(self.honest, status_timeout_s), rss_bytes(self.pid, "RssAnon"))
        self.max_fds = max(self.max_fds, s.fds)
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except (OSError, RuntimeError):  # the node is gone: the caller sees it
                return
            # fds between status samples: a flood comes and goes within a second
            until = time.monotonic() + self.interval_s
            while time.monotonic() < until and not self._stop.is_set():
                try:
                    self.max_fds = max(self.max_fds, open_fds(self.pid))
                except OSError:
                    return
                time.sleep(0.05)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Sent:
    """What was sent, and what the node must make of it (p2p/harness/fuzz.py's expectations)."""

    control: Counter = field(default_factory=Counter)  # by mutation kind
    bulk: Counter = field(default_factory=Counter)
    control_expect: Counter = field(default_factory=Counter)  # reject / valid
    bulk_expect: Counter = field(default_factory=Counter)  # reject / abandoned / valid
    control_unsent: int = 0  # the node's queue stayed full past the send timeout
    bulk_unsent: int = 0  # a connection that could not be made (counted, not retried)
    slow_closed_after_s: list = field(default_factory=list)  # per slow sender: when the node closed it
    slow_not_closed: int = 0
    slow_control_closed_after_s: list = field(default_factory=list)
    slow_control_not_closed: int = 0
    flood_opened: int = 0


def send_control(addr: str, mutator: Mutator, count: int, dealers: int, sent: Sent,
                 keyring: Optional[Keyring]) -> None:
    ctx = zmq.Context.instance()
    socks = []
    for i in range(dealers):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 5000)
        s.setsockopt(zmq.SNDTIMEO, 5000)
        s.setsockopt(zmq.RCVHWM, 16)  # the node's answers to status requests pile up unread: it drops them
        s.connect(to_endpoint(addr))
        socks.append(s)
    try:
        for i in range(count):
            kind, frames = mutator.control()
            try:
                socks[i % dealers].send_multipart(frames)
            except zmq.Again:
                sent.control_unsent += 1
                continue
            sent.control[kind] += 1
            sent.control_expect[expect_control(frames, keyring)] += 1
    finally:
        for s in socks:
            s.close()  # (lingers until what is queued has gone out)


def _one_bulk(port: tuple[str, int], data: bytes) -> bool:
    """Connect, write ``data``, hang up, and wait for the node to close its end (it has read it all)."""
    try:
        sock = socket.create_connection(port, timeout=10.0)
    except OSError:
        return False
    with sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):
                pass
        except OSError:  # reset: the node closed on a bad message before reading the rest
            pass
    return True


def send_bulk(addr: str, mutator: Mutator, count: int, workers: int, sent: Sent,
              keyring: Optional[Keyring]) -> None:
    port = bulk_address(addr)
    with ThreadPoolExecutor(workers) as pool:
        pending = []
        for _ in range(count):
            kind, data = mutator.bulk()
            expected = expect_bulk(data, keyring)
            pending.append((kind, expected, pool.submit(_one_bulk, port, data)))
            if len(pending) >= 4 * workers:
                _settle(pending[:workers], sent)
                del pending[:workers]
        _settle(pending, sent)


def _settle(pending: list, sent: Sent) -> None:
    for kind, expected, future in pending:
        if future.result():
            sent.bulk[kind] += 1
            sent.bulk_expect.update(expected)
        else:
            sent.bulk_unsent += 1


def trickle(port: tuple[str, int], first: bytes, max_s: float) -> Optional[float]:
    """Open a connection and write ``first`` a byte a second (then zeros), reading and dropping
    whatever comes back, until the node closes it; seconds until it did, or None if it was
    still open after ``max_s``."""
    start = time.monotonic()
    try:
        sock = socket.create_connection(port, timeout=5.0)
    except OSError:
        return 0.0  # refused outright: closed at once
    with sock:
        sock.setblocking(False)
        poller = select.poll()  # (not select(): a flood takes this process past fd 1024)
        poller.register(sock, select.POLLIN)
        i, next_send = 0, start
        while time.monotonic() - start < max_s:
            try:
                if time.monotonic() >= next_send:
                    sock.send(first[i:i + 1] if i < len(first) else b"\0")
                    i, next_send = i + 1, next_send + 1.0
                readable = poller.poll(max(0.0, next_send - time.monotonic()) * 1000)
                if readable and sock.recv(4096) == b"":
                    return time.monotonic() - start
            except OSError:  # reset
                return time.monotonic() - start
    return None


# A ZeroMQ (ZMTP 3.0) greeting, NULL mechanism: trickled, it never completes in time.
ZMTP_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)


def flood(ports: Sequence[tuple[str, int]], count: int, hold_s: float, rng: np.random.Generator) -> int:
    """Open ``count`` connections to each port at once, hold them, close them; how many opened.
    One in ten to the first port (the ZeroMQ one) writes a greeting with a junk security
    mechanism (libzmq drops those itself: nothing reaches the node's counters; plain random
    bytes might, as libzmq reads a first byte other than 0xff as an old ZMTP 1.0 peer's)."""
    socks = []
    for p, port in enumerate(ports):
        for i in range(count):
            try:
                s = socket.create_connection(port, timeout=2.0)
            except OSError:
                continue
            if p == 0 and i % 10 == 0:  # a greeting naming a mechanism nobody speaks
                try:
                    s.send(ZMTP_GREETING[:12] + rng.integers(65, 91, 52, dtype=np.uint8).tobytes())
                except OSError:
                    pass
            socks.append(s)
    time.sleep(hold_s)  # (the connections' lifetime: they are meant to sit there)
    for s in socks:
        s.close()
    return len(socks)


def _span(values: Sequence[float]) -> str:
    return f"{min(values):.1f}..{max(values):.1f}" if values else "-"


@dataclass
class Report:
    sent: Sent
    before: Sample
    after: Sample
    samples: list[Sample]
    max_fds: int
    seconds: float

    def delta(self, key: str) -> int:
        return int(self.after.info.get(key, 0)) - int(self.before.info.get(key, 0))

    def rejected(self) -> Counter:
        return Counter(self.after.info["rejected"]) - Counter(self.before.info["rejected"])

    @property
    def rss_growth(self) -> float:
        """From the start to the end of the run, once settled (``Budget.settle_s``)."""
        return (self.after.rss - self.before.rss) / self.before.rss

    @property
    def rss_peak(self) -> int:
        return max(s.rss for s in [self.before, *self.samples, self.after])

    @property
    def anon_peak(self) -> int:
        return max(s.anon for s in [self.before, *self.samples, self.after])

    @property
    def rss_peak_growth(self) -> float:
        """The most the RSS rose over the run, against the RSS at its start: the larger of the
        total's rise and the anonymous memory's (the kernel may drop file pages meanwhile,
        which would hide a rise of the total; without swap it cannot drop the heaps)."""
        return max(self.rss_peak - self.before.rss, self.anon_peak - self.before.anon) / self.before.rss

    def exchanges_by_window(self, window_s: float) -> list[int]:
        """Exchanges the honest peer made with the node in each ``window_s`` of the run (the last
        window may be shorter), read off its status samples (the count at the last in each)."""
        rows = [(s.t, exchanges(s.honest)) for s in [self.before, *self.samples, self.after] if s.honest]
        t0, t1 = self.before.t, rows[-1][0]
        n = max(1, int(np.ceil((t1 - t0) / window_s)))
        at = [max(c for t, c in rows if t <= t0 + k * window_s) for k in range(n)] + [rows[-1][1]]
        return [b - a for a, b in zip(at, at[1:])]

    def status_gap_s(self) -> float:
        """The longest the node went without answering a status request (the monitor's samples)."""
        times = [s.t for s in [self.before, *self.samples, self.after] if s.info]
        return max(b - a for a, b in zip(times, times[1:]))


def fuzz_node(addr: str, pid: int, honest: str, seeds: Sequence[object], budget: Budget, seed: int = 0,
              keyring: Optional[Keyring] = None, log: Callable[[str], None] = lambda s: None) -> Report:
    """Run ``budget`` against the node at ``addr`` (process ``pid``), whose only partner is the
    honest peer at ``honest``. ``keyring``: the swarm's, when the node is sealed; the fuzzer only
    uses its public id to forge seals (and to check, as the node does, that nothing it made
    opens), and the monitor to ask for the status."""
    monitor = Monitor(pid, addr, keyring, honest)
    before = monitor.sample(status_timeout_s=5.0)
    if before.info is None or before.honest is None:
        raise RuntimeError(f"the node at {addr} or the honest peer at {honest} does not answer a status request")
    model_key = numel = None
    if keyring is None:  # an open node says what it trains (as it would to anyone): aim some messages at it
        from p2p.net.client import state
        reply = state(addr, 5.0)
        model_key, numel = reply.model_key, reply.params.size
    kid = keyring.primary_id if keyring is not None else None
    control_mutator = Mutator(seeds, seed, key_id=kid, model_key=model_key, numel=numel)
    bulk_mutator = Mutator(seeds, seed + 1, key_id=kid, model_key=model_key, numel=numel)
    sent = Sent()
    host, port = parse_address(addr)
    done = threading.Event()  # the control messages and bulk streams are all sent
    started = time.monotonic()
    monitor.start()

    def slow(port_: tuple[str, int], first: bytes, into: list, control: bool) -> None:
        while True:  # one slow connection after another, for as long as the run goes on
            closed = trickle(port_, first, budget.slow_max_s)
            if closed is None:
                if control:
                    sent.slow_control_not_closed += 1
                else:
                    sent.slow_not_closed += 1
            else:
                into.append(closed)
            if done.is_set():
                return

    def floods() -> None:
        rng = np.random.default_rng(seed)
        for i in range(budget.floods):
            if i and done.wait(budget.flood_every_s):
                return
            sent.flood_opened += flood([(host, port), bulk_address(addr)], budget.flood, budget.flood_hold_s, rng)

    slow_first = bulk_mutator._stream()  # a valid stream's first bytes: mid-message from the first byte
    threads = [threading.Thread(target=slow, args=(bulk_address(addr), slow_first, sent.slow_closed_after_s, False))
               for _ in range(budget.slow)]
    threads += [threading.Thread(target=slow, args=((host, port), ZMTP_GREETING,
                                                    sent.slow_control_closed_after_s, True))
                for _ in range(budget.slow_control)]
    for t in threads:
        t.start()
    log(f"{len(threads)} slow senders started")
    flooder = threading.Thread(target=floods)
    flooder.start()
    workers = [threading.Thread(target=send_control, args=(addr, control_mutator, budget.control, budget.dealers,
                                                           sent, keyring)),
               threading.Thread(target=send_bulk, args=(addr, bulk_mutator, budget.bulk, budget.bulk_workers,
                                                        sent, keyring))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    done.set()
    log(f"sent {sum(sent.control.values())} control messages and {sum(sent.bulk.values())} bulk streams "
        f"in {time.monotonic() - started:.1f}s")
    for t in [flooder, *threads]:
        t.join()
    log(f"{sent.flood_opened} flood connections; slow senders closed after "
        f"{_span(sent.slow_closed_after_s)} s (bulk), {_span(sent.slow_control_closed_after_s)} s (ZeroMQ)")
    # The node reads what the DEALERs queued in its own time: wait until it has read every message
    # (received, or dropped unopened over a connection's budget for a turn) and counted every
    # rejection it must, or its refusals and drops stop moving (then the caller sees what is
    # missing). The refusals alone are not enough: valid messages may be refused too (another
    # model, an unknown member), so they can reach their due while messages are still queued (CI:
    # 2,867 received of 3,069 then). What was received includes the honest peer's messages.
    must = sent.control_expect["reject"] + sent.bulk_expect["reject"]
    to_read = sum(sent.control.values()) + sent.bulk_expect["valid"]

    def delta(info: dict, key: str) -> int:
        return int(info.get(key, 0)) - int(before.info.get(key, 0))

    counted: list[tuple[int, int]] = []
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        after = monitor.sample(status_timeout_s=5.0)
        if after.info is not None:
            dropped = delta(after.info, "recv_drops")
            refused = sum(after.info["rejected"].values()) - sum(before.info["rejected"].values())
            counted.append((refused, dropped))
            if refused + dropped >= must and delta(after.info, "messages_received") + dropped >= to_read:
                break
            if counted[-3:] == [counted[-1]] * 3:
                break
        time.sleep(0.5)
    # Memory in flight (queued messages, buffers) is let go; what stays is what the run cost.
    time.sleep(budget.settle_s)
    after = monitor.sample(status_timeout_s=5.0)
    monitor.stop()
    if after.info is None:
        raise RuntimeError(f"the node at {addr} stopped answering")
    return Report(sent, before, after, monitor.samples, monitor.max_fds, time.monotonic() - started)
