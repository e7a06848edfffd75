"""The simulators' network model: loss, delay and jitter, uplink bandwidth, partitions, down nodes.

Theory of operation
-------------------
Members are indices ``0 .. n-1``. ``send(t, src, dst, payload, size)`` decides a message's fate
at send time and schedules its arrival on the ``EventLoop`` as a ``DELIVER`` event:

1. ``dst`` None (an address nobody holds): dropped;
2. lost with probability ``loss`` (one draw from the run's RNG, none when ``loss`` is 0);
3. with ``bandwidth_bps`` set, serialised on the sender's uplink: it departs once the previous
   message from ``src`` left, plus ``size * 8 / bandwidth_bps`` seconds (FIFO per sender);
4. arrives ``delay_s`` plus a uniform ``[0, jitter_s)`` draw after it departs.

At arrival the driver asks ``arrives(dst, src)``: the message is dropped when the receiver is
down (``up[dst]`` False: crashed, left, not started) or sits in another partition group than
the sender (``group``). So a partition or a crash also eats messages already in flight.

Counters: ``sent`` (every send, with ``bytes`` their sizes), ``lost`` (step 2), ``dropped``
(steps 1 and arrival), ``delivered``; sent == lost + dropped + delivered + in flight.

The RNG is passed in (the simulator's seeded ``random.Random``), and the draws happen in a
fixed order per message (loss, then jitter), so runs replay exactly. ``up`` and ``group`` are
plain lists that the simulators read directly in their hot loops (never rebound: ``heal``
clears ``group`` in place).
"""

from __future__ import annotations

import random
from typing import Optional, Sequence

from p2p.sim.loop import DELIVER, EventLoop


class Network:
    def __init__(self, loop: EventLoop, rng: random.Random, n: int, loss: float = 0.0,
                 delay_s: float = 0.0, jitter_s: float = 0.0, bandwidth_bps: Optional[float] = None) -> None:
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), got {loss}")
        if delay_s < 0 or jitter_s < 0:
            raise ValueError("delay and jitter must be >= 0")
        if bandwidth_bps is not None and not bandwidth_bps > 0:
            raise ValueError("bandwidth must be > 0 bits/s")
        self.rng = rng
        self.loss = loss
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.bandwidth_bps = bandwidth_bps
        self.up = [False] * n  # whether member i runs (receives)
        self.group = [0] * n  # partition group of member i: messages cross no group boundary
        self.link_free = [0.0] * n  # when member i's uplink is free again (bandwidth_bps only)
        self.sent = self.bytes = self.lost = self.dropped = self.delivered = 0
        self._push = loop.push

    def add(self, count: int = 1) -> None:
        """Room for ``count`` more members (indices n .., down, in group 0)."""
        self.up.extend([False] * count)
        self.group.extend([0] * count)
        self.link_free.extend([0.0] * count)

    def send(self, t: float, src: int, dst: Optional[int], payload: object, size: int = 0) -> bool:
        """Put ``payload`` from ``src`` on the wire to ``dst`` at time ``t``; False if it is
        dropped or lost at once (it then never arrives)."""
        self.sent += 1
        self.bytes += size
        if dst is None:
            self.dropped += 1
            return False
        rng = self.rng
        if self.loss and rng.random() < self.loss:
            self.lost += 1
            return False
        bw = self.bandwidth_bps
        if bw:
            free = self.link_free[src]
            t = (t if t > free else free) + size * 8.0 / bw
            self.link_free[src] = t
        self._push(t + self.delay_s + rng.random() * self.jitter_s, DELIVER, dst, src, payload)
        return True

    def arrives(self, dst: int, src: int) -> bool:
        """A message from ``src`` reached ``dst``'s host: is it delivered (counted either way)?"""
        if self.up[dst] and self.group[dst] == self.group[src]:
            self.delivered += 1
            return True
        self.dropped += 1
        return False

    def partition(self, fraction: float) -> list[int]:
        """Cut a random ``fraction`` of the running members (at least one, never all) off into
        group 1; returns them (none when fewer than two run: there is nothing to cut apart)."""
        live = [i for i, u in enumerate(self.up) if u]
        if len(live) < 2:
            return []
        self.rng.shuffle(live)
        cut = live[:max(1, min(len(live) - 1, round(fraction * len(live))))]
        for i in cut:
            self.group[i] = 1
        return cut

    def set_group(self, members: Sequence[int], group: int) -> None:
        for i in members:
            self.group[i] = group

    def heal(self) -> None:
        """Every member back in one group (in place: drivers hold this list)."""
        self.group[:] = [0] * len(self.group)

    def counters(self) -> dict[str, int]:
        return {"sent": self.sent, "bytes": self.bytes, "lost": self.lost, "dropped": self.dropped,
                "delivered": self.delivered}
