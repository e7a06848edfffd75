"""Per-node identities: an Ed25519 keypair per node and an allow file of public keys, so that
one machine can be cut off without rotating everyone's swarm key (no sockets here).

Why on top of the swarm key, signing inside its sealed envelope (p2p/net/seal.py): the seal
already gives each control message a random nonce and a timestamp that the receiver's replay
window checks, and it hides what is inside. The signature covers that clear seal header as
well as the message's frames, so a node that still holds the swarm key but is no longer
allowed cannot take a message signed by a member, re-seal it under a fresh nonce and have it
accepted (the signature would not cover the new header), nor make one of its own. Signing
outside the seal, or without a swarm key, would need a second nonce and replay window of its
own. The order of checks keeps the costly one last: the AES-GCM tag (an outsider without the
swarm key stops there, for a microsecond), then the allow list (a set lookup), then the
Ed25519 verification (tens of microseconds) only for a key on the list.

Control message, once the seal is opened: frame 0 is ``!2s32s64s`` (the tag ``b"I1"``, the
sender's public key, an Ed25519 signature over ``SHA-256("p2p control sig v1" || seal header ||
for each other frame: its 8-byte length and bytes)``), then the message's own frames.

Bulk stream: the hello (seal.py) carries the public key and a signature over the hello's clear
fields (its salt and time among them) and that key, and the connection's record key is derived
with the public key in HKDF's info: the records that follow belong to that identity's stream.

A node's identity file holds its private key (``p2p keygen --identity``; mode 600, like the
swarm key). The allow file lists public keys (``p2p keygen --public node.id`` prints one), one a
line, ``#`` comments allowed; others may read it but not write it. It is re-read when it
changes: a key taken off it is refused from the next reload on, and its bulk connections are
closed. The sender address a message names is bound to the first allowed key seen with it
(``Bindings``): another allowed key claiming that address is refused until the first key leaves
the allow file. Membership's node ids (``--id``) are bound the same way (p2p/net/member_ids.py).

Failures raise ``RemoteProtocolError``, counted by reason: ``unsigned`` (no signature where
one is needed), ``not_allowed`` (a key not on the allow file), ``bad_signature``,
``identity_mismatch`` (a sender address bound to another key).

What it does not do: a removed machine still holds the swarm key, so it can still read traffic
it can capture, and on the network path it could alter a bulk stream's records (their key comes
from the swarm key, the salt and the public key, all known to it; a one-way stream has no
key exchange). Control messages stay safe from it. Rotate the swarm key at leisure afterwards
to take those away too.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import struct
from typing import Optional, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from p2p.net.keyring import KeyFileError, WatchedFile, read_secret_file
from p2p.protocol import RemoteProtocolError

PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64
CONTROL_TAG = b"I1"
SIGNATURE_FRAME = struct.Struct(f"!2s{PUBLIC_BYTES}s{SIGNATURE_BYTES}s")  # control: tag, public key, signature
HELLO_SIGNATURE_BYTES = PUBLIC_BYTES + SIGNATURE_BYTES  # bulk: public key, signature
_LENGTH = struct.Struct("!Q")
MAX_BINDINGS = 4096  # node ids remembered (only allowed keys make them)


def short(public: bytes) -> str:
    """A public key as logs show it (the start of its file line)."""
    return public_line(public)[:12]


def public_line(public: bytes) -> str:
    return base64.b64encode(public).decode("ascii")


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class Identity:
    """This node's private key (from its identity file)."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public = _raw_public(private.public_key())

    @classmethod
    def generate(cls) -> "Identity":
        return cls(Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def file_text(self) -> str:
        raw = self._private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                          serialization.NoEncryption())
        return (f"# p2p node identity (Ed25519 private key): keep it secret, mode 600\n"
                f"# public key, for the allow file: {public_line(self.public)}\n"
                f"{base64.b64encode(raw).decode('ascii')}\n")


def _key_lines(text: str) -> list[tuple[int, str]]:
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append((number, line))
    return lines


def _decode32(line: str) -> Optional[bytes]:
    try:
        raw = base64.b64decode(line, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 32 else None


def load_identity_file(path: str) -> Identity:
    """The identity in ``path``; KeyFileError (one line) if it is missing, unsafe or malformed."""
    hint = f"make one with `p2p keygen --identity > {path}`"
    lines = _key_lines(read_secret_file(path, "identity file", hint))
    raw = _decode32(lines[0][1]) if len(lines) == 1 else None
    if raw is None:
        raise KeyFileError(f"identity file {path} does not hold one base64 Ed25519 private key ({hint})")
    return Identity(Ed25519PrivateKey.from_private_bytes(raw))


def load_allow_file(path: str) -> frozenset[bytes]:
    """The public keys in an allow file; KeyFileError (one line) if it is unusable."""
    text = read_secret_file(path, "allow file", "one public key a line", others_may_read=True)
    keys = set()
    for number, line in _key_lines(text):
        key = _decode32(line)
        if key is None:
            raise KeyFileError(f"allow file {path}, line {number}: not a base64 Ed25519 public key "
                               f"(print one with `p2p keygen --public node.id`)")
        keys.add(key)
    if not keys:
        raise KeyFileError(f"allow file {path} lists no public key (a node would refuse everyone)")
    return frozenset(keys)


class AllowFile(WatchedFile[frozenset]):
    """The allow file and the keys last loaded from it (re-read when it changes)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, load_allow_file)

    @property
    def allowed(self) -> frozenset[bytes]:
        return self.value


@functools.lru_cache(maxsize=1024)  # (the allowed keys, in practice: only they reach a verification)
def _public_key(public: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(public)


def _verify(public: bytes, signature: bytes, data: bytes, what: str) -> None:
    try:
        _public_key(public).verify(signature, data)
    except (InvalidSignature, ValueError):
        raise RemoteProtocolError("bad_signature", f"{what} signature does not verify (key {short(public)})") from None


def _allowed(public: bytes, allowed: Optional[frozenset], what: str) -> None:
    if allowed is not None and public not in allowed:
        raise RemoteProtocolError("not_allowed", f"{what} from key {short(public)}, not in the allow file")


# -- control messages ------------------------------------------------------------------------
def _control_digest(header: bytes, frames: Sequence[object]) -> bytes:
    h = hashlib.sha256(b"p2p control sig v1")
    h.update(header)
    for frame in frames:
        view = memoryview(frame)
        h.update(_LENGTH.pack(view.nbytes))
        h.update(view if view.format == "B" and view.ndim == 1 else view.cast("B"))
    return h.digest()


def sign_control(identity: Identity, header: bytes, frames: Sequence[object]) -> bytes:
    """The signature frame to put before ``frames`` inside the seal whose header is ``header``."""
    return SIGNATURE_FRAME.pack(CONTROL_TAG, identity.public, identity.sign(_control_digest(header, frames)))


def verify_control(header: bytes, frames: Sequence[bytes], allowed: Optional[frozenset]) -> bytes:
    """The signer's public key if ``frames`` (the opened seal) begin with a valid signature by a
    key in ``allowed`` (None: any key, for a client reading a node's reply)."""
    first = frames[0] if frames else b""
    if len(first) != SIGNATURE_FRAME.size or first[:2] != CONTROL_TAG:
        raise RemoteProtocolError("unsigned", "a message without an identity's signature")
    _, public, signature = SIGNATURE_FRAME.unpack(first)
    _allowed(public, allowed, "message")
    _verify(public, signature, _control_digest(header, frames[1:]), "message")
    return public


# -- the bulk stream's hello -----------------------------------------------------------------
def sign_hello(identity: Identity, clear: bytes) -> bytes:
    """Public key and signature to follow a bulk hello's clear fields."""
    return identity.public + identity.sign(b"p2p bulk hello v2" + clear + identity.public)


def verify_hello(clear: bytes, signed: bytes, allowed: frozenset) -> bytes:
    public, signature = signed[:PUBLIC_BYTES], signed[PUBLIC_BYTES:]
    _allowed(public, allowed, "bulk stream")
    _verify(public, signature, b"p2p bulk hello v2" + clear + public, "bulk hello")
    return public


class Bindings:
    """Name (the sender address a message names; a member's id, p2p/net/member_ids.py) -> the
    allowed key first seen with it."""

    def __init__(self, capacity: int = MAX_BINDINGS, reason: str = "identity_mismatch") -> None:
        self.capacity = capacity
        self.reason = reason  # what a refusal is counted as
        self._key: dict[str, bytes] = {}

    def check(self, node: str, public: bytes) -> None:
        bound = self._key.get(node)
        if bound == public:
            return
        if bound is not None:
            raise RemoteProtocolError(self.reason, f"{node} is bound to key {short(bound)}, not {short(public)}")
        if len(self._key) >= self.capacity:
            raise RemoteProtocolError(self.reason, f"{node}: {self.capacity} node ids bound already")
        self._key[node] = public

    def get(self, node: str) -> Optional[bytes]:
        """The key ``node`` is bound to, or None."""
        return self._key.get(node)

    def keep_only(self, allowed: frozenset) -> None:
        """The allow file changed: forget ids bound to keys no longer on it (a re-keyed machine
        can then bind its id to its new key)."""
        self._key = {node: key for node, key in self._key.items() if key in allowed}

    def __len__(self) -> int:
        return len(self._key)
