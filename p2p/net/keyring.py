"""The swarm's secret keys: a key file, the keyring it holds, and rotation without a restart.

A key file holds one base64-encoded 32-byte key per line (``p2p keygen`` writes one); blank
lines and ``#`` comments are ignored. Every key listed is accepted on receive, the first one
is used to send: memberlist's keyring (HashiCorp, ``keyring.go``). Rotation without a restart
follows from it: add the new key as a second line everywhere, wait until every node has
reloaded, move it to the first line everywhere, then remove the old line. A node re-reads its
file when its modification time changes (``KeyFile.reload_if_changed``, from the daemon's
periodic housekeeping).

Each key has a short public id (the first 4 bytes of its SHA-256) sent in clear with every
sealed message, so the receiver picks the key at once instead of trying each in turn.

A key file that others can read is refused: whoever reads it can join the swarm and read every
model. So is one that others can write (they could put their own key in).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Optional

KEY_BYTES = 32  # AES-256
KEY_ID_BYTES = 4


class KeyFileError(ValueError):
    """The key file cannot be used; the message is one line that says how to fix it."""


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:KEY_ID_BYTES]


def new_key_line() -> str:
    """A fresh random key, as a key file line (``p2p keygen``)."""
    return base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


@dataclass(frozen=True)
class Keyring:
    """Keys accepted on receive; ``keys[0]`` (the primary) is used to send."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a keyring needs at least one key")
        for key in self.keys:
            if len(key) != KEY_BYTES:
                raise ValueError(f"a swarm key is {KEY_BYTES} bytes, got {len(key)}")

    @property
    def primary(self) -> bytes:
        return self.keys[0]

    @property
    def primary_id(self) -> bytes:
        return key_id(self.keys[0])

    def lookup(self, kid: bytes) -> Optional[bytes]:
        """The key whose id is ``kid`` (None: not one of ours)."""
        for key in self.keys:
            if key_id(key) == kid:
                return key
        return None

    def describe(self) -> str:
        return f"encrypted (AES-256-GCM, key {self.primary_id.hex()}, {len(self.keys)} key{'s' * (len(self.keys) > 1)})"


def parse_keys(text: str, path: str) -> Keyring:
    keys = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            key = base64.b64decode(line, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise KeyFileError(f"swarm key file {path}, line {number}: not a base64 {KEY_BYTES}-byte key "
                               f"(make one with `p2p keygen`)")
        if key not in keys:
            keys.append(key)
    if not keys:
        raise KeyFileError(f"swarm key file {path} holds no key (make one with `p2p keygen > {path}`)")
    return Keyring(tuple(keys))


def load_key_file(path: str) -> Keyring:
    """The keyring in ``path``; KeyFileError (one line) if it is missing, unsafe or malformed."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(f"swarm key file {path} is not a regular file")
        if mode & 0o027:
            raise KeyFileError(f"swarm key file {path} is accessible to other users (mode {stat.S_IMODE(mode):03o}): "
                               f"run `chmod 600 {path}`")
        with open(path, encoding="ascii") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise KeyFileError(f"swarm key file {path} is not text (make one with `p2p keygen`)") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read swarm key file {path}: {exc.strerror}") from None
    return parse_keys(text, path)


class KeyFile:
    """A key file and the keyring last loaded from it; re-read when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp = self._mtime()
        self.keyring = load_key_file(path)
        self.reloads = 0
        self.last_error: Optional[str] = None  # why the last changed file was not taken (the old keys stay)

    def _mtime(self) -> Optional[tuple[int, int, int]]:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino  # an edit within one mtime tick still shows

    def reload_if_changed(self) -> bool:
        """Re-read the file if its mtime changed; True if the keyring changed. A file that is
        now unusable keeps the old keys (a half-written edit must not cut the node off)."""
        stamp = self._mtime()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            keyring = load_key_file(self.path)
        except KeyFileError as exc:
            self.last_error = str(exc)
            return False
        self.last_error = None
        if keyring == self.keyring:
            return False
        self.keyring = keyring
        self.reloads += 1
        return True
