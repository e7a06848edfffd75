"""Membership's node ids bound to identity keys (p2p/net/member_ids.py), through the driver's
error boundary into a real membership core: a member signing with its own key cannot speak as
another member, nor move another member's row to its own address; what SWIM relays about
others (suspicions, refutations) still goes through."""

import os
import random

import pytest

from p2p.gossip.config import MembershipConfig
from p2p.gossip.membership import Membership
from p2p.gossip.messages import ALIVE, LEFT, SUSPECT, Ack, Gossip, Ping, PushPull
from p2p.net.identity import Bindings, Identity, public_line
from p2p.net.keyring import Keyring
from p2p.net.member_ids import MemberIds
from p2p.protocol import RemoteProtocolError
from p2p.wire import encode

RING = Keyring((bytes([1]) * 32,))
X, M, ME = Identity.generate(), Identity.generate(), Identity.generate()  # the victim, the impostor, us
X_ADDR, M_ADDR = "10.0.0.2:7000", "10.0.0.3:7000"


def test_a_sender_id_is_bound_to_the_first_key_and_rows_to_the_keys_of_their_id_and_address():
    addresses = Bindings()
    ids = MemberIds(addresses)
    for addr, key, name in ((X_ADDR, X.public, "x"), (M_ADDR, M.public, "m")):
        addresses.check(addr, key)
        assert ids.screen(Ping(1, name, "me", ((ALIVE, name, addr, 0, ""),)), key) == (
            Ping(1, name, "me", ((ALIVE, name, addr, 0, ""),)), 0, None)
    with pytest.raises(RemoteProtocolError) as info:
        ids.screen(Ack(1, "x"), M.public)  # M's key, x's id
    assert info.value.reason == "sender_mismatch"
    rows = ((ALIVE, "x", M_ADDR, 9, ""), (SUSPECT, "x", X_ADDR, 0, "m"), (ALIVE, "new", M_ADDR, 0, ""))
    msg, dropped, problem = ids.screen(Gossip("m", rows), M.public)
    assert msg == Gossip("m", rows[1:]) and dropped == 1 and problem.reason == "member_mismatch"
    ids.ids.check("y", X.public)
    table = ((ALIVE, "m", M_ADDR, 0), (SUSPECT, "x", M_ADDR, 3), (LEFT, "y", M_ADDR, 4))  # (LEFT: no address taken)
    assert ids.screen(PushPull("m", False, False, table), M.public)[:2] == (PushPull("m", False, False, table[::2]), 1)
    ids.keep_only(frozenset({M.public}))  # X's key off the allow file: its id may be re-keyed
    assert len(ids) == 1 and ids.screen(Ack(2, "x"), M.public)[1:] == (0, None)


class _Driver:
    """A NetworkDriver on a bound transport, never started, with a real membership as its peer."""

    def __init__(self, tmp_path):
        from p2p.net.driver import NetworkDriver
        from p2p.net.identity import AllowFile
        from p2p.net.ports import bind_transport
        from p2p.net.transport import TransportConfig

        allow = tmp_path / "allow"
        allow.write_text("".join(public_line(k.public) + "\n" for k in (X, M, ME)))
        allow.chmod(0o644)
        allow_file = AllowFile(str(allow))
        self.transport, addr = bind_transport(TransportConfig(), "127.0.0.1:0", RING, identity=ME,
                                              allowed=allow_file.allowed)
        self.membership = Membership(MembershipConfig(), "me", addr, random.Random(1), 0.0)
        self.driver = NetworkDriver(self.transport, self.membership, addr, dict, None, 1.0, allow_file=allow_file)

    def deliver(self, msg, src, signer):
        from p2p.net.transport import Incoming

        self.driver._handle(Incoming(b"x", encode(msg, src), signer=signer.public))

    def state(self, member):
        row = self.membership.member(member)
        return row and (row.state, row.addr, row.incarnation)

    def close(self):
        os.close(self.driver._wake_read)
        os.close(self.driver._wake_write)
        self.transport.close()


def test_the_driver_refuses_an_allowed_key_speaking_as_another_member_and_keeps_swim_relays(tmp_path, caplog):
    import logging

    node = _Driver(tmp_path)
    try:
        node.deliver(PushPull("x", True, False, ((ALIVE, "x", X_ADDR, 0),)), X_ADDR, X)  # both join
        node.deliver(PushPull("m", True, False, ((ALIVE, "m", M_ADDR, 0),)), M_ADDR, M)
        assert node.state("x") == ("alive", X_ADDR, 0) and node.driver.rejected == {}
        with caplog.at_level(logging.WARNING, logger="p2p.events"):
            for _ in range(3):  # M, with `--id x`: its leave would take x out of every view
                node.deliver(Gossip("x", ((LEFT, "x", M_ADDR, 5, "x"),)), M_ADDR, M)
                node.deliver(PushPull("x", True, False, ((ALIVE, "x", M_ADDR, 7),)), M_ADDR, M)
        assert node.driver.rejected == {"sender_mismatch": 6}
        assert sum("sender_mismatch" in r.getMessage() for r in caplog.records) == 1  # once for that key
        assert node.state("x") == ("alive", X_ADDR, 0)  # untouched
        # M relays a suspicion of x (SWIM allows it) and tries to move x's row to its own address.
        node.deliver(Gossip("m", ((ALIVE, "x", M_ADDR, 1, ""), (SUSPECT, "x", X_ADDR, 0, "m"))), M_ADDR, M)
        assert node.state("x") == ("suspect", X_ADDR, 0)
        assert node.driver.rejected == {"sender_mismatch": 6, "member_mismatch": 1}
        node.deliver(Ack(1, "x", ((ALIVE, "x", X_ADDR, 1, ""),)), X_ADDR, X)  # x's own refutation passes
        assert node.state("x") == ("alive", X_ADDR, 1)
        node.deliver(Gossip("m", ((ALIVE, "x", X_ADDR, 2, ""),)), M_ADDR, M)  # a relayed refutation too
        assert node.state("x") == ("alive", X_ADDR, 2) and sum(node.driver.rejected.values()) == 7
        assert node.membership.stats.get("recv_Gossip") == 2  # the refused ones never reached the core
    finally:
        node.close()
