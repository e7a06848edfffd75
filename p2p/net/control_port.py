"""The control port: the node's listening ROUTER, read so that libzmq never pauses a connection.

Never pause a connection: libzmq (4.3.5 and master, issues #3937, #4364, #4767) stops reading a
connection whose receive queue is full (RCVHWM) with bytes already read into its buffer; if the
connection then fails (the peer resets it) it marks the engine ``_io_error``, and the next time
it would write on that connection (the PONG to a ZMTP PING decoded from the buffer once the node
reads again, or a DEALER's own heartbeat PING) it asserts ``!_io_error`` and aborts the process.
ZMTP is below the seal: any host that reaches the port, or that a node dials (a node answers
whatever address a message names), can do it on purpose (bench/zmq_router_abort.py). So no
socket of the transport has a receive limit (RCVHWM 0: the queue is never full, the engine never
stops its input: src/stream_engine_base.cpp stops it only when a message cannot be pushed into
the pipe, src/pipe.cpp's ``check_hwm`` never refuses one with a limit of 0), and memory is
bounded by reading instead: every turn, ``drain`` reads the ROUTER until it is empty, hands the
node at most ``recv_budget`` messages per connection and drops (counts, logs) the rest unopened,
and ``sweep`` drops whatever arrived on the outgoing DEALERs (peers never answer on them; looked
at every ``DEALER_SWEEP_EVERY_S``). What a connection can queue is what arrives between two
looks (ZMQ_MAXMSGSIZE still bounds one message).

Floods: small messages can still arrive faster than the network thread reads and drops them
(150-200k a second of CPU time here; 1-byte messages at that rate are a few Mbit/s), and libzmq's
I/O thread queues them faster still: bench/control_flood.py, one local sender of 100-byte
messages, RSS +70-120 MB/s, 490 MB after 5 s. So when ``router_rebind_turns`` turns in a row,
spanning ``router_rebind_after_s`` or more, each read ``recv_drain_max`` messages without emptying
the ROUTER (a backlog no swarm's traffic builds: 16k messages and more), the node closes the
ROUTER with everything libzmq queued for it and binds a new one on the same address
(``router_rebinds``; the same flood then peaks at 110-175 MB; 1-byte messages at 80 MB). Every
inbound control connection goes with it: peers' DEALERs re-dial by themselves within
``reconnect_ivl_ms`` (what they had written and the node had not read is lost, as a few probes
are), a client waiting for a reply gets none. An outgoing DEALER that a sweep finds with
``recv_drain_max`` messages or more is closed (``dealers_flooded``) and the next send to that peer
dials anew. Closing the ROUTER cannot abort: the engine of a closing connection cannot push what
it reads (its pipe is no longer active, src/pipe.cpp ``check_write``), so it stops its input, and
a reset then marks it ``_io_error``; but nothing writes on it afterwards (a ROUTER sends no
heartbeats of its own, and a peer's PING is never decoded again: ``restart_input`` comes only from
a pipe made writable again, which a terminating pipe never is; ``zap_msg_available`` needs a
security mechanism). A DEALER's own heartbeat PING could still do it, if its timer fired in the
moment between the reset and the session destroying the engine (a few commands between libzmq's
threads); that holds for every close of a DEALER (idle, eviction, redial), not only these. Trials,
bench/flood_close_abort.py: 72 rebinds and 280 DEALER closes under floods of PINGs and resets, no
abort.

Socket handling only: what a message means (its seal, its signer) is the transport's
(p2p/net/transport.py), which hands ``drain`` the function that reads one message.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable, Optional

import zmq

from p2p.events import event

LOG_EVERY_S = 10.0  # a flood logs a line this often at most; the counters say the rest
DEALER_SWEEP_EVERY_S = 0.1  # how often the outgoing DEALERs are emptied (nothing should be there)


class ControlPort:
    """The bound ROUTER (``socket``), its drain, and the flood counters."""

    def __init__(self, context: zmq.Context, endpoint: str, config) -> None:
        """``config``: the transport's (p2p/net/transport.py ``TransportConfig``). Raises
        ``zmq.ZMQError`` when ``endpoint`` cannot be bound (the socket is closed then)."""
        self.context, self.endpoint, self.config = context, endpoint, config
        self.socket = self._make()
        try:
            self.socket.bind(endpoint)
        except zmq.ZMQError:
            self.socket.close()
            raise
        self._unbound = False  # the ROUTER was replaced and the new one could not bind yet
        self.recv_drops = 0  # control messages read and dropped: over ``recv_budget``, or on a DEALER
        self.router_rebinds = 0  # ROUTERs closed and bound afresh: the drain could not keep up
        self.dealers_flooded = 0  # outgoing DEALERs closed: the listener sent more than a sweep reads
        self.bytes_dropped = 0  # the bytes of those messages (the transport counts them as received)
        self._behind_since: Optional[float] = None  # first of the turns in a row that left the ROUTER unemptied
        self._behind_turns = 0
        self._next_sweep = 0.0
        self._next_drop_log = self._next_flood_log = 0.0

    def _make(self) -> zmq.Socket:
        router = self.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVHWM, 0)  # never full: module docstring, "Never pause a connection"
        # A second connection naming a routing id already in use would otherwise be left unread
        # by libzmq (an "anonymous" pipe no one reads), and with no queue limit it could grow for
        # ever; with handover it takes the id over and the older connection is closed. Our peers
        # name none (libzmq picks a random one), so only a made-up id can clash.
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        # A client that asks and never reads would otherwise have libzmq keep 1000 replies (a
        # model each, for ``p2p export``) per connection.
        router.setsockopt(zmq.SNDHWM, self.config.reply_hwm)
        router.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished client raises, we count it
        router.setsockopt(zmq.HANDSHAKE_IVL, self.config.handshake_ms)  # (libzmq's default: 30 s)
        return router

    # -- reading ----------------------------------------------------------------------------
    def drain(self, readable: bool, read_one: Callable[[bytes], object], out: list, poller: zmq.Poller,
              now: float) -> None:
        """Read the ROUTER (when ``readable``) until it is empty or ``recv_drain_max`` reads: at
        most ``recv_budget`` messages per connection go through ``read_one(identity)`` into
        ``out``, the rest are dropped unopened; then replace the ROUTER if a flood outran the
        drain for long enough (module docstring, "Floods")."""
        if self._unbound:
            self._bind()
        read = dropped = 0
        if readable:
            taken: Counter = Counter()
            while read < self.config.recv_drain_max:
                try:
                    identity = self.socket.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                read += 1
                if taken[identity] < self.config.recv_budget:
                    taken[identity] += 1
                    out.append(read_one(identity))
                else:
                    self._skip_rest(self.socket)
                    dropped += 1
        self._dropped(dropped, now)
        self._keep_up(read >= self.config.recv_drain_max, poller, now)

    def sweep(self, dealers: dict, now: float) -> None:
        """Every ``DEALER_SWEEP_EVERY_S``: drop what arrived on the outgoing DEALERs
        (``{address: socket}``); close one that held a whole drain's worth and more (removed
        from ``dealers``: the next send dials anew)."""
        if now < self._next_sweep:  # asking 256 sockets costs 0.5-1.3 ms: not every turn
            return
        self._next_sweep = now + DEALER_SWEEP_EVERY_S
        dropped = 0
        for addr, sock in list(dealers.items()):
            if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                continue
            n = 0
            while n < self.config.recv_drain_max:
                try:
                    self.bytes_dropped += len(sock.recv(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    break
                self._skip_rest(sock)
                n += 1
            dropped += n
            if n >= self.config.recv_drain_max:  # more to come
                del dealers[addr]
                sock.close(linger=0)
                self.dealers_flooded += 1
                self._flooded(f"closed the outgoing connection to {addr}: it was sent at least "
                              f"{n} messages in {DEALER_SWEEP_EVERY_S} s", now)
        self._dropped(dropped, now)

    def _skip_rest(self, sock: zmq.Socket) -> None:
        while sock.getsockopt(zmq.RCVMORE):
            self.bytes_dropped += len(sock.recv(copy=False))

    def _dropped(self, n: int, now: float) -> None:
        if not n:
            return
        self.recv_drops += n
        if now >= self._next_drop_log:
            self._next_drop_log = now + LOG_EVERY_S
            event("recv_dropped", f"dropped {n} control messages over the per-connection budget or on an "
                  f"outgoing connection, {self.recv_drops} so far", logging.WARNING, dropped=n, total=self.recv_drops)

    # -- floods -----------------------------------------------------------------------------
    def _keep_up(self, behind: bool, poller: zmq.Poller, now: float) -> None:
        """Count the turns in a row whose drain left the ROUTER unemptied; when they have lasted
        long enough, replace the ROUTER (what libzmq queued for it goes with it)."""
        if not behind:
            self._behind_since, self._behind_turns = None, 0
            return
        if self._behind_since is None:
            self._behind_since = now
        self._behind_turns += 1
        if self._behind_turns >= self.config.router_rebind_turns \
                and now - self._behind_since >= self.config.router_rebind_after_s:
            self._behind_since, self._behind_turns = None, 0
            self._rebind(poller, now)

    def _rebind(self, poller: zmq.Poller, now: float) -> None:
        """Close the ROUTER with whatever libzmq queued for it and listen afresh on the same
        address. Every inbound control connection goes: peers' DEALERs re-dial by themselves
        (``reconnect_ivl_ms``), a client waiting for a reply gets none (the reply fails, counted)."""
        poller.unregister(self.socket)
        self.socket.close(linger=0)
        self.socket = self._make()
        poller.register(self.socket, zmq.POLLIN)
        self._unbound = True
        self._bind()
        self.router_rebinds += 1
        self._flooded(f"control messages arrived faster than they could be read for "
                      f"{self.config.router_rebind_after_s} s: listening afresh, every inbound control "
                      f"connection dropped ({self.router_rebinds} times so far)", now)

    def _bind(self) -> None:
        """Bind the new ROUTER; until the old one's listener is gone (libzmq closes it in its
        own threads, usually within a millisecond) the address is in use: try on the next turn."""
        try:
            self.socket.bind(self.endpoint)
        except zmq.ZMQError:
            return
        self._unbound = False

    def _flooded(self, what: str, now: float) -> None:
        if now >= self._next_flood_log:
            self._next_flood_log = now + LOG_EVERY_S
            event("control_flood", what, logging.WARNING, router_rebinds=self.router_rebinds,
                  dealers_flooded=self.dealers_flooded)

    def close(self) -> None:
        self.socket.close(linger=0)
