"""Per-node identities (pure parts): identity and allow files, signed control messages inside
the seal, signed bulk hellos, node id <-> key bindings, and hostile inputs against each."""

import os
import random

import numpy as np
import pytest

from p2p.averaging.adpsgd import AvgRequest
from p2p.net.bulk import BufferPool, SealedReader, StreamReader, sealed_chunks, stream_parts
from p2p.net.identity import (SIGNATURE_FRAME, AllowFile, Bindings, Identity, load_allow_file, load_identity_file,
                              public_line, sign_control, sign_hello)
from p2p.net.keyring import KeyFileError, Keyring
from p2p.net.seal import (HELLO, SIGNED_HELLO, BulkSealer, ReplayGuard, _connection_key, open_message, open_signed,
                          seal_message)
from p2p.protocol import RemoteProtocolError
from p2p.wire import decode, encode

RING = Keyring((bytes([1]) * 32,))
NOW = 1_800_000_000.0
A, B, C = Identity.generate(), Identity.generate(), Identity.generate()
ALLOWED = frozenset({A.public, B.public})


def frames_of(src="a:1", exchange=3):
    return [bytes(memoryview(f).cast("B")) for f in encode(AvgRequest(exchange, 7, "k", np.arange(50, dtype=np.float32)), src)]


def reason(fn, *args):
    with pytest.raises(RemoteProtocolError) as info:
        fn(*args)
    return info.value.reason


def opened(frames, allowed=ALLOWED, guard=None):
    return open_signed(RING, guard or ReplayGuard(), frames, NOW, allowed)


# -- control messages ---------------------------------------------------------------------------
def test_a_signed_message_opens_to_its_signer_and_frames():
    plain = frames_of()
    sealed = seal_message(RING, plain, NOW, identity=A)
    assert len(sealed) == len(plain) + 2  # header, signature frame, the frames
    assert A.public not in b"".join(sealed)  # the signer is hidden inside the seal
    signer, back = opened(sealed)
    assert signer == A.public and back == plain and decode(back)[1].exchange == 3


def test_a_key_off_the_allow_list_is_refused_even_with_the_swarm_key():
    assert reason(opened, seal_message(RING, frames_of(), NOW, identity=C)) == "not_allowed"


def test_an_unsigned_or_stripped_message_is_refused():
    assert reason(opened, seal_message(RING, frames_of(), NOW)) == "unsigned"
    # An insider with the swarm key opens a member's message, strips the signature, re-seals it.
    inner = open_message(RING, ReplayGuard(), seal_message(RING, frames_of(), NOW, identity=A), NOW)
    assert reason(opened, seal_message(RING, inner[1:], NOW)) == "unsigned"


def test_a_signature_made_by_another_key_does_not_pass_as_a_members():
    plain = frames_of()
    header_and_frames = seal_message(RING, plain, NOW, identity=C)  # C signs...
    inner = open_message(RING, ReplayGuard(), header_and_frames, NOW)
    _, _, signature = SIGNATURE_FRAME.unpack(inner[0])
    forged = SIGNATURE_FRAME.pack(b"I1", A.public, signature)  # ...and claims to be A
    nonce = bytes(12)
    resealed = seal_message(RING, [forged, *plain], NOW, nonce=nonce)
    assert reason(opened, resealed) == "bad_signature"


def test_a_members_message_resealed_under_a_fresh_nonce_or_another_sender_is_refused():
    """Replay by an insider: the seal's replay window would pass a fresh nonce, but the
    signature covers the seal header, and the sender named in the frames."""
    sealed = seal_message(RING, frames_of(), NOW, identity=A)
    inner = open_message(RING, ReplayGuard(), sealed, NOW)
    assert reason(opened, seal_message(RING, inner, NOW + 1)) == "bad_signature"  # new nonce, same signature
    other_sender = frames_of(src="c:1")
    assert reason(opened, seal_message(RING, [inner[0], *other_sender], NOW + 1)) == "bad_signature"
    guard = ReplayGuard()
    opened(sealed, guard=guard)
    assert reason(opened, sealed, ALLOWED, guard) == "replay"  # the very same message: the seal's guard


def test_a_tampered_signature_frame_is_refused_whatever_the_bit():
    plain = frames_of()
    nonce = os.urandom(12)
    header = seal_message(RING, plain, NOW, nonce=nonce)[0]
    good = sign_control(A, header, plain)
    rng = random.Random(0)
    for _ in range(50):
        frame = bytearray(good)
        bit = rng.randrange(8 * len(frame))
        frame[bit // 8] ^= 1 << (bit % 8)
        assert reason(opened, seal_message(RING, [bytes(frame), *plain], NOW, nonce=nonce)) in (
            "unsigned", "not_allowed", "bad_signature")


def test_a_client_reads_a_signed_reply_from_any_key_but_not_an_unsigned_one():
    signer, _ = opened(seal_message(RING, frames_of(), NOW, identity=C), None)
    assert signer == C.public
    assert reason(opened, seal_message(RING, frames_of(), NOW), None) == "unsigned"


# -- the bulk stream ----------------------------------------------------------------------------
def big(i, numel=400_000):
    return AvgRequest(i, 0, "k", np.random.default_rng(i).standard_normal(numel).astype(np.float32))


def stream(identity, messages=(big(1),), sealer=None):
    sealer = sealer or BulkSealer(RING, NOW, identity=identity)
    out = [sealer.hello]
    for i, msg in enumerate(messages):
        out += [bytes(sealer.seal(c)) for c in sealed_chunks(stream_parts(i, encode(msg, "a:1")))]
    return b"".join(out)


def read(data, allowed=ALLOWED, guard=None):
    reader = SealedReader(StreamReader(BufferPool(2), 1 << 28, 1 << 16, 0.0), lambda: RING, guard or ReplayGuard(),
                          lambda: NOW, 0.0, lambda: allowed)
    got, pos = [], 0
    while pos < len(data):
        target = reader.target()
        n = min(len(target), len(data) - pos)
        target[:n] = data[pos:pos + n]
        pos += n
        frames = reader.advance(n, 0.0)
        if frames is not None:
            got.append(frames)
    return reader, got


def test_a_signed_bulk_stream_reads_with_its_signer():
    reader, got = read(stream(A))
    assert reader.signer == A.public and len(got) == 1 and decode(got[0])[1].exchange == 1


def test_bulk_streams_unsigned_or_from_a_key_off_the_list_are_refused_at_the_hello():
    assert reason(read, stream(C)) == "not_allowed"
    assert reason(read, stream(None)) == "unsigned"
    assert reason(read, stream(A), None) == "malformed"  # a node without identities: not its format


def test_a_bulk_hello_that_claims_a_members_key_with_another_signature_is_refused():
    """An insider holding the swarm key can make a valid tag for any hello; not A's signature."""
    salt = os.urandom(16)
    clear = HELLO.pack(SIGNED_HELLO, RING.primary_id, salt, int(NOW * 1000))
    claimed = A.public + sign_hello(C, clear)[32:]
    tag = _connection_key(RING.primary, salt, A.public).encrypt(bytes(12), b"", clear + claimed)
    assert reason(read, clear + claimed + tag) == "bad_signature"


def test_a_replayed_signed_connection_is_refused():
    guard, data = ReplayGuard(), stream(A)
    read(data, guard=guard)
    assert reason(read, data, ALLOWED, guard) == "replay"


def test_records_are_bound_to_the_hellos_identity():
    """Records sealed for A's connection do not read after a hello naming B (another key)."""
    salt = os.urandom(16)
    a_stream = stream(A, sealer=BulkSealer(RING, NOW, salt=salt, identity=A))
    b_hello = BulkSealer(RING, NOW, salt=salt, identity=B).hello
    assert reason(read, b_hello + a_stream[len(b_hello):]) in ("bad_key", "malformed")


# -- files, bindings ----------------------------------------------------------------------------
def write(path, text, mode):
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return str(path)


def test_an_identity_file_round_trips_and_must_be_private(tmp_path):
    path = write(tmp_path / "node.id", A.file_text(), 0o600)
    assert load_identity_file(path).public == A.public
    assert public_line(A.public) in A.file_text()  # (in a comment: the line for allow files)
    write(tmp_path / "node.id", A.file_text(), 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_identity_file(path)
    write(tmp_path / "node.id", "not a key\n", 0o600)
    with pytest.raises(KeyFileError, match="p2p keygen --identity"):
        load_identity_file(path)


def test_allow_files_list_keys_with_comments_and_refuse_bad_lines_or_others_writing(tmp_path):
    text = f"# the swarm\n{public_line(A.public)}  # node a\n\n{public_line(B.public)}\n"
    path = write(tmp_path / "allow", text, 0o644)  # others may read it
    assert load_allow_file(path) == ALLOWED
    for bad, mode, expected in ((text, 0o666, "chmod 644"), ("nope\n", 0o644, "line 1"), ("# none\n", 0o644, "no public key")):
        write(tmp_path / "allow", bad, mode)
        with pytest.raises(KeyFileError, match=expected):
            load_allow_file(path)


def test_the_allow_file_is_reread_when_it_changes_and_a_broken_edit_keeps_the_old_list(tmp_path):
    path = tmp_path / "allow"
    write(path, f"{public_line(A.public)}\n{public_line(B.public)}\n", 0o644)
    allow = AllowFile(str(path))
    assert allow.allowed == ALLOWED and not allow.reload_if_changed()
    write(path, f"{public_line(A.public)}\n", 0o644)  # B taken off
    assert allow.reload_if_changed() and allow.allowed == {A.public} and allow.reloads == 1
    write(path, "garbage\n", 0o644)
    assert not allow.reload_if_changed() and allow.allowed == {A.public} and "line 1" in allow.last_error


def test_a_node_id_is_bound_to_the_first_key_seen_with_it_until_that_key_leaves():
    bindings = Bindings()
    bindings.check("a:1", A.public)
    bindings.check("a:1", A.public)
    bindings.check("b:1", B.public)
    assert reason(bindings.check, "a:1", B.public) == "identity_mismatch"  # B claims a's id
    bindings.keep_only(frozenset({B.public}))  # A taken off the allow file: a:1 may be re-keyed
    bindings.check("a:1", C.public)
    assert len(bindings) == 2


def test_bindings_are_bounded():
    bindings = Bindings(capacity=3)
    for i in range(3):
        bindings.check(f"n:{i}", A.public)
    assert reason(bindings.check, "n:9", A.public) == "identity_mismatch"


def test_identities_go_together_and_need_the_swarm_key(tmp_path):
    from p2p.config import SettingError, swarm_config

    key = write(tmp_path / "swarm.key", "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n", 0o600)
    node = write(tmp_path / "node.id", A.file_text(), 0o600)
    allow = write(tmp_path / "allow", public_line(A.public) + "\n", 0o644)
    for settings, problem in (({"identity": node}, "both identity"), ({"allow": allow}, "both identity"),
                              ({"identity": node, "allow": allow}, "give swarm_key too")):
        with pytest.raises(SettingError, match=problem):
            swarm_config(**settings)
    config = swarm_config(identity=node, allow=allow, swarm_key=key)
    assert (config.identity, config.allow) == (node, allow)


class _Peer:  # what the driver hands accepted messages to
    def __init__(self):
        self.got = []

    def receive(self, src, msg, now):
        self.got.append(src)
        return []


def test_the_driver_binds_node_ids_refuses_another_key_logs_once_per_key_and_forgets_on_reload(tmp_path, caplog):
    import logging

    from p2p.net.driver import NetworkDriver
    from p2p.net.ports import bind_transport
    from p2p.net.transport import Incoming, TransportConfig
    from p2p.gossip.messages import Ping

    allow_path = tmp_path / "allow"
    write(allow_path, f"{public_line(A.public)}\n{public_line(B.public)}\n", 0o644)
    allow = AllowFile(str(allow_path))
    t, addr = bind_transport(TransportConfig(), "127.0.0.1:0", RING, identity=A, allowed=allow.allowed)
    peer = _Peer()
    driver = NetworkDriver(t, peer, addr, dict, None, 1.0, allow_file=allow)

    def deliver(src, signer):
        driver._handle(Incoming(b"x", encode(Ping(1, src, addr), src), signer=signer))

    try:
        with caplog.at_level(logging.WARNING, logger="p2p.events"):
            deliver("b:1", B.public)
            for _ in range(5):
                deliver("b:1", A.public)  # A's key claims b:1, bound to B
            assert peer.got == ["b:1"] and driver.rejected == {"identity_mismatch": 5}
            assert sum("identity_mismatch" in r.getMessage() for r in caplog.records) == 1  # once for that key
            write(allow_path, f"{public_line(A.public)}\n{public_line(C.public)}\n", 0o644)  # B off, C on
            driver._reload_allowed()
            assert t.allowed == {A.public, C.public} and allow.reloads == 1
            deliver("b:1", C.public)  # b:1 re-keyed: its old binding went with B's key
            assert peer.got == ["b:1", "b:1"]
    finally:
        os.close(driver._wake_read)  # (never started: nothing else to stop)
        os.close(driver._wake_write)
        t.close()


def test_a_transport_closes_the_bulk_streams_of_a_key_taken_off_and_refuses_its_messages():
    import time

    from p2p.net.ports import bind_transport
    from p2p.net.transport import TransportConfig

    a, _ = bind_transport(TransportConfig(), "127.0.0.1:0", RING, identity=A, allowed=ALLOWED)
    b, b_addr = bind_transport(TransportConfig(), "127.0.0.1:0", RING, identity=B, allowed=ALLOWED)

    def receive_one():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            a.receive(0.01, time.monotonic())  # (drives its sends: connect, then writes)
            got = b.receive(0.05, time.monotonic())
            if got:
                return got[0]
        pytest.fail("nothing arrived")

    try:
        a.send(b_addr, encode(big(1), "a:1"), time.monotonic())  # large: on the bulk stream
        first = receive_one()
        assert first.error is None and first.signer == A.public and len(b._in) == 1
        b.done(first)
        b.set_allowed(frozenset({B.public}))  # A taken off b's allow file
        assert not b._in  # its stream closed at once
        a.send(b_addr, frames_of(), time.monotonic())  # and its control messages are refused
        assert receive_one().error.reason == "not_allowed"
    finally:
        a.close()
        b.close()
