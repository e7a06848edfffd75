"""Every membership message survives p2p.wire encode/decode; bad records are rejected."""

import msgpack
import pytest

from p2p.gossip import ALIVE, DEAD, LEFT, MEMBERSHIP_MESSAGES, SUSPECT, Ack, Gossip, Nack, Ping, PingReq, PushPull
from p2p.gossip.messages import MAX_UPDATES, record_size, trusted
from p2p.protocol import RemoteProtocolError
from p2p.wire import PROTOCOL_VERSION, decode, encode, registered_tags

UPDATES = (
    (ALIVE, "n1", "10.0.0.1:7946", 0, ""),
    (SUSPECT, "n2", "10.0.0.2:7946", 3, "n1"),
    (DEAD, "n3", "10.0.0.3:7946", 2**40, "n1"),
    (LEFT, "n4", "10.0.0.4:7946", 7, "n4"),
)
STATES = ((ALIVE, "n1", "10.0.0.1:7946", 0), (SUSPECT, "n2", "h:2", 1), (DEAD, "n3", "h:3", 5), (LEFT, "n4", "h:4", 2))

SAMPLES = [
    Ping(1, "n1", "n2", UPDATES),
    Ping(2**40, "n1", "n2"),
    Ack(7, "n2", UPDATES[:1]),
    PingReq(9, "n1", "n3", "10.0.0.3:7946"),
    Nack(9, "n2"),
    PushPull("n1", True, True, STATES),
    PushPull("n1", False, False, ()),
    Gossip("n1", UPDATES),
]


def test_membership_tags_are_pinned():
    tags = registered_tags()
    assert {tag: tags[tag] for tag in range(1, 7)} == {
        1: "Ping", 2: "Ack", 3: "PingReq", 4: "Nack", 5: "PushPull", 6: "Gossip"}
    assert {cls.TAG for cls in MEMBERSHIP_MESSAGES} == set(range(1, 7))


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    src, back = decode(encode(msg, "10.0.0.9:7946"))
    assert src == "10.0.0.9:7946"
    assert back == msg and type(back) is type(msg)


def test_trusted_builds_equal_messages():
    assert trusted(Ping, 1, "n1", "n2", UPDATES) == Ping(1, "n1", "n2", UPDATES)
    assert trusted(PushPull, "n1", True, True, STATES) == PushPull("n1", True, True, STATES)


@pytest.mark.parametrize("rec", [UPDATES[0], UPDATES[1], UPDATES[2], STATES[0], (ALIVE, "x" * 40, "y" * 300, 70000)])
def test_record_size_is_exact(rec):
    assert record_size(rec) == len(msgpack.packb(rec, use_bin_type=True))


def _frame(tag, fields):
    return [msgpack.packb([PROTOCOL_VERSION, tag, "h:1", fields, []], use_bin_type=True)]


@pytest.mark.parametrize("tag, fields", [
    (1, [1, "n1", "n2", [[9, "n3", "h:3", 0, ""]]]),  # state out of range
    (1, [1, "n1", "n2", [[0, "n3", "h:3", -1, ""]]]),  # negative incarnation
    (1, [1, "n1", "n2", [[0, "n3", "h:3", 0]]]),  # update with 4 fields
    (1, [1, "n1", "n2", [[1, "n3", "h:3", 0, ""]]]),  # suspicion without a suspector
    (1, [1, "n1", "n2", [[3, "n3", "h:3", 0, "n1"]]]),  # n1 cannot announce that n3 left
    (1, [1, "n1", "n2", [[0, "", "h:3", 0, ""]]]),  # empty node id
    (1, [1, "n1", "n2", [[0, "n3", "h:3", True, ""]]]),  # bool is not an incarnation
    (1, [-1, "n1", "n2", []]),  # negative seq
    (1, [1, "", "n2", []]),  # empty sender
    (1, [1, "n1", "n2", [[0, "n%d" % i, "h:3", 0, ""] for i in range(MAX_UPDATES + 1)]]),
    (5, ["n1", True, True, [[0, "n1", "h:1", 0], [0, "n1", "h:1", 0]]]),  # duplicate rows
    (5, ["n1", 1, True, []]),  # int is not a bool
    (5, ["n1", True, True, ["n1"]]),  # row is not an array
    (6, ["n1", [[0, "n3", "h:3", 0, "", "extra"]]]),
])
def test_malformed_records_are_rejected(tag, fields):
    with pytest.raises(RemoteProtocolError) as err:
        decode(_frame(tag, fields))
    assert err.value.reason == "malformed"
