"""The transport: one listening ROUTER per node, per peer an outgoing DEALER, and a plain TCP
stream per peer for large messages.

Peer-to-peer messages are one-way: A's DEALER connected to B's advertised address delivers to
B's ROUTER, and B answers through its own DEALER to A's advertised address (carried in every
header). That keeps the protocol symmetric and lets any node initiate to any address.
Clients such as ``p2p status`` are answered through the ROUTER on the connection they came
in on, since they have no listening address.

Two connections per peer, so that a model in flight never delays control traffic: small
messages (membership probes, replies without tensors) go on the DEALER; messages of
``bulk.threshold_bytes`` or more go on a plain TCP connection to the peer's bulk port (its
advertised port + 1), framed by p2p/net/bulk.py and written as the socket becomes writable. The
receiver reads them straight into pooled buffers (``recv_into``: one kernel copy, as a bare
socket; ZeroMQ would add a copy out of its own buffer). Flow control is TCP's window: the
sender holds at most ``max_pending_per_peer`` large messages per peer (references to the
snapshots being sent, no copies) and drops, and counts, any beyond; a transfer that makes no
progress for ``stall_timeout_s`` is abandoned by either end (which closes the connection: a
stream cannot skip a message half-sent).

Memory stays bounded whatever peers do: small send high-water marks, non-blocking sends that
drop and count rather than wait, inbound control messages read every turn and dropped past a
budget (p2p/net/control_port.py), an inbound size limit (ZMQ_MAXMSGSIZE, and the bulk reader's
limits checked before any payload arrives), and a cap on inbound bulk connections. ZeroMQ
reconnects by itself; a bulk connection that fails is re-dialled on the next large send
(after ``reconnect_ivl_ms``). Sockets to peers unused for ``idle_close_s`` are closed.

File descriptors stay bounded too, whatever peers claim or how slowly they send: the node
answers whatever address a message names as its sender, so the sockets to peers are capped at
``max_peer_sockets`` (the least recently used closes first: spoofed sender addresses cannot
grow the table without bound); and an inbound bulk message that, after ``bulk.slow_grace_s``,
has averaged less than ``bulk.min_rate_bytes_per_s`` is cut off (a trickling sender cannot hold
a connection, and one of the ``max_connections`` slots, for ever). A connection to the ZeroMQ
port that does not finish its greeting within ``handshake_ms`` is closed by libzmq (it accepts
every connection: its count is bounded only by the rate of connections times that timeout).

Never pause a connection, and floods: the control port (the ROUTER) and the outgoing DEALERs
have no receive limit, since libzmq aborts the process when a paused connection is reset with a
ZMTP PING buffered; memory is bounded by reading every turn instead, and a flood that outruns
the reading closes the ROUTER and listens afresh (p2p/net/control_port.py).

Dead connections: during a partition or a cut link TCP keeps the old connections and retries
with exponential backoff (its retransmission or zero-window probe timer doubles up to two
minutes), so after the link comes back the queued messages waited up to that long: views took
50 s and more to merge after a 60 s partition in the lab (issue 12's fault soak; seen with
``ss -tino``: ``persist`` timers at backoff 7-8). So the control DEALER sends ZMTP heartbeats
and drops a connection that answers nothing for ``heartbeat_timeout_ms`` (ZeroMQ then
re-dials every ``reconnect_ivl_max_ms`` at most, which succeeds as soon as the route is back),
and both channels set TCP_USER_TIMEOUT (``tcp_user_timeout_ms``), after which the kernel aborts
a connection whose data goes unacknowledged; a bulk send then fails and the next one re-dials.
What was queued on the dead connection is lost, as a cut link loses it anyway.
Those limits take seconds; a link that comes back sooner finds the connections still in TCP's
backoff (issue 16, a link cut for ~1 s: ``ss`` showed backoff 3, the next retransmission
0.7-1.06 s away). So the protocol may ask for a fresh connection (``Send.fresh``: membership does,
rate-limited, when it hears from or probes a member it held unreachable): ``redial`` closes both
sockets to the peer, and the send dials anew; counted in ``redials``.

With a swarm key (``keyring``), every message on both channels is sealed and opened here
(p2p/net/seal.py): control messages one by one, the bulk stream as records sealed just before
they are written (so a message dropped from the queue unsent never consumes a record number).
A message that fails to open comes back as a rejection like any other bad input. The keyring
may be replaced at any time (key rotation); open bulk connections keep the key they began with.

With identities on top (``identity`` and ``allowed``, p2p/net/identity.py), every control
message this node sends or answers is signed inside its seal and every bulk hello is signed;
a message received is accepted only if signed by a key on the allow list, and comes up with
its signer (``Incoming.signer``) for the driver to check against the sender it names. The allow
list may be replaced at any time: bulk connections from a key no longer on it are closed.
"""

from __future__ import annotations

import errno
import itertools
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional, Union

import zmq

from p2p.net.addresses import AddressError, bulk_address, parse_address, to_endpoint
from p2p.net.control_port import ControlPort
from p2p.net.bulk import BufferPool, BulkConfig, SealedReader, StreamReader, sealed_chunks, stream_parts
from p2p.net.identity import Identity
from p2p.net.keyring import Keyring
from p2p.net.seal import BulkSealer, ReplayGuard, open_message, open_signed, seal_message
from p2p.protocol import RemoteProtocolError
from p2p.wire import Limits


class TransportError(RuntimeError):
    """The local endpoint cannot be set up (port in use, bad address)."""


@dataclass(frozen=True)
class TransportConfig:
    send_hwm: int = 16  # queued outgoing messages per peer connection before sends drop
    reply_hwm: int = 4  # replies queued for one client (it asks one thing at a time) before replies drop
    # Inbound control messages are bounded by reading, not by a ZeroMQ queue limit (control_port.py,
    # "Never pause a connection"): each ``receive`` hands the node at most
    # ``recv_budget`` messages per connection and reads and drops (counted: ``recv_drops``) the
    # rest, up to ``recv_drain_max`` reads in all (then it yields to the rest of the turn). A peer
    # sends a few at a time (probes, replies, announcements), so only a flood crosses the budget.
    recv_budget: int = 128
    recv_drain_max: int = 4096
    # A flood faster than that drain (small messages, a few Mbit/s) still grows libzmq's queue:
    # when ``recv_drain_max`` reads have not emptied the ROUTER in ``router_rebind_turns`` turns
    # in a row spanning ``router_rebind_after_s``, the ROUTER is closed (freeing every queued
    # message) and a fresh one bound on the same address (control_port.py, "Floods"). Four
    # turns: a backlog of 16k messages, which peers sending a few a second never build; a
    # quarter of a second: the longer, the more a flood queues (~100 MB a second here).
    router_rebind_after_s: float = 0.25
    router_rebind_turns: int = 4
    max_message_bytes: int = 2 * 1024 * 1024 * 1024  # inbound message limit
    reconnect_ivl_ms: int = 100  # first reconnect delay after a peer drops
    reconnect_ivl_max_ms: int = 2000  # reconnect backoff cap
    idle_close_s: float = 120.0  # close the sockets to a peer not sent to for this long
    max_peer_sockets: int = 256  # peers with open sockets (ZeroMQ and bulk) at once; LRU closes first
    handshake_ms: int = 10_000  # an inbound ZeroMQ connection that has not said hello by then is closed
    # A connection that stops carrying anything (a partition, a cut link) is dropped and re-dialled
    # instead of waiting out TCP's backoff (module docstring, "Dead connections").
    heartbeat_ivl_ms: int = 1000  # ZMTP PING on an otherwise idle control connection
    heartbeat_timeout_ms: int = 6000  # no traffic back this long: the control connection is dropped
    tcp_user_timeout_ms: int = 10_000  # data unacknowledged this long: the kernel aborts the connection
    bulk: BulkConfig = field(default_factory=BulkConfig)


@dataclass
class Incoming:
    """One received message: its frames, or the reason it was rejected on arrival."""

    identity: bytes
    frames: Optional[list]
    error: Optional[RemoteProtocolError] = None
    finite_checked: bool = False  # the bulk reader already proved its float tensors finite
    signer: Optional[bytes] = None  # the public key that signed it (identities on)

    def limits(self, limits: Limits) -> Limits:
        """The limits to ``decode`` it with: without the NaN/Inf pass the reader already made."""
        return replace(limits, check_finite=False) if self.finite_checked and limits.check_finite else limits


class TopCounts(Counter):
    """Counts by peer address for at most about ``keep`` addresses: past twice that many, all but
    the ``keep`` largest are folded into one ``OTHERS`` entry. A node answers and counts whatever
    sender address a message names, so made-up ones must not grow this (the status, the metrics'
    label sets) without bound; real peers, with their steady traffic, stay on top."""

    OTHERS = "(others)"

    def __init__(self, keep: int = 512) -> None:
        super().__init__()
        self.keep = keep

    def add(self, key: str, n: int) -> None:
        self[key] += n
        if len(self) > 2 * self.keep:
            ranked = self.most_common()
            folded = sum(count for _, count in ranked[self.keep:])
            self.clear()
            self.update(dict(ranked[:self.keep]))
            self[self.OTHERS] += folded


def _detached(exc: RemoteProtocolError) -> RemoteProtocolError:
    """The rejection without its traceback and context (the error it was raised from): those
    hold the frames it passed through, whose locals hold the list it is put in, a reference
    cycle left to the collector's rare full passes while a flood of rejections piles them up."""
    return RemoteProtocolError(exc.reason, exc.detail)


def _nbytes(frame: Union[bytes, memoryview, zmq.Frame]) -> int:
    return len(frame) if not isinstance(frame, memoryview) else frame.nbytes


@dataclass
class _Outgoing:
    parts: list[memoryview]  # p2p.net.bulk.stream_parts (with a key: sealed_chunks of them)
    deadline: float
    index: int = 0  # the part being written
    offset: int = 0  # bytes of it written
    pending: Optional[memoryview] = None  # what is being written: the part, or its sealed record
    sealed: bool = False  # a record of it was sealed (it holds a record number: it must go out)

    @property
    def started(self) -> bool:
        return self.index > 0 or self.offset > 0 or self.sealed


@dataclass
class _OutStream:
    """The bulk connection to one peer and the large messages queued for it."""

    queue: deque = field(default_factory=deque)
    sock: Optional[socket.socket] = None
    connected: bool = False
    retry_at: float = 0.0  # no re-dial before this
    backoff_s: float = 0.0
    sealer: Optional[BulkSealer] = None  # this connection's records (with a swarm key)
    hello: Optional[memoryview] = None  # what is left to write of its hello


@dataclass
class _InStream:
    sock: socket.socket
    reader: Union[StreamReader, SealedReader]
    identity: bytes
    started: Optional[float] = None  # when the message now arriving began (None: between messages)
    got: int = 0  # bytes of it so far (the rate ``housekeeping`` holds it to)


def _listen_socket(listen: str) -> socket.socket:
    host, port = bulk_address(listen)
    host = "" if host in ("0.0.0.0", "*") else host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Transport:
    def __init__(self, config: TransportConfig, listen: str, keyring: Optional[Keyring] = None,
                 identity: Optional[Identity] = None, allowed: Optional[frozenset] = None) -> None:
        if (identity is None) != (allowed is None) or (identity is not None and keyring is None):
            raise ValueError("identities need an identity, an allow list and a swarm key together")
        self.config = config
        self.keyring = keyring  # None: an open swarm (nothing sealed, nothing required)
        self.identity = identity  # this node's signing key (None: identities off)
        self.allowed = allowed  # public keys whose messages are accepted (None: identities off)
        self.guard = ReplayGuard()  # sealed control nonces and bulk salts seen lately
        self.context = zmq.Context.instance()
        try:
            self.control = ControlPort(self.context, to_endpoint(listen), config)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise TransportError(f"cannot listen on {listen}: address already in use") from None
            raise TransportError(f"cannot listen on {listen}: {exc}") from None
        try:
            self.listener = _listen_socket(listen)
        except (OSError, AddressError) as exc:
            self.control.close()
            why = "address already in use" if getattr(exc, "errno", None) == errno.EADDRINUSE else str(exc)
            host, port = parse_address(listen)  # valid: the ROUTER bound it
            raise TransportError(f"cannot listen on {host}:{port + 1} (large messages use the port after "
                                 f"{listen}): {why}") from None
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.listener, zmq.POLLIN)
        self._control: dict[str, zmq.Socket] = {}
        self._out: dict[str, _OutStream] = {}
        self._in: dict[socket.socket, _InStream] = {}
        self._last_used: dict[str, float] = {}  # the peers with sockets: when each was last sent to
        self._keep: set[str] = set()  # the neighbours named at the last housekeeping (never idle-closed)
        self._transfer_ids = itertools.count(1)
        self.pool = BufferPool(config.bulk.pool_buffers)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0
        self.send_drops = 0
        self.transfers_abandoned = 0
        self.connections_refused = 0  # inbound bulk connections beyond ``max_connections``
        self.streams_closed_by_peer = 0  # idle outgoing streams the receiver closed (it died, restarted)
        self.slow_closed = 0  # inbound bulk connections cut off for sending too slowly
        self.peer_sockets_evicted = 0  # peers' sockets closed to stay within ``max_peer_sockets``
        self.redials = 0  # peers' sockets closed on the protocol's request, to dial afresh
        self.sent_to = TopCounts()  # bytes of messages accepted for sending, by address

    # -- sockets --------------------------------------------------------------------------
    @property
    def router(self) -> zmq.Socket:
        """The control port's listening socket (it changes when a flood makes it listen afresh)."""
        return self.control.socket

    @property
    def recv_drops(self) -> int:
        return self.control.recv_drops

    @property
    def router_rebinds(self) -> int:
        return self.control.router_rebinds

    @property
    def dealers_flooded(self) -> int:
        return self.control.dealers_flooded

    def _socket(self, addr: str) -> zmq.Socket:
        sock = self._control.get(addr)
        if sock is None:
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self.config.send_hwm)
            # Nothing should arrive on it (peers answer through their own sockets), but a hostile
            # listener can send: with a queue limit its messages would pause the connection, and
            # a reset then aborts the process at the next heartbeat (control_port.py, "Never pause a
            # connection"). So no limit, and ``receive`` reads and drops whatever comes.
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, self.config.reconnect_ivl_ms)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, self.config.reconnect_ivl_max_ms)
            sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
            sock.setsockopt(zmq.HEARTBEAT_IVL, self.config.heartbeat_ivl_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.config.heartbeat_timeout_ms)
            sock.setsockopt(zmq.HEARTBEAT_TTL, self.config.heartbeat_timeout_ms)  # the receiver drops it too
            sock.setsockopt(zmq.TCP_MAXRT, self.config.tcp_user_timeout_ms)
            try:
                sock.connect(to_endpoint(addr))
            except (zmq.ZMQError, ValueError):  # not an address (a peer may name anything): no socket kept
                sock.close(linger=0)
                raise
            self._control[addr] = sock
        return sock

    # -- sending --------------------------------------------------------------------------
    def send(self, addr: str, frames: list, now: float) -> bool:
        """Send ``frames`` to ``addr`` without blocking; False (and counted) if dropped."""
        if addr not in self._last_used and len(self._last_used) >= self.config.max_peer_sockets:
            self._evict_peer()
        self._last_used[addr] = now
        size = sum(_nbytes(f) for f in frames)
        try:
            if len(frames) > 1 and size >= self.config.bulk.threshold_bytes:
                queued = self._send_bulk(addr, frames, now)
                if queued:
                    self.sent_to.add(addr, size)
                return queued
            if self.keyring is not None:
                frames = seal_message(self.keyring, frames, time.time(), identity=self.identity)
            sock = self._socket(addr)
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.send_drops += 1
            return False
        except (zmq.ZMQError, ValueError):  # e.g. an unresolvable address
            self.send_drops += 1
            return False
        self.messages_sent += 1
        self.bytes_sent += size
        self.sent_to.add(addr, size)
        return True

    def _send_bulk(self, addr: str, frames: list, now: float) -> bool:
        stream = self._out.setdefault(addr, _OutStream())
        if len(stream.queue) >= self.config.bulk.max_pending_per_peer:
            self.send_drops += 1
            return False
        parts = stream_parts(next(self._transfer_ids), frames)
        if self.keyring is not None:
            parts = sealed_chunks(parts)
        stream.queue.append(_Outgoing(parts, now + self.config.bulk.stall_timeout_s))
        self.messages_sent += 1
        self._pump(addr, stream, now)
        return True

    def redial(self, addr: str) -> None:
        """Close the sockets to ``addr`` (what was queued on them is dropped) so that the next
        send dials afresh instead of queueing behind a connection in TCP's backoff."""
        if addr in self._last_used:
            self._close_peer(addr)
            self.redials += 1

    @property
    def peer_sockets(self) -> int:
        """Peers this node holds sockets to (at most ``max_peer_sockets``)."""
        return len(self._last_used)

    def _evict_peer(self) -> None:
        """Make room in the socket table: close the least recently used peer's sockets, not a
        neighbour's while another will do (a flood of spoofed senders must not cost the
        neighbours their connections)."""
        others = [a for a in self._last_used if a not in self._keep] or list(self._last_used)
        self._close_peer(min(others, key=self._last_used.__getitem__))
        self.peer_sockets_evicted += 1

    def _dial(self, addr: str, stream: _OutStream, now: float) -> None:
        """Start a non-blocking connect to ``addr``'s bulk port (completion shows as POLLOUT)."""
        try:
            host, port = bulk_address(addr)
            family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, kind, proto)
        except (OSError, AddressError):
            self._fail(stream, now)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux: a send then fails instead of waiting for TCP's backoff
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, self.config.tcp_user_timeout_ms)
        err = sock.connect_ex(sockaddr)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            self._fail(stream, now)
            return
        stream.sock, stream.connected = sock, err == 0
        if self.keyring is not None:
            stream.sealer = BulkSealer(self.keyring, time.time(), identity=self.identity)
            stream.hello = memoryview(stream.sealer.hello)
        if stream.connected:
            stream.backoff_s = 0.0

    def _closed_by_peer(self, stream: _OutStream) -> None:
        """The receiver closed (or reset) an idle stream: a receiver never sends on it, so
        anything readable is its end. Close ours; the next large message dials afresh."""
        try:
            data = stream.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            return  # not a close (nothing should come this way; leave it to the stall timeout)
        stream.sock.close()
        stream.sock, stream.connected, stream.retry_at, stream.backoff_s = None, False, 0.0, 0.0
        self.streams_closed_by_peer += 1

    def _fail(self, stream: _OutStream, now: float) -> None:
        """The bulk connection failed: close it, drop what was queued, re-dial later."""
        if stream.sock is not None:
            stream.sock.close()
        stream.sock, stream.connected = None, False
        self.transfers_abandoned += len(stream.queue)
        stream.queue.clear()
        cfg = self.config
        stream.backoff_s = min(max(2 * stream.backoff_s, cfg.reconnect_ivl_ms / 1000), cfg.reconnect_ivl_max_ms / 1000)
        stream.retry_at = now + stream.backoff_s

    def _pump(self, addr: str, stream: _OutStream, now: float) -> None:
        """Write queued large messages to ``addr`` until the socket would block."""
        queue = stream.queue
        while queue and now > queue[0].deadline:
            if queue[0].started:  # a stream cannot skip half a message: start afresh
                self._fail(stream, now)
                return
            queue.popleft()
            self.transfers_abandoned += 1
        if not queue:
            return
        if stream.sock is None:
            if now < stream.retry_at:
                self.transfers_abandoned += len(queue)
                queue.clear()
                return
            self._dial(addr, stream, now)
        if not stream.connected:
            return
        while queue:
            head = queue[0]
            if stream.hello is not None:
                chunk = stream.hello
            else:
                if head.pending is None:
                    part = head.parts[head.index]
                    head.pending = part if stream.sealer is None else stream.sealer.seal(part)
                    head.sealed = head.sealed or stream.sealer is not None
                chunk = head.pending[head.offset:]
            try:
                sent = stream.sock.send(chunk)
            except BlockingIOError:
                return
            except OSError:
                self._fail(stream, now)
                return
            self.bytes_sent += sent
            head.deadline = now + self.config.bulk.stall_timeout_s  # progress
            if stream.hello is not None:
                stream.hello = stream.hello[sent:] if sent < stream.hello.nbytes else None
                continue
            head.offset += sent
            if head.offset == head.pending.nbytes:
                head.index, head.offset, head.pending = head.index + 1, 0, None
                if head.index == len(head.parts):
                    queue.popleft()

    def pump(self, now: float) -> None:
        """Continue every transfer in progress (``receive`` calls it)."""
        for addr, stream in self._out.items():
            if stream.queue:
                self._pump(addr, stream, now)

    def set_keyring(self, keyring: Keyring) -> None:
        """Key rotation: from now on send with ``keyring.primary`` and accept only its keys. Bulk
        connections made with a key no longer listed are closed (a removed key must not keep a
        connection); idle outgoing ones made with the old primary too, so they re-dial with the new."""
        self.keyring = keyring
        for stream in list(self._in.values()):
            kid = getattr(stream.reader, "key_id", None)
            if kid is not None and keyring.lookup(kid) is None:
                self.transfers_abandoned += stream.reader.mid_message()
                self._close_in(stream)
        for stream in self._out.values():
            if stream.sealer is not None and stream.sealer.key_id != keyring.primary_id and not stream.queue:
                if stream.sock is not None:
                    stream.sock.close()
                stream.sock, stream.connected, stream.sealer, stream.hello = None, False, None, None

    def set_allowed(self, allowed: frozenset) -> None:
        """The allow file changed: accept only these keys from now on, and close the inbound bulk
        connections of keys no longer on it (a removed machine must not keep a stream open)."""
        self.allowed = allowed
        for stream in list(self._in.values()):
            signer = getattr(stream.reader, "signer", None)
            if signer is not None and signer not in allowed:
                self.transfers_abandoned += stream.reader.mid_message()
                self._close_in(stream)

    def reply(self, identity: bytes, frames: list) -> bool:
        """Answer a client on the ROUTER connection its request came in on."""
        if self.keyring is not None:
            frames = seal_message(self.keyring, frames, time.time(), identity=self.identity)
        try:
            self.router.send_multipart([identity, *frames], flags=zmq.NOBLOCK, copy=False)
        except (zmq.Again, zmq.ZMQError):
            self.send_drops += 1
            return False
        self.bytes_sent += sum(_nbytes(f) for f in frames)
        return True

    # -- receiving ------------------------------------------------------------------------
    def receive(self, timeout_s: float, now: float) -> list[Incoming]:
        """Wait up to ``timeout_s`` for traffic; return complete messages (or rejections)."""
        writers = [st for st in self._out.values() if st.queue and st.sock is not None]
        # Idle outgoing streams are watched for the peer's close (readable: EOF), so one to a peer
        # that died or restarted is re-dialled before the next message is lost on it.
        watched = [st for st in self._out.values() if st.sock is not None and st.connected and not st.queue]
        for st in writers:
            self.poller.register(st.sock, zmq.POLLOUT)
        for st in watched:
            self.poller.register(st.sock, zmq.POLLIN)
        try:  # (ZeroMQ sockets come back as themselves, plain sockets as their file descriptors)
            events = dict(self.poller.poll(max(0, int(timeout_s * 1000))))
        finally:
            for st in writers + watched:
                self.poller.unregister(st.sock)
        for st in watched:
            if events.get(st.sock.fileno(), 0):
                self._closed_by_peer(st)
        for st in writers:
            if not st.connected and events.get(st.sock.fileno(), 0):
                if st.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self._fail(st, now)
                else:
                    st.connected, st.backoff_s = True, 0.0
        if writers:
            self.pump(now)
        out: list[Incoming] = []
        if events.get(self.listener.fileno(), 0) & zmq.POLLIN:
            self._accept(now)
        for sock, stream in list(self._in.items()):
            if events.get(sock.fileno(), 0) & zmq.POLLIN:
                self._read(stream, now, out)
        before = self.control.bytes_dropped
        self.control.drain(bool(events.get(self.router, 0) & zmq.POLLIN), self._receive_one, out, self.poller, now)
        self.control.sweep(self._control, now)
        self.bytes_received += self.control.bytes_dropped - before
        return out

    def _accept(self, now: float) -> None:
        while True:
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of file descriptors: try again on the next event
                return
            if len(self._in) >= self.config.bulk.max_connections and not self._evict_idle():
                sock.close()
                self.connections_refused += 1
                continue
            sock.setblocking(False)
            reader = StreamReader(self.pool, self.config.max_message_bytes, self.config.bulk.max_header_bytes, now)
            if self.keyring is not None:
                reader = SealedReader(reader, lambda: self.keyring, self.guard, time.time, now, lambda: self.allowed)
            self._in[sock] = _InStream(sock, reader, f"tcp:{peer[0]}:{peer[1]}".encode())
            self.poller.register(sock, zmq.POLLIN)

    def _evict_idle(self) -> bool:
        """Make room for a new inbound connection by closing the one idle longest (a peer that
        vanished without closing leaves its connection open); False if all are mid-message."""
        idle = [st for st in self._in.values() if not st.reader.mid_message()]
        if not idle:
            return False
        self._close_in(min(idle, key=lambda st: st.reader.last_progress))
        return True

    def _close_in(self, stream: _InStream) -> None:
        self.poller.unregister(stream.sock)
        stream.sock.close()
        del self._in[stream.sock]

    def _read(self, stream: _InStream, now: float, out: list[Incoming]) -> None:
        """Read what the connection has (level-triggered: the rest comes on the next poll)."""
        reader = stream.reader
        while True:
            try:
                got = stream.sock.recv_into(reader.target())
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                got = 0
            if got == 0:  # closed (or reset) by the sender: a peer that left, not a bad message
                self.transfers_abandoned += reader.mid_message()
                self._close_in(stream)
                return
            self.bytes_received += got
            if stream.started is None:
                stream.started, stream.got = now, 0
            stream.got += got
            try:
                frames = reader.advance(got, now)
            except RemoteProtocolError as exc:
                out.append(Incoming(stream.identity, None, _detached(exc)))
                self._close_in(stream)
                return
            if not reader.mid_message():
                stream.started = None
            if frames is not None:
                self.messages_received += 1
                if reader.non_finite:
                    self.pool.release(frames)
                    out.append(Incoming(stream.identity, None,
                                        RemoteProtocolError("non_finite", "a tensor carries NaN or Inf")))
                else:
                    out.append(Incoming(stream.identity, frames, finite_checked=reader.finite_checked,
                                        signer=getattr(reader, "signer", None)))
                return  # one message per connection per call: other traffic gets its turn

    def _more(self) -> bool:
        return bool(self.router.getsockopt(zmq.RCVMORE))

    def _receive_one(self, identity: bytes) -> Incoming:
        frames = []
        while self._more():
            frame = self.router.recv(copy=False)
            self.bytes_received += len(frame)
            frames.append(frame)
        if not frames:
            return Incoming(identity, None, RemoteProtocolError("malformed", "empty message"))
        self.messages_received += 1
        signer = None
        if self.keyring is not None:
            try:
                if self.allowed is None:
                    frames = open_message(self.keyring, self.guard, frames, time.time())
                else:
                    signer, frames = open_signed(self.keyring, self.guard, frames, time.time(), self.allowed)
            except RemoteProtocolError as exc:
                return Incoming(identity, None, _detached(exc))
        return Incoming(identity, frames, signer=signer)

    def done(self, incoming: Incoming) -> None:
        """The message has been handled: its receive buffer may be reused."""
        if incoming.frames is not None:
            self.pool.release(incoming.frames)

    # -- housekeeping ---------------------------------------------------------------------
    def housekeeping(self, now: float, keep: Iterable[str] = ()) -> None:
        """Drop stalled inbound transfers; close sockets to peers idle for ``idle_close_s``."""
        cfg = self.config.bulk
        for stream in list(self._in.values()):
            if stream.reader.mid_message() and now - stream.reader.last_progress > cfg.stall_timeout_s:
                self.transfers_abandoned += 1
                self._close_in(stream)
            elif stream.started is not None and now - stream.started > cfg.slow_grace_s \
                    and stream.got < cfg.min_rate_bytes_per_s * (now - stream.started):
                self.slow_closed += 1
                self._close_in(stream)
        self._keep = keep = set(keep)
        for addr, last in list(self._last_used.items()):
            out = self._out.get(addr)
            if addr not in keep and now - last > self.config.idle_close_s and not (out and out.queue):
                self._close_peer(addr)

    def _close_peer(self, addr: str) -> None:
        """Close the sockets to ``addr`` (a message still queued for it is abandoned)."""
        sock = self._control.pop(addr, None)
        if sock is not None:
            sock.close(linger=0)
        out = self._out.pop(addr, None)
        if out is not None:
            if out.sock is not None:
                out.sock.close()
            self.transfers_abandoned += len(out.queue)
        del self._last_used[addr]

    def close(self, linger_s: Optional[float] = None) -> None:
        linger = 0 if linger_s is None else int(linger_s * 1000)
        for sock in self._control.values():
            sock.close(linger=linger)
        self._control.clear()
        for stream in self._out.values():
            if stream.sock is not None:
                stream.sock.close()
        self._out.clear()
        for stream in list(self._in.values()):
            stream.sock.close()
        self._in.clear()
        self.listener.close()
        self.control.close()
