"""ZeroMQ transport: one listening ROUTER per node, one outgoing DEALER per peer address.

Peer-to-peer messages are one-way: A's DEALER connected to B's advertised address delivers to
B's ROUTER, and B answers through its own DEALER to A's advertised address (carried in every
header). That keeps the protocol symmetric and lets any node initiate to any address.
Clients such as ``p2p status`` are answered through the ROUTER on the connection they came
in on, since they have no listening address.

Memory stays bounded whatever peers do:
- each DEALER has a small send high-water mark; a send that would block is dropped and
  counted (the protocol above treats it as a lost message), so a slow or dead peer cannot
  make this node's memory grow;
- the ROUTER refuses inbound messages bigger than the configured limit (ZMQ_MAXMSGSIZE
  drops the connection) and holds at most ``recv_hwm`` messages.
ZeroMQ reconnects DEALERs by itself; sockets to peers unused for ``idle_close_s`` are closed.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Iterable, Optional

import zmq

from p2p.addresses import to_endpoint


class TransportError(RuntimeError):
    """The local endpoint cannot be set up (port in use, bad address)."""


@dataclass(frozen=True)
class TransportConfig:
    send_hwm: int = 16  # queued outgoing messages per peer before sends are dropped
    recv_hwm: int = 256  # queued incoming messages before ZeroMQ pushes back
    max_message_bytes: int = 2 * 1024 * 1024 * 1024  # inbound frame limit (ZMQ_MAXMSGSIZE)
    reconnect_ivl_ms: int = 100  # first reconnect delay after a peer drops
    reconnect_ivl_max_ms: int = 2000  # reconnect backoff cap
    idle_close_s: float = 120.0  # close the socket to a peer not sent to for this long


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
        self._dealers: dict[str, zmq.Socket] = {}
        self._last_used: dict[str, float] = {}
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0
        self.send_drops = 0

    def _dealer(self, addr: str) -> zmq.Socket:
        sock = self._dealers.get(addr)
        if sock is None:
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self.config.send_hwm)
            sock.setsockopt(zmq.RECONNECT_IVL, self.config.reconnect_ivl_ms)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, self.config.reconnect_ivl_max_ms)
            sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
            sock.connect(to_endpoint(addr))
            self._dealers[addr] = sock
        return sock

    def send(self, addr: str, frames: list, now: float) -> bool:
        """Queue ``frames`` for ``addr`` without blocking; False (and counted) if dropped."""
        try:
            sock = self._dealer(addr)
        except (zmq.ZMQError, ValueError):
            self.send_drops += 1
            return False
        self._last_used[addr] = now
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.send_drops += 1
            return False
        self.messages_sent += 1
        self.bytes_sent += sum(len(f) if isinstance(f, (bytes, bytearray)) else f.nbytes for f in frames)
        return True

    def reply(self, identity: bytes, frames: list) -> bool:
        """Answer a client on the ROUTER connection its request came in on."""
        try:
            self.router.send_multipart([identity, *frames], flags=zmq.NOBLOCK, copy=False)
        except (zmq.Again, zmq.ZMQError):
            self.send_drops += 1
            return False
        self.bytes_sent += sum(len(f) if isinstance(f, (bytes, bytearray)) else f.nbytes for f in frames)
        return True

    def receive(self, timeout_s: float, max_messages: int = 64) -> list[tuple[bytes, list]]:
        """Wait up to ``timeout_s`` for messages; return ``(identity, frames)`` pairs."""
        out: list[tuple[bytes, list]] = []
        if not self.poller.poll(max(0, int(timeout_s * 1000))):
            return out
        while len(out) < max_messages:
            try:
                parts = self.router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.messages_received += 1
            self.bytes_received += sum(len(p) for p in parts[1:])
            out.append((parts[0].bytes, parts[1:]))
        return out

    def close_idle(self, now: float, keep: Iterable[str] = ()) -> None:
        """Close sockets to peers we have not sent to for ``idle_close_s``."""
        keep = set(keep)
        for addr, last in list(self._last_used.items()):
            if addr not in keep and now - last > self.config.idle_close_s:
                self._dealers.pop(addr).close(linger=0)
                del self._last_used[addr]

    def close(self, linger_s: Optional[float] = None) -> None:
        linger = 0 if linger_s is None else int(linger_s * 1000)
        for sock in self._dealers.values():
            sock.close(linger=linger)
        self._dealers.clear()
        self.router.close(linger=0)
