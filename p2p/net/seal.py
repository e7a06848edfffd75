"""Authenticated encryption of both channels with the swarm key (AES-256-GCM; no sockets here).

Why AES-GCM from ``cryptography``: PyCA's package is the Python ecosystem's maintained
binding to OpenSSL, whose AES-GCM uses AES-NI and carry-less multiply (several GB/s per core,
so the bulk stream keeps most of its speed); its ``encrypt_into``/``decrypt_into`` write into
our own buffers (no allocation per record). Memberlist seals its gossip the same way
(``security.go``: AES-GCM, a key ring, the key used to send first).

Control messages (ZeroMQ, one multipart message each). A sealed message is

    header   !B4s12sQ  version, key id, random 12-byte nonce, sender's wall clock in ms (clear)
    frame i  AES-GCM(key, nonce with i XORed into its last 4 bytes, frame i,
                     AAD = header + !HH (i, frame count))

so a frame cannot be altered, dropped, reordered or moved into another message. Replay:
``ReplayGuard`` refuses a message whose timestamp is more than ``window_s`` from the
receiver's clock, or whose nonce it has already seen in that window. This is the one place
where peers' wall clocks meet: nodes need clocks within ``window_s`` of each other (NTP).

Bulk stream (one TCP connection per sender and receiver, carrying p2p/net/bulk.py's byte
stream). The sender opens with a hello, ``!B4s16sQ`` version, key id, random 16-byte salt,
wall clock in ms, followed by a 16-byte tag over it; both ends derive the connection's own key
``HKDF-SHA256(swarm key, salt, info="p2p bulk v1")`` (RFC 5869). The hello's salt and time go
through the same ReplayGuard, so a recorded connection cannot be played again. Then records:

    !I length (clear, bounded before anything is allocated), then AES-GCM(connection key,
    nonce = direction byte 1 + 11-byte counter, plaintext of at most RECORD_BYTES,
    AAD = the length prefix)

The counter starts at 0 and the receiver expects exactly the next one, so a record that is
replayed, reordered or dropped fails its tag. The 1 MiB records keep AES-GCM on large buffers
(fast) and the receiver's memory bounded.

With per-node identities (p2p/net/identity.py) a control message's first sealed frame is its
sender's signature over the header and the other frames (``open_signed`` checks it), and the
bulk hello is version 2: its clear fields, the sender's public key and signature, then the tag
over all of them; the connection key is then derived with that public key in HKDF's info
(``"p2p bulk v2" || public key``).

Every failure raises ``RemoteProtocolError`` with a countable reason: ``unauthenticated`` (a
plain message reached a node with a key), ``no_key`` (sealed with a key we do not hold),
``bad_key`` (the tag does not verify: another key with a colliding id, or tampering),
``replay`` (seen before, or outside the time window), ``malformed`` (not the sealed shape).
"""

from __future__ import annotations

import os
import struct
from collections import deque
from typing import Optional, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from p2p.net.identity import (HELLO_SIGNATURE_BYTES, PUBLIC_BYTES, Identity, sign_control, sign_hello, verify_control,
                              verify_hello)
from p2p.net.keyring import KEY_ID_BYTES, Keyring
from p2p.protocol import RemoteProtocolError

VERSION = 1
SIGNED_HELLO = 2  # a bulk hello with an identity's signature (p2p/net/identity.py)
TAG_BYTES = 16
NONCE_BYTES = 12
HEADER = struct.Struct(f"!B{KEY_ID_BYTES}s{NONCE_BYTES}sQ")  # control: version, key id, nonce, time ms
_POSITION = struct.Struct("!HH")  # control AAD: frame index, frame count
_INDEX = struct.Struct("!I")
MAX_FRAMES = 16  # p2p.wire.Limits.max_frames: more is refused before any decryption
REPLAY_WINDOW_S = 120.0
REPLAY_CAPACITY = 100_000  # nonces remembered; past it the oldest are forgotten and the floor rises

HELLO = struct.Struct(f"!B{KEY_ID_BYTES}s16sQ")  # bulk: version, key id, salt, time ms
HELLO_BYTES = HELLO.size + TAG_BYTES
RECORD_BYTES = 1 << 20  # plaintext per bulk record
LENGTH = struct.Struct("!I")
_HELLO_NONCE = bytes(NONCE_BYTES)  # direction byte 0: never a record's nonce
_RECORD_DIRECTION = b"\x01"


def _view(frame: object) -> memoryview:
    """Bytes of a frame (bytes, zmq.Frame, a numpy array's memoryview) as AES-GCM takes them."""
    view = memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _frame_nonce(nonce: bytes, index: int) -> bytes:
    (last,) = _INDEX.unpack_from(nonce, NONCE_BYTES - 4)
    return nonce[:NONCE_BYTES - 4] + _INDEX.pack(last ^ index)


class ReplayGuard:
    """Remembers the nonces of messages accepted in the last ``window_s`` (at most
    ``capacity``). When the set is full the oldest is forgotten and ``floor_ms`` rises to its
    time: anything at or before the floor is refused, so a forgotten nonce can never pass."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S, capacity: int = REPLAY_CAPACITY) -> None:
        self.window_ms = int(window_s * 1000)
        self.capacity = capacity
        self.floor_ms = -1
        self._seen: set[bytes] = set()
        self._order: deque[tuple[int, bytes]] = deque()  # (time ms, nonce) in arrival order

    def admit(self, nonce: bytes, sent_ms: int, now_ms: int) -> None:
        """Record ``nonce``; RemoteProtocolError("replay") if it must not be accepted."""
        if abs(sent_ms - now_ms) > self.window_ms:
            raise RemoteProtocolError("replay", f"sent {(now_ms - sent_ms) / 1000:+.0f}s from our clock "
                                                f"(window {self.window_ms / 1000:g}s: are the clocks synchronised?)")
        if sent_ms <= self.floor_ms or nonce in self._seen:
            raise RemoteProtocolError("replay", "nonce seen before")
        order = self._order
        while order and (order[0][0] < now_ms - self.window_ms or len(order) >= self.capacity):
            sent, old = order.popleft()
            self._seen.discard(old)
            if sent >= now_ms - self.window_ms:  # forgotten while still in the window
                self.floor_ms = max(self.floor_ms, sent)
        self._seen.add(nonce)
        order.append((sent_ms, nonce))


# -- control messages ------------------------------------------------------------------------
def seal_message(keyring: Keyring, frames: Sequence[object], now_s: float,
                 nonce: Optional[bytes] = None, identity: Optional[Identity] = None) -> list[bytes]:
    """The sealed frames of one message (``nonce``: tests only; random by default). With an
    ``identity``, its signature frame goes first inside the seal (p2p/net/identity.py)."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    header = HEADER.pack(VERSION, keyring.primary_id, nonce, int(now_s * 1000))
    if identity is not None:
        frames = [sign_control(identity, header, frames), *frames]
    aead = AESGCM(keyring.primary)
    count = len(frames)
    return [header, *(aead.encrypt(_frame_nonce(nonce, i), _view(f), header + _POSITION.pack(i, count))
                      for i, f in enumerate(frames))]


def _open(keyring: Keyring, frames: Sequence[object], max_frames: int) -> tuple[bytes, list[bytes]]:
    if not frames:
        raise RemoteProtocolError("malformed", "empty message")
    header = bytes(_view(frames[0]))
    if len(header) != HEADER.size or header[0] != VERSION:
        raise RemoteProtocolError("unauthenticated", "a message without the swarm key's seal")
    _, kid, nonce, sent_ms = HEADER.unpack(header)
    count = len(frames) - 1
    if not 1 <= count <= max_frames:
        raise RemoteProtocolError("malformed", f"sealed message of {count} frames")
    key = keyring.lookup(kid)
    if key is None:
        raise RemoteProtocolError("no_key", f"sealed with key {kid.hex()}, not in our keyring")
    aead = AESGCM(key)
    opened = []
    for i, frame in enumerate(frames[1:]):
        data = _view(frame)
        if data.nbytes < TAG_BYTES:
            raise RemoteProtocolError("malformed", f"sealed frame of {data.nbytes} bytes")
        try:
            opened.append(aead.decrypt(_frame_nonce(nonce, i), data, header + _POSITION.pack(i, count)))
        except InvalidTag:
            raise RemoteProtocolError("bad_key", f"frame {i} fails authentication (key {kid.hex()})") from None
    return header, opened


def _admit(guard: ReplayGuard, header: bytes, now_s: float) -> None:
    _, _, nonce, sent_ms = HEADER.unpack(header)
    guard.admit(nonce, sent_ms, int(now_s * 1000))  # after the checks: forged nonces never fill the set


def open_message(keyring: Keyring, guard: ReplayGuard, frames: Sequence[object], now_s: float) -> list[bytes]:
    """The original frames of a sealed message, or RemoteProtocolError (module docstring)."""
    header, opened = _open(keyring, frames, MAX_FRAMES)
    _admit(guard, header, now_s)
    return opened


def open_signed(keyring: Keyring, guard: ReplayGuard, frames: Sequence[object], now_s: float,
                allowed: Optional[frozenset]) -> tuple[bytes, list[bytes]]:
    """(signer's public key, original frames) of a message sealed and signed by an identity in
    ``allowed`` (None: any, for a client reading a reply); RemoteProtocolError otherwise."""
    header, opened = _open(keyring, frames, MAX_FRAMES + 1)  # (+ the signature frame)
    signer = verify_control(header, opened, allowed)
    _admit(guard, header, now_s)
    return signer, opened[1:]


# -- the bulk stream -------------------------------------------------------------------------
def _connection_key(key: bytes, salt: bytes, signer: bytes = b"") -> AESGCM:
    info = b"p2p bulk v2" + signer if signer else b"p2p bulk v1"  # a signed stream's key is its identity's
    return AESGCM(HKDF(algorithm=SHA256(), length=32, salt=salt, info=info).derive(key))


def _record_nonce(counter: int) -> bytes:
    return _RECORD_DIRECTION + counter.to_bytes(NONCE_BYTES - 1, "big")


def hello_bytes(signed: bool) -> int:
    """The length of a bulk hello (signed: with an identity, p2p/net/identity.py)."""
    return HELLO_BYTES + HELLO_SIGNATURE_BYTES * signed


class BulkSealer:
    """The sending end of one bulk connection: its hello, then records in order. With an
    ``identity`` the hello is version 2: its clear fields, the public key and a signature over
    them, then the tag; the record key is bound to that public key."""

    def __init__(self, keyring: Keyring, now_s: float, salt: Optional[bytes] = None,
                 identity: Optional[Identity] = None) -> None:
        salt = os.urandom(16) if salt is None else salt
        self.key_id = keyring.primary_id
        clear = HELLO.pack(SIGNED_HELLO if identity else VERSION, self.key_id, salt, int(now_s * 1000))
        signed = sign_hello(identity, clear) if identity else b""
        self._aead = _connection_key(keyring.primary, salt, identity.public if identity else b"")
        self.hello = clear + signed + self._aead.encrypt(_HELLO_NONCE, b"", clear + signed)
        self._counter = 0
        self._out = bytearray(LENGTH.size + RECORD_BYTES + TAG_BYTES)

    def seal(self, plain: memoryview) -> memoryview:
        """The record (length prefix + ciphertext) for ``plain`` (at most RECORD_BYTES); a view of
        a buffer the next call reuses, so write it out before sealing the next."""
        n = plain.nbytes + TAG_BYTES
        prefix = LENGTH.pack(n)
        self._out[:LENGTH.size] = prefix
        out = memoryview(self._out)[:LENGTH.size + n]
        self._aead.encrypt_into(_record_nonce(self._counter), plain, prefix, out[LENGTH.size:])
        self._counter += 1
        return out


class BulkOpener:
    """The receiving end of one bulk connection, once its hello checked out. ``allowed``: the
    public keys whose signed hellos are accepted (None: identities off, unsigned hellos only)."""

    def __init__(self, keyring: Keyring, guard: ReplayGuard, hello: bytes, now_s: float,
                 allowed: Optional[frozenset] = None) -> None:
        if hello[:4] == b"P2PB":  # p2p.net.bulk.MAGIC: a stream without the seal
            raise RemoteProtocolError("unauthenticated", "a bulk stream without the swarm key's seal")
        clear, tag = hello[:HELLO.size], hello[-TAG_BYTES:]
        signed = hello[HELLO.size:-TAG_BYTES]
        version, kid, salt, sent_ms = HELLO.unpack(clear)
        if allowed is not None and version == VERSION:
            raise RemoteProtocolError("unsigned", "a bulk stream without an identity's signature")
        if version != (VERSION if allowed is None else SIGNED_HELLO):
            raise RemoteProtocolError("malformed", f"bulk hello version {version}")
        key = keyring.lookup(kid)
        if key is None:
            raise RemoteProtocolError("no_key", f"bulk stream sealed with key {kid.hex()}, not in our keyring")
        self.signer = signed[:PUBLIC_BYTES] or None
        self._aead = _connection_key(key, salt, signed[:PUBLIC_BYTES])
        try:
            self._aead.decrypt(_HELLO_NONCE, tag, clear + signed)
        except InvalidTag:
            raise RemoteProtocolError("bad_key", f"bulk hello fails authentication (key {kid.hex()})") from None
        if allowed is not None:
            verify_hello(clear, signed, allowed)
        guard.admit(salt, sent_ms, int(now_s * 1000))
        self.key_id = kid
        self._counter = 0

    @staticmethod
    def record_length(prefix: bytes) -> int:
        """A record's ciphertext length, refused before anything is allocated if out of bounds."""
        (n,) = LENGTH.unpack(prefix)
        if n > RECORD_BYTES + TAG_BYTES:
            raise RemoteProtocolError("oversized", f"bulk record of {n} bytes")
        if n <= TAG_BYTES:
            raise RemoteProtocolError("malformed", f"bulk record of {n} bytes")
        return n

    def open_into(self, record: memoryview, out: memoryview) -> None:
        """Decrypt ``record`` (the next in order) into ``out`` (``record.nbytes - TAG_BYTES``)."""
        try:
            self._aead.decrypt_into(_record_nonce(self._counter), record, LENGTH.pack(record.nbytes), out)
        except InvalidTag:
            raise RemoteProtocolError("bad_key", f"bulk record {self._counter} fails authentication "
                                                 f"(tampered, replayed, reordered or dropped)") from None
        self._counter += 1
