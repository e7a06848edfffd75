"""Coordinator-free membership: SWIM with Lifeguard, as a sans-I/O state machine.

``Membership`` is fed ``receive(src, msg, now)`` / ``tick(now)`` and answers with ``Send``
records; the node daemon drives it over ZeroMQ and ``p2p.sim`` drives thousands of them in one
process. See ``membership.py`` for the theory of operation.
"""

from p2p.gossip.config import MembershipConfig
from p2p.gossip.membership import Member, Membership
from p2p.gossip.messages import (
    ALIVE, DEAD, LEFT, MEMBERSHIP_MESSAGES, STATE_NAMES, SUSPECT,
    Ack, Gossip, Nack, Ping, PingReq, PushPull,
)

__all__ = [
    "MembershipConfig", "Member", "Membership", "MEMBERSHIP_MESSAGES", "STATE_NAMES",
    "ALIVE", "SUSPECT", "DEAD", "LEFT", "Ping", "Ack", "PingReq", "Nack", "PushPull", "Gossip",
]
