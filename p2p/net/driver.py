"""The real driver: feeds a sans-I/O ``Peer`` from ZeroMQ and the OS clock, on its own thread.

This is the error boundary of DESIGN.md: every received frame set is decoded here; anything a
peer gets wrong (``RemoteProtocolError`` from the codec or from a protocol object) is logged,
counted by reason, and dropped. It never reaches training and never stops the loop.

Other threads never touch the Peer: they ask the network thread to run a query for them
(``call``), which wakes it at once through a pipe and waits for the answer.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import zmq

from p2p.net.heap import Trimmer
from p2p.net.identity import AllowFile, Bindings
from p2p.net.keyring import KeyFile
from p2p.net.member_ids import ROW_REASON, SENDER_REASON, MemberIds
from p2p.net.control import ModelReply, ModelRequest, StateReply, StateRequest, StatusReply, StatusRequest
from p2p.events import event
from p2p.peer import Peer
from p2p.protocol import RemoteProtocolError, Send
from p2p.net.transport import Incoming, TopCounts, Transport
from p2p.wire import DEFAULT_LIMITS, Limits, decode, encode

if TYPE_CHECKING:  # the trainer's side of the averager's hooks (p2p/training/step_hooks.py)
    from p2p.training.step_hooks import StepHooks

log = logging.getLogger("p2p.net.driver")
REJECT_LOG_EVERY_S = 10.0  # rejected messages: one log line per this long (and the first of each reason)
IDENTITY_REASONS = ("unsigned", "not_allowed", "bad_signature", "identity_mismatch",  # p2p/net/identity.py
                    SENDER_REASON, ROW_REASON)  # p2p/net/member_ids.py
MAX_LOGGED_KEYS = 256
# How often to see whether the heap's free memory should go back to the OS (p2p/net/heap.py).
TRIM_EVERY_S = 5.0
T = TypeVar("T")


class DriverStopped(RuntimeError):
    """``call`` after the network thread ended."""


class DriverBusy(RuntimeError):
    """``call`` timed out: the network thread is busy (a long capture, a flood); the call still
    runs later, its result is dropped."""


class NetworkDriver:
    def __init__(self, transport: Transport, peer: Peer, advertise: str,
                 status_info: Callable[[], dict], state_reply: Callable[[], StateReply],
                 shutdown_grace_s: float, hooks: StepHooks | None = None,
                 limits: Limits = DEFAULT_LIMITS, model_reply: Callable[[], ModelReply] | None = None,
                 tamper: Callable[[object], object] | None = None, key_file: KeyFile | None = None,
                 allow_file: AllowFile | None = None) -> None:
        self.transport = transport
        self.key_file = key_file  # re-read when it changes (key rotation); transport.keyring follows
        self.allow_file = allow_file  # identities' allow file, re-read likewise; transport.allowed follows
        self.bindings = Bindings()  # sender address -> the allowed key first seen with it (identities on)
        self.member_ids = MemberIds(self.bindings)  # membership's node ids, likewise
        self.tamper = tamper  # test-only: a hostile peer rewrites what it sends (p2p/averaging/hostile.py)
        self.peer = peer
        self.advertise = advertise
        self.status_info = status_info
        self.state_reply = state_reply
        self.model_reply = model_reply
        self.limits = limits
        self.shutdown_grace_s = shutdown_grace_s  # how long shutdown waits for an exchange in flight
        self.hooks = hooks if hooks is not None and hooks.posts else None  # (a release is a no-op without posts)
        if self.hooks is not None:  # the trainer's hook posts wake the loop at once
            transport.poller.register(hooks.wake_socket, zmq.POLLIN)
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._wake_lock = threading.Lock()  # a write never races the pipe's close (fds get reused)
        self._wake_read, self._wake_write = os.pipe()  # any thread may write; the loop polls it
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        transport.poller.register(self._wake_read, zmq.POLLIN)
        self.rejected: Counter[str] = Counter()
        self._next_reject_log = 0.0
        self._logged_keys: set[tuple[str, str]] = set()  # (reason, key) already logged once (identities)
        self.stop_requested = threading.Event()
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.last_turn = time.monotonic()  # when the loop last went round (-inf once it ended): health
        self.received_from = TopCounts()  # bytes of decoded messages, by sender address
        self._next_housekeeping = 0.0
        self._next_trim = 0.0
        self.trimmer = Trimmer()
        self.cpu_s = 0.0  # the network thread's CPU seconds: what averaging takes from training's CPU
        self.turns = 0  # times the loop went round (status: a loop that spins shows here)
        self._thread = threading.Thread(target=self._run, name="p2p-network", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the network thread; from here on only it touches the Peer. The Peer's
        membership starts when told (``act(lambda now: peer.start(seeds, now))``): a joiner
        syncs its state first."""
        self._thread.start()

    def act(self, fn: Callable[[float], list[Send]], timeout_s: float = 5.0) -> None:
        """Run ``fn(now)`` on the network thread and send what it returns."""
        self.call(lambda: self._send_all(fn(time.monotonic())), timeout_s)

    def stop(self, timeout_s: float) -> None:
        """Finish (or abandon) the exchange in flight, announce leave, close sockets."""
        self.stop_requested.set()
        self._wake()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            with self._wake_lock:
                os.close(self._wake_read)
                os.close(self._wake_write)
                self._wake_write = -1

    def call(self, fn: Callable[[], T], timeout_s: float = 5.0) -> T:
        """Run ``fn`` on the network thread (it owns the Peer and the sockets) and return its
        result. Raises DriverStopped once the loop has ended."""
        if self.finished.is_set():
            raise DriverStopped("the network thread has stopped")
        future: Future = Future()
        self._calls.append((fn, future))
        self._wake()
        if self.finished.is_set():  # it ended between the check and the append: nobody will run it
            self._run_calls()
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            raise DriverBusy(f"the network thread did not answer within {timeout_s:g}s") from None

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_write < 0:
                return
            try:
                os.write(self._wake_write, b"\0")
            except BlockingIOError:  # the pipe is full of wake-ups already
                pass

    def _run_calls(self) -> None:
        with self._wake_lock:  # stop() may be closing the pipe (its fd number could be reused)
            if self._wake_write >= 0:
                try:
                    os.read(self._wake_read, 4096)
                except BlockingIOError:
                    pass
        while self._calls:
            fn, future = self._calls.popleft()
            if self.finished.is_set():
                future.set_exception(DriverStopped("the network thread has stopped"))
                continue
            try:
                future.set_result(fn())
            except Exception as exc:  # the caller's query failed: it gets the error, the loop goes on
                future.set_exception(exc)

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug in protocol code: report it, do not hang the node
            log.exception("network loop failed")
            self.error = exc
        finally:
            self.cpu_s = time.thread_time()
            self.last_turn = -math.inf
            self.finished.set()
            if self.hooks is not None:
                self.hooks.release()  # a trainer waiting at a gate goes on (and sees the error) now
            self._run_calls()  # anyone still waiting gets DriverStopped

    def _loop(self) -> None:
        shutdown_deadline = None
        while True:
            now = self.last_turn = time.monotonic()
            self.turns += 1
            if self.stop_requested.is_set():
                if shutdown_deadline is None:
                    shutdown_deadline = now + self.shutdown_grace_s
                if not self.peer.busy() or now >= shutdown_deadline:
                    break
            timeout = min(max(self.peer.next_deadline() - now, 0.0), 0.05)
            for incoming in self.transport.receive(timeout, now):
                self._handle(incoming)
                self.transport.done(incoming)
            self._run_calls()
            now = time.monotonic()
            if now >= self._next_housekeeping:
                self.cpu_s = time.thread_time()  # this thread's CPU seconds so far (status: network_cpu_s)
                self.transport.housekeeping(now, self.peer.neighbours())
                self._reload_keys()
                self._reload_allowed()
                if now >= self._next_trim:
                    self.trimmer.check()
                    self._next_trim = now + TRIM_EVERY_S
                self._next_housekeeping = now + 1.0
            if self.hooks is not None:
                self._send_all(self.hooks.service(now, self.peer.neighbours))
            if now >= self.peer.next_deadline():
                self._send_all(self.peer.tick(now))
        if self.hooks is not None:
            self.hooks.release()  # a trainer waiting on a gate goes on (and sees the stop)
            self.transport.poller.unregister(self.hooks.wake_socket)
        self._send_all(self.peer.leave(time.monotonic()))
        self.transport.close(linger_s=0.5)  # give the leave announcements a moment to go out

    def _reload_keys(self) -> None:
        """Key rotation without a restart: take the key file's new keys (a stat per second)."""
        keys = self.key_file
        if keys is None:
            return
        error = keys.last_error
        if keys.reload_if_changed():
            self.transport.set_keyring(keys.keyring)
            event("keys_reloaded", f"swarm key file reloaded: {keys.keyring.describe()}", logging.WARNING,
                  key_id=keys.keyring.primary_id.hex(), keys=len(keys.keyring.keys))
        elif keys.last_error and keys.last_error != error:
            event("keys_unusable", f"{keys.last_error}; keeping the keys loaded before", logging.ERROR)

    def _reload_allowed(self) -> None:
        """Cut a machine off without a restart: take the allow file's new keys, forget the node
        ids bound to keys taken off it, close their bulk connections."""
        allow = self.allow_file
        if allow is None:
            return
        error = allow.last_error
        if allow.reload_if_changed():
            self.transport.set_allowed(allow.allowed)
            self.bindings.keep_only(allow.allowed)
            self.member_ids.keep_only(allow.allowed)
            self._logged_keys.clear()  # a key put back on and off again is logged again
            event("allow_reloaded", f"allow file reloaded: {len(allow.allowed)} keys", logging.WARNING,
                  keys=len(allow.allowed))
        elif allow.last_error and allow.last_error != error:
            event("allow_unusable", f"{allow.last_error}; keeping the keys loaded before", logging.ERROR)

    def _handle(self, incoming: Incoming) -> None:
        now = time.monotonic()
        if incoming.error is not None:  # (not re-raised: its traceback would hold ``incoming``, a cycle)
            self._reject(incoming.error, now)
            return
        try:
            src, msg = decode(incoming.frames, incoming.limits(self.limits))
            self.received_from.add(src, sum(_frame_bytes(f) for f in incoming.frames))
            if isinstance(msg, StatusRequest):
                self.transport.reply(incoming.identity, encode(StatusReply(self.status_info()), self.advertise))
                return
            if isinstance(msg, StateRequest):
                self.transport.reply(incoming.identity, encode(self.state_reply(), self.advertise))
                return
            if isinstance(msg, ModelRequest) and self.model_reply is not None:
                self.transport.reply(incoming.identity, encode(self.model_reply(), self.advertise))
                return
            if incoming.signer is not None:  # (clients, above, have no node id to bind)
                self.bindings.check(src, incoming.signer)
                msg, dropped, problem = self.member_ids.screen(msg, incoming.signer)
                if problem is not None:  # rows dropped, the rest of the message goes on
                    self._reject(problem, now, dropped)
            sends = self.peer.receive(src, msg, now)
        except RemoteProtocolError as exc:
            self._reject(exc, now)
            return
        self._send_all(sends)

    def _reject(self, exc: RemoteProtocolError, now: float, count: int = 1) -> None:
        self.rejected[exc.reason] += count
        total = sum(self.rejected.values())
        # The first of each reason, then at most one line per REJECT_LOG_EVERY_S: a flood (an
        # outsider hammering a sealed swarm) stays a few lines, and the counters say the rest.
        # An identity's rejection is logged once per key instead (for the first few hundred keys:
        # past them, made-up keys fall back to the rate limit).
        key = (exc.reason, exc.detail.partition("key ")[2])
        if exc.reason in IDENTITY_REASONS and key[1] and (key in self._logged_keys or len(self._logged_keys) < MAX_LOGGED_KEYS):
            if key in self._logged_keys:
                return
            self._logged_keys.add(key)
        elif not (self.rejected[exc.reason] == 1 or now >= self._next_reject_log):
            return
        self._next_reject_log = now + REJECT_LOG_EVERY_S
        event("rejected", f"rejected message ({exc}), {total} rejected so far ({dict(self.rejected)})",
              logging.WARNING, reason=exc.reason, detail=exc.detail, total=total)

    def _send_all(self, sends: list[Send]) -> None:
        now = time.monotonic()
        for s in sends:
            msg = s.msg if self.tamper is None else self.tamper(s.msg)
            if s.fresh:
                self.transport.redial(s.to)
            if not self.transport.send(s.to, encode(msg, self.advertise), now):
                self.peer.send_dropped(s, now)  # dropped here, never sent: the sender may take it back


def _frame_bytes(frame: object) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)
