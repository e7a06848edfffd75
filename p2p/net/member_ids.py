"""Membership's node ids bound to identity keys: with identities on, a member cannot speak as
another (issue 12, spoofing). No sockets, no protocol state: the driver screens each signed
membership message here before the membership core sees it.

The transport already binds a message's sender *address* (the wire envelope's) to the key that
signed it (p2p/net/identity.py, ``Bindings``). SWIM messages name their sender once more, by
node id (``Ping.sender`` and the others), and ``p2p start --id NAME`` makes that id differ from
the address: without this module a member on the allow file could sign with its own key, from
its own address, and claim another member's id, so its Acks, joins and leave would count as
that member's (a LEFT announced under the victim's id takes the victim out of every view).

Two rules, the same first-key-wins policy as the address binding:

- ``sender_mismatch``: a membership message whose sender id is bound to another key (the first
  allowed key seen sending with that id) is dropped whole. Every SWIM message names its actual
  sender (a PingReq helper forwards an Ack under its own id), so this is exactly "a member's own
  claims come only from its key": its liveness (Acks), its join, its leave, and its own rows in
  a pushed table, refutations (ALIVE at a higher incarnation) among them.
- ``member_mismatch``: a row that would give a member an address (an ALIVE update; an ALIVE or
  SUSPECT row of a pushed table, which creates or moves a row) is dropped, the rest of the
  message kept, when the member's id and that address are bound to two different keys: a
  member relaying "X is alive, at my address" is trying to receive X's probes.

What stays as SWIM allows: rows *about* other members (suspicions, deaths, another member's
refutation) are relayed by everyone, signed by the relayer, not by the member; the membership
core checks a rumoured death with a Ping of its own before believing it. A forged ALIVE about X
at X's own address can lift a suspicion of X early (X refutes a higher incarnation itself); one
at an address this node has never heard from cannot be checked until that address speaks. A
member that first claims an unbound id (before the real one joins) keeps it: trust on first
use, as for addresses, until its key leaves the allow file.

Why in the driver rather than in the core (the alternative: ``Membership.receive`` takes the
verified signer and keeps the table): the bindings follow the allow file (forgotten when a key is
taken off it, which only the driver sees), the simulator and the open swarm have no keys, and
the core's rules stay the same with or without identities; a screened message is an ordinary
message to it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from p2p.gossip.messages import ALIVE, MEMBERSHIP_MESSAGES, SUSPECT, PushPull
from p2p.net.identity import Bindings, short
from p2p.protocol import RemoteProtocolError

SENDER_REASON = "sender_mismatch"
ROW_REASON = "member_mismatch"


class MemberIds:
    """Member id -> the allowed key first seen sending with it, checked against ``addresses``
    (the driver's address bindings)."""

    def __init__(self, addresses: Bindings) -> None:
        self.ids = Bindings(reason=SENDER_REASON)
        self.addresses = addresses

    def screen(self, msg: object, signer: bytes) -> tuple[object, int, Optional[RemoteProtocolError]]:
        """``(msg with mismatched rows dropped, how many were, the first as an error)``; raises
        RemoteProtocolError(``sender_mismatch``) for a message to drop whole."""
        if not isinstance(msg, MEMBERSHIP_MESSAGES):
            return msg, 0, None
        self.ids.check(msg.sender, signer)
        if isinstance(msg, PushPull):
            field, rows, addressed = "states", msg.states, (ALIVE, SUSPECT)
        else:
            field, rows, addressed = "updates", getattr(msg, "updates", ()), (ALIVE,)
        first: Optional[RemoteProtocolError] = None
        kept = []
        for row in rows:
            problem = self._mismatch(row, signer) if row[0] in addressed else None
            if problem is None:
                kept.append(row)
            elif first is None:
                first = problem
        if first is None:
            return msg, 0, None
        return dataclasses.replace(msg, **{field: tuple(kept)}), len(rows) - len(kept), first

    def _mismatch(self, row: tuple, signer: bytes) -> Optional[RemoteProtocolError]:
        member, addr = row[1], row[2]
        member_key, addr_key = self.ids.get(member), self.addresses.get(addr)
        if member_key is None or addr_key is None or member_key == addr_key:
            return None
        return RemoteProtocolError(ROW_REASON, f"key {short(signer)} sent a row that puts {member} (bound to "
                                               f"{short(member_key)}) at {addr} (bound to {short(addr_key)})")

    def keep_only(self, allowed: frozenset) -> None:
        self.ids.keep_only(allowed)

    def __len__(self) -> int:
        return len(self.ids)
