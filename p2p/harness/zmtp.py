"""ZMTP 3.1 written by hand: what a hostile peer puts on a ZeroMQ connection (NULL mechanism).

Why by hand: libzmq itself would never send a PING after every message nor reset the connection
at a moment the caller picks, which is what reaches libzmq's ``!_io_error`` abort
(p2p/net/control_port.py, "Never pause a connection"). Used by tests/test_transport_no_pause.py
and bench/flood_close_abort.py."""

from __future__ import annotations

import struct


def frame(body: bytes, command: bool = False) -> bytes:
    """One short frame (a body under 256 bytes): a message part, or a command."""
    return bytes([0x04 if command else 0x00, len(body)]) + body


def hello(socket_type: bytes) -> bytes:
    """The greeting (NULL mechanism) and the READY command naming ``socket_type``."""
    greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return greeting + frame(ready, command=True)


PING = frame(b"\x04PING\x00\x00", command=True)  # a heartbeat: TTL 0, no context
