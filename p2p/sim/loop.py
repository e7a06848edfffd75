"""The simulators' event loop: a deterministic heap of timed events and a logical clock.

Theory of operation
-------------------
An event is the tuple ``(time, seq, kind, a, b, c)``. ``seq`` is a counter bumped on every push,
so the heap orders by time and then by insertion order, and nothing else in a tuple is ever
compared (payloads need not be orderable). ``now`` is the logical clock: it only moves when
``pop`` hands out the next event, never backwards (events pushed into the past are clamped by
the callers, see ``Timers.arm``), and nothing here or in any simulator reads the wall clock.
So the same pushes in the same order replay the same run bit for bit.

Kinds: ``DELIVER`` (``a`` = receiver index, ``b`` = sender index, ``c`` = payload; pushed by
``network.Network``) and ``TICK`` (``a`` = member index; a member's ``next_deadline`` came) are
shared; each simulator numbers its own scenario events from ``FIRST_KIND``.

``Timers`` keeps at most one live TICK per member: ``arm`` pushes a TICK when the member's
deadline changed and records it; an older TICK still in the heap is stale (``due`` says no)
and is skipped when it comes out. Invariant: ``at[i]`` is the time of member i's one live TICK
(inf: none).

The membership simulator runs millions of events, so its main loop binds ``heap``,
``heapq.heappop`` and ``push`` to locals; the class stays plain for that reason.
"""

from __future__ import annotations

import heapq

INF = float("inf")
DELIVER, TICK = 0, 1
FIRST_KIND = 2  # scenario event kinds of a simulator number from here


class EventLoop:
    __slots__ = ("heap", "seq", "now")

    def __init__(self) -> None:
        self.heap: list[tuple] = []
        self.seq = 0  # events pushed so far: the tie-breaker
        self.now = 0.0

    def push(self, t: float, kind: int, a: int = 0, b: int = 0, c: object = None) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, a, b, c))
        self.seq += 1

    def pop(self) -> tuple:
        """The earliest event; the clock moves to its time."""
        event = heapq.heappop(self.heap)
        self.now = event[0]
        return event

    def peek_time(self) -> float:
        return self.heap[0][0] if self.heap else INF

    def __len__(self) -> int:
        return len(self.heap)


class Timers:
    """One live TICK per member at its next deadline (module docstring)."""

    __slots__ = ("at", "_push")

    def __init__(self, loop: EventLoop, n: int) -> None:
        self.at = [INF] * n  # time of member i's live TICK (inf: none)
        self._push = loop.push

    def add(self, count: int = 1) -> None:
        self.at.extend([INF] * count)

    def arm(self, i: int, deadline: float, now: float) -> None:
        """Make member i's live TICK the one at ``deadline`` (a deadline in the past: now)."""
        if deadline < now:
            deadline = now
        if deadline != self.at[i]:
            self.at[i] = deadline
            if deadline < INF:
                self._push(deadline, TICK, i)

    def due(self, i: int, t: float) -> bool:
        """A TICK for member i at ``t`` came out of the heap: is it the live one? (It is then
        consumed: re-arm after running the member's timers.)"""
        if self.at[i] != t:
            return False
        self.at[i] = INF
        return True

    def cancel(self, i: int) -> None:
        self.at[i] = INF
