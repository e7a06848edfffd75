"""Bytes a membership message would take on the wire, estimated cheaply.

The first message of each type is really encoded with ``p2p.wire.encode`` (its record tuple
emptied) to learn the fixed part; records are then added at their exact msgpack size when a
message holds few of them, and at a per-shape average (measured from this run's own member ids
and addresses) when it holds many, so a 10k-row PushPull costs O(1) to size.
"""

from __future__ import annotations

import dataclasses

from p2p.gossip.messages import ALIVE, PushPull, record_size
from p2p.wire import encode

_EXACT_UP_TO = 8
_CACHE_MAX = 1 << 20


def _array_header(n: int) -> int:
    return 0 if n < 16 else 2 if n < 65536 else 4


class WireSize:
    def __init__(self, ids: list[str], addrs: list[str]) -> None:
        k = max(1, len(ids))
        self.state_avg = sum(record_size((ALIVE, i, a, 0)) for i, a in zip(ids, addrs)) / k
        self.update_avg = sum(record_size((ALIVE, i, a, 0, "")) for i, a in zip(ids, addrs)) / k
        self._shapes: dict[type, tuple[int, str, float]] = {}
        self._src = addrs[0] if addrs else "0.0.0.0:0"
        self._record_sizes: dict[int, tuple[tuple, int]] = {}  # id(record) -> (record, size)

    def _shape(self, msg: object) -> tuple[int, str, float]:
        t = type(msg)
        field = "states" if t is PushPull else "updates" if hasattr(msg, "updates") else ""
        empty = dataclasses.replace(msg, **{field: ()}) if field else msg
        shape = (len(encode(empty, self._src)[0]), field,
                 self.state_avg if field == "states" else self.update_avg)
        self._shapes[t] = shape
        return shape

    def __call__(self, msg: object) -> int:
        shape = self._shapes.get(type(msg))
        if shape is None:
            shape = self._shape(msg)
        base, field, avg = shape
        if not field:
            return base
        recs = getattr(msg, field)
        n = len(recs)
        if not n:
            return base
        if n <= _EXACT_UP_TO:
            cache = self._record_sizes
            total = base + _array_header(n)
            for r in recs:  # updates are forwarded as the same tuple objects: size each once
                hit = cache.get(id(r))
                if hit is None or hit[0] is not r:
                    if len(cache) > _CACHE_MAX:
                        cache.clear()
                    hit = cache[id(r)] = (r, record_size(r))
                total += hit[1]
            return total
        return base + _array_header(n) + int(n * avg)
