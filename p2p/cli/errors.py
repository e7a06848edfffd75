"""User errors on the command line: one line on stderr naming what to fix, and an exit code."""

from __future__ import annotations

import math
from typing import Optional

from p2p.net.addresses import AddressError, parse_address


class CliError(Exception):
    """A user error: printed as one line, exit code ``code`` (2: a bad flag or value; 1: a
    runtime failure such as a port in use or no peer answering)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def check_address(flag: str, value: str, *, allow_wildcard: bool = True) -> str:
    try:
        parse_address(value, allow_wildcard=allow_wildcard)
    except AddressError as exc:
        raise CliError(f"{flag}: {exc}") from None
    return value


def check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise CliError(f"{flag}: unknown value {value!r} (choose from {', '.join(choices)})")


def positive(flag: str, value: Optional[float], *, allow_zero: bool = False) -> None:
    if value is not None and not math.isfinite(value):
        raise CliError(f"{flag} must be a finite number, got {value:g}")
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise CliError(f"{flag} must be {'>= 0' if allow_zero else '> 0'}, got {value:g}")


def read_key_file(path: Optional[str]):
    """The keyring in ``--swarm-key FILE`` (None without one); a bad file is one line."""
    if path is None:
        return None
    from p2p.net.keyring import KeyFileError, load_key_file

    try:
        return load_key_file(path)
    except KeyFileError as exc:
        raise CliError(f"--swarm-key: {exc}") from None


def read_identity_file(path: Optional[str], keyring: object):
    """The identity in ``--identity FILE`` (None without one); a bad file is one line."""
    if path is None:
        return None
    if keyring is None:
        raise CliError("--identity signs inside the swarm key's seal: give --swarm-key too")
    from p2p.net.identity import load_identity_file
    from p2p.net.keyring import KeyFileError

    try:
        return load_identity_file(path)
    except KeyFileError as exc:
        raise CliError(f"--identity: {exc}") from None
