"""Query a running node over its listening socket (``p2p status``, the demo's live view).

A node with a swarm key answers only requests sealed with one of its keys, and seals its
answer (p2p/net/seal.py): give ``keyring``. Without it, such a node stays silent. A node with
identities on answers only requests signed by a key on its allow file: give ``identity`` too.
Its signed answer is checked for a sound signature (this side has no allow file to check the
key against; the seal already says it comes from a holder of the swarm key).
"""

from __future__ import annotations

import time

import zmq

from typing import Optional

from p2p.net.addresses import to_endpoint
from p2p.net.identity import Identity
from p2p.net.keyring import Keyring
from p2p.net.seal import ReplayGuard, open_message, open_signed, seal_message
from p2p.net.control import ModelReply, ModelRequest, StateReply, StateRequest, StatusReply, StatusRequest
from p2p.protocol import RemoteProtocolError
from p2p.wire import decode, encode


class QueryError(RuntimeError):
    """The node did not answer, or answered with something unexpected."""


def query(addr: str, request: object, timeout_s: float = 2.0, keyring: Optional[Keyring] = None,
          identity: Optional[Identity] = None) -> object:
    """Send one control request to the node at ``addr`` and return its reply message."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    frames = encode(request, "client")
    if keyring is not None:
        frames = seal_message(keyring, frames, time.time(), identity=identity)
    try:
        sock.connect(to_endpoint(addr))
        sock.send_multipart(frames, copy=False)
        if not sock.poll(int(timeout_s * 1000)):
            hint = ("is a node running there? a node with a swarm key answers only requests sealed with it: "
                    "give --swarm-key FILE" if keyring is None else
                    "is a node running there, with a key from this swarm key file? a node without a key ignores sealed "
                    "requests" + ("" if identity is not None else
                                  ", and one with identities answers only requests signed by an allowed one: give --identity FILE"))
            raise QueryError(f"no answer from {addr} within {timeout_s:g}s ({hint})")
        try:
            reply_frames = sock.recv_multipart(copy=False)
            if keyring is not None:
                if identity is None:
                    reply_frames = open_message(keyring, ReplayGuard(), reply_frames, time.time())
                else:
                    _, reply_frames = open_signed(keyring, ReplayGuard(), reply_frames, time.time(), None)
            _, reply = decode(reply_frames)
        except RemoteProtocolError as exc:
            raise QueryError(f"{addr} answered something unreadable ({exc})") from None
        return reply
    finally:
        sock.close(linger=0)


def status(addr: str, timeout_s: float = 2.0, keyring: Optional[Keyring] = None,
           identity: Optional[Identity] = None) -> dict:
    reply = query(addr, StatusRequest(), timeout_s, keyring, identity)
    if not isinstance(reply, StatusReply):
        raise QueryError(f"{addr} answered {type(reply).__name__} to a status request")
    return reply.info


def state(addr: str, timeout_s: float = 5.0, keyring: Optional[Keyring] = None,
          identity: Optional[Identity] = None) -> StateReply:
    reply = query(addr, StateRequest(), timeout_s, keyring, identity)
    if not isinstance(reply, StateReply):
        raise QueryError(f"{addr} answered {type(reply).__name__} to a state request")
    return reply


def model(addr: str, timeout_s: float = 60.0, keyring: Optional[Keyring] = None,
          identity: Optional[Identity] = None) -> ModelReply:
    """The node's current model as a safetensors blob (``p2p export --peer``)."""
    reply = query(addr, ModelRequest(), timeout_s, keyring, identity)
    if not isinstance(reply, ModelReply):
        raise QueryError(f"{addr} answered {type(reply).__name__} to a model request")
    return reply
