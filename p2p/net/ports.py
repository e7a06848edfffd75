"""Choosing ports: every node needs two adjacent free ones (ZeroMQ on PORT, bulk on PORT + 1)."""

from __future__ import annotations

import socket
from typing import Any, Iterable

from p2p.net.addresses import parse_address
from p2p.net.keyring import Keyring
from p2p.net.transport import Transport, TransportConfig, TransportError


def free_ports(count: int, host: str = "127.0.0.1", avoid: Iterable[int] = ()) -> list[int]:
    """Ports the OS reports free right now, each with the next port free too (a node's bulk
    port, p2p/net/bulk.py), and no two pairs overlapping. All are held while choosing, so none
    repeats. ``avoid``: the first ports of pairs already given out whose nodes may not have
    bound them yet (a process takes seconds to start): no returned pair overlaps one of them."""
    taken = set(avoid)
    held, ports = [], []
    try:
        while len(ports) < count:
            first = socket.socket()
            first.bind((host, 0))
            held.append(first)
            port = first.getsockname()[1]
            if port >= 65535 or taken & {port - 1, port, port + 1}:
                continue
            second = socket.socket()
            try:
                second.bind((host, port + 1))
            except OSError:
                second.close()
                continue
            held.append(second)
            ports.append(port)
            taken.add(port)
        return ports
    finally:
        for s in held:
            s.close()


def pair_free(host: str, port: int) -> bool:
    """Can a node bind ``port`` and its bulk port ``port + 1`` on ``host`` right now?"""
    held = []
    try:
        for p in (port, port + 1):
            s = socket.socket()
            held.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the node's listeners do
            s.bind((host, p))
        return True
    except OSError:
        return False
    finally:
        for s in held:
            s.close()


WILDCARDS = ("0.0.0.0", "::", "*")
DEFAULT_ROUTE_PROBE = "192.0.2.1:9"  # TEST-NET-1 (RFC 5737): only asks which route the kernel would take
ATTEMPTS = 20  # a free pair can be taken by another process before we bind it: try again


def bind_transport(config: TransportConfig, listen: str, keyring: Keyring | None = None,
                   **identities: Any) -> tuple[Transport, str]:
    """A Transport listening on ``listen``; port 0 takes a free pair of adjacent ports.
    Returns it with the address it bound. Raises TransportError. ``identities``: Transport's
    ``identity`` and ``allowed``."""
    host, _, port = listen.rpartition(":")
    if port != "0":
        return Transport(config, listen, keyring, **identities), listen
    probe_host = "0.0.0.0" if host in WILDCARDS else parse_address(f"{host}:1")[0]
    for attempt in range(ATTEMPTS):
        (free,) = free_ports(1, probe_host)
        address = f"{host}:{free}"
        try:
            return Transport(config, address, keyring, **identities), address
        except TransportError:
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def advertised_address(bound: str, advertise: str | None, join: tuple[str, ...]) -> str:
    """The address peers dial: ``advertise``; else the bound one; on a wildcard, the local
    address the kernel would use towards the first join peer (a UDP ``connect`` picks the
    route and sends nothing), or with no join peer along the default route. ValueError when no
    dialable address can be found."""
    if advertise:
        return advertise
    host, port = parse_address(bound)
    if host not in WILDCARDS:
        return bound
    for peer in (*join, DEFAULT_ROUTE_PROBE):
        peer_host, peer_port = parse_address(peer)
        try:
            family = socket.AF_INET6 if ":" in peer_host else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((peer_host, peer_port))
                local = probe.getsockname()[0]
        except OSError:
            continue
        if not local.startswith("127.") or peer_host.startswith("127."):
            return f"[{local}]:{port}" if ":" in local else f"{local}:{port}"
    raise ValueError(f"listening on {bound} with nothing to tell peers: give advertise=HOST:PORT that "
                     f"peers can dial (--advertise)")
