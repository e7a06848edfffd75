"""SWIM + Lifeguard membership as a sans-I/O state machine.

Theory of operation
-------------------
Every member keeps a table of ``(state, node_id, addr, incarnation)`` rows, itself included.
States: ALIVE -> SUSPECT -> DEAD, and LEFT for a graceful leave. Precedence follows SWIM
section 4.2 as memberlist implements it: for the same member, a higher incarnation wins;
at equal incarnation SUSPECT beats ALIVE and DEAD/LEFT beat both; only the member itself raises
its incarnation (to refute a suspicion, a death or a stale rumour about itself).

- Failure detection (SWIM 4.1): each protocol period we Ping one member, walking a lazily
  shuffled list round-robin. No Ack within ``probe_timeout`` -> PingReq to ``indirect_checks``
  alive members; still nothing when the period ends -> SUSPECT, gossiped with our id as origin.
- Suspicion (SWIM 4.2, Lifeguard IV-B): a suspicion fires after a timeout that starts at
  ``max`` and falls towards ``min`` as independent suspectors confirm it; when it fires we
  declare the member DEAD. The suspect refutes by gossiping ALIVE with a higher incarnation;
  pinging a suspect carries the suspicion along so it can refute at once (Lifeguard buddy).
- Local health (Lifeguard IV-A): missed acks / missing Nacks / having to refute raise a score
  that stretches our own probe interval and timeout, so a slow node accuses less.
- Dissemination (SWIM 4.1): every accepted change is queued once per member and piggybacked on
  Pings, Acks and periodic Gossip messages within ``packet_budget_bytes``, each update at most
  ``retransmit_mult * ceil(log10(N + 1))`` times, least-sent and newest first.
- Anti-entropy and join: PushPull exchanges whole tables with one random member every
  ``push_pull_interval`` (scaled with log2 N). A joiner push-pulls its seeds, retrying with
  exponential backoff until one answers. Merging a remote table is memberlist's ``mergeState``:
  a remote DEAD is taken as a SUSPECT (so the member can refute), LEFT as LEFT.
- Rumoured deaths are checked (issue 12: a hostile member must not get others declared dead
  faster than SWIM's refutation allows). memberlist takes a gossiped DEAD, or anyone's LEFT, as
  a verdict: one member that says "X is dead" or "X left" removes X from every view at once.
  Here such a rumour about a member we hold alive or suspect, from a Gossip, a Ping/Ack or (a
  LEFT) in a pushed table, first gets a Ping of our own to the member: an Ack within the probe
  timeout means it is alive and the rumour is dropped (counted); silence, and the rumour
  stands. A member that really died or left answers nothing, so an honest verdict costs one
  probe timeout (a left member stops answering: ``receive`` returns nothing after ``leave``);
  a lie costs one Ping, at most one in flight per member, and none while the member's answer
  to the last check is less than a probe interval old (a flood of lies is not a flood of Pings). A member cut off from us but not from
  its accuser is taken as dead, as SWIM would (our own probe would have failed too).
- Partitions: members we declared dead stay in the table for ``reap_after``; for
  ``reconnect_window`` we now and then push-pull one of them (Serf's reconnect), so once the
  network heals each side learns that the other thinks it dead, refutes, and the views merge.
- Healing a brief cut (beyond Serf): members dead for less than ``reconnect_fast_window`` are
  push-pulled every ``reconnect_fast_interval`` (at most ``reconnect_fast_max`` a time), and a
  member we hold dead that is heard from again is answered at once (our reply to it,
  or a PushPull that tells it what we think, so it refutes and is re-admitted one round trip
  later; at most once per ``nudge_interval`` per member, so a flapping or hostile peer cannot
  make us spam). Those sends ask the driver for a fresh connection (``Send.fresh``): the old
  one was carrying nothing through the cut, and TCP's retransmission backoff would hold what
  we queue behind it for a second or more after the link is back (issue 16: the cut peer's
  first share came ~1 s after the restore). Only for members held dead: a suspect is most
  often just slow, and redialling it would drop a transfer in flight on a live connection.

Invariants (checked by the simulator): a member never holds itself DEAD (it refutes instead);
a member's incarnation in any table never decreases while the row is held; a row that went
DEAD/LEFT at incarnation i only becomes ALIVE/SUSPECT again at an incarnation > i.

Beyond memberlist: ``restore()`` preloads a table (a snapshot of an earlier run, like Serf's
snapshot file, or the simulator's warm start) without gossiping it; probes then verify it.
PingReq helpers Nack at 80% of their probe timeout (see NACK_AFTER).

Layout: rows, probe order and sampling live in ``table.py``; the timeout and retransmit
arithmetic in ``suspicion.py``; the transmit-limited queue in ``broadcast.py``; messages in
``messages.py``. This module holds the rules and the timers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence, Union

from p2p.gossip.broadcast import BroadcastQueue
from p2p.gossip.config import MembershipConfig
from p2p.gossip.messages import (
    ALIVE, DEAD, LEFT, MEMBERSHIP_MESSAGES, STATE_NAMES, SUSPECT,
    Ack, Gossip, Nack, Ping, PingReq, PushPull, record_size, trusted,
)
from p2p.gossip.suspicion import (
    Awareness, Suspicion, awareness_delta, expected_confirmations, push_pull_interval,
    retransmit_limit, suspicion_min_timeout,
)
from p2p.gossip.table import ChangeHook, MemberTable
from p2p.protocol import LocalProtocolError, RemoteProtocolError, Send

INF = float("inf")
JOIN_GOSSIP_GAP = 0.25  # a new member's news flushes the gossip queue at most once per this share of gossip_interval
_OVERHEAD = 64  # bytes of a Ping/Ack/Gossip besides its updates (header, ids, seq)
# A PingReq helper Nacks after this fraction of its probe timeout, so that (with equal configs)
# the Nack reaches the origin before its period ends; memberlist waits the full timeout, which
# makes the Nack race the origin's deadline.
NACK_AFTER = 0.8


@dataclass(frozen=True)
class Member:
    id: str
    addr: str
    state: str  # "alive" | "suspect" | "dead" | "left"
    incarnation: int
    last_heard: Optional[float]  # local `now` of the last message received from it, or None


class Membership:
    def __init__(self, config: MembershipConfig, node_id: str, addr: str, rng: random.Random,
                 now: float, incarnation: int = 0) -> None:
        if not isinstance(config, MembershipConfig):
            raise LocalProtocolError("config must be a MembershipConfig")
        for name, v in (("node_id", node_id), ("addr", addr)):
            if not isinstance(v, str) or not v or len(v) > 256:
                raise LocalProtocolError(f"{name} must be a non-empty string of at most 256 chars")
        if isinstance(incarnation, bool) or not isinstance(incarnation, int) or incarnation < 0:
            raise LocalProtocolError("incarnation must be an int >= 0")
        self.config = config
        self.node_id = node_id
        self.addr = addr
        self._rng = rng
        self._inc = incarnation
        self._t = MemberTable(node_id, (ALIVE, node_id, addr, incarnation), rng)
        self._members = self._t.rows  # read-only alias for the hot paths; writes go through _t.set
        self._suspicions: dict[str, Suspicion] = {}
        # Rumoured deaths being checked: member -> (our Ping's seq, the rumour, when it stands)
        self._checking: dict[str, tuple[int, tuple, float]] = {}
        self._next_check = INF
        self._answered_at: dict[str, float] = {}  # member -> when it last answered a check
        self._next_suspicion = INF  # earliest suspicion deadline (kept by _retime_suspicions)
        self._relays: dict[int, tuple[str, int, float]] = {}  # our seq -> (origin addr, its seq, deadline)
        self._queue = BroadcastQueue()
        self._limit_n, self._limit = -1, 0  # retransmit_limit() cached for _limit_n members
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._seq = 0
        self._probe_seq = -1  # -1: no probe outstanding
        self._probe_id = ""
        self._probe_timeout_at = INF
        self._probe_nacks = 0
        self._probe_expected_nacks = 0
        self._started = False
        self._left = False
        self._joined = False
        self._seeds: tuple[str, ...] = ()
        self._join_backoff = config.join_retry_initial
        self._next_probe = self._next_gossip = self._next_push_pull = INF
        self._gossiped_at = -INF  # when the last gossip round went out
        self._next_reconnect = self._next_join = self._next_fast = INF
        self._nudged: dict[str, float] = {}  # member -> when we last sent it something fresh
        self._alive_cache: tuple[int, list[tuple]] = (-1, [])
        self.stats: dict[str, int] = {}

    @property
    def on_change(self) -> Optional[ChangeHook]:
        """Optional observer of every table change (simulator invariants, logs); see table.py."""
        return self._t.on_change

    @on_change.setter
    def on_change(self, hook: Optional[ChangeHook]) -> None:
        self._t.on_change = hook

    # ------------------------------------------------------------------ public API

    @property
    def joined(self) -> bool:
        """True when started with no seeds, or once any seed or peer has answered."""
        return self._joined

    @property
    def incarnation(self) -> int:
        return self._inc

    @property
    def has_left(self) -> bool:
        return self._left

    @property
    def version(self) -> int:
        """A counter bumped on every table change (read-only): a cache key for views derived
        from the table, such as ``alive()`` or a topology over it."""
        return self._t.version

    def owns(self, msg: object) -> bool:
        """Whether ``msg`` belongs to the membership protocol (routing helper for drivers)."""
        return isinstance(msg, MEMBERSHIP_MESSAGES)

    def start(self, seeds: Sequence[str], now: float) -> list[Send]:
        """Start timers and join through any of ``seeds`` ("host:port"; empty: first member)."""
        if self._started:
            raise LocalProtocolError("start() called twice")
        if isinstance(seeds, str):
            raise LocalProtocolError("seeds must be a sequence of addresses, not one string")
        self._started = True
        cfg, rng = self.config, self._rng
        self._seeds = tuple(dict.fromkeys(s for s in seeds if s != self.addr))
        self._next_probe = now + rng.random() * cfg.probe_interval
        n = len(self._members)
        self._next_push_pull = now + rng.random() * push_pull_interval(cfg.push_pull_interval, n)
        self._next_reconnect = now + (0.5 + rng.random()) * cfg.reconnect_interval
        self._broadcast((ALIVE, self.node_id, self.addr, self._inc, ""), now)
        if not self._seeds:
            self._joined = True
            return []
        out: list[Send] = []
        self._send_join(out)
        self._next_join = now + self._join_backoff
        return out

    def restore(self, rows: Union[Iterable[tuple], Mapping[str, tuple]], now: float) -> None:
        """Before start(): take ALIVE rows ``(state, node_id, addr, incarnation)`` (the PushPull
        row format), or a mapping node_id -> row, as members, quietly; rows in any other state,
        or about us, are skipped.

        For a table saved by an earlier run (Serf's snapshot) or a simulator's warm start; the
        rows are not gossiped (everyone is presumed to know them) and probes soon verify them.
        Runs at C speed: a simulator restores 10k-row tables into 10k members.
        """
        if self._started:
            raise LocalProtocolError("restore() must come before start()")
        self._t.restore(MemberTable.table_of(rows), now)

    def receive(self, src: str, msg: object, now: float) -> list[Send]:
        """Handle ``msg`` from the node advertised at ``src``; raises RemoteProtocolError if bad."""
        t = type(msg)
        if t not in _HANDLERS:
            raise LocalProtocolError(f"{t.__name__} is not a membership message (check owns())")
        if self._left:
            return []
        sender = msg.sender
        if sender == self.node_id:
            raise RemoteProtocolError("id_conflict", f"a message from {src} claims our id {sender!r}")
        stats, key = self.stats, _RECV_KEYS[t]
        stats[key] = stats.get(key, 0) + 1
        out: list[Send] = []
        held = self._members.get(sender)
        _HANDLERS[t](self, src, msg, now, out)
        if held is not None and held[0] == DEAD:
            self._answer_fresh(src, sender, now, out)
        self._joined = True
        if sender in self._members:
            self._t.last_heard[sender] = now
        return out

    def tick(self, now: float) -> list[Send]:
        """Run every timer that is due at ``now``; afterwards next_deadline() > now."""
        if not self._started or self._left:
            return []
        out: list[Send] = []
        if self._probe_timeout_at <= now:
            self._probe_timeout_at = INF
            self._send_indirect(out)
        if self._next_probe <= now:
            self._probe(now, out)
        if self._next_suspicion <= now:
            self._expire_suspicions(now)
        if self._next_check <= now:
            self._expire_checks(now)
        if self._relays:
            self._expire_relays(now, out)
        if self._next_gossip <= now:
            self._gossip(now, out)
        if self._next_push_pull <= now:
            self._push_pull(now, out)
        if self._next_reconnect <= now:
            self._reconnect(now, out)
        if self._next_fast <= now:
            self._reconnect_fast(now, out)
        if self._next_join <= now:
            if self._joined:
                self._next_join = INF
            else:
                self._send_join(out)
                self._join_backoff = min(self._join_backoff * 2.0, self.config.join_retry_max)
                self._next_join = now + self._join_backoff
        return out

    def next_deadline(self) -> float:
        """Absolute time at which tick() wants to run next (inf when nothing is pending)."""
        if not self._started or self._left:
            return INF
        d = min(self._next_probe, self._probe_timeout_at, self._next_gossip,
                self._next_push_pull, self._next_reconnect, self._next_join, self._next_suspicion, self._next_check,
                self._next_fast)
        if self._relays:
            d = min(d, min(r[2] for r in self._relays.values()))
        return d

    def leave(self, now: float) -> list[Send]:
        """Leave gracefully: mark ourselves LEFT and tell a few members, who gossip it on."""
        if self._left:
            return []
        update = (LEFT, self.node_id, self.addr, self._inc, self.node_id)
        self._t.set(self.node_id, (LEFT, self.node_id, self.addr, self._inc), now)
        cfg = self.config
        fanout = max(cfg.gossip_nodes, retransmit_limit(cfg.retransmit_mult, self._t.n_live + 1))
        out = [Send(self._members[i][2], trusted(Gossip, self.node_id, (update,)))
               for i in self._t.sample(fanout, SUSPECT, "")]
        self._count("sent_Gossip", len(out))
        self._left = True
        return out

    def alive(self) -> list[Member]:
        """Members believed ALIVE or SUSPECT (not yet declared dead), excluding self, by id.

        Suspects are included because most suspicions are refuted; callers that must avoid a
        possibly failing member can filter on ``state == "alive"``.
        """
        version, rows = self._alive_cache
        if version != self._t.version:
            rows = sorted((r for r in self._members.values() if r[0] <= SUSPECT and r[1] != self.node_id),
                          key=lambda r: r[1])
            self._alive_cache = (self._t.version, rows)
        lh = self._t.last_heard
        return [Member(r[1], r[2], STATE_NAMES[r[0]], r[3], lh.get(r[1])) for r in rows]

    def table(self) -> list[Member]:
        """Every known member, self included, by id (for ``p2p status``)."""
        lh = self._t.last_heard
        rows = [Member(r[1], r[2], STATE_NAMES[r[0]], r[3], lh.get(r[1])) for r in self._members.values()]
        rows.sort(key=lambda m: m.id)
        return rows

    def member(self, node_id: str) -> Optional[Member]:
        """The row for ``node_id``, or None if unknown (never known, or reaped)."""
        r = self._members.get(node_id)
        if r is None:
            return None
        return Member(r[1], r[2], STATE_NAMES[r[0]], r[3], self._t.last_heard.get(node_id))

    def state_of(self, node_id: str) -> Optional[int]:
        """The state code (ALIVE/SUSPECT/DEAD/LEFT) of ``node_id``, or None; cheap."""
        r = self._members.get(node_id)
        return None if r is None else r[0]

    def num_live(self) -> int:
        """Rows ALIVE or SUSPECT, self included (our estimate of the cluster size)."""
        return self._t.n_live

    def local_health(self) -> int:
        """Lifeguard awareness score: 0 is healthy; timeouts are scaled by score + 1."""
        return self._awareness.score

    # ------------------------------------------------------------------ message handlers

    def _on_ping(self, src: str, msg: Ping, now: float, out: list) -> None:
        if msg.updates:
            self._apply_updates(msg.updates, now, out)
        if msg.target != self.node_id:  # the address now belongs to someone else
            self._count("ignored_wrong_target")
            return
        out.append(Send(src, trusted(Ack, msg.seq, self.node_id, self._take())))
        self._count("sent_Ack")

    def _on_ack(self, src: str, msg: Ack, now: float, out: list) -> None:
        if msg.updates:
            self._apply_updates(msg.updates, now, out)
        seq = msg.seq
        if self._checking and self._rumour_refuted(msg.sender, seq, now):
            return
        if seq == self._probe_seq:
            self._probe_seq = -1
            self._probe_timeout_at = INF
            self._awareness.apply(-1)
            return
        relay = self._relays.pop(seq, None)
        if relay is not None:
            out.append(Send(relay[0], trusted(Ack, relay[1], self.node_id, ())))
            self._count("sent_Ack")
        else:
            self._count("stale_acks")

    def _on_nack(self, src: str, msg: Nack, now: float, out: list) -> None:
        if msg.seq == self._probe_seq:
            self._probe_nacks += 1

    def _on_ping_req(self, src: str, msg: PingReq, now: float, out: list) -> None:
        if msg.target == self.node_id:
            raise RemoteProtocolError("bad_ping_req", "asked to probe ourselves")
        if len(self._relays) >= self.config.max_relays:
            self._count("relays_dropped")
            return
        seq = self._seq = self._seq + 1
        self._relays[seq] = (src, msg.seq, now + NACK_AFTER * self.config.probe_timeout)
        out.append(Send(msg.target_addr, trusted(Ping, seq, self.node_id, msg.target, self._take())))
        self._count("sent_Ping")

    def _on_push_pull(self, src: str, msg: PushPull, now: float, out: list) -> None:
        if msg.join:
            own = [s for s in msg.states if s[1] == msg.sender]
            if not own or own[0][0] != ALIVE:
                raise RemoteProtocolError("bad_join", "a joiner must list itself alive")
        self._merge(msg.states, now, out)
        if msg.reply:
            out.append(Send(src, trusted(PushPull, self.node_id, False, False, tuple(self._members.values()))))
            self._count("sent_PushPull")

    def _on_gossip(self, src: str, msg: Gossip, now: float, out: list) -> None:
        self._apply_updates(msg.updates, now, out)

    # ------------------------------------------------------------------ state changes

    def _apply_updates(self, updates: tuple, now: float, out: list) -> None:
        members, me = self._members, self.node_id
        for u in updates:
            kind = u[0]
            if kind == ALIVE:
                cur = members.get(u[1])
                if cur is not None and u[3] <= cur[3] and u[1] != me:
                    continue  # old news: the common case, kept off the slow path
                self._on_alive(u, now, True)
            elif kind == SUSPECT:
                self._on_suspect(u, now)
            elif u[1] == me:
                self._on_dead(u, now)  # we refute
            else:
                self._check_rumour(u, now, out)

    def _merge(self, states: tuple, now: float, out: list) -> None:
        """memberlist mergeState: take a remote table into ours, re-gossiping what is news."""
        members = self._members
        for rec in states:
            nid = rec[1]
            cur = members.get(nid)
            if cur is rec or cur == rec:
                continue
            st = rec[0]
            if cur is None:
                if st <= SUSPECT:  # new member; a remote suspicion is theirs to confirm, not ours
                    self._t.set(nid, rec if st == ALIVE else (ALIVE, nid, rec[2], rec[3]), now)
                    self._broadcast((ALIVE, nid, rec[2], rec[3], ""), now)
                    self._gossip_soon(now)
                continue
            if st == ALIVE:
                self._on_alive(rec, now, True)
            elif st == LEFT:
                if nid == self.node_id:
                    self._on_dead((LEFT, nid, rec[2], rec[3], nid), now)  # we refute
                else:
                    self._check_rumour((LEFT, nid, rec[2], rec[3], nid), now, out)
            else:  # SUSPECT, or DEAD taken as SUSPECT so that the member may refute
                self._on_suspect((SUSPECT, nid, rec[2], rec[3], self.node_id), now)

    def _on_alive(self, u: tuple, now: float, announce: bool) -> None:
        nid, addr, inc = u[1], u[2], u[3]
        if nid == self.node_id:
            if inc > self._inc or (inc == self._inc and addr != self.addr):
                self._refute(inc, now)
            return
        cur = self._members.get(nid)
        if cur is not None and inc <= cur[3]:
            return
        if cur is not None and self._suspicions.pop(nid, None) is not None:
            self._retime_suspicions()
        self._t.set(nid, (ALIVE, nid, addr, inc), now)
        if announce:
            self._broadcast(u if len(u) == 5 else (ALIVE, nid, addr, inc, ""), now)
            if cur is None:
                self._gossip_soon(now)

    def _on_suspect(self, u: tuple, now: float) -> None:
        nid, inc = u[1], u[3]
        cur = self._members.get(nid)
        if cur is None or inc < cur[3]:
            return
        s = self._suspicions.get(nid)
        if s is not None:
            if s.confirm(u[4]):
                self._broadcast(u, now)
                self._retime_suspicions()
            return
        if cur[0] != ALIVE:
            return
        if nid == self.node_id:
            self._refute(inc, now)
            self._count("false_suspicions_refuted")
            return
        self._t.set(nid, (SUSPECT, nid, cur[2], inc), now)
        cfg = self.config
        n = self._t.n_live
        mn = suspicion_min_timeout(cfg.suspicion_mult, n, cfg.probe_interval)
        s = self._suspicions[nid] = Suspicion(u[4], expected_confirmations(cfg.suspicion_mult, n), mn,
                                              mn * cfg.suspicion_max_timeout_mult, now, inc)
        if s.deadline < self._next_suspicion:
            self._next_suspicion = s.deadline
        self._broadcast(u, now)
        self._count("suspected")

    def _check_rumour(self, u: tuple, now: float, out: list) -> None:
        """Another member says ``u[1]`` died or left: Ping it before we believe it (module
        docstring, "Rumoured deaths are checked")."""
        nid, inc = u[1], u[3]
        cur = self._members.get(nid)
        if cur is None or inc < cur[3] or cur[0] >= DEAD:
            return
        if now - self._answered_at.get(nid, -INF) < self.config.probe_interval:
            self._count("rumours_refuted")  # it answered a check a moment ago
            return
        pending = self._checking.get(nid)
        if pending is not None:
            if inc > pending[1][3] or (inc == pending[1][3] and u[0] == LEFT):
                self._checking[nid] = (pending[0], u, pending[2])  # the stronger rumour stands if it does
            return
        seq = self._seq = self._seq + 1
        out.append(Send(cur[2], trusted(Ping, seq, self.node_id, nid, ())))
        self._count("sent_Ping")
        self._count("rumours_checked")
        deadline = now + self._awareness.scale(self.config.probe_timeout)
        self._checking[nid] = (seq, u, deadline)
        self._next_check = min(self._next_check, deadline)

    def _rumour_refuted(self, sender: str, seq: int, now: float) -> bool:
        """An Ack to a rumour check: the member answered, the rumour is dropped."""
        pending = self._checking.get(sender)
        if pending is None or pending[0] != seq:
            return False
        del self._checking[sender]
        self._count("rumours_refuted")
        horizon = now - self.config.probe_interval
        self._answered_at = {n: t for n, t in self._answered_at.items() if t >= horizon}
        self._answered_at[sender] = now
        return True

    def _expire_checks(self, now: float) -> None:
        """Rumours whose member stayed silent for the probe timeout stand."""
        due = [nid for nid, (_, _, deadline) in self._checking.items() if deadline <= now]
        for nid in due:
            _, u, _ = self._checking.pop(nid)
            self._on_dead(u, now)
        self._next_check = min((c[2] for c in self._checking.values()), default=INF)

    def _on_dead(self, u: tuple, now: float) -> None:
        nid, inc = u[1], u[3]
        cur = self._members.get(nid)
        if cur is None or inc < cur[3]:
            return
        if self._suspicions.pop(nid, None) is not None:
            self._retime_suspicions()
        if cur[0] >= DEAD:
            return
        if nid == self.node_id:
            self._refute(inc, now)
            return
        state = LEFT if u[0] == LEFT else DEAD
        self._t.set(nid, (state, nid, cur[2], inc), now)
        self._broadcast(u, now)
        self._count("declared_left" if state == LEFT else "declared_dead")
        if state == DEAD and self._next_fast == INF:
            self._next_fast = now + self.config.reconnect_fast_interval

    def _refute(self, accused: int, now: float) -> None:
        inc = max(self._inc, accused) + 1
        self._inc = inc
        self._awareness.apply(1)
        self._t.set(self.node_id, (ALIVE, self.node_id, self.addr, inc), now)
        self._broadcast((ALIVE, self.node_id, self.addr, inc, ""), now)
        self._count("refutes")

    def _broadcast(self, update: tuple, now: float) -> None:
        self._queue.push(update[1], update, record_size(update))
        if self._next_gossip == INF and self._started:
            self._next_gossip = now + self.config.gossip_interval

    def _gossip_soon(self, now: float) -> None:
        """A new member's news goes out now, not at the next gossip tick. A swarm launched
        together (each node joining the one before: the lab, LocalSwarm) trains only once every
        member knows all ``--min-members``, and each hop waited up to a tick (0.2 s on lan): in the
        simulator 30 peers joining at once converged in a median 0.61 s, now 0.27 s. At most one
        such early round per JOIN_GOSSIP_GAP of the interval: a burst of joins still shares rounds."""
        self._next_gossip = min(self._next_gossip, max(now, self._gossiped_at + JOIN_GOSSIP_GAP * self.config.gossip_interval))

    def _take(self) -> tuple:
        if not self._queue:
            return ()
        n = self._t.n_live
        if n != self._limit_n:
            self._limit_n, self._limit = n, retransmit_limit(self.config.retransmit_mult, n)
        return tuple(self._queue.take(self.config.packet_budget_bytes - _OVERHEAD, self._limit))

    # ------------------------------------------------------------------ timers

    def _probe(self, now: float, out: list) -> None:
        cfg = self.config
        if self._probe_seq >= 0:  # the previous probe got no ack, even indirectly
            self._probe_failed(now)
        self._next_probe = now + self._awareness.scale(cfg.probe_interval)
        if self._queue and self._next_gossip == INF:
            self._next_gossip = now + cfg.gossip_interval
        target = self._t.next_probe_target()
        if target is None:
            return
        rec = self._members[target]
        seq = self._seq = self._seq + 1
        updates = self._take()
        if rec[0] == SUSPECT:  # Lifeguard buddy system: tell the suspect, it may refute at once
            updates = ((SUSPECT, target, rec[2], rec[3], self.node_id),) + tuple(
                u for u in updates if u[1] != target)
        out.append(Send(rec[2], trusted(Ping, seq, self.node_id, target, updates)))
        self._count("sent_Ping")
        self._probe_seq = seq
        self._probe_id = target
        self._probe_nacks = 0
        self._probe_expected_nacks = 0
        self._probe_timeout_at = now + self._awareness.scale(cfg.probe_timeout)

    def _probe_failed(self, now: float) -> None:
        self._count("probe_failures")
        self._awareness.apply(awareness_delta(self._probe_expected_nacks, self._probe_nacks))
        target, self._probe_seq, self._probe_timeout_at = self._probe_id, -1, INF
        rec = self._members.get(target)
        if rec is not None and rec[0] <= SUSPECT:
            self._on_suspect((SUSPECT, target, rec[2], rec[3], self.node_id), now)

    def _send_indirect(self, out: list) -> None:
        if self._probe_seq < 0:
            return
        target = self._probe_id
        rec = self._members.get(target)
        if rec is None:
            return
        helpers = self._t.sample(self.config.indirect_checks, ALIVE, target)
        for h in helpers:
            out.append(Send(self._members[h][2], trusted(PingReq, self._probe_seq, self.node_id, target, rec[2])))
        self._count("sent_PingReq", len(helpers))
        self._probe_expected_nacks = len(helpers)

    def _expire_suspicions(self, now: float) -> None:
        due = [nid for nid, s in self._suspicions.items() if s.deadline <= now]
        for nid in due:
            del self._suspicions[nid]
            rec = self._members.get(nid)
            if rec is not None and rec[0] == SUSPECT:
                self._on_dead((DEAD, nid, rec[2], rec[3], self.node_id), now)
        self._retime_suspicions()

    def _retime_suspicions(self) -> None:
        sus = self._suspicions
        self._next_suspicion = min([s.deadline for s in sus.values()]) if sus else INF

    def _expire_relays(self, now: float, out: list) -> None:
        due = [seq for seq, r in self._relays.items() if r[2] <= now]
        for seq in due:
            origin, origin_seq, _ = self._relays.pop(seq)
            out.append(Send(origin, trusted(Nack, origin_seq, self.node_id)))
            self._count("sent_Nack")

    def _gossip(self, now: float, out: list) -> None:
        cfg = self.config
        if not self._queue:
            self._next_gossip = INF
            return
        targets = self._t.sample(cfg.gossip_nodes, SUSPECT, "", now - cfg.gossip_to_the_dead)
        if not targets:
            self._next_gossip = INF  # re-armed by the next probe tick or queued update
            return
        self._next_gossip = now + cfg.gossip_interval
        self._gossiped_at = now
        for t in targets:
            updates = self._take()
            if not updates:
                break
            out.append(Send(self._members[t][2], trusted(Gossip, self.node_id, updates)))
            self._count("sent_Gossip")

    def _push_pull(self, now: float, out: list) -> None:
        cfg = self.config
        self._next_push_pull = now + push_pull_interval(cfg.push_pull_interval, self._t.n_live)
        peers = self._t.sample(1, ALIVE, "")
        if peers:
            self._send_push_pull(self._members[peers[0]][2], out)

    def _reconnect(self, now: float, out: list) -> None:
        """Serf's reconnect: now and then push-pull a recently dead member; reap old rows."""
        cfg = self.config
        self._next_reconnect = now + cfg.reconnect_interval
        members = self._members
        recent = []
        for nid, since in list(self._t.dead_since.items()):
            age = now - since
            if age > cfg.reap_after:
                self._t.set(nid, None, now)
                self._count("reaped")
            elif age <= cfg.reconnect_window and members[nid][0] == DEAD:
                recent.append(nid)
        if recent and self._rng.random() < len(recent) / max(1, self._t.n_live - 1):
            nid = recent[int(self._rng.random() * len(recent))]
            self._send_push_pull(members[nid][2], out)
            self._count("reconnects")

    def _reconnect_fast(self, now: float, out: list) -> None:
        """Push-pull the members that died less than ``reconnect_fast_window`` ago, each on a
        fresh connection: once the link is back the first of these gets through at once."""
        cfg = self.config
        horizon = now - cfg.reconnect_fast_window
        members = self._members
        recent = [nid for nid, since in self._t.dead_since.items() if since >= horizon and members[nid][0] == DEAD]
        if not recent:
            self._next_fast = INF  # re-armed by the next death
            return
        self._next_fast = now + cfg.reconnect_fast_interval
        if len(recent) > cfg.reconnect_fast_max:
            recent = self._rng.sample(recent, cfg.reconnect_fast_max)
        for nid in recent:
            self._send_push_pull(members[nid][2], out, fresh=True)
        self._count("fast_reconnects", len(recent))

    def _may_nudge(self, nid: str, now: float) -> bool:
        """At most one fresh send per ``nudge_interval`` per member (taken if True)."""
        if now - self._nudged.get(nid, -INF) < self.config.nudge_interval:
            return False
        if len(self._nudged) > len(self._members):  # forget the old ones (rows reaped meanwhile)
            horizon = now - self.config.nudge_interval
            self._nudged = {n: t for n, t in self._nudged.items() if t >= horizon}
        self._nudged[nid] = now
        return True

    def _answer_fresh(self, src: str, sender: str, now: float, out: list) -> None:
        """A member we held dead spoke: answer it now, on a fresh connection (our reply to it,
        if any, goes fresh). While we still hold it suspect or dead, a PushPull
        asking for its table tells it so: it refutes, and its answer re-admits it. Else (this
        message re-admitted it) our table, so that our connection to it is renewed all the same."""
        if not self._may_nudge(sender, now):
            return
        self._count("readmit_nudges")
        renewed = False
        for i, s in enumerate(out):
            if s.to == src:
                out[i], renewed = Send(s.to, s.msg, True), True
                break
        row = self._members.get(sender)
        ask = row is not None and (row[0] == SUSPECT or row[0] == DEAD)
        if ask and any(s.to == src and type(s.msg) is PushPull for s in out):
            return  # our reply already carries the table that tells it
        if ask or not renewed:
            out.append(Send(src, trusted(PushPull, self.node_id, False, ask, tuple(self._members.values())),
                            not renewed))
            self._count("sent_PushPull")

    def _send_join(self, out: list) -> None:
        states = tuple(self._members.values())
        for seed in self._seeds:
            out.append(Send(seed, trusted(PushPull, self.node_id, True, True, states)))
        self._count("sent_PushPull", len(self._seeds))
        self._count("join_attempts")

    def _send_push_pull(self, addr: str, out: list, fresh: bool = False) -> None:
        out.append(Send(addr, trusted(PushPull, self.node_id, False, True, tuple(self._members.values())), fresh))
        self._count("sent_PushPull")

    def _count(self, key: str, n: int = 1) -> None:
        stats = self.stats
        stats[key] = stats.get(key, 0) + n


_RECV_KEYS = {t: "recv_" + t.__name__ for t in MEMBERSHIP_MESSAGES}

_HANDLERS = {
    Ping: Membership._on_ping,
    Ack: Membership._on_ack,
    Nack: Membership._on_nack,
    PingReq: Membership._on_ping_req,
    PushPull: Membership._on_push_pull,
    Gossip: Membership._on_gossip,
}
