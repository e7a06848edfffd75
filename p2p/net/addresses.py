"""Parsing and checking ``HOST:PORT`` addresses given on the command line or by peers."""

from __future__ import annotations

import ipaddress


class AddressError(ValueError):
    """An address that is not HOST:PORT; the message says what is wrong."""


def parse_address(text: str, *, allow_wildcard: bool = True) -> tuple[str, int]:
    """``"host:port"`` -> (host, port). IPv6 hosts go in brackets: ``[::1]:7000``."""
    if not isinstance(text, str) or ":" not in text:
        raise AddressError(f"address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7000")
    host, _, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise AddressError(f"address {text!r}: missing host")
    try:
        port = int(port_text)
    except ValueError:
        raise AddressError(f"address {text!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise AddressError(f"address {text!r}: port must be 1..65535")
    if not allow_wildcard and host in ("0.0.0.0", "::", "*"):
        raise AddressError(f"address {text!r}: a wildcard host cannot be dialled; give --advertise")
    return host, port


def to_endpoint(text: str) -> str:
    """``"host:port"`` -> a ZeroMQ TCP endpoint."""
    host, port = parse_address(text)
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"tcp://[{host}]:{port}"
    except ValueError:
        pass  # a hostname
    return f"tcp://{host}:{port}"


def bulk_address(text: str) -> tuple[str, int]:
    """The (host, port) of a node's bulk-transfer TCP port: its ZeroMQ port + 1 (p2p/net/bulk.py)."""
    host, port = parse_address(text)
    if port >= 65535:
        raise AddressError(f"address {text!r}: port {port} leaves no room for the bulk port {port + 1}")
    return host, port + 1
