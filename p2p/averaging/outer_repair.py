"""Repairing a DiLoCo peer whose copy of the outer parameters fell apart: pull from one donor.

Why. DiLoCo's workers share theta_start by construction (Douillard et al., arXiv:2311.08105,
Alg. 1); here each peer holds its own copy (p2p/averaging/diloco.py), and a missed round, a
cut link or a joiner leaves copies apart. Mixing the copies in the next round (both sides send
theta_start and the outer momentum to each other) costs 2 x 8N bytes per pair: at 20 Mbit/s
on a 2 M-parameter model that outlasts the round timeout, the round fails, the copies stay
apart and the next round tries the same again, for ever (issue 16). So a repair here is
a pull, sized and scheduled so that it cannot feed on itself:

- **Who repairs.** After each round, the sketches of theta_start (ours and the neighbours',
  all taken at the same round's start) are grouped (``reference_group``): the largest group of
  matching sketches is the reference; among groups of one size, the one holding the most
  trained copy (the highest step count, then the lowest address: every peer on ``full`` sees
  the same shares and picks the same group, and picks it again next round. An earlier rule,
  the smallest sketch as bytes, changed its answer from round to round as the copies moved:
  in the lab two peers apart pulled from each other and swapped copies).
  Only a peer outside the reference group repairs; the others do nothing, so no repair ever
  answers another.
- **From whom, what.** From ONE donor of the reference group (the fastest measured link): its
  theta_start in float32 and its outer momentum in float16 (6 bytes per parameter, once;
  a momentum beyond float16's range goes as float32; no momentum at all when the outer
  momentum coefficient is 0, SparseLoCo's outer step: it never enters an outer step, so the
  puller asks for theta_start's chunks only and keeps its own buffer, 4 bytes per parameter),
  as of one outer round (the donor captures it when it reaches the round asked for, and
  serves every chunk of the transfer from that capture).
- **In the background.** ``CHUNK_ENTRIES`` at a time (each chunk is a bulk-stream message),
  one chunk in flight, paced to ``PULL_SHARE`` of the link: after a chunk that took t seconds
  the next is asked for t (1 / PULL_SHARE - 1) seconds later. Unpaced, the pull filled the
  donor's uplink and its round shares queued behind the chunks, so every peer's round (and the
  trainers gated on it) stretched from ~2.5 s to ~6 s at 20 Mbit/s in the lab
  (bench/diloco_repair.py); paced, it takes a few rounds and the rounds keep their pace.
  Training never waits for it: no step hook looks at a repair.
- **Bounded.** At most one repair in flight. A chunk's deadline is its bytes / the measured
  link rate x a slack; past it the attempt fails and, after a doubling backoff, the same chunk
  is asked for again: a retry never moves more than the attempt before, and the chunks already
  in are kept (the rules the catch-up shares: p2p/averaging/donor_pull.py).
- **Replay.** The pulled (theta_start, m) are the donor's after outer round R; we kept our own
  (theta_start, m) of round R when we asked. With the same averaged pseudo-gradients D in
  the rounds since (we took part in them), the outer step
  ``m <- mu m + D; theta <- theta - lr (D + mu m)`` moves the difference between two copies
  by a linear map independent of D (``propagate``): so we add the propagated difference to our
  current theta_start, our momentum and our model (the model keeps its inner progress as a
  delta) and rejoin the compressed rounds with the swarm's copy, as Streaming DiLoCo's workers
  rejoin a synchronisation of fragments they missed (Douillard et al., arXiv:2501.18512).

States (puller): idle -> pulling (one chunk in flight, or backing off after a failed attempt)
-> done (the correction waits for our next idle moment) -> idle; pulling -> idle when the donor
no longer holds the round or after ``MAX_ATTEMPTS`` failed attempts (donor_pull.py). Donor: captures keyed
by outer round (at most ``MAX_CAPTURES``), requests for a round it has not reached yet wait
for it (at most ``MAX_PENDING``); a request for a round it has passed gets an empty chunk
naming its round (the puller drops that attempt and asks again later).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from p2p.averaging.donor_pull import DonorPull
from p2p.bandwidth import BandwidthMonitor
from p2p.protocol import RemoteProtocolError, Send
from p2p.wire import message

CHUNK_ENTRIES = 512 * 1024  # entries per chunk (2 MiB of theta_start: a bulk-stream message; small
# enough that a round share queued behind one waits well under a second at 20 Mbit/s)
PULL_SHARE = 0.25  # of the link's time a pull may take (module docstring, "In the background")
MAX_CAPTURES = 2  # outer rounds a donor keeps captured for transfers in progress
MAX_PENDING = 16  # requests a donor keeps for rounds it has not reached
CAPTURE_IDLE_S = 60.0  # a capture no request asked for this long is dropped
STALE = -1  # RepairChunk.offset of "I am past that round" (data empty, round = mine)


@message(29)
@dataclass(frozen=True)
class RepairRequest:
    round: int  # the outer round whose (theta_start, momentum) we want (the state after it)
    offset: int  # first entry of the chunk, in [0, 2 numel): theta_start, then momentum
    count: int  # entries wanted
    model_key: str


@message(30)
@dataclass(frozen=True)
class RepairChunk:
    round: int  # the round of the capture the chunk comes from (another than asked: stale)
    offset: int  # as asked, or STALE
    model_key: str
    data: np.ndarray  # float32 (theta_start part) or float16 (momentum part); empty when STALE


def reference_group(sketches: dict[str, tuple[np.ndarray, int]],
                    differ: Callable[[np.ndarray, np.ndarray], bool]) -> set[str]:
    """The keys of the reference group, from {key: (sketch, the holder's step count)} (module
    docstring): the largest group of matching sketches; among groups of one size, the one
    holding the most trained copy (a joiner that synced while the swarm went on, or a peer cut
    off that trained alone, holds fewer steps), then the lowest key (the holder's address:
    stable from round to round, unlike anything taken from the moving copies). Greedy and
    deterministic: members, most trained first, each join the first group whose first member
    they match; every peer of a ``full`` swarm sees the same shares and picks the same group."""
    order = sorted(sketches, key=lambda k: (-sketches[k][1], k))
    groups: list[list[str]] = []
    for key in order:
        for group in groups:
            if not differ(sketches[group[0]][0], sketches[key][0]):
                group.append(key)
                break
        else:
            groups.append([key])
    return set(max(groups, key=len)) if groups else set()  # max keeps the first of equal sizes


def propagate(d_start: np.ndarray, d_momentum: np.ndarray, steps: int, lr: float, mu: float) -> None:
    """Carry the difference between two copies of (theta_start, m) through ``steps`` outer
    steps that used the same D (in place): d_m <- mu d_m; d_theta <- d_theta - lr mu d_m."""
    for _ in range(steps):
        d_momentum *= np.float32(mu)
        d_start -= np.float32(lr * mu) * d_momentum


def chunk_bounds(numel: int, momentum: bool = True) -> list[tuple[int, int]]:
    """(offset, count) of every chunk of theta_start ‖ momentum (theta_start alone without
    ``momentum``); no chunk spans the two."""
    out = []
    for base in ((0, numel) if momentum else (0,)):
        out += [(base + o, min(CHUNK_ENTRIES, numel - o)) for o in range(0, numel, CHUNK_ENTRIES)]
    return out


def chunk_bytes(offset: int, count: int, numel: int) -> int:
    return count * (4 if offset < numel else 2)


class RepairDonor:
    """Serves (theta_start, momentum) of one outer round in chunks (module docstring)."""

    def __init__(self, numel: int, model_key: str, stats: dict[str, int]) -> None:
        self.numel, self.model_key, self.stats = numel, model_key, stats
        self._captures: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}  # round -> (start, m16, last use)
        self._pending: list[tuple[str, RepairRequest]] = []

    def receive(self, src: str, msg: RepairRequest, current: int, state: tuple[np.ndarray, np.ndarray],
                now: float) -> list[Send]:
        if msg.model_key != self.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.model_key!r}")
        if msg.round < 0 or not 0 <= msg.offset < 2 * self.numel or not 0 < msg.count <= CHUNK_ENTRIES \
                or (msg.offset < self.numel) != (msg.offset + msg.count <= self.numel) \
                or msg.offset + msg.count > 2 * self.numel:
            raise RemoteProtocolError("bad_value", f"repair request round {msg.round} [{msg.offset}, +{msg.count})")
        if msg.round in self._captures:
            return [self._serve(src, msg, now)]
        if msg.round == current:
            self._capture(current, state, now)
            return [self._serve(src, msg, now)]
        if msg.round > current:  # we have not reached it yet: serve it when we do
            self._pending = [(s, m) for s, m in self._pending if s != src][-(MAX_PENDING - 1):] + [(src, msg)]
            return []
        return [Send(src, RepairChunk(current, STALE, self.model_key, np.empty(0, np.float32)))]

    def outer_step(self, current: int, state: tuple[np.ndarray, np.ndarray], now: float) -> list[Send]:
        """We reached round ``current``: serve the requests that waited for it."""
        self._captures = {r: c for r, c in self._captures.items() if now - c[2] < CAPTURE_IDLE_S}
        due = [(s, m) for s, m in self._pending if m.round <= current]
        self._pending = [(s, m) for s, m in self._pending if m.round > current]
        sends = []
        for src, msg in due:
            if msg.round == current:
                self._capture(current, state, now)
                sends.append(self._serve(src, msg, now))
            else:
                sends.append(Send(src, RepairChunk(current, STALE, self.model_key, np.empty(0, np.float32))))
        return sends

    def _capture(self, round: int, state: tuple[np.ndarray, np.ndarray], now: float) -> None:
        if round not in self._captures:
            start, momentum = state
            while len(self._captures) >= MAX_CAPTURES:
                del self._captures[min(self._captures, key=lambda r: self._captures[r][2])]
            with np.errstate(over="ignore"):
                m16 = momentum.astype(np.float16)
            if not np.isfinite(m16).all():  # beyond float16's range: send it as it is
                m16 = momentum.copy()
            self._captures[round] = (start.copy(), m16, now)

    def _serve(self, src: str, msg: RepairRequest, now: float) -> Send:
        start, m16, _ = self._captures[msg.round]
        self._captures[msg.round] = (start, m16, now)
        if msg.offset < self.numel:
            data = start[msg.offset:msg.offset + msg.count]
        else:
            data = m16[msg.offset - self.numel:msg.offset - self.numel + msg.count]
        self.stats["repair_bytes_served"] += data.nbytes
        return Send(src, RepairChunk(msg.round, msg.offset, self.model_key, data))


@dataclass
class _Pull:
    donor: str
    round: int
    own_start: np.ndarray  # our theta_start and momentum as of ``round`` (the replay's base)
    own_momentum: np.ndarray
    start: np.ndarray  # what arrived so far
    momentum: np.ndarray
    chunks: list[tuple[int, int]]  # still to fetch, in order


@dataclass(frozen=True)
class Pulled:
    """A finished pull: the donor's (theta_start, momentum) after ``round``, and ours then."""

    round: int
    start: np.ndarray
    momentum: np.ndarray
    own_start: np.ndarray
    own_momentum: np.ndarray
    donor: str  # whose state it is (diloco.py checks the donor's rounds until it lands)


class RepairPuller(DonorPull):
    """The repairing side: at most one pull in flight (module docstring), one chunk asked for at a
    time with donor_pull.py's deadline, backoff and drop rules: a retry asks for the same chunk as
    the attempt before, never more, and an answer to the earlier ask is still taken meanwhile (a
    late chunk, not a lost one, so a second copy only goes out when the first is more than twice
    its deadline late). ``MAX_ATTEMPTS`` failures in one pull drop it; so does a donor that no
    longer holds the round."""

    def __init__(self, numel: int, model_key: str, monitor: BandwidthMonitor, stats: dict[str, int],
                 momentum: bool = True) -> None:
        super().__init__(monitor, stats)
        self.numel, self.model_key = numel, model_key
        # Without outer momentum (mu = 0: SparseLoCo's outer step) the buffer never enters an
        # outer step (mu m = 0) and ``propagate`` zeroes its difference: the pull leaves it out
        # (theta_start only: 4 bytes per parameter instead of 6) and keeps ours.
        self.momentum = momentum

    def begin(self, donor: str, round: int, own: tuple[np.ndarray, np.ndarray], now: float) -> bool:
        """Start pulling round ``round`` from ``donor`` (False: one is in flight already)."""
        if self.active:
            return False
        n = self.numel
        self._start(_Pull(donor, round, own[0].copy(), own[1].copy(), np.empty(n, np.float32),
                          np.empty(n, np.float32) if self.momentum else own[1].copy(),
                          chunk_bounds(n, self.momentum)))
        return True

    def _ask(self) -> tuple[object, int, float]:
        p = self.pull
        offset, count = p.chunks[0]
        return RepairRequest(p.round, offset, count, self.model_key), chunk_bytes(offset, count, self.numel), 0.0

    def receive(self, src: str, msg: RepairChunk, now: float) -> None:
        if msg.model_key != self.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.model_key!r}")
        p = self.pull
        if p is None or src != p.donor:
            self.stats["repair_chunks_unasked"] += 1
            return
        if msg.offset == STALE:  # the donor is past the round we asked: the next round decides again
            self._drop("repair_stale")
            return
        offset, count = p.chunks[0]
        if msg.round != p.round or msg.offset != offset:
            self.stats["repair_chunks_unasked"] += 1  # not the chunk we wait for
            return
        want = (np.float32,) if offset < self.numel else (np.float16, np.float32)
        if not isinstance(msg.data, np.ndarray) or msg.data.dtype not in want or msg.data.shape != (count,):
            raise RemoteProtocolError("bad_tensor", f"repair chunk {getattr(msg.data, 'dtype', '?')}"
                                                    f"{list(getattr(msg.data, 'shape', ()))}, want float32[{count}]"
                                                    " (float16 for the momentum)")
        if offset < self.numel:
            p.start[offset:offset + count] = msg.data
        else:
            p.momentum[offset - self.numel:offset - self.numel + count] = msg.data
        self.stats["repair_bytes"] += msg.data.nbytes
        p.chunks.pop(0)
        self._answered(src, msg.data.nbytes, now, PULL_SHARE)
        if not p.chunks:
            self._finish(Pulled(p.round, p.start, p.momentum, p.own_start, p.own_momentum, p.donor))
