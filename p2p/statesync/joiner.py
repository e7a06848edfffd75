"""``StateJoiner``: the downloading side of state sync.

Theory of operation. States: QUERYING -> TRANSFERRING -> DONE, or FAILED.

- QUERYING: ask the join addresses for an offer (``SyncQuery``); every offer names more live
  members, which are asked too, up to ``max_candidates``. When everyone asked has answered, or
  ``query_timeout_s`` passed, choose a donor. Only offers for our model (same model key) with a
  step above our own count (a joiner with a fresher checkpoint keeps it). With none, the outcome
  is DONE with no state: we are as fresh as anyone (a new swarm, or a restart of all of it). That
  takes an answer from a member that holds state: silence, or answers only from members still
  joining themselves (step -1), mean "ask again" (after a pause of 0.25 s that doubles up to the
  query timeout) until the deadline (a joiner that joined through
  a syncing member while the members with state were slow to answer started from a random model,
  and dragged the finished swarm's model down; seen in CI).
- Choosing: the freshest offer sets the bar; every donor within ``step_slack`` steps of it is as
  good, and among those each joiner prefers a different one (rendezvous hashing of the joiner's
  nonce with the donor's address), busy ones last. So simultaneous joiners spread over donors.
- TRANSFERRING: keep ``window`` chunk requests in flight; each chunk must belong to the
  transfer, come from the same capture (``snapshot``, step, size) as the first, and land where
  asked; the state must not exceed ``max_bytes`` (the caller's bound from its own state's size).
  A donor that sends nothing for ``timeout_s``, refuses (BUSY, UNKNOWN) or breaks a rule is
  dropped and the next candidate is tried from the start (its state is another capture). When
  the candidates run out, the members are asked again, until ``deadline``; then FAILED.
- DONE: ``outcome`` holds the bytes, the donor's step and address, and a crc32 of the bytes.

Invariant: the bytes delivered are exactly one capture of one donor, in order, complete.
"""

from __future__ import annotations

import hashlib
import math
import random
import zlib
from dataclasses import dataclass, field
from typing import Optional, Sequence

from p2p.protocol import RemoteProtocolError, Send
from p2p.statesync.messages import (BUSY, CAPTURED, OK, PREPARING, UNKNOWN, SyncChunk, SyncChunkRequest, SyncConfig,
                                    SyncOffer, SyncQuery)

QUERYING, TRANSFERRING, DONE, FAILED = "querying", "transferring", "done", "failed"
NOT_YET_PAUSE_S = 0.25  # the first pause before asking again when no member with state answered (``_not_yet_pause``)


@dataclass(frozen=True)
class SyncOutcome:
    data: Optional[bytes]  # None: no member had fresher state than ours
    step: int = -1
    donor: str = ""
    crc: int = 0


@dataclass
class _Offer:
    step: int
    busy: bool
    chunk_bytes: int  # 0: any


@dataclass
class _Transfer:
    donor: str
    ident: int
    chunk: int  # bytes per request (ours, or less when the donor asked)
    buffer: bytearray = field(default_factory=bytearray)
    total: int = -1
    snapshot: int = -1
    step: int = -1
    next_offset: int = 0  # the next offset to request
    requested: set[int] = field(default_factory=set)  # offsets asked for and not yet received
    received: int = 0  # bytes in place, contiguous from 0
    pending: dict[int, bytes] = field(default_factory=dict)  # chunks that came ahead of a gap
    last_progress: float = 0.0
    preparing: bool = False  # the donor said it is capturing
    retried: bool = False  # after a stall, the outstanding chunks were asked for again


class StateJoiner:
    def __init__(self, config: SyncConfig, seeds: Sequence[str], own_step: int, model_key: str, max_bytes: int,
                 rng: random.Random, now: float, deadline: float, exclude: Sequence[str] = (),
                 optimizer: bool = True) -> None:
        self.config = config
        self.own_step, self.model_key, self.max_bytes = own_step, model_key, max_bytes
        self.optimizer = optimizer  # ask for the donor's optimizer state too
        self.rng = rng
        self.nonce = rng.getrandbits(62)
        self.deadline = deadline  # give up (FAILED) when nothing could be synced by then
        self.phase = QUERYING
        self.outcome: Optional[SyncOutcome] = None
        self.error = ""
        self._seeds = list(dict.fromkeys(seeds))
        self._asked: set[str] = set()
        self._answered: set[str] = set()
        self._holders = 0  # answers from members that hold state (step >= 0), in this round of asking
        self._queries = 0  # SyncQuery sent in this round of asking
        self._offers: dict[str, _Offer] = {}
        self._failed: set[str] = set()  # donors given up on in this run (asked again after a re-query)
        self._excluded = frozenset(exclude)  # never donors (their state did not fit before)
        # No wait past ``deadline``: a round of asking that outlasted it made a silent join
        # address cost the joiner the join timeout plus up to a query timeout.
        self._query_until = min(now + config.query_timeout_s, deadline)
        self._reask_at = math.inf  # after every candidate failed: when to ask the members again
        self._not_yet = min(NOT_YET_PAUSE_S, config.query_timeout_s)  # the next pause when nobody with state answered
        self._transfer: Optional[_Transfer] = None
        self.attempts = 0  # donors tried
        self.stats = {"offers": 0, "chunks": 0, "bytes": 0, "donors_failed": 0, "rejected": 0, "retries": 0,
                      "duplicates": 0}

    # -- driver interface -----------------------------------------------------------------------
    def start(self, now: float) -> list[Send]:
        return self._ask(self._seeds)

    @property
    def finished(self) -> bool:
        return self.phase in (DONE, FAILED)

    def next_deadline(self) -> float:
        if self.phase == QUERYING:
            return min(self._query_until, self._reask_at)
        if self.phase == TRANSFERRING:
            return self._transfer.last_progress + self._patience()
        return math.inf

    def _patience(self) -> float:
        """How long the current donor may stay silent: longer between its PREPARING and its
        first chunk (it is capturing the state)."""
        t = self._transfer
        return self.config.first_chunk_s if t.preparing and t.total < 0 else self.config.timeout_s

    def tick(self, now: float) -> list[Send]:
        if self.phase == QUERYING and now >= self.deadline and not self._offers:
            # Out of time with nothing offered in this round of asking: no new round. Silence
            # from the start is "nobody fresher" (keep ours, as before); after failed transfers
            # the last one's error stands.
            if self.attempts:
                self.phase, self.error = FAILED, self.error or "no member could serve its state"
            else:
                self.phase, self.outcome = DONE, SyncOutcome(None)
            return []
        if self.phase == QUERYING and now >= self._reask_at:
            self._reask_at, self._query_until = math.inf, min(now + self.config.query_timeout_s, self.deadline)
            return self._ask(self._seeds)
        if self.phase == QUERYING and now >= self._query_until:
            return self._choose(now)
        t = self._transfer
        if self.phase == TRANSFERRING and now >= t.last_progress + self._patience():
            if t.retried or not t.requested:
                return self._drop(f"{t.donor} sent nothing for {self._patience():g}s", now)
            # Ask once more for what is outstanding: a chunk can be lost with a stale connection
            # (the donor wrote it to a peer that restarted at the same address).
            t.retried, t.last_progress = True, now
            self.stats["retries"] += 1
            return [Send(t.donor, SyncChunkRequest(t.ident, offset, t.chunk, self.optimizer)) for offset in sorted(t.requested)]
        return []

    def receive(self, src: str, msg: object, now: float) -> list[Send]:
        if isinstance(msg, SyncOffer):
            return self._on_offer(src, msg, now)
        if isinstance(msg, SyncChunk):
            return self._on_chunk(src, msg, now)
        return []

    def progress(self) -> dict:
        """For status: the phase, the donor and bytes so far."""
        t = self._transfer
        return {"phase": self.phase, "donor": t.donor if t else "", "received": t.received if t else 0,
                "total": t.total if t else -1, "step": t.step if t else -1, "attempts": self.attempts,
                "candidates": len(self._offers), "error": self.error}

    # -- querying ---------------------------------------------------------------------------------
    def _ask(self, addrs: Sequence[str]) -> list[Send]:
        room = self.config.max_candidates - len(self._asked)
        fresh = [a for a in addrs if a not in self._asked][:max(0, room)]
        self._asked.update(fresh)
        self._queries += len(fresh)
        return [Send(a, SyncQuery(self.nonce)) for a in fresh]

    def _on_offer(self, src: str, msg: SyncOffer, now: float) -> list[Send]:
        # Matched by the nonce, not the address: a member may answer under another name than
        # the one we asked (a hostname, another interface, a wildcard listener's routed address).
        if msg.nonce != self.nonce or src in self._answered or len(self._answered) >= self.config.max_candidates:
            return []  # not an answer to us, a repeated one, or one too many
        self._asked.add(src)  # whatever we called it, we need not ask it again
        self.stats["offers"] += 1
        self._holders += msg.step >= 0
        if msg.model_key == self.model_key and msg.step > self.own_step:
            self._offers[src] = _Offer(msg.step, msg.busy, msg.chunk_bytes)
        elif msg.step >= 0 and msg.model_key != self.model_key:
            self.stats["rejected"] += 1  # another model: never a donor
        self._answered.add(src)
        sends = self._ask(msg.members) if self.phase == QUERYING else []
        if self.phase == QUERYING and len(self._answered) >= self._queries:
            sends += self._choose(now)  # as many answers as questions: no need to wait longer
        return sends

    def _choose(self, now: float) -> list[Send]:
        candidates = {a: o for a, o in self._offers.items() if a not in self._failed and a not in self._excluded}
        if not candidates:
            if not self._holders and not self._failed and now < self.deadline:
                # Nobody with state answered yet: a socket still reconnecting to our address (we
                # restarted), a member still starting, or only members that are joining themselves.
                # Silence is not "nobody is fresher": ask again.
                self.error = "no member with state answered yet"
                return self._ask_again(now, self._not_yet_pause())
            if not self._offers and not self._failed:
                self.phase, self.outcome = DONE, SyncOutcome(None)  # nobody fresher (or nobody at all): keep ours
                return []
            if now >= self.deadline:
                self.phase, self.error = FAILED, self.error or "no member could serve its state"
                return []
            # Everyone failed once: ask again after a pause (members come back, a busy one frees
            # up; a donor that breaks the rules at once must not make us spin).
            return self._ask_again(now)
        best = max(o.step for o in candidates.values())
        good = [a for a, o in candidates.items() if o.step >= best - self.config.step_slack]

        def preference(addr: str) -> tuple:
            digest = hashlib.blake2b(f"{self.nonce}:{addr}".encode(), digest_size=8).digest()
            return (candidates[addr].busy, -int.from_bytes(digest, "big"))

        donor = min(good, key=preference)
        self.attempts += 1
        chunk = min(self.config.chunk_bytes, candidates[donor].chunk_bytes or self.config.chunk_bytes)
        self._transfer = _Transfer(donor, self.rng.getrandbits(62), chunk, last_progress=now)
        self.phase = TRANSFERRING
        return self._request_more()

    def _not_yet_pause(self) -> float:
        """The pause before asking again when the members answered but none holds state yet:
        ``NOT_YET_PAUSE_S``, doubling each time, up to the query timeout. Members that start
        together (a new swarm, every node launched at once) are each still syncing through the
        next when the first asks: a whole query timeout per round of asking made the last of
        four nodes start training ~2 s after the first could have (the lab, bench/slow_links.py)."""
        pause, self._not_yet = self._not_yet, min(2 * self._not_yet, self.config.query_timeout_s)
        return pause

    def _ask_again(self, now: float, pause: Optional[float] = None) -> list[Send]:
        """Forget this round of asking and start another after a pause (tick): ``pause``, else
        the query timeout (every candidate failed: a donor that breaks the rules at once must
        not make us spin)."""
        self._failed.clear()
        self._asked.clear()
        self._answered = set()
        self._holders = 0
        self._queries = 0
        self._offers.clear()
        self._query_until = math.inf
        self._reask_at = min(now + (self.config.query_timeout_s if pause is None else pause), self.deadline)
        self.phase = QUERYING
        return []

    # -- transferring -----------------------------------------------------------------------------
    def _request_more(self) -> list[Send]:
        t = self._transfer
        size = t.chunk
        sends = []
        limit = t.total if t.total >= 0 else 1  # before the first chunk (the size is unknown) ask for one
        while len(t.requested) < self.config.window and t.next_offset < limit:
            sends.append(Send(t.donor, SyncChunkRequest(t.ident, t.next_offset, size, self.optimizer)))
            t.requested.add(t.next_offset)
            t.next_offset += size
        return sends

    def _on_chunk(self, src: str, msg: SyncChunk, now: float) -> list[Send]:
        t = self._transfer
        if self.phase != TRANSFERRING or src != t.donor or msg.transfer != t.ident:
            return []  # late, from a donor given up on: ignore
        if msg.status == PREPARING and t.total < 0 and not t.preparing:
            t.preparing, t.last_progress = True, now  # alive, capturing: the bytes follow
            return []
        if msg.status == CAPTURED and msg.data.size == 0:
            if t.total >= 0:
                return []  # it came after the first chunk: nothing new
            try:
                self._capture_fields(t, msg)
            except RemoteProtocolError as exc:
                self.stats["rejected"] += 1
                return self._drop(f"{src} broke the transfer: {exc}", now)
            t.preparing, t.last_progress = False, now
            return self._request_more()
        if msg.status == OK and t.total >= 0 and (msg.offset < t.received or msg.offset in t.pending):
            self.stats["duplicates"] += 1  # the answer to a repeated request: we have it
            return []
        if msg.status != OK:
            why = {BUSY: "busy", UNKNOWN: "unknown transfer", PREPARING: "preparing twice", CAPTURED: "data in a notice"}[msg.status]
            return self._drop(f"{src} refused ({why})", now)
        try:
            self._check(t, msg)
        except RemoteProtocolError as exc:
            self.stats["rejected"] += 1
            return self._drop(f"{src} broke the transfer: {exc}", now)
        t.last_progress, t.retried = now, False
        t.requested.discard(msg.offset)
        self.stats["chunks"] += 1
        self.stats["bytes"] += int(msg.data.size)
        if msg.offset == t.received:
            t.buffer += memoryview(msg.data)
            t.received += msg.data.size
            while t.received in t.pending:
                piece = t.pending.pop(t.received)
                t.buffer += piece
                t.received += len(piece)
        elif msg.offset > t.received:
            t.pending[msg.offset] = bytes(msg.data)
        if t.received == t.total:
            data = bytes(t.buffer)
            self.phase = DONE
            self.outcome = SyncOutcome(data, t.step, t.donor, zlib.crc32(data))
            return []
        return self._request_more()

    def _capture_fields(self, t: _Transfer, msg: SyncChunk) -> None:
        """The first word about the capture (CAPTURED, or the first chunk) fixes it."""
        if msg.model_key != self.model_key:
            raise RemoteProtocolError("wrong_model", f"state of {msg.model_key!r}, we train {self.model_key!r}")
        if msg.total > self.max_bytes:
            raise RemoteProtocolError("oversized", f"state of {msg.total} bytes, at most {self.max_bytes} expected")
        if msg.step <= self.own_step:
            raise RemoteProtocolError("bad_value", f"state of step {msg.step}, ours is {self.own_step}")
        t.total, t.snapshot, t.step = msg.total, msg.snapshot, msg.step

    def _check(self, t: _Transfer, msg: SyncChunk) -> None:
        if t.total < 0:
            self._capture_fields(t, msg)
        elif (msg.snapshot, msg.total, msg.step) != (t.snapshot, t.total, t.step):
            raise RemoteProtocolError("bad_value", "a chunk of another capture within one transfer")
        expected = min(t.chunk, t.total - msg.offset)
        if msg.offset not in t.requested or msg.data.size != expected:
            raise RemoteProtocolError("bad_value", f"chunk at {msg.offset} of {msg.data.size} bytes, not asked for")

    def _drop(self, why: str, now: float) -> list[Send]:
        """Give up on the current donor; try the next candidate."""
        self.error = why
        self.stats["donors_failed"] += 1
        self._failed.add(self._transfer.donor)
        self._transfer = None
        return self._choose(now)
