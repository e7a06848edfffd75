"""A seeded fuzzer for a node's two inbound channels (no sockets here: p2p/harness/fuzz_live.py
sends what it makes).

``Mutator`` turns valid messages (the seeds: encoded with p2p/wire.py) into hostile input:

- control messages (ZeroMQ multipart, to the node's ROUTER): bit flips, truncated or dropped
  frames, wrong protocol versions and tags, fields of the wrong type or count, tensor specs
  with hostile shapes and dtypes or frames of the wrong size, too many frames, random bytes,
  random msgpack, and valid messages under made-up sender addresses (``spoof``: the node
  answers whatever address a message names, so these test its socket table's bound);
- bulk streams (the bytes of one TCP connection to the node's bulk port, p2p/net/bulk.py's
  framing): wrong magic, header lengths of 0 or past the limit, too many tensor frames,
  declared sizes past the message limit, large declared sizes then a hang-up, truncation, bit
  flips, garbage after a valid message, random bytes;
- against a sealed node (``key_id``: the swarm key's public id, sent in clear with every sealed
  message, so an outsider knows it): forged seals under unknown key ids and under the right id
  with ciphertext that cannot authenticate, and bulk hellos likewise; plus everything above
  sent plain.

``expect_control`` and ``expect_bulk`` say what the node must do with each input, by running the
node's own readers and decoder on it here: which inputs it must reject (and count), which a
hang-up leaves abandoned mid-message, and which decode as valid messages (the node may still
refuse those: a message about another model, an unknown member). So a live run can check the
node's counters against what was sent.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections import Counter
from dataclasses import replace
from typing import Any, Optional, Sequence

import msgpack
import numpy as np

# Every message the node speaks must be registered here too, or a frame the node decodes would
# be classified as an unknown tag (the imports register them).
import p2p.averaging.registry  # noqa: F401
import p2p.gossip.messages  # noqa: F401
import p2p.net.control  # noqa: F401
import p2p.statesync.messages  # noqa: F401
from p2p.net.bulk import MAGIC, BufferPool, SealedReader, StreamReader, stream_parts
from p2p.net.keyring import KEY_ID_BYTES, Keyring
from p2p.net.seal import HEADER, HELLO, NONCE_BYTES, TAG_BYTES, ReplayGuard, open_message
from p2p.net.transport import TransportConfig
from p2p.protocol import RemoteProtocolError
from p2p.wire import DEFAULT_LIMITS, PROTOCOL_VERSION, decode, encode, registered_tags

_PREFIX = struct.Struct("!4sQIH")  # p2p/net/bulk.py's stream prefix
_SIZE = struct.Struct("!Q")

CONTROL_KINDS = {  # kind: weight
    "spoof": 10, "bitflip": 20, "truncate": 10, "version": 8, "tag": 8, "fields": 10, "tensor": 10,
    "frames": 6, "random": 10, "msgpack": 8,
}
SEALED_CONTROL_KINDS = {"sealed_no_key": 30, "sealed_bad_tag": 30, "plain": 40}
BULK_KINDS = {
    "valid": 8, "truncated": 12, "magic": 8, "header_len": 8, "count": 6, "oversized": 8, "hang_up": 6,
    "sizes": 10, "bitflip": 14, "garbage_after": 8, "random": 12,
}
SEALED_BULK_KINDS = {"hello_no_key": 30, "hello_bad_tag": 30, "hello_short": 10, "plain": 30}
_BAD_TAGS = (-1, 1000, 65535, 2**33, "20", None, 3.5)  # never registered (tags are small ints)
_BAD_VERSIONS = (0, PROTOCOL_VERSION + 1, 255, -1, 2**40, "1", None, 1.0)


def _pick(rng: np.random.Generator, weights: dict[str, int]) -> str:
    names = list(weights)
    p = np.array([weights[n] for n in names], dtype=float)
    return names[rng.choice(len(names), p=p / p.sum())]


def _bytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def _flip(rng: np.random.Generator, data: bytes, flips: int) -> bytes:
    if not data:
        return data
    buf = bytearray(data)
    for pos in rng.integers(0, len(buf) * 8, flips):
        buf[pos // 8] ^= 1 << (pos % 8)
    return bytes(buf)


def random_value(rng: np.random.Generator, depth: int = 0) -> Any:
    """A random msgpack-able value: what a header field might hold, of any type."""
    kind = rng.integers(0, 9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return bool(rng.integers(0, 2))
    if kind == 2:
        return int(rng.choice([0, -1, 1, 2**31, 2**63 - 1, -(2**63), int(rng.integers(-1000, 1000))]))
    if kind == 3:
        return float(rng.choice([0.0, -1.0, np.inf, -np.inf, np.nan, 1e308, float(rng.normal())]))
    if kind == 4:
        return _bytes(rng, int(rng.integers(0, 40))).decode("latin-1")
    if kind == 5:
        return _bytes(rng, int(rng.integers(0, 40)))
    if kind in (6, 7):
        return [random_value(rng, depth + 1) for _ in range(rng.integers(0, 6))]
    return {str(random_value(rng, depth + 1)): random_value(rng, depth + 1) for _ in range(rng.integers(0, 4))}


def _spoofed_src(rng: np.random.Generator) -> str:
    roll = rng.integers(0, 4)
    if roll < 2:
        return f"127.0.0.1:{int(rng.integers(1024, 65535))}"  # a made-up peer (nobody listens)
    if roll == 2:
        return f"10.{int(rng.integers(0, 256))}.{int(rng.integers(0, 256))}.1:{int(rng.integers(1, 65535))}"
    return _bytes(rng, int(rng.integers(0, 30))).decode("latin-1")  # not an address at all


class Mutator:
    """Hostile control messages and bulk streams, reproducible from ``seed`` (module docstring)."""

    def __init__(self, seeds: Sequence[object], seed: int, src: str = "127.0.0.1:1",
                 key_id: Optional[bytes] = None, model_key: Optional[str] = None,
                 numel: Optional[int] = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.src = src  # the sender address valid messages name (spoofed ones draw their own)
        self.key_id = key_id  # a sealed node's key id (public): forge seals under it
        self.seeds = [self._aligned(m, model_key, numel) for m in seeds]
        self.tags = set(registered_tags())

    def _aligned(self, msg: object, model_key: Optional[str], numel: Optional[int]) -> object:
        """The seed with the live node's model key and size where it has them, so that some valid
        messages with hostile contents get past the model check into the algorithms."""
        fields = {f.name for f in dataclasses.fields(msg)}
        changes: dict[str, Any] = {}
        if model_key is not None and "model_key" in fields:
            changes["model_key"] = model_key
        if numel is not None and "params" in fields and getattr(msg, "params").dtype == np.float32 \
                and getattr(msg, "params").size and not ({"scales", "data"} & fields):
            changes["params"] = np.full(numel, 1e30, dtype=np.float32)  # the right size, hostile values
        try:
            return replace(msg, **changes)
        except (TypeError, ValueError):  # a message whose own checks refuse the change: keep it as is
            return msg

    # -- control ---------------------------------------------------------------------------
    def control(self) -> tuple[str, list[bytes]]:
        """One hostile control message: ``(kind, frames)``."""
        if self.key_id is not None:
            kind = _pick(self.rng, SEALED_CONTROL_KINDS)
            if kind != "plain":
                return kind, self._forged_seal(kind)
        kind = _pick(self.rng, CONTROL_KINDS)
        return kind, getattr(self, f"_c_{kind}")()

    def _seed_frames(self, src: Optional[str] = None) -> list[bytes]:
        msg = self.seeds[self.rng.integers(0, len(self.seeds))]
        return [bytes(f) for f in encode(msg, self.src if src is None else src)]

    def _header(self) -> tuple[list, list[bytes]]:
        frames = self._seed_frames()
        return msgpack.unpackb(frames[0], raw=False), frames

    def _c_spoof(self) -> list[bytes]:
        return self._seed_frames(_spoofed_src(self.rng))

    def _c_bitflip(self) -> list[bytes]:
        frames = self._seed_frames()
        i = 0 if len(frames) == 1 or self.rng.random() < 0.7 else int(self.rng.integers(1, len(frames)))
        frames[i] = _flip(self.rng, frames[i], int(self.rng.integers(1, 9)))
        return frames

    def _c_truncate(self) -> list[bytes]:
        frames = self._seed_frames()
        if len(frames) > 1 and self.rng.random() < 0.3:
            del frames[int(self.rng.integers(1, len(frames)))]  # a tensor frame missing
        else:
            frames[0] = frames[0][:int(self.rng.integers(0, len(frames[0])))]
        return frames

    def _c_version(self) -> list[bytes]:
        header, frames = self._header()
        header[0] = _BAD_VERSIONS[self.rng.integers(0, len(_BAD_VERSIONS))]
        return [msgpack.packb(header, use_bin_type=True), *frames[1:]]

    def _c_tag(self) -> list[bytes]:
        header, frames = self._header()
        header[1] = _BAD_TAGS[self.rng.integers(0, len(_BAD_TAGS))]
        return [msgpack.packb(header, use_bin_type=True), *frames[1:]]

    def _c_fields(self) -> list[bytes]:
        header, frames = self._header()
        values = header[3]
        roll = self.rng.integers(0, 3)
        if roll == 0 or not values:
            header[3] = [random_value(self.rng) for _ in range(self.rng.integers(0, 8))]
        elif roll == 1:
            values[int(self.rng.integers(0, len(values)))] = random_value(self.rng)
        else:
            header[int(self.rng.integers(0, 5))] = random_value(self.rng)
        return [msgpack.packb(header, use_bin_type=True), *frames[1:]]

    def _c_tensor(self) -> list[bytes]:
        header, frames = self._header()
        specs = header[4]
        if not specs:  # a message without tensors: give it a hostile one
            header[4] = [["float32", [2**40]]]
            return [msgpack.packb(header, use_bin_type=True), *frames[1:], b"\0" * 8]
        i = int(self.rng.integers(0, len(specs)))
        roll = self.rng.integers(0, 5)
        if roll == 0:
            specs[i][1] = [2**40]  # a terabyte declared
        elif roll == 1:
            specs[i][1] = [-1]
        elif roll == 2:
            specs[i][1] = [1] * 9  # too many dimensions
        elif roll == 3:
            specs[i][0] = str(self.rng.choice(["object", "complex64", "bool", "", "V8"]))
        else:
            frames[1 + i] = frames[1 + i] + b"\0" * int(self.rng.integers(1, 64))  # the wrong size
        return [msgpack.packb(header, use_bin_type=True), *frames[1:]]

    def _c_frames(self) -> list[bytes]:
        frames = self._seed_frames()
        if self.rng.random() < 0.5:
            return frames + [b"\0" * 4] * int(self.rng.integers(16, 40))  # past max_frames
        return [b""] * int(self.rng.integers(1, 4))

    def _c_random(self) -> list[bytes]:
        return [_bytes(self.rng, int(self.rng.integers(0, 300))) for _ in range(self.rng.integers(1, 5))]

    def _c_msgpack(self) -> list[bytes]:
        return [msgpack.packb(random_value(self.rng), use_bin_type=True)]

    def _forged_seal(self, kind: str) -> list[bytes]:
        """A sealed-looking message: unknown key id, or ours with ciphertext that cannot verify."""
        kid = self.key_id if kind == "sealed_bad_tag" else _bytes(self.rng, KEY_ID_BYTES)
        header = HEADER.pack(1, kid, _bytes(self.rng, NONCE_BYTES), int(time.time() * 1000))
        return [header, *(_bytes(self.rng, int(self.rng.integers(TAG_BYTES, 200)))
                          for _ in range(self.rng.integers(1, 4)))]

    # -- bulk ------------------------------------------------------------------------------
    def bulk(self) -> tuple[str, bytes]:
        """The bytes of one hostile bulk connection: ``(kind, data)``."""
        if self.key_id is not None:
            kind = _pick(self.rng, SEALED_BULK_KINDS)
            if kind != "plain":
                return kind, self._forged_hello(kind)
        kind = _pick(self.rng, BULK_KINDS)
        return kind, getattr(self, f"_b_{kind}")()

    def _stream(self) -> bytes:
        frames = self._seed_frames()
        return b"".join(bytes(p) for p in stream_parts(int(self.rng.integers(1, 2**32)), frames))

    def _b_valid(self) -> bytes:
        return self._stream()

    def _b_truncated(self) -> bytes:
        data = self._stream()
        return data[:int(self.rng.integers(1, len(data)))]

    def _b_magic(self) -> bytes:
        data = self._stream()
        return _bytes(self.rng, 4) + data[4:]

    def _b_header_len(self) -> bytes:
        n = int(self.rng.choice([0, 64 * 1024 + 1, 2**32 - 1]))
        return _PREFIX.pack(MAGIC, 1, n, 1) + _bytes(self.rng, int(self.rng.integers(0, 64)))

    def _b_count(self) -> bytes:
        return _PREFIX.pack(MAGIC, 1, 10, int(self.rng.integers(16, 65536))) + _bytes(self.rng, 10)

    def _b_oversized(self) -> bytes:
        """Sizes that add up past the message limit (or overflow): refused before any payload."""
        header = self._seed_frames()[0]
        sizes = [int(self.rng.choice([2**63, 2**31 + 1, 2**62]))] * int(self.rng.integers(1, 4))
        return _PREFIX.pack(MAGIC, 1, len(header), len(sizes)) + header + b"".join(_SIZE.pack(s) for s in sizes)

    def _b_hang_up(self) -> bytes:
        """A large size the node accepts (and sets a buffer aside for), then a few bytes and a hang-up."""
        header = self._seed_frames()[0]
        size = int(self.rng.integers(1 << 20, 1 << 30))
        return _PREFIX.pack(MAGIC, 1, len(header), 1) + header + _SIZE.pack(size) + _bytes(self.rng, 100)

    def _b_sizes(self) -> bytes:
        """Framing that checks out around frames that do not match the header's tensor specs."""
        header = self._seed_frames()[0]
        sizes = [int(self.rng.integers(0, 2000)) for _ in range(self.rng.integers(0, 4))]
        payload = _bytes(self.rng, sum(sizes))
        return (_PREFIX.pack(MAGIC, 1, len(header), len(sizes)) + header
                + b"".join(_SIZE.pack(s) for s in sizes) + payload)

    def _b_bitflip(self) -> bytes:
        data = self._stream()
        return _flip(self.rng, data[:4096], int(self.rng.integers(1, 9))) + data[4096:]

    def _b_garbage_after(self) -> bytes:
        return self._stream() + _bytes(self.rng, int(self.rng.integers(1, 200)))

    def _b_random(self) -> bytes:
        return _bytes(self.rng, int(self.rng.integers(1, 2000)))

    def _forged_hello(self, kind: str) -> bytes:
        kid = self.key_id if kind == "hello_bad_tag" else _bytes(self.rng, KEY_ID_BYTES)
        clear = HELLO.pack(1, kid, _bytes(self.rng, 16), int(time.time() * 1000))
        hello = clear + _bytes(self.rng, TAG_BYTES)
        if kind == "hello_short":
            return hello[:int(self.rng.integers(1, len(hello)))]
        return hello + _bytes(self.rng, int(self.rng.integers(0, 300)))  # records that never get read


# -- what the node must do with each input ---------------------------------------------------
def expect_control(frames: Sequence[bytes], keyring: Optional[Keyring] = None) -> str:
    """``reject`` (the node must count it), or ``valid`` (it decodes; the node may still refuse it)."""
    try:
        if keyring is not None:
            frames = open_message(keyring, ReplayGuard(), frames, time.time())
        decode(frames)
    except RemoteProtocolError:
        return "reject"
    return "valid"


def expect_bulk(data: bytes, keyring: Optional[Keyring] = None,
                config: TransportConfig = TransportConfig()) -> Counter:
    """What a node with ``config`` makes of a connection that sends ``data`` and hangs up, as
    p2p/net/transport.py reads it: ``reject`` per message refused (the connection then closes),
    ``abandoned`` for a hang-up mid-message, ``valid`` per message that decodes."""
    out: Counter = Counter()
    reader: Any = StreamReader(BufferPool(0), config.max_message_bytes, config.bulk.max_header_bytes, 0.0)
    if keyring is not None:
        reader = SealedReader(reader, lambda: keyring, ReplayGuard(), time.time, 0.0)
    view, pos = memoryview(data), 0
    try:
        while pos < len(data):
            target = reader.target()
            n = min(target.nbytes, len(data) - pos)
            target[:n] = view[pos:pos + n]
            pos += n
            frames = reader.advance(n, 0.0)
            if frames is None:
                continue
            if reader.non_finite:
                out["reject"] += 1
                continue
            limits = replace(DEFAULT_LIMITS, check_finite=not reader.finite_checked)
            try:
                decode(frames, limits)
                out["valid"] += 1
            except RemoteProtocolError:
                out["reject"] += 1
    except RemoteProtocolError:
        out["reject"] += 1
        return out
    if reader.mid_message():
        out["abandoned"] += 1
    return out

