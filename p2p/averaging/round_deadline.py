"""How long a synchronous round waits for its neighbours: from the bytes it moves and the link.

A D-PSGD round moves a model-sized vector each way with every neighbour (8.7 MB fp32 on
nodes.wide); at 20 Mbit/s that takes ~10 s, so a constant 5 s deadline (``round_timeout_s``)
left nearly every round partial, and the vectors that arrived late were thrown away (issue 16).
So the deadline follows the link, as AD-PSGD's exchange timeout does (p2p/bandwidth.py,
``link_timeout``):

- **Measured.** Per neighbour, a ``BandwidthMonitor`` link estimate: when a neighbour's vector
  for the round in flight arrives, the round's bytes with it (ours out and theirs in, both
  directions as the monitor counts them) over the time since the round began. A vector that was
  already buffered when the round began (the neighbour was ahead) says nothing about the link.
- **Derived.** The next round's deadline is ``TIMEOUT_FACTOR`` x the longest expected transfer
  among its neighbours (its bytes over that neighbour's measured rate: a round that carries
  more, GossipGraD's parameter rounds, waits longer), never below ``round_timeout_s`` (the old
  constant: fast links and unmeasured neighbours behave as before) nor above the cap
  (``round_wait_cap``: AD-PSGD's, ``max_interval_s``).
- **Timeouts are measurements.** A round that timed out with no neighbour's vector at all took
  at least that long with each of them: they are observed as such, so the rate estimates fall
  and the next deadline grows (towards the cap) instead of timing out forever. When some
  neighbours' vectors came and others' did not, the link carried what it had to: the missing
  ones are stragglers or gone, and the round drops them at the deadline as before (waiting
  longer would run the swarm at a straggler's pace, or stall it on a crashed peer until
  membership notices). Arrival times alone cannot tell a neighbour's compute lag from its link:
  with a single neighbour (GossipGraD's partner) a straggler would raise the deadline too, up to
  the cap, and its partners would then wait for it ever longer. So the link is measured from
  receipts when they come (below), from arrivals only when they do not (older peers).
- **Receipts.** A neighbour's network thread answers our round vector with a ``RoundReceipt`` as
  soon as it has it, whatever its trainer is doing: the time from the round's beginning to the
  receipt is our vector's transfer (plus a small message back), never the neighbour's compute
  lag. A round that timed out with no vector at all but with receipts says the link carried our
  bytes: the neighbours are slow or stalled, not the link, and the deadline does not grow (a
  stalled partner costs its partners the floor per round, not up to the cap).

The deadline only decides how long to wait; what a round sends is the caller's payload, the same
whatever the last round did.

Pure: fed ``now`` by the round engine (p2p/averaging/rounds.py), never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from p2p.averaging.base import AveragingConfig
from p2p.bandwidth import BandwidthMonitor, link_timeout
from p2p.wire import message

MAX_LINKS = 1024  # link estimates kept (bounds memory under churn: beyond it, only the current neighbours')


@message(34)
@dataclass(frozen=True)
class RoundReceipt:
    """Our round vector for ``round`` reached the neighbour that sends this (module docstring,
    "Receipts"); D-PSGD and GossipGraD send it back for every round vector they accept."""

    round: int


def round_wait_cap(config: AveragingConfig) -> float:
    """The longest a synchronous round of D-PSGD or GossipGraD may wait (the trainer's gate,
    p2p/training/swarm.py, must outlast it)."""
    return max(config.round_timeout_s, config.max_interval_s)


class RoundDeadline:
    """One synchronous round's deadline at a time (module docstring)."""

    def __init__(self, floor_s: float, cap_s: float, stats: dict[str, int], prefix: str = "") -> None:
        self.floor_s, self.cap_s = floor_s, cap_s
        self.monitor = BandwidthMonitor()
        self.stats = stats
        self._key = prefix + "round_deadline_ms"  # the current round's, for status
        stats.setdefault(self._key, int(floor_s * 1e3))
        self._began = 0.0
        self._bytes: dict[str, int] = {}  # per neighbour of the round in flight: bytes both ways
        self._arrived: dict[str, float] = {}  # neighbour -> when its vector arrived during the round
        self._received: dict[str, float] = {}  # neighbour -> when its receipt for our vector came

    def begin(self, now: float, neighbours: Sequence[str], nbytes: int) -> float:
        """A round that sends ``nbytes`` to each neighbour (and gets as much back) begins: its
        timeout in seconds."""
        self._began, self._arrived, self._received = now, {}, {}
        self._bytes = {j: 2 * nbytes for j in neighbours}
        timeout = link_timeout(self.expected_s(neighbours, nbytes), self.floor_s, self.cap_s)
        self.stats[self._key] = int(timeout * 1e3)
        return timeout

    def arrived(self, src: str, now: float) -> None:
        """A neighbour's vector for the round in flight arrived."""
        if src in self._bytes:
            self._arrived.setdefault(src, now)

    def received(self, src: str, now: float) -> None:
        """A neighbour's receipt for our vector of the round in flight came."""
        if src in self._bytes:
            self._received.setdefault(src, now)

    def finished(self, now: float, senders: Iterable[str], timed_out: bool) -> None:
        """The round ended: learn the link from the receipts (else the vectors) that came during
        it and, when it timed out with neither at all, from every neighbour (they took at least
        this long)."""
        starved = timed_out and not set(senders) and not self._received
        for j, nbytes in self._bytes.items():
            at = self._received.get(j, self._arrived.get(j))
            if at is not None:
                self.monitor.observe(j, nbytes, at - self._began)  # (0 s: no information, ignored)
            elif starved:
                self.monitor.observe(j, nbytes, now - self._began)
        if len(self.monitor.links) > MAX_LINKS:
            self.monitor.forget(list(self._bytes))
        self._bytes, self._arrived, self._received = {}, {}, {}

    def expected_s(self, neighbours: Sequence[str], nbytes: int) -> Optional[float]:
        """The longest expected transfer of ``nbytes`` each way among ``neighbours`` (None: none measured)."""
        links = self.monitor.links
        times = [2 * nbytes / links[j].throughput_bps for j in neighbours if j in links and links[j].throughput_bps]
        return max(times) if times else None
