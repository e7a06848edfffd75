"""TEMPORARY stand-in for p2p.gossip.Membership while SWIM is written. Delete when it lands."""
from __future__ import annotations
import random
from dataclasses import dataclass
from typing import Optional, Sequence
from p2p.protocol import Send
from p2p.wire import message


@message(99)
@dataclass(frozen=True)
class Hello:
    node_id: str
    members: tuple


@dataclass(frozen=True)
class Member:
    id: str
    addr: str
    state: str = "alive"
    incarnation: int = 0
    last_heard: Optional[float] = None


class StubMembership:
    MESSAGES = (Hello,)

    def __init__(self, config, node_id, addr, rng: random.Random, now, incarnation=0):
        self.node_id, self.addr, self.rng = node_id, addr, rng
        self.known: dict[str, Member] = {}
        self.seeds: list[str] = []
        self._joined = False
        self._next = now
        self.stats = {}

    @property
    def joined(self):
        return self._joined

    def start(self, seeds: Sequence[str], now):
        self.seeds = list(seeds)
        self._joined = not self.seeds
        return self.tick(now)

    def _hello(self):
        return Hello(self.node_id, tuple((m.id, m.addr) for m in self.known.values()) + ((self.node_id, self.addr),))

    def receive(self, src, msg, now):
        self._joined = True
        self.known[msg.node_id] = Member(msg.node_id, src, last_heard=now)
        for mid, maddr in msg.members:
            if mid != self.node_id and mid not in self.known:
                self.known[mid] = Member(mid, maddr)
        return []

    def tick(self, now):
        if now < self._next:
            return []
        self._next = now + 0.3
        targets = [] if self._joined else list(self.seeds)
        if self.known:
            targets.append(self.rng.choice(list(self.known.values())).addr)
        return [Send(t, self._hello()) for t in targets]

    def next_deadline(self):
        return self._next

    def leave(self, now):
        return []

    def alive(self):
        return sorted(self.known.values(), key=lambda m: m.id)

    def table(self):
        return [Member(self.node_id, self.addr)] + self.alive()
