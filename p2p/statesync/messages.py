"""State-sync wire records (control tags 44..47; only append) and their settings.

| tag | message          | direction      | purpose                                                   |
|-----|------------------|----------------|-----------------------------------------------------------|
| 44  | SyncQuery        | joiner -> any  | "what state do you hold, and who else is there?"           |
| 45  | SyncOffer        | any -> joiner  | step and model key of its state (-1: none), live members   |
| 46  | SyncChunkRequest | joiner -> donor| bytes [offset, offset + length) of transfer ``transfer``; the
|     |                  |                | first request also says whether to include the optimizer    |
| 47  | SyncChunk        | donor -> joiner| those bytes of one captured state (``snapshot``), or a refusal |

A transfer is bound to one captured state on its first request, so every chunk of it comes from
the same step; the donor names that capture (``snapshot``) in every chunk and the joiner checks
it never changes within a transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from p2p.wire import message

# SyncChunk.status: served; the donor serves enough joiners; no such transfer; the donor is
# capturing the state (sent at once on a transfer's first request); the capture is ready (its
# size, step and id, no data: a small message, so it does not wait behind the bytes)
OK, BUSY, UNKNOWN, PREPARING, CAPTURED = 0, 1, 2, 3, 4
MAX_MEMBERS = 64  # addresses an offer lists
MAX_CHUNK = 64 << 20
PACED_CHUNK_S = 0.25  # a paced donor asks for chunks it sends in about this long
MIN_CHUNK = 16 << 10


@dataclass(frozen=True)
class SyncConfig:
    """How state sync behaves, on both sides."""

    chunk_bytes: int = 1 << 20  # a joiner asks for this much per request
    # Requests in flight per transfer: 2 keeps the link busy (the next is asked for when one
    # arrives) and is what the transport queues per peer before it drops (BulkConfig.max_pending_per_peer).
    window: int = 2
    timeout_s: float = 10.0  # a donor that sends nothing for this long is given up for the next one
    first_chunk_s: float = 60.0  # once it said it is capturing (PREPARING), its first chunk may take this long
    query_timeout_s: float = 2.0  # wait this long for offers before choosing a donor
    max_candidates: int = 16  # members asked for an offer
    step_slack: int = 20  # donors this many steps behind the freshest are as good (load spreading)
    max_transfers: int = 2  # joiners a donor serves at once; more are told to try another
    reuse_s: float = 5.0  # joiners arriving this soon after a capture share it
    max_rate_bps: Optional[float] = None  # a donor serves state at most this fast (bytes/s); None: link speed

    def __post_init__(self) -> None:
        if not 0 < self.chunk_bytes <= MAX_CHUNK or self.window < 1 or self.max_candidates < 1:
            raise ValueError("chunk_bytes must be in (0, 64 MiB], window and max_candidates >= 1")
        if not (self.timeout_s > 0 and self.query_timeout_s > 0 and self.reuse_s >= 0):
            raise ValueError("timeouts must be > 0 and reuse_s >= 0")
        if self.step_slack < 0 or self.max_transfers < 1:
            raise ValueError("step_slack must be >= 0 and max_transfers >= 1")
        if self.max_rate_bps is not None and not 0 < self.max_rate_bps < math.inf:
            raise ValueError("max_rate_bps must be a finite number > 0")


@message(44)
@dataclass(frozen=True)
class SyncQuery:
    nonce: int  # echoed in the offer


@message(45)
@dataclass(frozen=True)
class SyncOffer:
    nonce: int
    step: int  # the step of the state it would serve; -1: it has none to give (it is syncing itself)
    model_key: str
    members: tuple  # addresses of the live members it knows (at most MAX_MEMBERS)
    busy: bool  # it already serves max_transfers joiners
    chunk_bytes: int  # ask it for chunks of at most this (0: any): a paced donor wants small ones,
    # so that every chunk arrives well within the joiner's timeout

    def __post_init__(self) -> None:
        if not isinstance(self.members, tuple) or len(self.members) > MAX_MEMBERS or \
                not all(isinstance(a, str) and 0 < len(a) <= 256 for a in self.members):
            raise ValueError(f"members: at most {MAX_MEMBERS} addresses")
        if self.step < -1 or not 0 <= self.chunk_bytes <= MAX_CHUNK:
            raise ValueError(f"step {self.step}, chunk_bytes {self.chunk_bytes}")


@message(46)
@dataclass(frozen=True)
class SyncChunkRequest:
    transfer: int  # the joiner's id for this transfer (fresh per donor tried)
    offset: int
    length: int
    optimizer: bool  # include the optimizer's state (read on a transfer's first request)

    def __post_init__(self) -> None:
        if self.offset < 0 or not 0 < self.length <= MAX_CHUNK:
            raise ValueError(f"offset {self.offset}, length {self.length}")


@message(47)
@dataclass(frozen=True)
class SyncChunk:
    transfer: int
    status: int  # OK, BUSY or UNKNOWN
    snapshot: int  # the donor's id of the captured state this transfer reads
    step: int
    model_key: str
    total: int  # the state's size in bytes
    offset: int
    data: np.ndarray  # uint8, bytes [offset, offset + len(data))

    def __post_init__(self) -> None:
        if self.status not in (OK, BUSY, UNKNOWN, PREPARING, CAPTURED) or min(self.total, self.offset, self.step) < 0:
            raise ValueError("bad status, total, offset or step")
        if self.data.dtype != np.uint8 or self.data.ndim != 1 or self.offset + self.data.size > self.total:
            raise ValueError("data must be uint8 bytes inside [0, total)")


SYNC_MESSAGES = (SyncQuery, SyncOffer, SyncChunkRequest, SyncChunk)
