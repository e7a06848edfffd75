"""Chunked transfers: reassembly limits (pure) and the real transport over loopback."""

import time

import msgpack
import numpy as np
import pytest

from p2p.averaging.adpsgd import AvgRequest
from p2p.bulk import BulkConfig, Reassembler, chunk_records, kind_of, start_record
from p2p.control import StatusRequest
from p2p.protocol import RemoteProtocolError
from p2p.swarm import free_ports
from p2p.transport import Transport, TransportConfig
from p2p.wire import decode, encode

CFG = BulkConfig(threshold_bytes=1024, chunk_bytes=1000, max_transfers_per_sender=2, stall_timeout_s=5.0)


def feed(reassembler, sender, records, now=0.0):
    """Deliver records as the transport would; return completed frames."""
    done = []
    for record in records:
        first = bytes(record[0])
        if kind_of(first) == "start":
            reassembler.start(sender, first, bytes(record[1]), bytes(record[2]), now)
            continue
        key, target = reassembler.chunk_target(sender, first, now)
        payload = bytes(record[1])
        target[:len(payload)] = payload
        frames = reassembler.chunk_done(key, len(payload))
        if frames is not None:
            done.append(frames)
    return done


def records_for(msg, transfer_id=1, chunk=1000):
    frames = encode(msg, "a:1")
    return [start_record(transfer_id, frames), *chunk_records(transfer_id, frames, chunk)]


def test_reassembled_message_decodes_to_the_original():
    params = np.random.default_rng(0).standard_normal(2500).astype(np.float32)
    r = Reassembler(CFG, max_message_bytes=1 << 20)
    (frames,) = feed(r, b"s", records_for(AvgRequest(7, 3, "k", params)))
    _, msg = decode(frames)
    assert msg.exchange == 7 and np.array_equal(msg.params, params)
    assert r.open_transfers() == 0


def test_buffers_are_reused_only_when_nothing_holds_them():
    params = np.ones(2500, dtype=np.float32)
    r = Reassembler(CFG, max_message_bytes=1 << 20)
    (frames,) = feed(r, b"s", records_for(AvgRequest(1, 0, "k", params)))
    _, kept = decode(frames)  # a protocol object keeps the message
    first_buffer = id(frames[1].obj)
    r.release(frames)
    (frames2,) = feed(r, b"s", records_for(AvgRequest(2, 0, "k", params * 2), transfer_id=2))
    assert id(frames2[1].obj) != first_buffer  # still referenced: not reused
    assert np.array_equal(kept.params, params)  # and not overwritten
    del kept
    buffer2 = id(frames2[1].obj)
    r.release(frames2)
    (frames3,) = feed(r, b"s", records_for(AvgRequest(3, 0, "k", params), transfer_id=3))
    assert id(frames3[1].obj) == buffer2  # nothing held it: reused, no fresh page faults


def test_limits_are_enforced_before_payload_arrives():
    r = Reassembler(CFG, max_message_bytes=5000)
    big = records_for(AvgRequest(1, 0, "k", np.ones(2000, dtype=np.float32)))
    with pytest.raises(RemoteProtocolError) as info:
        feed(r, b"s", big[:1])
    assert info.value.reason == "oversized"
    small = [records_for(AvgRequest(i, 0, "k", np.ones(500, dtype=np.float32)), transfer_id=i)[0] for i in (1, 2, 3)]
    feed(r, b"s", small[:2])
    with pytest.raises(RemoteProtocolError) as info:
        feed(r, b"s", small[2:])
    assert info.value.reason == "too_many_transfers"
    feed(r, b"other", small[2:])  # the limit is per sender


@pytest.mark.parametrize("mutate, reason", [
    (lambda recs: recs[1:], "unknown_transfer"),  # chunk without a start
    (lambda recs: [recs[0], recs[2]], "malformed"),  # a chunk skipped
    (lambda recs: [recs[0], recs[0]], "malformed"),  # started twice
    (lambda recs: [[recs[0][0], recs[0][1], b"\xc1"]], "malformed"),  # garbage size list
    (lambda recs: [[recs[0][0], recs[0][1], msgpack.packb([-1])]], "malformed"),
    (lambda recs: [[recs[0][0], recs[0][1], msgpack.packb([0])]], "malformed"),
])
def test_malformed_transfers_are_rejected(mutate, reason):
    r = Reassembler(CFG, max_message_bytes=1 << 20)
    recs = records_for(AvgRequest(1, 0, "k", np.ones(2500, dtype=np.float32)))
    with pytest.raises(RemoteProtocolError) as info:
        feed(r, b"s", mutate(recs))
    assert info.value.reason == reason


def test_chunk_running_past_the_end_is_rejected():
    r = Reassembler(CFG, max_message_bytes=1 << 20)
    recs = records_for(AvgRequest(1, 0, "k", np.ones(250, dtype=np.float32)))
    feed(r, b"s", recs[:1])
    key, target = r.chunk_target(b"s", bytes(recs[1][0]), 0.0)
    with pytest.raises(RemoteProtocolError):
        r.chunk_done(key, len(target) + 1)  # zmq reports the full size of a truncated chunk


def test_stalled_transfers_expire():
    r = Reassembler(CFG, max_message_bytes=1 << 20)
    recs = records_for(AvgRequest(1, 0, "k", np.ones(2500, dtype=np.float32)))
    feed(r, b"s", recs[:2], now=0.0)
    assert r.expire(now=4.0) == 0 and r.expire(now=6.0) == 1 and r.open_transfers() == 0


def receive_until(transport, count, timeout_s=10.0):
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += transport.receive(0.1, time.monotonic())
    return got


def test_large_and_small_messages_over_real_sockets():
    a_port, b_port = free_ports(2)
    a_addr, b_addr = f"127.0.0.1:{a_port}", f"127.0.0.1:{b_port}"
    config = TransportConfig(bulk=BulkConfig(chunk_bytes=64 * 1024))
    a, b = Transport(config, a_addr), Transport(config, b_addr)
    try:
        params = np.random.default_rng(1).standard_normal(1_000_000).astype(np.float32)  # 4 MB
        now = time.monotonic()
        assert a.send(b_addr, encode(AvgRequest(1, 0, "k", params), a_addr), now)
        assert a.send(b_addr, encode(StatusRequest(), a_addr), now)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            a.pump(time.monotonic())
            got += b.receive(0.05, time.monotonic())
        assert len(got) == 2 and all(g.error is None for g in got)
        messages = {type(decode(g.frames)[1]).__name__: decode(g.frames)[1] for g in got}
        assert np.array_equal(messages["AvgRequest"].params, params)
        assert b.bytes_received >= params.nbytes and a.bytes_sent >= params.nbytes
    finally:
        a.close()
        b.close()


def test_pending_large_messages_per_peer_are_bounded():
    a_port, silent = free_ports(2)
    a = Transport(TransportConfig(bulk=BulkConfig(max_pending_per_peer=2, chunk_bytes=65536)), f"127.0.0.1:{a_port}")
    try:
        big = encode(AvgRequest(1, 0, "k", np.ones(4_000_000, dtype=np.float32)), "a:1")
        results = [a.send(f"127.0.0.1:{silent}", big, 0.0) for _ in range(5)]
        assert results == [True, True, False, False, False]
        assert a.send_drops == 3
    finally:
        a.close()
