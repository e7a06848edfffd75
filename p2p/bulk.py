"""Chunked transfer of large messages: framing, and reassembly with limits (no sockets here).

Why: a model-sized message sent as one ZeroMQ message is allocated whole by the receiver (page
faults on fresh memory every time), cannot be abandoned half-way, and queues every later
message to that peer behind it. So messages above ``BulkConfig.threshold_bytes`` travel on a
separate connection (p2p/transport.py) as one *start* record followed by *chunks*:

    start  [START_MAGIC + transfer_id, header frame, msgpack list of tensor frame sizes]
    chunk  [CHUNK_MAGIC + transfer_id + offset, raw bytes]

Chunks of one transfer arrive in order (one TCP connection per sender). The receiver checks
the start record against its limits *before* any payload arrives, receives each chunk straight
into a preallocated (pooled) buffer, and hands the reassembled frames to ``p2p.wire.decode``,
which performs every usual check. Partial transfers that stall are dropped after
``stall_timeout_s``; a sender can have at most ``max_transfers_per_sender`` open at once.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from typing import Optional

import msgpack
import numpy as np

from p2p.protocol import RemoteProtocolError

START_MAGIC = b"P2PS"  # cannot start a wire header (msgpack fixarray 0x95)
CHUNK_MAGIC = b"P2PC"
_START = struct.Struct("!4sQ")
_CHUNK = struct.Struct("!4sQQ")


@dataclass(frozen=True)
class BulkConfig:
    threshold_bytes: int = 256 * 1024  # messages at least this large go chunked
    chunk_bytes: int = 1024 * 1024  # few enough records that per-chunk Python cost stays small
    max_transfers_per_sender: int = 4  # open transfers one sender may have at a receiver
    max_pending_per_peer: int = 2  # large messages queued for one peer before sends drop
    stall_timeout_s: float = 30.0  # a transfer that makes no progress this long is dropped
    pool_buffers: int = 4  # reassembly buffers kept for reuse (page faults are the cost)


def start_record(transfer_id: int, frames: list) -> list:
    sizes = [len(f) if isinstance(f, (bytes, bytearray)) else f.nbytes for f in frames[1:]]
    return [_START.pack(START_MAGIC, transfer_id), frames[0], msgpack.packb(sizes)]


def chunk_records(transfer_id: int, frames: list, chunk_bytes: int):
    """Yield chunk messages covering the tensor frames, as zero-copy memoryview slices."""
    offset = 0
    for frame in frames[1:]:
        view = memoryview(frame).cast("B") if not isinstance(frame, memoryview) else frame
        for start in range(0, len(view), chunk_bytes):
            part = view[start:start + chunk_bytes]
            yield [_CHUNK.pack(CHUNK_MAGIC, transfer_id, offset), part]
            offset += len(part)


def kind_of(first_frame: bytes) -> str:
    """'start', 'chunk' or 'message' from a message's first frame (bytes)."""
    if first_frame[:4] == START_MAGIC and len(first_frame) == _START.size:
        return "start"
    if first_frame[:4] == CHUNK_MAGIC and len(first_frame) == _CHUNK.size:
        return "chunk"
    return "message"


def parse_chunk(first_frame: bytes) -> tuple[int, int]:
    _, transfer_id, offset = _CHUNK.unpack(first_frame)
    return transfer_id, offset


class BufferPool:
    """Reuses reassembly buffers, but only ones nothing else still references."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        for i, buf in enumerate(self._free):
            if buf.nbytes == nbytes:
                return self._free.pop(i)
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, buf: np.ndarray) -> None:
        # Decoded arrays are views of ``buf``: if any is still alive (a protocol object kept
        # it), the buffer's reference count shows it and the buffer is left to the GC.
        # 3 = our local name + the argument + getrefcount's own reference.
        if sys.getrefcount(buf) <= 3 and len(self._free) < self.keep:
            self._free.append(buf)


@dataclass
class _Transfer:
    header: bytes
    sizes: list[int]
    buffer: np.ndarray
    received: int
    last_progress: float


class Reassembler:
    """Per-sender reassembly of chunked transfers, with limits. Fed by the transport."""

    def __init__(self, config: BulkConfig, max_message_bytes: int) -> None:
        self.config = config
        self.max_message_bytes = max_message_bytes
        self.pool = BufferPool(config.pool_buffers)
        self._open: dict[tuple[bytes, int], _Transfer] = {}

    def start(self, sender: bytes, first: bytes, header: bytes, sizes_frame: bytes, now: float) -> None:
        _, transfer_id = _START.unpack(first)
        if (sender, transfer_id) in self._open:
            raise RemoteProtocolError("malformed", f"transfer {transfer_id} started twice")
        try:
            sizes = msgpack.unpackb(sizes_frame)
        except Exception:  # msgpack raises many types on garbage
            raise RemoteProtocolError("malformed", "bulk start: bad size list") from None
        if (not isinstance(sizes, list) or len(sizes) > 16
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes)):
            raise RemoteProtocolError("malformed", "bulk start: bad size list")
        total = sum(sizes)
        if total == 0:
            raise RemoteProtocolError("malformed", "bulk start with nothing to transfer")
        if total > self.max_message_bytes:
            raise RemoteProtocolError("oversized", f"bulk transfer of {total} bytes")
        if sum(1 for s, _ in self._open if s == sender) >= self.config.max_transfers_per_sender:
            raise RemoteProtocolError("too_many_transfers", "sender has too many open transfers")
        self._open[(sender, transfer_id)] = _Transfer(bytes(header), sizes, self.pool.take(total), 0, now)

    def chunk_target(self, sender: bytes, first: bytes, now: float) -> tuple[tuple[bytes, int], memoryview]:
        """Where the next chunk's payload goes: a writable view of the rest of the buffer
        (the chunk size is the sender's choice; a chunk that does not fit is caught by
        ``chunk_done``)."""
        transfer_id, offset = parse_chunk(first)
        key = (sender, transfer_id)
        transfer = self._open.get(key)
        if transfer is None:
            raise RemoteProtocolError("unknown_transfer", f"chunk of transfer {transfer_id}")
        if offset != transfer.received:
            del self._open[key]
            raise RemoteProtocolError("malformed", f"chunk at {offset}, expected {transfer.received}")
        transfer.last_progress = now
        return key, memoryview(transfer.buffer)[offset:]

    def chunk_done(self, key: tuple[bytes, int], nbytes: int) -> Optional[list]:
        """Account a chunk of ``nbytes`` (its full size, as zmq reports it even when it did
        not fit). Returns the reassembled frames when the transfer is complete."""
        transfer = self._open.get(key)
        if transfer is None:
            return None
        if nbytes == 0 or transfer.received + nbytes > transfer.buffer.nbytes:
            del self._open[key]
            raise RemoteProtocolError("malformed", "chunk runs past the end of its transfer")
        transfer.received += nbytes
        if transfer.received < transfer.buffer.nbytes:
            return None
        del self._open[key]
        frames: list = [transfer.header]
        view = memoryview(transfer.buffer)
        offset = 0
        for size in transfer.sizes:
            frames.append(view[offset:offset + size])
            offset += size
        return frames

    def release(self, frames: list) -> None:
        """Give a delivered transfer's buffer back once its message has been handled."""
        if len(frames) > 1 and isinstance(frames[1], memoryview):
            buf = frames[1].obj
            frames.clear()  # drop our own views before the reference check
            if isinstance(buf, np.ndarray):
                self.pool.give(buf)

    def expire(self, now: float) -> int:
        stale = [k for k, t in self._open.items() if now - t.last_progress > self.config.stall_timeout_s]
        for key in stale:
            del self._open[key]
        return len(stale)

    def open_transfers(self) -> int:
        return len(self._open)
