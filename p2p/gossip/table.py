"""The member table: rows, the probe order, random sampling, and an observer hook.

A row is the PushPull state tuple ``(state, node_id, addr, incarnation)``. Rows are immutable
and replaced on change, so a row received from a peer can be stored as is (the simulator's
members then share row objects instead of copying 10k tables).

``set`` is the one place rows change; it keeps every derived structure in step:

- ``ids``: every other member ever added (until reaped), in probe order. The order is a lazy
  Fisher-Yates shuffle: each probe swaps a random not-yet-probed id into place, so every round
  visits each member once in a fresh random order at O(1) per probe (SWIM section 4.3), and
  newcomers appended at the end join the current round at a random position;
- ``n_live``: rows ALIVE or SUSPECT, self included (the cluster size estimate N);
- ``dead_since``: when each DEAD/LEFT row became so (reconnect window, reaping);
- ``version``: bumped on every change (cache key for sorted views);
- ``on_change(member_id, old_state, old_inc, new_state, new_inc)``: optional observer.
"""

from __future__ import annotations

import operator
import random
from typing import Callable, Mapping, Optional

from p2p.gossip.messages import ALIVE, DEAD, SUSPECT

INF = float("inf")
_STATE_OF = operator.itemgetter(0)
_ID_OF = operator.itemgetter(1)

# on_change(member_id, old_state, old_incarnation, new_state, new_incarnation): old_state is
# None when the row is new (old_incarnation -1), new_state None when it is reaped.
ChangeHook = Callable[[str, Optional[int], int, Optional[int], int], None]


class MemberTable:
    __slots__ = ("me", "rows", "ids", "probe_idx", "n_live", "last_heard", "dead_since", "version",
                 "on_change", "_rng", "_needs_compaction")

    def __init__(self, me: str, row: tuple, rng: random.Random) -> None:
        self.me = me
        self.rows: dict[str, tuple] = {me: row}
        self.ids: list[str] = []
        self.probe_idx = 0
        self.n_live = 1
        self.last_heard: dict[str, float] = {}
        self.dead_since: dict[str, float] = {}
        self.version = 0
        self.on_change: Optional[ChangeHook] = None
        self._rng = rng
        self._needs_compaction = False

    def set(self, nid: str, new: Optional[tuple], now: float) -> None:
        """Replace (or, with ``new`` None, reap) the row for ``nid``."""
        rows = self.rows
        old = rows.get(nid)
        was_live = old is not None and old[0] <= SUSPECT
        if new is None:
            del rows[nid]
            self.dead_since.pop(nid, None)
            self.last_heard.pop(nid, None)
            self._needs_compaction = True
        else:
            rows[nid] = new
            if new[0] >= DEAD:
                if old is None or old[0] <= SUSPECT:
                    self.dead_since[nid] = now
            elif old is not None and old[0] >= DEAD:
                del self.dead_since[nid]
            if old is None and nid != self.me:
                self.ids.append(nid)
        self.n_live += (new is not None and new[0] <= SUSPECT) - was_live
        self.version += 1
        hook = self.on_change
        if hook is not None:
            hook(nid, None if old is None else old[0], -1 if old is None else old[3],
                 None if new is None else new[0], -1 if new is None else new[3])

    def restore(self, table: Mapping[str, tuple], now: float) -> None:
        """Add the ALIVE rows of ``table`` we do not hold yet, at C speed when unobserved."""
        if any(map(_STATE_OF, table.values())):  # ALIVE is 0: some row is not alive
            table = {k: r for k, r in table.items() if r[0] == ALIVE}
        rows = self.rows
        if self.on_change is not None or len(rows) > 1:
            for nid, r in table.items():
                if nid not in rows:
                    self.set(nid, r, now)
            return
        me = rows[self.me]
        rows.update(table)
        rows[self.me] = me
        ids = list(table)
        if self.me in table:
            ids.remove(self.me)
        self.ids.extend(ids)
        self.n_live = len(rows)
        self.version += 1

    @staticmethod
    def table_of(rows) -> Mapping[str, tuple]:
        """A node_id -> row mapping from a mapping or a sequence of rows."""
        if isinstance(rows, Mapping):
            return rows
        rows = rows if isinstance(rows, (list, tuple)) else list(rows)
        return dict(zip(map(_ID_OF, rows), rows))

    def next_probe_target(self) -> Optional[str]:
        """Round-robin over ALIVE/SUSPECT members in an order reshuffled every round (lazily)."""
        rows, rng = self.rows, self._rng
        for _ in range(2):  # at most one wrap per call
            ids = self.ids
            n = len(ids)
            i = self.probe_idx
            while i < n:
                j = i + int(rng.random() * (n - i))
                cand = ids[j]
                ids[j] = ids[i]
                ids[i] = cand
                i += 1
                rec = rows.get(cand)
                if rec is not None and rec[0] <= SUSPECT:
                    self.probe_idx = i
                    return cand
            self.probe_idx = 0
            if self._needs_compaction:  # drop reaped ids (and duplicates from re-adds) once a round
                self.ids[:] = [x for x in dict.fromkeys(ids) if x in rows]
                self._needs_compaction = False
        return None

    def sample(self, k: int, max_state: int, exclude: str, dead_after: float = INF) -> list[str]:
        """Up to ``k`` distinct random members with state <= ``max_state`` (or DEAD since
        ``dead_after`` or later), never ourselves or ``exclude``."""
        if k <= 0:
            return []
        ids, rows, rng, me, dead_since = self.ids, self.rows, self._rng, self.me, self.dead_since
        n = len(ids)
        if n <= 4 * k + 8:
            pool = [i for i in dict.fromkeys(ids) if i != exclude and i != me and i in rows
                    and (rows[i][0] <= max_state or (rows[i][0] == DEAD and dead_since[i] >= dead_after))]
            return pool if len(pool) <= k else rng.sample(pool, k)
        chosen: list[str] = []
        for _ in range(4 * k + 16):  # rejection sampling: O(k) when most members qualify
            i = ids[int(rng.random() * n)]
            if i == exclude or i == me or i in chosen:
                continue
            rec = rows.get(i)
            if rec is not None and (rec[0] <= max_state or (rec[0] == DEAD and dead_since[i] >= dead_after)):
                chosen.append(i)
                if len(chosen) == k:
                    break
        return chosen
