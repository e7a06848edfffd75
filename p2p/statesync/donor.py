"""``StateDonor``: the serving side of state sync, which every member runs.

Theory of operation. A ``SyncQuery`` is answered at once with an offer: the step and model key
of the state this member holds (``describe()``; -1 while it has none to give, e.g. while it is
syncing itself) and the live members it knows, so a joiner that knows one address finds the
others. The first ``SyncChunkRequest`` of a transfer binds the transfer to a captured state:
``capture()`` (the training side's consistent copy of model, optimizer and algorithm state, as
bytes), or a capture taken less than ``reuse_s`` ago (joiners arriving together share one).
Capturing a large model takes a while, so the first request is answered PREPARING at once and
the capture is taken on the next ``tick``: the joiner knows the donor is alive meanwhile.
Every later request of that transfer reads the same bytes, so a joiner never mixes two steps.

Bounds. At most ``max_transfers`` transfers are active at once (a transfer is active while it
asked for a chunk within ``timeout_s``); a request that would start one more is answered BUSY
and the joiner tries another member. Captures no transfer uses any more are dropped. With
``max_rate_bps`` the chunks are paced (a token bucket on the time each may leave), so serving a
joiner never takes more than that share of the donor's uplink from its own training traffic.

States per transfer: bound (to a capture) -> expired (silent for ``timeout_s``: forgotten).
Invariant: a transfer's chunks all come from one capture.
"""

from __future__ import annotations

import heapq
import math
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from p2p.protocol import Send
from p2p.statesync.messages import (BUSY, CAPTURED, MAX_MEMBERS, MIN_CHUNK, OK, PACED_CHUNK_S, PREPARING, UNKNOWN,
                                    SyncChunk, SyncChunkRequest, SyncConfig, SyncOffer, SyncQuery)

Describe = Callable[[], Optional[tuple[int, str]]]  # -> (step, model key), or None: nothing to give
Capture = Callable[[bool], tuple[np.ndarray, int, str]]  # (with optimizer) -> (state bytes as uint8, step, model key)
Members = Callable[[], list[str]]


@dataclass
class _Capture:
    ident: int
    data: np.ndarray  # uint8
    step: int
    model_key: str
    taken_at: float
    optimizer: bool  # whether it includes the optimizer's state
    crc: int  # crc32 of the bytes, for status: a joiner reports the same of what it received


@dataclass
class _Transfer:
    capture: Optional[_Capture]  # None until tick() captured it (the first request waits in ``first``)
    last_request: float
    first: Optional[SyncChunkRequest] = None
    served_last: bool = False  # its last byte went out: it no longer takes a slot (kept for re-asks)


@dataclass(order=True)
class _Paced:
    send_at: float
    seq: int
    send: Send = field(compare=False)


class StateDonor:
    def __init__(self, config: SyncConfig, describe: Describe, capture: Capture, members: Members) -> None:
        self.config = config
        self._describe, self._capture, self._members = describe, capture, members
        self._captures: list[_Capture] = []
        self._transfers: dict[tuple[str, int], _Transfer] = {}
        self._paced: list[_Paced] = []
        self._free_at = -math.inf  # pacing: when the next chunk may leave
        self._seq = 0
        self._next_ident = 1
        self.stats = {"offers": 0, "transfers": 0, "chunks_sent": 0, "bytes_sent": 0, "busy": 0, "captures": 0}
        rate = config.max_rate_bps
        self._chunk_hint = 0 if rate is None else max(MIN_CHUNK, int(rate * PACED_CHUNK_S))
        self.served: list[dict] = []  # the last transfers started: joiner, step, bytes, crc32 (status)

    # -- driver interface -----------------------------------------------------------------------
    def receive(self, src: str, msg: object, now: float) -> list[Send]:
        if isinstance(msg, SyncQuery):
            self.stats["offers"] += 1
            described = self._describe()
            step, key = described if described is not None else (-1, "")
            members = tuple(a for a in self._members() if a != src)[:MAX_MEMBERS]
            busy = self._active(now) >= self.config.max_transfers
            return [Send(src, SyncOffer(msg.nonce, step, key, members, busy, self._chunk_hint))]
        if isinstance(msg, SyncChunkRequest):
            return self._serve(src, msg, now)
        return []

    def tick(self, now: float) -> list[Send]:
        sends = []
        for (src, _), transfer in list(self._transfers.items()):
            if transfer.capture is None:  # capture now (the joiner was told: PREPARING) and serve
                first, transfer.first = transfer.first, None
                transfer.capture = self._capture_for(first.optimizer, now)
                c = transfer.capture
                self.served.append({"joiner": src, "step": c.step, "bytes": int(c.data.size), "crc": c.crc})
                del self.served[:-8]
                sends.append(Send(src, SyncChunk(first.transfer, CAPTURED, c.ident, c.step, c.model_key,
                                                 int(c.data.size), 0, _EMPTY)))
                sends += self._serve(src, first, now)
        self._expire(now)
        while self._paced and self._paced[0].send_at <= now:
            sends.append(heapq.heappop(self._paced).send)
        return sends

    def next_deadline(self) -> float:
        if any(t.capture is None for t in self._transfers.values()):
            return -math.inf  # a capture to take: at once (tick)
        deadlines = [p.last_request + self.config.timeout_s for p in self._transfers.values()]
        if self._paced:
            deadlines.append(self._paced[0].send_at)
        return min(deadlines, default=math.inf)

    # -- serving --------------------------------------------------------------------------------
    def _active(self, now: float) -> int:
        return sum(1 for t in self._transfers.values()
                   if not t.served_last and now - t.last_request < self.config.timeout_s)

    def _serve(self, src: str, msg: SyncChunkRequest, now: float) -> list[Send]:
        key = (src, msg.transfer)
        transfer = self._transfers.get(key)
        if transfer is None:
            if msg.offset != 0:  # forgotten (expired), or never started here
                return [Send(src, SyncChunk(msg.transfer, UNKNOWN, 0, 0, "", 0, 0, _EMPTY))]
            if self._active(now) >= self.config.max_transfers or self._describe() is None:
                self.stats["busy"] += 1
                return [Send(src, SyncChunk(msg.transfer, BUSY, 0, 0, "", 0, 0, _EMPTY))]
            # Capturing may take a while (a large model): say so now, capture from tick().
            self._transfers[key] = _Transfer(None, now, msg)
            self.stats["transfers"] += 1
            return [Send(src, SyncChunk(msg.transfer, PREPARING, 0, 0, "", 0, 0, _EMPTY))]
        transfer.last_request = now
        c = transfer.capture
        if c is None:  # a second request before the capture: it is served with the rest
            return []
        offset = min(msg.offset, c.data.size)
        data = c.data[offset:offset + msg.length]  # a view: no copy until the wire
        if offset + data.size >= c.data.size:
            transfer.served_last = True  # its slot is free for the next joiner; a lost chunk can still be asked for
        chunk = SyncChunk(msg.transfer, OK, c.ident, c.step, c.model_key, int(c.data.size), offset, data)
        self.stats["chunks_sent"] += 1
        self.stats["bytes_sent"] += int(data.size)
        return self._pace(Send(src, chunk), data.size, now)

    def _capture_for(self, optimizer: bool, now: float) -> _Capture:
        fresh = [c for c in self._captures if now - c.taken_at <= self.config.reuse_s and c.optimizer == optimizer]
        if fresh:
            return fresh[-1]
        data, step, key = self._capture(optimizer)
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        capture = _Capture(self._next_ident, data, step, key, now, optimizer, zlib.crc32(data))
        self._next_ident += 1
        self._captures.append(capture)
        self.stats["captures"] += 1
        return capture

    def _pace(self, send: Send, nbytes: int, now: float) -> list[Send]:
        """A chunk leaves once the link, at ``max_rate_bps``, would have carried it and the
        ones before it (so even a one-chunk state takes size / rate)."""
        rate = self.config.max_rate_bps
        if rate is None:
            return [send]
        send_at = max(now, self._free_at) + nbytes / rate
        self._free_at = send_at
        self._seq += 1
        heapq.heappush(self._paced, _Paced(send_at, self._seq, send))
        return []

    def _expire(self, now: float) -> None:
        timeout = self.config.timeout_s
        self._transfers = {k: t for k, t in self._transfers.items() if now - t.last_request < timeout}
        used = {id(t.capture) for t in self._transfers.values() if t.capture is not None}
        self._captures = [c for c in self._captures if id(c) in used or now - c.taken_at <= self.config.reuse_s]


_EMPTY = np.empty(0, dtype=np.uint8)
