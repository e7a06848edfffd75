"""Query a running node over its listening socket (``p2p status``, the demo's live view)."""

from __future__ import annotations

import zmq

from p2p.net.addresses import to_endpoint
from p2p.net.control import ModelReply, ModelRequest, StateReply, StateRequest, StatusReply, StatusRequest
from p2p.protocol import RemoteProtocolError
from p2p.wire import decode, encode


class QueryError(RuntimeError):
    """The node did not answer, or answered with something unexpected."""


def query(addr: str, request: object, timeout_s: float = 2.0) -> object:
    """Send one control request to the node at ``addr`` and return its reply message."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(to_endpoint(addr))
        sock.send_multipart(encode(request, "client"), copy=False)
        if not sock.poll(int(timeout_s * 1000)):
            raise QueryError(f"no answer from {addr} within {timeout_s:g}s (is a node running there?)")
        try:
            _, reply = decode(sock.recv_multipart(copy=False))
        except RemoteProtocolError as exc:
            raise QueryError(f"{addr} answered something unreadable ({exc})") from None
        return reply
    finally:
        sock.close(linger=0)


def status(addr: str, timeout_s: float = 2.0) -> dict:
    reply = query(addr, StatusRequest(), timeout_s)
    if not isinstance(reply, StatusReply):
        raise QueryError(f"{addr} answered {type(reply).__name__} to a status request")
    return reply.info


def state(addr: str, timeout_s: float = 5.0) -> StateReply:
    reply = query(addr, StateRequest(), timeout_s)
    if not isinstance(reply, StateReply):
        raise QueryError(f"{addr} answered {type(reply).__name__} to a state request")
    return reply


def model(addr: str, timeout_s: float = 60.0) -> ModelReply:
    """The node's current model as a safetensors blob (``p2p export --peer``)."""
    reply = query(addr, ModelRequest(), timeout_s)
    if not isinstance(reply, ModelReply):
        raise QueryError(f"{addr} answered {type(reply).__name__} to a model request")
    return reply
