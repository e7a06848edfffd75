"""The transmit-limited broadcast queue (memberlist ``TransmitLimitedQueue``).

Holds at most one pending update per member id (a newer update about a member replaces the older
one). ``take`` fills a byte budget with the least-transmitted updates first and, among equally
transmitted ones, the newest first; every update taken counts one transmission and is dropped
once it has been sent ``limit`` times (``retransmit_limit``: lambda * ceil(log10(N + 1))).

Items live in buckets indexed by transmit count; each bucket is an insertion-ordered dict, so
"newest first" is a reversed walk. Cost per ``take`` is proportional to what it returns (plus at most ``_MAX_SKIPS``).
"""

from __future__ import annotations

_MIN_RECORD = 12  # no record is smaller than this many bytes: stop filling below it
_MAX_SKIPS = 8  # updates too big for the space left that we step over before giving up


class BroadcastQueue:
    __slots__ = ("_items", "_buckets", "_low")

    def __init__(self) -> None:
        self._items: dict[str, list] = {}  # node id -> [update, size, transmits]
        self._buckets: list[dict[str, list]] = [{}]
        self._low = 0  # no bucket below this index holds anything

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def push(self, node_id: str, update: tuple, size: int) -> None:
        """Queue ``update`` (about ``node_id``), replacing any pending update about that member."""
        old = self._items.get(node_id)
        if old is not None:
            del self._buckets[old[2]][node_id]
        item = [update, size, 0]
        self._items[node_id] = item
        self._buckets[0][node_id] = item
        self._low = 0

    def pending(self) -> list[tuple]:
        """Pending updates, least transmitted and newest first (for tests and diagnostics)."""
        return [b[k][0] for b in self._buckets for k in reversed(b)]

    def take(self, budget: int, limit: int) -> list[tuple]:
        """Updates whose encoded sizes fit in ``budget`` bytes; each counts one transmission."""
        items = self._items
        if not items:
            return []
        buckets = self._buckets
        taken: list[list] = []
        skips = _MAX_SKIPS
        remaining = len(items)
        for t in range(self._low, len(buckets)):
            bucket = buckets[t]
            if not bucket:
                continue
            remaining -= len(bucket)
            for item in reversed(bucket.values()):
                size = item[1]
                if size > budget:  # look a little further for a smaller one, then give up
                    skips -= 1
                    if budget < _MIN_RECORD or not skips:
                        break
                    continue
                budget -= size
                taken.append(item)
            if remaining <= 0 or budget < _MIN_RECORD or not skips:
                break
        out: list[tuple] = []
        taken.reverse()  # oldest first, so "newest last" holds in the next bucket
        for item in taken:
            update = item[0]
            out.append(update)
            node_id = update[1]
            t = item[2]
            del buckets[t][node_id]
            t += 1
            if t >= limit:
                del items[node_id]
                continue
            item[2] = t
            if t == len(buckets):
                buckets.append({})
            buckets[t][node_id] = item
        low, n = self._low, len(buckets)
        while low < n and not buckets[low]:
            low += 1
        self._low = low if items else 0
        out.reverse()
        return out

    def prune(self, limit: int) -> None:
        """Drop updates already sent ``limit`` times (the limit shrinks when the cluster does)."""
        for t in range(limit, len(self._buckets)):
            for node_id in self._buckets[t]:
                del self._items[node_id]
            self._buckets[t] = {}
