"""ZeroMQ transport: one listening ROUTER per node; per peer address, two outgoing DEALERs.

Peer-to-peer messages are one-way: A's DEALER connected to B's advertised address delivers to
B's ROUTER, and B answers through its own DEALER to A's advertised address (carried in every
header). That keeps the protocol symmetric and lets any node initiate to any address.
Clients such as ``p2p status`` are answered through the ROUTER on the connection they came
in on, since they have no listening address.

Two connections per peer, so that a model in flight never delays control traffic: small
messages (membership probes, replies without tensors) go on the *control* DEALER; messages of
``bulk.threshold_bytes`` or more go on the *bulk* DEALER as chunked transfers (p2p/bulk.py),
pumped as the socket becomes writable. That is the flow control of the ZeroMQ guide's
file-transfer pattern, with TCP's window and ZeroMQ's high-water mark as the credit: the
sender holds at most ``max_pending_per_peer`` large messages per peer (references to the
snapshots being sent, no copies) and drops, and counts, any beyond; a stalled transfer is
abandoned after ``stall_timeout_s``. The receiver checks each transfer's declared size before
any payload arrives and receives chunks straight into pooled buffers (``recv_into``).

Memory stays bounded whatever peers do: small send high-water marks, non-blocking sends that
drop and count rather than wait, an inbound size limit (ZMQ_MAXMSGSIZE), and limits on open
transfers per sender. ZeroMQ reconnects by itself; sockets to peers unused for
``idle_close_s`` are closed.
"""

from __future__ import annotations

import errno
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Union

import zmq

from p2p.addresses import to_endpoint
from p2p.bulk import BulkConfig, Reassembler, chunk_records, kind_of, start_record
from p2p.protocol import RemoteProtocolError


class TransportError(RuntimeError):
    """The local endpoint cannot be set up (port in use, bad address)."""


@dataclass(frozen=True)
class TransportConfig:
    send_hwm: int = 16  # queued outgoing messages per peer connection before sends drop
    recv_hwm: int = 256  # queued incoming messages before ZeroMQ pushes back
    max_message_bytes: int = 2 * 1024 * 1024 * 1024  # inbound message limit
    reconnect_ivl_ms: int = 100  # first reconnect delay after a peer drops
    reconnect_ivl_max_ms: int = 2000  # reconnect backoff cap
    idle_close_s: float = 120.0  # close the sockets to a peer not sent to for this long
    bulk: BulkConfig = field(default_factory=BulkConfig)


@dataclass
class Incoming:
    """One received message: its frames, or the reason it was rejected on arrival."""

    identity: bytes
    frames: Optional[list]
    error: Optional[RemoteProtocolError] = None


def _nbytes(frame: Union[bytes, memoryview, zmq.Frame]) -> int:
    return len(frame) if not isinstance(frame, memoryview) else frame.nbytes


@dataclass
class _Outgoing:
    records: Iterator[list]
    deadline: float
    current: Optional[list] = None


class Transport:
    def __init__(self, config: TransportConfig, listen: str) -> None:
        self.config = config
        self.context = zmq.Context.instance()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVHWM, config.recv_hwm)
        self.router.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished client raises, we count it
        try:
            self.router.bind(to_endpoint(listen))
        except zmq.ZMQError as exc:
            self.router.close()
            if exc.errno == errno.EADDRINUSE:
                raise TransportError(f"cannot listen on {listen}: address already in use") from None
            raise TransportError(f"cannot listen on {listen}: {exc}") from None
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self._control: dict[str, zmq.Socket] = {}
        self._bulk: dict[str, zmq.Socket] = {}
        self._pending: dict[str, deque[_Outgoing]] = {}
        self._last_used: dict[str, float] = {}
        self._transfer_ids = itertools.count(1)
        self.reassembler = Reassembler(config.bulk, config.max_message_bytes)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0
        self.send_drops = 0
        self.transfers_abandoned = 0

    # -- sockets --------------------------------------------------------------------------
    def _socket(self, table: dict[str, zmq.Socket], addr: str) -> zmq.Socket:
        sock = table.get(addr)
        if sock is None:
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self.config.send_hwm)
            sock.setsockopt(zmq.RECONNECT_IVL, self.config.reconnect_ivl_ms)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, self.config.reconnect_ivl_max_ms)
            sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
            sock.connect(to_endpoint(addr))
            table[addr] = sock
        return sock

    # -- sending --------------------------------------------------------------------------
    def send(self, addr: str, frames: list, now: float) -> bool:
        """Send ``frames`` to ``addr`` without blocking; False (and counted) if dropped."""
        self._last_used[addr] = now
        size = sum(_nbytes(f) for f in frames)
        try:
            if len(frames) > 1 and size >= self.config.bulk.threshold_bytes:
                return self._send_bulk(addr, frames, now)
            sock = self._socket(self._control, addr)
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.send_drops += 1
            return False
        except (zmq.ZMQError, ValueError):  # e.g. an unresolvable address
            self.send_drops += 1
            return False
        self.messages_sent += 1
        self.bytes_sent += size
        return True

    def _send_bulk(self, addr: str, frames: list, now: float) -> bool:
        queue = self._pending.setdefault(addr, deque())
        if len(queue) >= self.config.bulk.max_pending_per_peer:
            self.send_drops += 1
            return False
        transfer_id = next(self._transfer_ids)
        records = itertools.chain([start_record(transfer_id, frames)],
                                  chunk_records(transfer_id, frames, self.config.bulk.chunk_bytes))
        queue.append(_Outgoing(records, now + self.config.bulk.stall_timeout_s))
        self.messages_sent += 1
        self._pump(addr, now)
        return True

    def _pump(self, addr: str, now: float) -> None:
        """Send queued transfer records to ``addr`` until the socket would block."""
        queue = self._pending.get(addr)
        sock = self._socket(self._bulk, addr)
        while queue:
            head = queue[0]
            if now > head.deadline:
                queue.popleft()  # the receiver drops the partial transfer after its own timeout
                self.transfers_abandoned += 1
                continue
            record = head.current if head.current is not None else next(head.records, None)
            if record is None:
                queue.popleft()
                continue
            try:
                sock.send_multipart(record, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                head.current = record
                return
            head.current = None
            self.bytes_sent += sum(_nbytes(f) for f in record)

    def pump(self, now: float) -> None:
        """Continue every transfer in progress (call on each loop iteration)."""
        for addr in [a for a, q in self._pending.items() if q]:
            self._pump(addr, now)

    def reply(self, identity: bytes, frames: list) -> bool:
        """Answer a client on the ROUTER connection its request came in on."""
        try:
            self.router.send_multipart([identity, *frames], flags=zmq.NOBLOCK, copy=False)
        except (zmq.Again, zmq.ZMQError):
            self.send_drops += 1
            return False
        self.bytes_sent += sum(_nbytes(f) for f in frames)
        return True

    # -- receiving ------------------------------------------------------------------------
    def receive(self, timeout_s: float, now: float, max_messages: int = 64) -> list[Incoming]:
        """Wait up to ``timeout_s`` for traffic; return complete messages (or rejections)."""
        writers = [self._bulk[a] for a, q in self._pending.items() if q and a in self._bulk]
        for sock in writers:
            self.poller.register(sock, zmq.POLLOUT)
        try:
            events = dict(self.poller.poll(max(0, int(timeout_s * 1000))))
        finally:
            for sock in writers:
                self.poller.unregister(sock)
        if writers:
            self.pump(now)
        out: list[Incoming] = []
        if not events.get(self.router, 0) & zmq.POLLIN:
            return out
        while len(out) < max_messages:
            try:
                identity = self.router.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            incoming = self._receive_one(identity, now)
            if incoming is not None:
                out.append(incoming)
        return out

    def _more(self) -> bool:
        return bool(self.router.getsockopt(zmq.RCVMORE))

    def _drain(self) -> None:
        while self._more():
            frame = self.router.recv(copy=False)
            self.bytes_received += len(frame)

    def _receive_one(self, identity: bytes, now: float) -> Optional[Incoming]:
        if not self._more():
            return Incoming(identity, None, RemoteProtocolError("malformed", "empty message"))
        first = self.router.recv(copy=False)
        self.bytes_received += len(first)
        head = bytes(first.buffer[:32])
        kind = kind_of(head) if len(first) <= 32 else "message"
        try:
            if kind == "chunk":
                key, target = self.reassembler.chunk_target(identity, head, now)
                if not self._more():
                    raise RemoteProtocolError("malformed", "chunk without payload")
                nbytes = self.router.recv_into(target)
                self.bytes_received += nbytes
                self._drain()
                frames = self.reassembler.chunk_done(key, nbytes)
                if frames is None:
                    return None
                self.messages_received += 1
                return Incoming(identity, frames)
            rest = []
            while self._more():
                frame = self.router.recv(copy=False)
                self.bytes_received += len(frame)
                rest.append(frame)
            if kind == "start":
                if len(rest) != 2:
                    raise RemoteProtocolError("malformed", "bulk start record")
                self.reassembler.start(identity, head, rest[0].bytes, rest[1].bytes, now)
                return None
            self.messages_received += 1
            return Incoming(identity, [first, *rest])
        except RemoteProtocolError as exc:
            self._drain()
            return Incoming(identity, None, exc)

    def done(self, incoming: Incoming) -> None:
        """The message has been handled: its reassembly buffer may be reused."""
        if incoming.frames is not None:
            self.reassembler.release(incoming.frames)

    # -- housekeeping ---------------------------------------------------------------------
    def housekeeping(self, now: float, keep: Iterable[str] = ()) -> None:
        """Drop stalled inbound transfers; close sockets to peers idle for ``idle_close_s``."""
        self.reassembler.expire(now)
        keep = set(keep)
        for addr, last in list(self._last_used.items()):
            if addr not in keep and now - last > self.config.idle_close_s and not self._pending.get(addr):
                for table in (self._control, self._bulk):
                    sock = table.pop(addr, None)
                    if sock is not None:
                        sock.close(linger=0)
                self._pending.pop(addr, None)
                del self._last_used[addr]

    def close(self, linger_s: Optional[float] = None) -> None:
        linger = 0 if linger_s is None else int(linger_s * 1000)
        for table in (self._control, self._bulk):
            for sock in table.values():
                sock.close(linger=linger)
            table.clear()
        self.router.close(linger=0)
