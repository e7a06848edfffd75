"""Membership wire messages (tags 1..19 are reserved for membership; only append).

| tag | message  | purpose                                                          |
|-----|----------|------------------------------------------------------------------|
| 1   | Ping     | direct probe of ``target`` (a node id), piggybacks updates        |
| 2   | Ack      | answer to a Ping (direct, or forwarded by a PingReq helper)       |
| 3   | PingReq  | "please probe ``target`` at ``target_addr`` for me" (SWIM k-indirect) |
| 4   | Nack     | Lifeguard: the helper got no ack from the target in time          |
| 5   | PushPull | full-state anti-entropy exchange; also the join handshake         |
| 6   | Gossip   | a batch of updates sent to a few random members every gossip tick |

Two record shapes travel inside messages, both plain tuples (lists after msgpack):

- an *update* ``(kind, node_id, addr, incarnation, origin)``: ``kind`` is one of ALIVE, SUSPECT,
  DEAD, LEFT; ``origin`` is the member that raised it (the suspector for SUSPECT, the declarer for
  DEAD, the leaving node itself for LEFT, "" for ALIVE);
- a *state* ``(state, node_id, addr, incarnation)``: one row of a member table (PushPull).

Every message validates itself in ``__post_init__`` (ValueError / TypeError, which the codec turns
into ``RemoteProtocolError("malformed")``) and normalises nested lists into tuples. Messages the
local ``Membership`` builds itself are valid by construction and are made with ``trusted`` which
skips that pass (a 10k-member PushPull would otherwise be re-checked on every send in the
simulator).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from p2p.wire import message

ALIVE, SUSPECT, DEAD, LEFT = 0, 1, 2, 3
STATE_NAMES = ("alive", "suspect", "dead", "left")

MAX_ID_LEN = 256  # node ids and "host:port" addresses
MAX_UPDATES = 1024  # updates in one Ping/Ack/Gossip
MAX_STATES = 65536  # rows in one PushPull
MAX_SEQ = 2**63 - 1
MAX_INCARNATION = 2**63 - 1


def _check_id(name: str, value: object, allow_empty: bool = False) -> None:
    if type(value) is not str:
        raise TypeError(f"{name}: expected str")
    if len(value) > MAX_ID_LEN or (not value and not allow_empty):
        raise ValueError(f"{name}: length {len(value)} outside [1, {MAX_ID_LEN}]")


def _check_seq(value: object) -> None:
    if type(value) is not int:
        raise TypeError("seq: expected int")
    if not 0 <= value <= MAX_SEQ:
        raise ValueError(f"seq {value} out of range")


def _norm_records(name: str, entries: object, width: int, limit: int) -> tuple:
    """Check a tuple of update (width 5) or state (width 4) records; return it with tuple rows."""
    if not isinstance(entries, (tuple, list)):
        raise TypeError(f"{name}: expected a tuple")
    if len(entries) > limit:
        raise ValueError(f"{name}: {len(entries)} records, at most {limit}")
    out = []
    for e in entries:
        if type(e) is list:
            e = tuple(e)
        elif type(e) is not tuple:
            raise TypeError(f"{name}: record is not an array")
        if len(e) != width:
            raise ValueError(f"{name}: record of {len(e)} fields, want {width}")
        kind, node, addr, inc = e[0], e[1], e[2], e[3]
        if type(kind) is not int or not ALIVE <= kind <= LEFT:
            raise ValueError(f"{name}: state {kind!r} out of range")
        _check_id(f"{name}.node_id", node)
        _check_id(f"{name}.addr", addr)
        if type(inc) is not int or not 0 <= inc <= MAX_INCARNATION:
            raise ValueError(f"{name}: incarnation {inc!r} out of range")
        if width == 5:
            origin = e[4]
            _check_id(f"{name}.origin", origin, allow_empty=kind == ALIVE)
            if kind == LEFT and origin != node:
                raise ValueError(f"{name}: only {node!r} itself can announce that it left")
        out.append(e)
    return tuple(out)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def trusted(cls, *values):
    """Build a message without re-validating it: for messages this process made itself."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", dict(zip(names, values)))  # the frozen __init__, minus checks
    return obj


@message(1)
@dataclass(frozen=True)
class Ping:
    seq: int
    sender: str  # node id of the prober
    target: str  # node id the prober means to reach (an address may be reused by another node)
    updates: tuple = ()

    def __post_init__(self) -> None:
        _check_seq(self.seq)
        _check_id("sender", self.sender)
        _check_id("target", self.target)
        object.__setattr__(self, "updates", _norm_records("updates", self.updates, 5, MAX_UPDATES))


@message(2)
@dataclass(frozen=True)
class Ack:
    seq: int
    sender: str  # node id of whoever sends this Ack (the target, or the PingReq helper)
    updates: tuple = ()

    def __post_init__(self) -> None:
        _check_seq(self.seq)
        _check_id("sender", self.sender)
        object.__setattr__(self, "updates", _norm_records("updates", self.updates, 5, MAX_UPDATES))


@message(3)
@dataclass(frozen=True)
class PingReq:
    seq: int  # the origin's probe sequence number, echoed in the forwarded Ack / Nack
    sender: str
    target: str  # node id to probe
    target_addr: str

    def __post_init__(self) -> None:
        _check_seq(self.seq)
        _check_id("sender", self.sender)
        _check_id("target", self.target)
        _check_id("target_addr", self.target_addr)


@message(4)
@dataclass(frozen=True)
class Nack:
    seq: int
    sender: str

    def __post_init__(self) -> None:
        _check_seq(self.seq)
        _check_id("sender", self.sender)


@message(5)
@dataclass(frozen=True)
class PushPull:
    sender: str
    join: bool  # the sender is joining through us: announce it to the cluster
    reply: bool  # the sender wants our full state back
    states: tuple  # (state, node_id, addr, incarnation) rows, the sender's whole table

    def __post_init__(self) -> None:
        _check_id("sender", self.sender)
        if type(self.join) is not bool or type(self.reply) is not bool:
            raise TypeError("join/reply: expected bool")
        states = _norm_records("states", self.states, 4, MAX_STATES)
        if len({s[1] for s in states}) != len(states):
            raise ValueError("states: duplicate node ids")
        object.__setattr__(self, "states", states)


@message(6)
@dataclass(frozen=True)
class Gossip:
    sender: str
    updates: tuple

    def __post_init__(self) -> None:
        _check_id("sender", self.sender)
        object.__setattr__(self, "updates", _norm_records("updates", self.updates, 5, MAX_UPDATES))


MEMBERSHIP_MESSAGES = (Ping, Ack, PingReq, Nack, PushPull, Gossip)


def _str_size(s: str) -> int:
    n = len(s) if s.isascii() else len(s.encode())
    return n + (1 if n < 32 else 2 if n < 256 else 3)


def record_size(rec: tuple) -> int:
    """msgpack size in bytes of an update or state record (exact for the shapes above)."""
    node, addr, inc = rec[1], rec[2], rec[3]
    if len(rec) == 5:
        origin = rec[4]
        if len(node) < 32 and len(addr) < 32 and len(origin) < 32 and inc < 128 and \
                node.isascii() and addr.isascii() and origin.isascii():
            return 6 + len(node) + len(addr) + len(origin)  # the common case, kept cheap
        size = _str_size(origin)
    else:
        size = 0
    inc_size = 1 if inc < 128 else 2 if inc < 256 else 3 if inc < 65536 else 5 if inc < 2**32 else 9
    return size + 2 + _str_size(node) + _str_size(addr) + inc_size
