"""Large messages as a byte stream on a plain TCP connection: framing and reading (no sockets).

Why not ZeroMQ for these: libzmq receives a message into a buffer of its own, and the
application then copies it out; for a model-sized message that copy, on top of the kernel's,
costs about a third of loopback throughput on a 2-core machine (bench/transport_throughput.py).
On a plain TCP stream the kernel copies straight into our pooled buffer (``recv_into``), as a
bare socket does; and the receiver checks each message's declared sizes against its limits
*before* any payload arrives. So messages of ``BulkConfig.threshold_bytes`` or more travel on
one TCP connection per (sender, receiver) pair, to the receiver's bulk port (its ZeroMQ port
+ 1, p2p/net/addresses.py), framed as:

    prefix   !4sQIH: magic "P2PB", transfer id, header length, number of tensor frames
    meta     the wire header frame (p2p/wire.py), then one !Q byte count per tensor frame
    payload  the tensor frames' bytes, back to back

``StreamReader`` is the receiving state machine: it names where the next received bytes go
(``target``) and accounts them (``advance``), returning ``[header, *tensor frames]`` once a
message is complete; the frames are views of one pooled buffer and go through
``p2p.wire.decode`` like any other message. The NaN/Inf check is the one exception: the reader
runs it on float tensors piece by piece as they arrive (``CHECK_BYTES`` at a time, while the
bytes are still in cache, about 3x cheaper than a pass over the whole message afterwards), so
a message it delivers is marked ``finite_checked`` and a message carrying NaN/Inf is reported
as ``non_finite`` instead of delivered. A stream
cannot resynchronise after garbage, so any framing error raises ``RemoteProtocolError`` and the
transport closes that connection.

With a swarm key the same byte stream travels inside AES-GCM records (p2p/net/seal.py):
``SealedReader`` wraps a ``StreamReader``, reads the hello and each record, and decrypts a
record straight into the inner reader's target when it fits there (the payload's pooled
buffer: no extra copy); ``sealed_chunks`` is the sender's side.
"""

from __future__ import annotations

import mmap
import struct
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import msgpack
import numpy as np

from p2p.net.seal import LENGTH, RECORD_BYTES, TAG_BYTES, BulkOpener, ReplayGuard, hello_bytes
from p2p.net.keyring import Keyring
from p2p.protocol import RemoteProtocolError
from p2p.wire import all_finite

CHECK_BYTES = 256 * 1024  # check float payload for NaN/Inf in pieces this size, still in cache
_FLOATS = {"float32": np.float32, "float64": np.float64, "float16": np.float16}

MAGIC = b"P2PB"
_PREFIX = struct.Struct("!4sQIH")
_SIZE = struct.Struct("!Q")
MAX_TENSOR_FRAMES = 15  # p2p.wire.Limits.max_frames - 1 (the header)


@dataclass(frozen=True)
class BulkConfig:
    threshold_bytes: int = 256 * 1024  # messages at least this large travel on the bulk stream
    max_pending_per_peer: int = 2  # large messages queued for one peer before sends drop
    stall_timeout_s: float = 30.0  # a transfer that makes no progress this long is dropped
    # A sender that trickles (a byte now and then: progress, so never stalled) would hold its
    # connection, a file descriptor and a slot of ``max_connections`` for ever: once a message
    # has been arriving for ``slow_grace_s``, it must average at least ``min_rate_bytes_per_s``.
    slow_grace_s: float = 10.0
    min_rate_bytes_per_s: float = 1024.0
    max_connections: int = 256  # inbound bulk connections kept open at once
    max_header_bytes: int = 64 * 1024  # a bulk message's wire header (a few hundred bytes in practice)
    pool_buffers: int = 4  # receive buffers kept for reuse (fresh memory costs page faults)


def stream_parts(transfer_id: int, frames: list) -> list[memoryview]:
    """What the sender writes, in order: prefix + meta, then each tensor frame (no copies)."""
    header = bytes(frames[0])
    tensors = [memoryview(f).cast("B") for f in frames[1:]]
    meta = _PREFIX.pack(MAGIC, transfer_id, len(header), len(tensors)) + header
    meta += b"".join(_SIZE.pack(t.nbytes) for t in tensors)
    return [memoryview(meta), *(t for t in tensors if t.nbytes)]


def _mapped(nbytes: int) -> np.ndarray:
    """A receive buffer in an anonymous mapping of its own, not from malloc: its size is the
    sender's word (checked only against the message limit), and glibc's malloc, on freeing a
    block between its mmap threshold and 32 MiB, raises that threshold to the block's size for
    the whole process. A hostile stream declaring 20 MB and hanging up would so send every later
    allocation under 20 MB (ZeroMQ's messages, numpy's, Python's) into malloc's heaps, where
    freed memory stays resident (bench/fuzz_node.py, an open node: +14% RSS over the run, 50 MB
    free in two threads' heaps; a thread heap's free top is given back only past the trim
    threshold, which rises with the mmap threshold, and malloc_trim leaves it). A mapping costs
    address space until bytes arrive, and goes back to the OS whole when the last view of it is
    dropped."""
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


class BufferPool:
    """Reuses receive buffers, but only ones nothing else still references."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        for i, buf in enumerate(self._free):
            if buf.nbytes == nbytes:
                return self._free.pop(i)
        return _mapped(nbytes)

    def give(self, buf: np.ndarray) -> None:
        # Decoded arrays are views of ``buf``: if any is still alive (a protocol object kept
        # it), the buffer's reference count shows it and the buffer is left to the GC.
        # 3 = our local name + the argument + getrefcount's own reference.
        if sys.getrefcount(buf) <= 3 and len(self._free) < self.keep:
            self._free.append(buf)

    def release(self, frames: list) -> None:
        """A delivered message was handled: its buffer may be reused."""
        if len(frames) > 1 and isinstance(frames[1], memoryview):
            buf = frames[1].obj
            frames.clear()  # drop our own views before the reference check
            if isinstance(buf, np.ndarray):
                self.give(buf)


def _float_dtypes(header: bytes, count: int) -> Optional[list]:
    """Per tensor frame, its float dtype (None for other dtypes), read from the wire header's
    tensor specs; None if the header cannot be read (decode will reject it anyway)."""
    try:
        specs = msgpack.unpackb(header, raw=False)[4]
        names = [spec[0] for spec in specs]
    except Exception:  # any malformed header: leave every check to decode
        return None
    if len(names) != count or not all(isinstance(n, str) for n in names):
        return None
    return [_FLOATS.get(n) for n in names]


class StreamReader:
    """Reads framed messages from one inbound bulk connection (module docstring)."""

    def __init__(self, pool: BufferPool, max_message_bytes: int, max_header_bytes: int, now: float) -> None:
        self.pool = pool
        self.max_message_bytes = max_message_bytes
        self.max_header_bytes = max_header_bytes
        self.last_progress = now
        self._reset()

    def _reset(self) -> None:
        self._phase = "prefix"
        self._buf: "bytearray | np.ndarray" = bytearray(_PREFIX.size)
        self._have = 0
        self._header_len = 0
        self._sizes: list[int] = []
        self._floats: list = []  # per tensor frame: its float dtype, or None
        self._checked: list[int] = []  # per tensor frame: bytes checked finite so far
        self._ends: list[int] = []  # per tensor frame: its end offset in the payload
        self._since_check = 0
        self._bad = False
        self.finite_checked = False  # the last delivered message's floats were all checked
        self.non_finite = False  # the last delivered message carries NaN or Inf: do not use it

    def mid_message(self) -> bool:
        """Some of a message has arrived but not all of it."""
        return self._phase != "prefix" or self._have > 0

    def target(self) -> memoryview:
        """Where the next received bytes go (never empty)."""
        return memoryview(self._buf)[self._have:]

    def advance(self, nbytes: int, now: float) -> Optional[list]:
        """``nbytes`` were written into ``target()``; the message's frames once it is complete."""
        self._have += nbytes
        self.last_progress = now
        if self._have < len(self._buf):
            if self._phase == "payload":
                self._since_check += nbytes
                if self._since_check >= CHECK_BYTES:
                    self._check()
            return None
        if self._phase == "prefix":
            self._parse_prefix()
            return None
        if self._phase == "meta":
            return self._parse_meta()
        self._check()
        return self._frames(memoryview(self._buf))

    def _parse_prefix(self) -> None:
        magic, _transfer_id, header_len, count = _PREFIX.unpack(self._buf)  # the id is for the sender's logs
        if magic != MAGIC:
            raise RemoteProtocolError("malformed", "bulk stream: bad magic")
        if header_len == 0 or header_len > self.max_header_bytes:
            raise RemoteProtocolError("oversized" if header_len else "malformed", f"bulk header of {header_len} bytes")
        if count > MAX_TENSOR_FRAMES:
            raise RemoteProtocolError("oversized", f"bulk message of {count} tensor frames")
        self._header_len = header_len
        self._phase, self._buf, self._have = "meta", bytearray(header_len + _SIZE.size * count), 0

    def _parse_meta(self) -> Optional[list]:
        meta = bytes(self._buf)
        header = meta[:self._header_len]
        sizes = [s for (s,) in _SIZE.iter_unpack(meta[self._header_len:])]
        total = sum(sizes)
        if total > self.max_message_bytes:
            raise RemoteProtocolError("oversized", f"bulk transfer of {total} bytes")
        self._header, self._sizes = header, sizes
        self._floats = _float_dtypes(header, len(sizes))
        ends, offset = [], 0
        for size in sizes:
            offset += size
            ends.append(offset)
        self._ends, self._checked, self._since_check = ends, [0] * len(sizes), 0
        self._bad = False
        if total == 0:  # nothing but empty tensors: deliver at once
            return self._frames(memoryview(b""))
        self._phase, self._buf, self._have = "payload", self.pool.take(total), 0
        return None

    def _check(self) -> None:
        """Check the float tensors' bytes that arrived since the last check (whole elements)."""
        self._since_check = 0
        if self._bad or self._floats is None:
            return
        start = 0
        for i, (dtype, end) in enumerate(zip(self._floats, self._ends)):
            begin = start + self._checked[i]
            start = end
            if dtype is None or begin >= end or begin >= self._have:
                continue
            upto = min(end, self._have)
            upto -= (upto - begin) % np.dtype(dtype).itemsize
            if upto > begin:
                part = np.frombuffer(self._buf, dtype=np.uint8, count=upto - begin, offset=begin).view(dtype)
                if not all_finite(part):
                    self._bad = True
                    return
                self._checked[i] += upto - begin

    def _frames(self, view: memoryview) -> list:
        frames: list = [self._header]
        offset = 0
        for size in self._sizes:
            frames.append(view[offset:offset + size])
            offset += size
        checked = self._floats is not None and all(
            f is None or c == s for f, c, s in zip(self._floats, self._checked, self._sizes))
        bad = self._bad
        self._reset()
        self.non_finite, self.finite_checked = bad, checked and not bad
        return frames


class SealedReader:
    """A ``StreamReader`` behind the swarm key's records (module docstring); the same interface."""

    def __init__(self, inner: StreamReader, keyring: Callable[[], Keyring], guard: ReplayGuard,
                 wall_clock: Callable[[], float], now: float,
                 allowed: Callable[[], Optional[frozenset]] = lambda: None) -> None:
        self.inner = inner
        self.keyring = keyring  # () -> the keyring now (it may be rotated before the hello arrives)
        self.allowed = allowed  # () -> the identities' allow list now (None: identities off)
        self.guard = guard
        self.wall_clock = wall_clock  # () -> seconds since the epoch (the hello's replay window)
        self.last_progress = now
        self._opener: Optional[BulkOpener] = None
        self._phase = "hello"
        self._buf = bytearray(hello_bytes(allowed() is not None))
        self._have = 0
        self._record = bytearray(0)  # grown on demand, up to one record, once the hello checked out

    @property
    def non_finite(self) -> bool:
        return self.inner.non_finite

    @property
    def finite_checked(self) -> bool:
        return self.inner.finite_checked

    @property
    def key_id(self) -> Optional[bytes]:
        """The id of the key the sender sealed with (None until its hello arrived)."""
        return self._opener.key_id if self._opener is not None else None

    @property
    def signer(self) -> Optional[bytes]:
        """The public key that signed the hello (None: not yet, or identities off)."""
        return self._opener.signer if self._opener is not None else None

    def mid_message(self) -> bool:
        return self._have > 0 or self._phase == "record" or self.inner.mid_message()

    def target(self) -> memoryview:
        return memoryview(self._buf)[self._have:]

    def advance(self, nbytes: int, now: float) -> Optional[list]:
        self._have += nbytes
        self.last_progress = now
        if self._have < len(self._buf):
            return None
        if self._phase == "hello":
            self._opener = BulkOpener(self.keyring(), self.guard, bytes(self._buf), self.wall_clock(), self.allowed())
            self._expect("length", LENGTH.size)
            return None
        if self._phase == "length":
            n = BulkOpener.record_length(bytes(self._buf))
            if len(self._record) < n:
                self._record = bytearray(min(max(n, 2 * len(self._record)), RECORD_BYTES + TAG_BYTES))
            self._phase, self._buf, self._have = "record", memoryview(self._record)[:n], 0
            return None
        record = memoryview(self._buf)
        self._expect("length", LENGTH.size)
        return self._deliver(record, now)

    def _expect(self, phase: str, nbytes: int) -> None:
        self._phase, self._buf, self._have = phase, bytearray(nbytes), 0

    def _deliver(self, record: memoryview, now: float) -> Optional[list]:
        """Decrypt one record and hand its plaintext to the inner reader."""
        size = record.nbytes - TAG_BYTES
        target = self.inner.target()
        if target.nbytes >= size:  # straight into place (the payload's pooled buffer)
            self._opener.open_into(record, target[:size])
            return self.inner.advance(size, now)
        plain = memoryview(bytearray(size))
        self._opener.open_into(record, plain)
        done = 0
        while done < size:
            target = self.inner.target()
            n = min(target.nbytes, size - done)
            target[:n] = plain[done:done + n]
            done += n
            frames = self.inner.advance(n, now)
            if frames is not None:
                if done != size:  # our senders end a record with each message
                    raise RemoteProtocolError("malformed", "bulk record spans two messages")
                return frames
        return None


def sealed_chunks(parts: list[memoryview]) -> list[memoryview]:
    """The plaintext pieces the sender seals one record each: each part cut at RECORD_BYTES
    (a record never spans two messages: ``SealedReader`` relies on it)."""
    return [part[i:i + RECORD_BYTES] for part in parts for i in range(0, part.nbytes, RECORD_BYTES)]
