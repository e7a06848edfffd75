"""One peer's whole protocol: membership, topology, averaging and state sync composed, still
sans-I/O.

The driver (ZeroMQ daemon or simulator) feeds it messages and timer ticks; it routes each
message to the part that owns its type and merges their deadlines. Averaging sees only the
neighbours the topology picks among the members that membership believes alive, so a dead
member costs at most one exchange timeout.

State sync (p2p/statesync/): every peer serves its state to joiners (``donor``); a joiner runs
a ``StateJoiner`` (``begin_sync``) BEFORE ``start``, so no member averages with it until it
holds the swarm's state.

``neighbours()`` is asked on every message and step; it is memoised on (membership table
version, topology round, robust-mixing exclusions): the topology is a pure function of (me,
alive members, round), so the answer only changes when the table or the round does.

Robust mixing (p2p/averaging/robust.py): a peer the averager found to be a repeat offender is
left out of this peer's neighbours for its cool-down, and its averaging messages are dropped
unread (counted as ``robust_dropped``). Membership is not touched: the offender is alive, just
not averaged with; other peers judge it for themselves.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from p2p.protocol import RemoteProtocolError, Send
from p2p.statesync import StateDonor, StateJoiner
from p2p.statesync.messages import SyncChunk, SyncChunkRequest, SyncOffer, SyncQuery

Topology = Callable[[str, Sequence[str]], list[str]]


class Peer:
    def __init__(self, addr: str, membership, averager, topology: Topology,
                 donor: Optional[StateDonor] = None) -> None:
        self.addr = addr
        self.membership = membership
        self.averager = averager
        if hasattr(averager, "self_addr"):
            averager.self_addr = addr  # DiLoCo names the Deltas it averaged by address (replay repairs)
        self.topology = topology
        self.donor = donor
        self.joiner: Optional[StateJoiner] = None
        self._averaging_types = tuple(averager.MESSAGES)
        self._round_of = getattr(averager, "topology_round", None)
        self._robust = getattr(averager, "robust", None)
        self._alive_version = -1  # membership version that ``_alive`` was read at
        self._alive: list[str] = []
        self._memo_version, self._memo_round = -1, -1  # the key ``_memo`` was computed for
        self._memo: list[str] = []

    def neighbours(self) -> list[str]:
        """This round's neighbours: the topology over the members believed alive (by address,
        so every peer computes the same graph from the same view without talking about it)."""
        r = self._round_of() if self._round_of else 0
        shunned = self._robust.version if self._robust is not None else 0
        version = (self.membership.version, shunned)
        if version != self._memo_version or r != self._memo_round:
            if version[0] != self._alive_version:
                self._alive = [m.addr for m in self.membership.alive()]
                self._alive_version = version[0]
            self._memo = self.topology(self.addr, self._alive, r)
            if shunned:
                self._memo = self._robust.allowed(self._memo)
            self._memo_version, self._memo_round = version, r
        return list(self._memo)

    def start(self, seeds: Sequence[str], now: float) -> list[Send]:
        return self.membership.start(seeds, now)

    def begin_sync(self, joiner: StateJoiner, now: float) -> list[Send]:
        """Download the swarm's state with ``joiner`` (before ``start``)."""
        self.joiner = joiner
        return joiner.start(now)

    def receive(self, src: str, msg: object, now: float) -> list[Send]:
        if self.membership.owns(msg):
            return self.membership.receive(src, msg, now)
        if isinstance(msg, self._averaging_types):
            if self._robust is not None and self._robust.drop(src):
                return []
            return self.averager.receive(src, msg, now, self.neighbours())
        if isinstance(msg, (SyncQuery, SyncChunkRequest)) and self.donor is not None:
            return self.donor.receive(src, msg, now)
        if isinstance(msg, (SyncOffer, SyncChunk)):
            if self.joiner is None or self.joiner.finished:
                return []  # an answer that comes after we stopped asking
            return self.joiner.receive(src, msg, now)
        raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not a peer message")

    def send_dropped(self, send: Send, now: float) -> None:
        """The driver dropped ``send`` unsent (its queue to that peer was full): an averager
        that gave something away with it (SGP's push-sum weight) takes it back."""
        hook = getattr(self.averager, "send_dropped", None)
        if hook is not None and isinstance(send.msg, self._averaging_types):
            hook(send.to, send.msg, now)

    def tick(self, now: float) -> list[Send]:
        sends = []
        if now >= self.membership.next_deadline():
            sends += self.membership.tick(now)
        if self._robust is not None and now >= self._robust.next_deadline():
            self._robust.expire(now)
        if now >= self.averager.next_deadline():
            sends += self.averager.tick(now, self.neighbours())
        for part in (self.donor, self.joiner):
            if part is not None and now >= part.next_deadline():
                sends += part.tick(now)
        return sends

    def next_deadline(self) -> float:
        deadlines = [self.membership.next_deadline(), self.averager.next_deadline()]
        if self._robust is not None:
            deadlines.append(self._robust.next_deadline())
        deadlines += [part.next_deadline() for part in (self.donor, self.joiner) if part is not None]
        return min(deadlines)

    @property
    def joined(self) -> bool:
        """Some member answered: we are part of a swarm (or its first member)."""
        return self.membership.joined

    def live_members(self) -> int:
        """Members believed alive or suspect, this one included (the swarm size as we see it)."""
        return self.membership.num_live()

    def busy(self) -> bool:
        """An averaging exchange is in flight (a stop waits for it, bounded by its timeout)."""
        return self.averager.busy()

    def leave(self, now: float) -> list[Send]:
        """Announce a graceful stop to the other members."""
        return self.membership.leave(now)
