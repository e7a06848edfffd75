"""The swarm key (pure parts): key files, sealing control messages, sealing the bulk stream's
records, replay protection, rotation."""

import base64
import os
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.averaging.adpsgd import AvgRequest
from p2p.net.bulk import BufferPool, SealedReader, StreamReader, sealed_chunks, stream_parts
from p2p.net.keyring import KeyFile, KeyFileError, Keyring, key_id, load_key_file, new_key_line
from p2p.net.seal import (HEADER, HELLO_BYTES, RECORD_BYTES, BulkSealer, ReplayGuard, open_message,
                          seal_message)
from p2p.protocol import RemoteProtocolError
from p2p.wire import decode, encode

K1, K2, K3 = (bytes([i]) * 32 for i in (1, 2, 3))
NOW = 1_800_000_000.0  # wall clock seconds


def frames_of(msg=None):
    msg = msg or AvgRequest(3, 7, "k", np.arange(1000, dtype=np.float32))
    return [bytes(memoryview(f).cast("B")) for f in encode(msg, "a:1")]


def opened(ring, frames, guard=None, now=NOW):
    return open_message(ring, guard or ReplayGuard(), frames, now)


def reason(fn, *args):
    with pytest.raises(RemoteProtocolError) as info:
        fn(*args)
    return info.value.reason


# -- control messages ---------------------------------------------------------------------------
def test_a_sealed_message_opens_to_its_frames_and_decodes():
    plain = frames_of()
    sealed = seal_message(Keyring((K1,)), plain, NOW)
    assert len(sealed) == len(plain) + 1 and len(sealed[0]) == HEADER.size
    assert all(bytes(p) not in s for p, s in zip(plain, sealed[1:]))  # encrypted, not just signed
    back = opened(Keyring((K1,)), sealed)
    assert back == plain
    assert decode(back)[1].exchange == 3


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_bit_flipped_anywhere_is_rejected(data):
    sealed = seal_message(Keyring((K1,)), frames_of(), NOW)
    which = data.draw(st.integers(0, len(sealed) - 1))
    frame = bytearray(sealed[which])
    bit = data.draw(st.integers(0, 8 * len(frame) - 1))
    frame[bit // 8] ^= 1 << (bit % 8)
    sealed[which] = bytes(frame)
    with pytest.raises(RemoteProtocolError) as info:
        opened(Keyring((K1,)), sealed)
    # a flipped header bit may change the version (unauthenticated), the key id (no_key), the
    # time (out of the window: replay) or anything else the tags cover (bad_key)
    assert info.value.reason in {"bad_key", "no_key", "unauthenticated", "replay"}


@settings(max_examples=100, deadline=None)
@given(st.permutations(range(3)), st.integers(0, 2))
def test_reordered_dropped_or_spliced_frames_are_rejected(order, drop):
    ring = Keyring((K1,))
    msg = frames_of() + [b"third frame, as a message may have"]
    sealed = seal_message(ring, msg, NOW)
    body = sealed[1:]
    if list(order) != [0, 1, 2]:
        assert reason(opened, ring, [sealed[0], *(body[i] for i in order)]) == "bad_key"
    assert reason(opened, ring, [sealed[0], *(f for i, f in enumerate(body) if i != drop)]) == "bad_key"
    other = seal_message(ring, msg, NOW)  # another message's frame in its place
    spliced = list(sealed)
    spliced[1 + drop] = other[1 + drop]
    assert reason(opened, ring, spliced) == "bad_key"


def test_a_replayed_message_is_rejected_and_so_is_one_outside_the_time_window():
    ring, guard = Keyring((K1,)), ReplayGuard(window_s=120)
    sealed = seal_message(ring, frames_of(), NOW)
    opened(ring, sealed, guard)
    assert reason(opened, ring, sealed, guard) == "replay"
    assert reason(opened, ring, seal_message(ring, frames_of(), NOW - 121), guard) == "replay"
    assert reason(opened, ring, seal_message(ring, frames_of(), NOW + 121), guard) == "replay"
    opened(ring, seal_message(ring, frames_of(), NOW - 119), guard)  # within the window: fine
    # long after, the same message is still refused: by the window now, not the memory
    assert reason(opened, ring, sealed, guard, NOW + 300) == "replay"


def test_the_replay_memory_is_bounded_and_what_it_forgets_is_still_refused():
    guard = ReplayGuard(window_s=120, capacity=3)
    now_ms = int(NOW * 1000)
    for i in range(10):
        guard.admit(bytes([i]) * 12, now_ms + i, now_ms + i)
    assert len(guard._order) <= 3
    for i in range(7):  # forgotten: refused by the floor
        with pytest.raises(RemoteProtocolError):
            guard.admit(bytes([i]) * 12, now_ms + i, now_ms + 10)
    guard.admit(b"new nonce...", now_ms + 11, now_ms + 11)


def test_a_key_we_do_not_hold_and_a_plain_message_are_told_apart():
    sealed = seal_message(Keyring((K2,)), frames_of(), NOW)
    assert reason(opened, Keyring((K1,)), sealed) == "no_key"
    assert reason(opened, Keyring((K1,)), frames_of()) == "unauthenticated"
    # another key under our key's id (a collision, or a forgery): the tag fails
    forged = seal_message(Keyring((K2,)), frames_of(), NOW)
    forged[0] = forged[0][:1] + key_id(K1) + forged[0][5:]
    assert reason(opened, Keyring((K1,)), forged) == "bad_key"
    assert reason(opened, Keyring((K2,)), [sealed[0]]) == "malformed"  # no body
    assert reason(opened, Keyring((K2,)), [sealed[0], b"short"]) == "malformed"


def test_a_node_without_a_key_refuses_sealed_messages_as_malformed():
    sealed = seal_message(Keyring((K1,)), frames_of(), NOW)
    assert reason(decode, sealed) == "malformed"


def test_rotation_old_key_accepted_while_listed_refused_once_removed():
    old_sender = Keyring((K1,))
    during = Keyring((K2, K1))  # new key first: sends with K2, still accepts K1
    after = Keyring((K2,))
    msg = seal_message(old_sender, frames_of(), NOW)
    assert opened(during, msg) == frames_of()
    assert opened(Keyring((K1, K2)), seal_message(during, frames_of(), NOW)) == frames_of()
    assert reason(opened, after, msg) == "no_key"


# -- the bulk stream ----------------------------------------------------------------------------
def sealed_stream(ring, messages, now=NOW):
    sealer = BulkSealer(ring, now)
    out = [sealer.hello]
    for i, msg in enumerate(messages):
        out += [bytes(sealer.seal(c)) for c in sealed_chunks(stream_parts(i, encode(msg, "a:1")))]
    return out  # hello, then records


def sealed_reader(ring, guard=None, pool=None):
    inner = StreamReader(pool or BufferPool(2), 1 << 28, 1 << 16, 0.0)
    return SealedReader(inner, lambda: ring, guard or ReplayGuard(), lambda: NOW, 0.0)


def feed(reader, data, rng):
    done, pos = [], 0
    while pos < len(data):
        target = reader.target()
        n = min(len(target), len(data) - pos, rng.randint(1, 3_000_000))
        target[:n] = data[pos:pos + n]
        pos += n
        frames = reader.advance(n, 0.0)
        if frames is not None:
            done.append(frames)
    return done


def big(i, numel=700_000):  # 2.8 MB: three records
    return AvgRequest(i, 0, "k", np.random.default_rng(i).standard_normal(numel).astype(np.float32))


def test_sealed_bulk_messages_split_anywhere_reassemble():
    ring = Keyring((K1,))
    messages = [big(1), AvgRequest(2, 0, "k", np.zeros(3, np.float32)), big(3)]
    stream = b"".join(sealed_stream(ring, messages))
    assert stream.count(memoryview(messages[0].params).cast("B")[:64].tobytes()) == 0
    got = feed(sealed_reader(ring), stream, random.Random(0))
    assert [decode(g)[1].exchange for g in got] == [1, 2, 3]
    assert np.array_equal(decode(got[2])[1].params, messages[2].params)


def test_records_are_at_most_a_mebibyte_and_oversized_lengths_are_refused_before_allocating():
    ring = Keyring((K1,))
    pieces = sealed_stream(ring, [big(1)])
    assert max(len(p) for p in pieces) <= 4 + RECORD_BYTES + 16
    reader = sealed_reader(ring)
    feed(reader, pieces[0], random.Random(0))
    target = reader.target()
    target[:4] = (RECORD_BYTES + 17).to_bytes(4, "big")
    with pytest.raises(RemoteProtocolError, match="oversized"):
        reader.advance(4, 0.0)


@pytest.mark.parametrize("change", ["tamper", "drop", "swap", "repeat"])
def test_a_tampered_dropped_reordered_or_replayed_record_is_rejected(change):
    ring = Keyring((K1,))
    hello, *records = sealed_stream(ring, [big(1), big(2)])
    if change == "tamper":
        r = bytearray(records[2])
        r[100] ^= 1
        records[2] = bytes(r)
    elif change == "drop":
        del records[2]
    elif change == "swap":
        records[1], records[2] = records[2], records[1]
    else:
        records.insert(2, records[1])
    with pytest.raises(RemoteProtocolError) as info:
        feed(sealed_reader(ring), hello + b"".join(records), random.Random(1))
    assert info.value.reason in ("bad_key", "malformed")


def test_a_replayed_connection_and_foreign_or_plain_streams_are_rejected_at_the_hello():
    ring, guard = Keyring((K1,)), ReplayGuard()
    stream = b"".join(sealed_stream(ring, [big(1)]))
    assert len(feed(sealed_reader(ring, guard), stream, random.Random(0))) == 1
    with pytest.raises(RemoteProtocolError, match="replay"):  # the whole connection again
        feed(sealed_reader(ring, guard), stream, random.Random(0))
    with pytest.raises(RemoteProtocolError, match="no_key"):
        feed(sealed_reader(ring), b"".join(sealed_stream(Keyring((K2,)), [big(1)])), random.Random(0))
    plain = b"".join(bytes(p) for p in stream_parts(1, encode(big(1), "a:1")))
    with pytest.raises(RemoteProtocolError, match="unauthenticated"):
        feed(sealed_reader(ring), plain[:HELLO_BYTES], random.Random(0))
    with pytest.raises(RemoteProtocolError, match="bad magic"):  # a node without a key
        feed(StreamReader(BufferPool(1), 1 << 28, 1 << 16, 0.0), stream, random.Random(0))


def test_a_connection_made_with_an_old_key_is_read_while_the_key_is_listed():
    stream = b"".join(sealed_stream(Keyring((K1,)), [big(1)]))
    assert len(feed(sealed_reader(Keyring((K2, K1))), stream, random.Random(0))) == 1
    with pytest.raises(RemoteProtocolError, match="no_key"):
        feed(sealed_reader(Keyring((K2,))), stream, random.Random(0))


# -- key files ----------------------------------------------------------------------------------
def write(path, text, mode=0o600):
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_a_key_file_lists_keys_in_order_with_comments_and_blank_lines(tmp_path):
    a, b = new_key_line(), new_key_line()
    path = write(tmp_path / "swarm.key", f"# swarm key\n{a}\n\n{b}  # the next one\n")
    ring = load_key_file(path)
    assert ring.keys == (base64.b64decode(a), base64.b64decode(b))
    assert ring.describe().startswith(f"encrypted (AES-256-GCM, key {key_id(ring.primary).hex()}, 2 keys")


@pytest.mark.parametrize("text, mode, expected", [
    ("KEY", 0o644, "chmod 600"),
    ("KEY", 0o620, "chmod 600"),
    ("KEY", 0o604, "chmod 600"),
    ("# nothing\n\n", 0o600, "holds no key"),
    ("bm90IGEga2V5", 0o600, "line 1: not a base64 32-byte key"),
    ("KEY\n!!!", 0o600, "line 2: not a base64 32-byte key"),
])
def test_unsafe_or_malformed_key_files_are_refused_in_one_line(tmp_path, text, mode, expected):
    path = write(tmp_path / "k", text.replace("KEY", new_key_line()), mode)
    with pytest.raises(KeyFileError) as info:
        load_key_file(path)
    assert expected in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(KeyFileError, match="cannot read swarm key file"):
        load_key_file(str(tmp_path / "missing"))


def test_the_key_file_is_reread_when_it_changes_and_a_broken_edit_keeps_the_old_keys(tmp_path):
    a, b = new_key_line(), new_key_line()
    path = write(tmp_path / "k", a + "\n")
    keys = KeyFile(path)
    assert not keys.reload_if_changed()
    write(tmp_path / "k", f"{a}\n{b}\n")
    assert keys.reload_if_changed() and len(keys.keyring.keys) == 2 and keys.reloads == 1
    write(tmp_path / "k", f"{b}\nnot a key\n")
    assert not keys.reload_if_changed() and len(keys.keyring.keys) == 2 and "line 2" in keys.last_error
    write(tmp_path / "k", f"{b}\n")
    assert keys.reload_if_changed() and keys.keyring.keys == (base64.b64decode(b),) and keys.last_error is None


# -- hostile input never gets further than a RemoteProtocolError ---------------------------------
@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=20), st.booleans())
def test_any_frames_open_or_raise_a_remote_protocol_error(frames, sealed_header):
    if sealed_header and frames:  # a well-formed header with our key id: the body is what varies
        frames[0] = HEADER.pack(1, key_id(K1), os.urandom(12), int(NOW * 1000))
    with pytest.raises(RemoteProtocolError):
        opened(Keyring((K1,)), frames)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=5000), st.booleans(), st.integers(0, 2**32 - 1))
def test_any_bytes_on_a_sealed_stream_are_refused_or_wait_but_never_deliver(data, after_hello, seed):
    ring = Keyring((K1,))
    reader = sealed_reader(ring)
    prefix = BulkSealer(ring, NOW).hello if after_hello else b""
    try:
        got = feed(reader, prefix + data, random.Random(seed))
    except RemoteProtocolError:
        return
    assert got == []  # nothing forged is ever delivered (at most it waits for more bytes)
