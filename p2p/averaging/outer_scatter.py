"""DiLoCo's outer round as a reduce-scatter + all-gather (``--diloco-reduce-scatter``).

The all-to-all round of p2p/averaging/diloco.py sends every peer's whole (compressed)
pseudo-gradient to each of the N-1 others: N-1 model-sizes per peer and outer step. Here the
averaging is split the way ring / reduce-scatter all-reduce splits it (Patarasuk & Yuan,
"Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009;
Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH",
IJHPCA 2005): the vector is cut into N slices, slice k has one owner, and

- **phase 1 (reduce-scatter):** each peer sends slice k of its Delta, compressed, to the owner
  of slice k (``OuterSlice``; it carries the round's header as ``OuterShare`` does: sketch,
  ``mixed``, H proposal, so the copy watch and the schedule see what they see today). The owner
  averages what arrived by the round's deadline, its own slice included, exactly as the
  all-to-all round averages whole vectors (rounds.py, ``uniform``; robust mixing's "one answer
  for one set" on the slice);
- **phase 2 (all-gather):** the owner compresses the averaged slice again and sends it to all
  (``OuterGather``), with the list of peers whose contributions it included, and applies the
  decoded copy itself, so every peer that holds the gathered slices takes the same outer step.

Bytes per peer: (N-1)/N of a model out in each phase, 2(N-1)/N in all, plus N-1 headers per
phase (the member list, N addresses; in phase 1 also a sketch of 256 floats and the ``mixed``
list: O(N^2) bytes per peer and round, small beside a model up to some hundred peers), against
N-1 for all-to-all. With 4 peers and 100k float32 parameters one round sent 604 kB per peer
against 1.20 MB (int8: 156 kB against 308 kB; tests/test_diloco_scatter.py, peers driven by
hand through p2p.wire). Direct sends, not a ring: N-1 messages per phase instead of a ring's 2(N-1)
sequential hops, so one missing peer costs one slice, not the whole pipeline. Each slice is
compressed twice (the contributions, then their average): the dense codecs' errors are
unbiased and fresh each round (diloco.py, "Compression"), so a second one only adds variance.

**Who owns what.** Slice k = entries [k*numel//N, (k+1)*numel//N) belongs to the k-th of the
round's member set, sorted. Every message carries the set it was cut for (``members``), and a
slice cut for another set than the owner's is dropped and counted (``scatter_view_mismatch``),
never mixed: its bounds are not the owner's. The set must agree across peers, and the driver's
neighbour lists do not always (a join or a death not yet known everywhere; in the simulator, a
pair of peers whose link is cut each drop the other from their view while the rest still see
both), so the set is what the last round agreed on: the one most of its gathered slices were
cut for, less those that are no longer neighbours and whose Delta reached no owner (dead), plus
our neighbours (joiners). A round's set is settled when we begin it (``settle``): every slice
that reached us for it before then votes for the set its sender cut it for, our view votes
once, and the set with the most votes among our view and its supersets is the round's (our
view on a tie); the slices cut for another set are dropped from the round then
(``NeighbourRounds.discard``, counted). A slice that comes after we began must be cut for the
round's set. A superset only: a member we see stays in (we cut for it as long as we see it, as
above, and the round waits for its slice). The senders began the round already, their sets are
fixed, so the set most of them cut for loses the fewest slices; a member we have not heard of
yet (a joiner, or at start-up) is one they have. Before, the set was our view at the time the
round's first slice came, and at start-up that was too early: a peer still waiting for
``--min-members`` got the others' first slices (they had seen every member, it had not seen
all yet), pinned a set no other peer cut for, dropped their slices and had its own dropped by
them: a partial round, one slice skipped per peer and the copies apart
(tests/test_diloco_scatter_real.py, 1 run in 3-4).

**Failures.** Unlike gossip, where a missing neighbour only leaves its weight on ours and every
round stands alone (rounds.py), a reduce-scatter gives each peer one piece of everyone's work,
so a missing peer takes a piece of the average with it:

- *a missing contributor* (crashed, link cut, another set): its owner's round deadline passes,
  the owner averages what arrived and names whose in its ``OuterGather``; every peer applies
  that same slice, so the copies stay equal (the all-to-all round leaves each peer with its own
  set instead, which the copy repair then mends);
- *a missing owner* (crashed before or during phase 2, or its gather lost): phase 2 waits for an
  owner that may itself wait out a missing contributor (the longest round timeout past the
  round's begin, then our usual wait; only the usual wait after a round that missed a slice, so
  a dead owner costs that once). A peer still without slice k then skips the outer step on
  slice k: theta_start and the outer momentum stay as they were there and the model keeps its
  inner progress on it, which the next Delta (theta_start - x) sends again, so nothing is lost
  but a round's delay. An owner that died before sending: every peer skips slice k, the copies
  stay equal. One that reached only some: the copies are apart on slice k, the next round's
  sketches (256 fixed positions, ~256/N in slice k) show it and the peers outside the largest
  group of matching copies pull the swarm's (theta_start, momentum) (outer_copies.py,
  outer_repair.py), as after a partial round of the all-to-all path. A replay cannot mend it (no
  peer holds the others' whole Deltas: it falls back to the pull). A third phase that agreed on
  the gathered set before applying it would close this window at one more round trip; not built.
- *a cut link* (o and p alive, their messages lost): o's gather goes to p through one relay, the
  lowest other member p heard from, when p's slice of the round lacks o's contribution or o's
  lacks p's (``scatter_relayed``); gossip needs no such thing, a cut link there only removes an
  edge from the mixing graph.

There is no switch to the all-to-all round within a round or a swarm: all peers run with the
setting or all without (a share of the other kind is refused as ``unexpected``).

Only the dense codecs (none, fp16, bf16, int8, int4): ``sparseloco`` sends each peer's Delta with
error feedback on what its top-k left out, and an owner's top-k of the average would drop most
of the average with no one to feed it back to (SparseLoCo, arXiv:2508.15706, averages sparse
vectors all-to-all for that reason). Only with one gossip round per outer step (``full``): on
sparse graphs no peer sees everyone.

Pure state, no I/O: DiLoCo calls it and sends what it returns.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from p2p.compression import decompress, make_compressor
from p2p.compression.messages import CompressedFields, compressed_fields
from p2p.protocol import RemoteProtocolError, Send
from p2p.wire import message

MAX_MEMBERS = 1024  # slices a round may be cut into (bounds the member lists a message carries)
MAX_AHEAD = 4  # rounds of gathered slices kept ahead of our own (a faster owner's)
MAX_UNBEGUN = 32  # rounds not begun yet whose slices' sets we keep (>= the rounds rounds.py buffers)
MAX_SETS = 8  # distinct sets one round not begun yet may be voted for (beyond: dropped, a flood)


@message(67)
@dataclass(frozen=True)
class OuterSlice(CompressedFields):
    """Phase 1: slice ``index`` (the receiver's) of the sender's Delta, with the round's header."""

    round: int
    step: int
    degree: int
    model_key: str
    sketch: np.ndarray  # as OuterShare.sketch
    mixed: tuple  # as OuterShare.mixed
    inner_steps: int  # as OuterShare.inner_steps
    members: tuple  # the sender's member set for the round, sorted: slice k belongs to members[k]
    index: int  # which slice (the receiver's position in ``members``)


@message(68)
@dataclass(frozen=True)
class OuterGather(CompressedFields):
    """Phase 2: the averaged slice ``index`` from its owner (or relayed), and whose Deltas it averaged."""

    round: int
    model_key: str
    members: tuple  # the owner's member set for the round, sorted
    index: int  # the slice: members[index] is its owner
    included: tuple  # addresses whose slices went into the average (the owner's among them)


def slice_bounds(numel: int, count: int) -> list[tuple[int, int]]:
    """The N contiguous slices of a ``numel`` vector, as even as integers allow."""
    return [(k * numel // count, (k + 1) * numel // count) for k in range(count)]


def digest(addresses) -> str:
    return hashlib.blake2b("\n".join(sorted(addresses)).encode(), digest_size=8).hexdigest()


def hold(ranges: Sequence[tuple[int, int]], *pairs) -> None:
    """For each (dst, src): dst[lo:hi] = src[lo:hi] (or the scalar src) on every skipped range."""
    for dst, src in pairs:
        for lo, hi in ranges:
            dst[lo:hi] = src if np.isscalar(src) else src[lo:hi]


@dataclass(frozen=True)
class Plan:
    """One round's slicing: the sorted member set, our slice's index, the bounds."""

    members: tuple[str, ...]
    index: int
    bounds: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, self_addr: str, members, numel: int) -> "Plan":
        members = tuple(sorted(set(members) | {self_addr}))
        if len(members) > MAX_MEMBERS:
            raise RemoteProtocolError("bad_value", f"{len(members)} members, reduce-scatter takes {MAX_MEMBERS}")
        return cls(members, members.index(self_addr), tuple(slice_bounds(numel, len(members))))

    def part(self, vector: np.ndarray, k: int) -> np.ndarray:
        lo, hi = self.bounds[k]
        return vector[lo:hi]


class OuterScatter:
    """The reduce-scatter side of one DiLoCo peer (module docstring)."""

    def __init__(self, codec: str, block: Optional[int], numel: int, model_key: str, stats: dict[str, int]) -> None:
        params = {"block": block} if block is not None and codec in ("int8", "int4") else {}
        self._codec = make_compressor(codec, **params)
        self.numel, self.model_key, self.stats = numel, model_key, stats
        for key in ("scatter_rounds", "scatter_slices_skipped", "scatter_contributors_missing",
                    "scatter_view_mismatch", "scatter_relayed", "scatter_late", "scatter_duplicates",
                    "scatter_overflow"):
            stats.setdefault(key, 0)
        self._plans: dict[int, Plan] = {}  # round -> our plan (the round in phase 1, or phase 2)
        # rounds not begun yet -> sender -> the set its slice was cut for; and -> set -> its votes
        self._taken: dict[int, dict[str, tuple]] = {}
        self._votes: dict[int, dict[tuple, int]] = {}
        self.pending: Optional[int] = None  # the round whose phase 2 is in flight
        self.deadline = math.inf
        self._floor = 0  # gathered slices for earlier rounds are late
        # round -> (member set, index) -> (included, decoded slice, the message: relays forward it)
        self._got: dict[int, dict[tuple[tuple, int], tuple[tuple, np.ndarray, OuterGather]]] = {}
        # The last round's agreement (module docstring, "Who owns what"): the member set most of
        # its gathered slices were cut for, and whose Deltas reached any owner.
        self._agreed: tuple = ()
        self._alive: frozenset = frozenset()
        self.delta = np.zeros(numel, dtype=np.float32)
        self.complete = True  # the last round gathered every slice

    def settle(self, round: int, self_addr: str, neighbours: Sequence[str]) -> tuple[Plan, Callable[[str], bool]]:
        """The set round ``round`` is cut for, as we begin it (module docstring, "Who owns
        what"): of ``view`` and its supersets, the one most of the slices that reached us for
        the round were cut for (``view`` on a tie); and which senders' buffered slices of the
        round were cut for another set (DiLoCo drops them from the round: their bounds are not
        the plan's; counted here)."""
        view = self.view(self_addr, neighbours)
        mine = set(view.members)
        votes = {m: n for m, n in self._votes.get(round, {}).items() if mine.issubset(m)}
        votes[view.members] = votes.get(view.members, 0) + 1
        members = max(votes, key=lambda m: (votes[m], m == view.members))
        plan = view if members == view.members else Plan.of(self_addr, members, self.numel)
        taken = self._taken.get(round, {})
        self.stats["scatter_view_mismatch"] += sum(1 for m in taken.values() if m != plan.members)
        return plan, lambda src: taken.get(src) != plan.members

    def view(self, self_addr: str, neighbours: Sequence[str]) -> Plan:
        """The member set of our next round: our neighbours, plus the last round's agreed
        members that are still neighbours or whose Deltas reached an owner (a peer we cannot
        reach but others can stays a member: we must cut the vector as they do)."""
        mine = set(neighbours) | {self_addr}
        return Plan.of(self_addr, mine | (set(self._agreed) & (mine | self._alive)), self.numel)

    # -- phase 1 ----------------------------------------------------------------------------
    def begin(self, round: int, plan: Plan, delta: np.ndarray, header: dict) -> list[Send]:
        """Round ``round`` began under ``plan`` (the rounds average our own slice, ``plan.part(
        delta, plan.index)``, with the others'): send the other slices to their owners."""
        self._plans[round] = plan
        self.delta = delta  # our whole Delta of the round (a peer that fell behind sends it again)
        self._plans = {r: p for r, p in self._plans.items() if r >= round - 1}
        self._taken = {r: t for r, t in self._taken.items() if r > round}
        self._votes = {r: v for r, v in self._votes.items() if r > round}
        self._floor = max(self._floor, round)
        sends = []
        for k, owner in enumerate(plan.members):
            if k != plan.index:
                packed = self._codec.compress(plan.part(delta, k))
                sends.append(Send(owner, OuterSlice(**compressed_fields(packed), **header, members=plan.members,
                                                    index=k)))
        return sends

    def slice_in(self, src: str, msg: OuterSlice, self_addr: Optional[str]):
        """A phase-1 slice, decoded, or None when it was cut for another member set than the
        one our round uses (counted). A round we have not begun has no set yet: the slice is
        kept with its set's vote (``settle`` decides when we begin it)."""
        self._check(src, msg)
        plan = self._plans.get(msg.round)
        if (self_addr is None or msg.members[msg.index] != self_addr or (plan is None and msg.round < self._floor)
                or (plan is not None and msg.members != plan.members)):
            self.stats["scatter_view_mismatch"] += 1
            return None
        if plan is None:
            votes = self._votes.get(msg.round, {})
            if (msg.round not in self._taken and len(self._taken) >= MAX_UNBEGUN) or (
                    msg.members not in votes and len(votes) >= MAX_SETS):
                self.stats["scatter_overflow"] += 1  # a flood of rounds, or of sets: not kept
                return None
            taken = self._taken.setdefault(msg.round, {})
            if src not in taken:  # (a duplicate: rounds.py counts it and keeps the first)
                votes = self._votes.setdefault(msg.round, votes)
                members = next((m for m in votes if m == msg.members), msg.members)  # one copy of each set
                taken[src], votes[members] = members, votes.get(members, 0) + 1
        return self._decode(msg)

    # -- phase 2 ----------------------------------------------------------------------------
    def gather(self, round: int, average: np.ndarray, included, now: float, timeout_s: float) -> list[Send]:
        """Our slice of round ``round`` is averaged: send it to all, wait for the others'."""
        plan = self._plans[round]
        packed = self._codec.compress(average)
        mine = tuple(sorted(included))
        self.stats["scatter_contributors_missing"] += len(plan.members) - len(mine)
        self.pending, self.deadline = round, now + timeout_s
        msg = OuterGather(**compressed_fields(packed), round=round, model_key=self.model_key, members=plan.members,
                          index=plan.index, included=mine)
        key = (plan.members, plan.index)
        box = self._got.setdefault(round, {})
        box[key] = (mine, decompress(packed, average.size), msg)
        me = plan.members[plan.index]
        return [Send(j, msg) for j in plan.members if j != me] + self._relays(box, key, me)

    def gather_in(self, src: str, msg: OuterGather, self_addr: Optional[str]) -> list[Send]:
        """An averaged slice: checked, decoded, kept for its round; relayed on to the members
        its owner did not hear from (module docstring, "Failures")."""
        self._check(src, msg)
        if len(msg.included) > len(msg.members) or not set(msg.included) <= set(msg.members):
            raise RemoteProtocolError("bad_value", f"included: {len(msg.included)} entries, not all members")
        owner = msg.members[msg.index]
        if src != owner:
            self.stats["scatter_relayed"] += 1
        if msg.round < self._floor:
            self.stats["scatter_late"] += 1
            return []
        if msg.round not in self._got and (msg.round > self._floor + MAX_AHEAD or len(self._got) > MAX_AHEAD):
            self.stats["scatter_overflow"] += 1  # a flood of rounds far ahead: not kept
            return []
        box = self._got.setdefault(msg.round, {})
        key = (tuple(msg.members), msg.index)
        if key in box:
            self.stats["scatter_duplicates"] += 1  # the first one stands (the owner's, or a relay's)
            return []
        box[key] = (tuple(msg.included), self._decode(msg), msg)
        return [] if self_addr is None else self._relays(box, key, self_addr)

    @staticmethod
    def _relays(box: dict, new: tuple, self_addr: str) -> list[Send]:
        """Owner o's gathered slice goes to owner p through one relay when p's slice of the
        round lacks o's contribution (o's messages to p are being lost: its gather probably
        was too), or o's lacks p's (a cut link is usually cut both ways). The relay is the
        lowest other member p heard from; it forwards o's message as it came."""
        members, _ = new
        sends = []
        for key, (inc, _, msg) in box.items():
            if key == new or key[0] != members:
                continue
            for (x, x_inc, x_msg), (y, y_inc) in (((members[new[1]], box[new][0], box[new][2]), (members[key[1]], inc)),
                                                  ((members[key[1]], inc, msg), (members[new[1]], box[new][0]))):
                if (x not in y_inc or y not in x_inc) and self_addr == min(set(y_inc) - {x, y}, default=None):
                    sends.append(Send(y, x_msg))
        return sends

    def ready(self, now: float) -> bool:
        if self.pending is None:
            return False
        plan, box = self._plans[self.pending], self._got.get(self.pending, {})
        return now >= self.deadline or all((plan.members, k) in box for k in range(len(plan.members)))

    def finish(self) -> tuple[int, np.ndarray, list[tuple[int, int]], tuple[str, ...]]:
        """The round, its averaged Delta, the ranges whose slice never came (skipped: left at
        zero here, held by the outer step), and the round's ``mixed`` names."""
        r, self.pending, self.deadline = self.pending, None, math.inf
        plan, box = self._plans[r], self._got.pop(r, {})
        self._floor = r + 1
        self._got = {k: v for k, v in self._got.items() if k > r}
        delta = np.zeros(self.numel, dtype=np.float32)
        skipped, names = [], []
        for k, owner in enumerate(plan.members):
            entry = box.get((plan.members, k))
            if entry is None:
                skipped.append(plan.bounds[k])
                names.append(f"{owner}/-")
                continue
            lo, hi = plan.bounds[k]
            delta[lo:hi] = entry[1]
            names.append(f"{owner}/{digest(entry[0])}")  # two peers that took the same step name the same
        self.stats["scatter_rounds"] += 1
        self.stats["scatter_slices_skipped"] += len(skipped)
        self.complete = not skipped
        self.stats["scatter_view_mismatch"] += sum(1 for members, _ in box if members != plan.members)
        # the member set most owners cut this round for, and whose Deltas reached one
        votes: dict[tuple, int] = {}
        for members, _ in box:
            votes[members] = votes.get(members, 0) + 1
        self._agreed = max(votes, key=lambda m: (votes[m], m == plan.members), default=plan.members)
        self._alive = frozenset().union(*(entry[0] for entry in box.values()))
        return r, delta, skipped, tuple(names)

    # -- checks -----------------------------------------------------------------------------
    def _check(self, src: str, msg) -> None:
        if msg.model_key != self.model_key:
            raise RemoteProtocolError("wrong_model", f"peer trains {msg.model_key!r}, we train {self.model_key!r}")
        members = msg.members
        if not (isinstance(members, tuple) and 1 <= len(members) <= MAX_MEMBERS and 0 <= msg.index < len(members)
                and msg.round >= 0 and all(isinstance(m, str) for m in members)
                and all(a < b for a, b in zip(members, members[1:])) and src in members):
            raise RemoteProtocolError("bad_value", f"slice {msg.index} of {len(members) if isinstance(members, tuple) else '?'} "
                                                   f"members (sorted, unique, the sender's among them), round {msg.round}")
        count = len(members)
        want = (msg.index + 1) * self.numel // count - msg.index * self.numel // count
        if msg.numel != want:
            raise RemoteProtocolError("bad_tensor", f"slice of {msg.numel} parameters, want {want}")

    @staticmethod
    def _decode(msg) -> np.ndarray:
        return decompress(msg.payload(), msg.numel)
