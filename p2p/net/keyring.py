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
from typing import Callable, Generic, Optional, TypeVar

KEY_BYTES = 32  # AES-256
KEY_ID_BYTES = 4
T = TypeVar("T")


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


def read_secret_file(path: str, what: str, hint: str, others_may_read: bool = False) -> str:
    """The text of ``path``; KeyFileError (one line) if it is missing, not text, or unsafe: a
    secret that others can read, or any file of ours that others can write."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(f"{what} {path} is not a regular file")
        if mode & (0o022 if others_may_read else 0o027):
            raise KeyFileError(f"{what} {path} is accessible to other users (mode {stat.S_IMODE(mode):03o}): "
                               f"run `chmod {'644' if others_may_read else '600'} {path}`")
        with open(path, encoding="ascii") as f:
            return f.read()
    except UnicodeDecodeError:
        raise KeyFileError(f"{what} {path} is not text ({hint})") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read {what} {path}: {exc.strerror}") from None


def load_key_file(path: str) -> Keyring:
    """The keyring in ``path``; KeyFileError (one line) if it is missing, unsafe or malformed."""
    return parse_keys(read_secret_file(path, "swarm key file", "make one with `p2p keygen`"), path)


class WatchedFile(Generic[T]):
    """A file and what ``load`` last made of it; re-read when the file changes (the swarm key
    file, the identities' allow file: p2p/net/identity.py)."""

    def __init__(self, path: str, load: Callable[[str], T]) -> None:
        self.path = path
        self._load = load
        self._stamp = self._mtime()
        self.value: T = load(path)
        self.reloads = 0
        self.last_error: Optional[str] = None  # why the last changed file was not taken (the old value stays)

    def _mtime(self) -> Optional[tuple[int, int, int]]:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino  # an edit within one mtime tick still shows

    def reload_if_changed(self) -> bool:
        """Re-read the file if its mtime changed; True if its value changed. A file that is now
        unusable keeps the old value (a half-written edit must not cut the node off)."""
        stamp = self._mtime()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            value = self._load(self.path)
        except KeyFileError as exc:
            self.last_error = str(exc)
            return False
        self.last_error = None
        if value == self.value:
            return False
        self.value = value
        self.reloads += 1
        return True


class KeyFile(WatchedFile[Keyring]):
    """A swarm key file and the keyring last loaded from it."""

    def __init__(self, path: str) -> None:
        super().__init__(path, load_key_file)

    @property
    def keyring(self) -> Keyring:
        return self.value
