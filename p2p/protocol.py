"""Types shared by every sans-I/O state machine.

A protocol object is fed ``receive(src, msg, now)`` and ``tick(now)`` and answers with a list of
``Send`` records; ``next_deadline()`` says when it next wants ``tick``. It never opens a socket,
reads a clock, sleeps or starts a thread (DESIGN.md, after h11 / aioquic).

Two kinds of error (after h11's LocalProtocolError / RemoteProtocolError):

- ``LocalProtocolError``: the local caller misused the API. Raised at once; a bug to fix.
- ``RemoteProtocolError``: a peer sent something we cannot accept (bad shape, lies, NaNs).
  Drivers catch it at the boundary, log and count it, and carry on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class LocalProtocolError(Exception):
    """The local caller misused a protocol object."""


class RemoteProtocolError(Exception):
    """A peer's message was rejected. ``reason`` is a short, countable label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Send:
    """Ask the driver to deliver ``msg`` to the node advertised at ``to`` ("host:port").

    ``fresh``: deliver it on a newly dialled connection. The sender held ``to`` unreachable
    until now, so the old connection may sit in TCP's retransmission backoff (up to seconds
    before anything queued behind it moves); the driver closes it first, dropping what was
    still queued on it. Protocol code sets it rarely and rate-limited (membership's re-admission
    and reconnect probes); a simulator ignores it."""

    to: str
    msg: Any
    fresh: bool = False
