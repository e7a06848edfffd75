"""Large messages on the bulk TCP stream: the reader's framing and limits (pure), and the real
transport over loopback."""

import ctypes
import random
import socket
import struct
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from p2p.averaging.adpsgd import AvgRequest
from p2p.net.bulk import MAGIC, BufferPool, StreamReader, stream_parts
from p2p.net.control import StatusRequest
from p2p.protocol import RemoteProtocolError
from p2p.net.ports import free_ports
from p2p.net.transport import Transport, TransportConfig, TransportError
from p2p.net.bulk import BulkConfig
from p2p.wire import DEFAULT_LIMITS, decode, encode


def wire_bytes(msg, transfer_id=1) -> bytes:
    return b"".join(bytes(p) for p in stream_parts(transfer_id, encode(msg, "a:1")))


def feed(reader, data: bytes, rng=None, now=0.0):
    """Deliver ``data`` as a socket would, in pieces of random size; return completed frames."""
    rng = rng or random.Random(0)
    done, pos = [], 0
    while pos < len(data):
        target = reader.target()
        n = min(len(target), len(data) - pos, rng.randint(1, 70_000))
        target[:n] = data[pos:pos + n]
        pos += n
        frames = reader.advance(n, now)
        if frames is not None:
            done.append(frames)
    return done


def reader(pool=None, max_message_bytes=1 << 24, max_header_bytes=1 << 16):
    return StreamReader(pool or BufferPool(4), max_message_bytes, max_header_bytes, 0.0)


def test_messages_split_anywhere_reassemble_and_decode_to_the_originals():
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(n).astype(np.float32) for n in (2500, 70_000, 1)]
    data = b"".join(wire_bytes(AvgRequest(i, 3, "k", p), transfer_id=i) for i, p in enumerate(params))
    r = reader()
    got = feed(r, data)
    assert len(got) == 3 and not r.mid_message()
    for i, (frames, p) in enumerate(zip(got, params)):
        _, msg = decode(frames)
        assert msg.exchange == i and np.array_equal(msg.params, p)


def test_a_message_of_empty_tensors_is_delivered_without_payload():
    (frames,) = feed(reader(), wire_bytes(AvgRequest(1, 0, "k", np.empty(0, np.float32))))
    _, msg = decode(frames)
    assert msg.params.size == 0


def test_buffers_are_reused_only_when_nothing_holds_them():
    pool = BufferPool(4)
    r = reader(pool)
    params = np.ones(2500, dtype=np.float32)
    (frames,) = feed(r, wire_bytes(AvgRequest(1, 0, "k", params)))
    _, kept = decode(frames)  # a protocol object keeps the message
    first_buffer = id(frames[1].obj)
    pool.release(frames)
    (frames2,) = feed(r, wire_bytes(AvgRequest(2, 0, "k", params * 2)))
    assert id(frames2[1].obj) != first_buffer  # still referenced: not reused
    assert np.array_equal(kept.params, params)  # and not overwritten
    del kept
    buffer2 = id(frames2[1].obj)
    pool.release(frames2)
    (frames3,) = feed(r, wire_bytes(AvgRequest(3, 0, "k", params)))
    assert id(frames3[1].obj) == buffer2  # nothing held it: reused, no fresh page faults


def _prefix(header_len, count, magic=MAGIC):
    return struct.pack("!4sQIH", magic, 1, header_len, count)


@pytest.mark.parametrize("data, reason", [
    (_prefix(10, 1, magic=b"HTTP"), "malformed"),  # not our stream
    (_prefix(0, 1), "malformed"),  # no header
    (_prefix(1 << 17, 1), "oversized"),  # header over the limit
    (_prefix(10, 16), "oversized"),  # more tensor frames than a message may have
])
def test_bad_prefixes_are_rejected_before_anything_else_is_read(data, reason):
    r = reader()
    with pytest.raises(RemoteProtocolError) as err:
        feed(r, data)
    assert err.value.reason == reason


def test_the_declared_size_is_checked_before_any_payload_arrives():
    data = wire_bytes(AvgRequest(1, 0, "k", np.ones(2000, dtype=np.float32)))
    meta_len = len(stream_parts(1, encode(AvgRequest(1, 0, "k", np.ones(2000, np.float32)), "a:1"))[0])
    r = reader(max_message_bytes=5000)
    with pytest.raises(RemoteProtocolError) as err:
        feed(r, data[:meta_len])  # prefix and meta only
    assert err.value.reason == "oversized"


# In a fresh process (the threshold is process-wide): a 2 MiB block, then a 20 MB declared size
# and a hang-up, then whether a 4 MiB block still gets a mapping of its own (mallinfo2's hblks).
_THRESHOLD_CHECK = """
import ctypes, struct
import numpy as np
from p2p.net.bulk import BufferPool, MAGIC, StreamReader
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
def mapped(nbytes):
    before = libc.mallinfo2().hblks
    block = np.empty(nbytes, np.uint8)
    return libc.mallinfo2().hblks - before
assert mapped(2 << 20) == 1, "malloc's threshold is past 2 MiB already: the check cannot tell"
reader = StreamReader(BufferPool(4), 1 << 31, 1 << 16, 0.0)
data = bytearray(struct.pack("!4sQIH", MAGIC, 1, 1, 1) + b"h" + struct.pack("!Q", 20_000_000) + bytes(100))
while data:
    target = reader.target()
    n = min(target.nbytes, len(data))
    target[:n] = data[:n]
    del data[:n]
    reader.advance(n, 0.0)
assert reader.mid_message()
del reader, target  # the sender hung up: the transport drops the connection's reader
print(mapped(4 << 20))
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc's malloc only")
def test_a_hostile_declared_size_does_not_raise_mallocs_mmap_threshold():
    # A receive buffer sized by the sender and freed after a hang-up must not come from malloc:
    # glibc would then keep every later block under that size in its heaps (p2p/net/bulk.py, _mapped).
    out = subprocess.run([sys.executable, "-c", _THRESHOLD_CHECK], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


def test_garbage_in_the_header_frame_is_caught_by_decode():
    header = b"\xc1" * 10  # not msgpack
    data = _prefix(len(header), 1) + header + struct.pack("!Q", 8) + bytes(8)
    (frames,) = feed(reader(), data)
    with pytest.raises(RemoteProtocolError):
        decode(frames)


# -- over real sockets --------------------------------------------------------------------------

def exchange(a, b, count, timeout_s=10.0):
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        a.receive(0.0, time.monotonic())  # the sender's loop pumps its bulk streams
        got += b.receive(0.05, time.monotonic())
    return got


def test_large_and_small_messages_over_real_sockets():
    a_port, b_port = free_ports(2)
    a_addr, b_addr = f"127.0.0.1:{a_port}", f"127.0.0.1:{b_port}"
    a, b = Transport(TransportConfig(), a_addr), Transport(TransportConfig(), b_addr)
    try:
        params = np.random.default_rng(1).standard_normal(1_000_000).astype(np.float32)  # 4 MB
        got = []
        for i in range(3):  # at most two queued per peer: the third waits for room
            deadline = time.monotonic() + 10
            while not a.send(b_addr, encode(AvgRequest(i, 0, "k", params * i), a_addr), time.monotonic()):
                assert time.monotonic() < deadline
                got += exchange(a, b, 1, timeout_s=0.05)
        assert a.send(b_addr, encode(StatusRequest(), a_addr), time.monotonic())
        got += exchange(a, b, 4 - len(got))
        assert len(got) == 4 and all(g.error is None for g in got)
        decoded = [decode(g.frames)[1] for g in got]
        requests = sorted((m for m in decoded if isinstance(m, AvgRequest)), key=lambda m: m.exchange)
        assert [m.exchange for m in requests] == [0, 1, 2]
        for m in requests:
            assert np.array_equal(m.params, params * m.exchange)
        assert b.bytes_received >= 3 * params.nbytes and a.bytes_sent >= 3 * params.nbytes
    finally:
        a.close()
        b.close()


def test_pending_large_messages_per_peer_are_bounded():
    a_port, silent = free_ports(2)
    never_reads = socket.socket()  # a peer that accepts the connection but never reads
    never_reads.bind(("127.0.0.1", silent + 1))
    never_reads.listen(1)
    a = Transport(TransportConfig(bulk=BulkConfig(max_pending_per_peer=2)), f"127.0.0.1:{a_port}")
    try:
        big = encode(AvgRequest(1, 0, "k", np.ones(16_000_000, dtype=np.float32)), "a:1")  # 64 MB
        now = time.monotonic()
        first = a.send(f"127.0.0.1:{silent}", big, now)
        deadline = time.monotonic() + 5
        while a.bytes_sent == 0 and time.monotonic() < deadline:  # connected, writing until TCP's window is full
            a.receive(0.05, time.monotonic())
        results = [first] + [a.send(f"127.0.0.1:{silent}", big, time.monotonic()) for _ in range(4)]
        assert results == [True, True, False, False, False]
        assert a.send_drops == 3 and 0 < a.bytes_sent < len(big[1])
    finally:
        a.close()
        never_reads.close()


def test_a_sender_vanishing_mid_message_or_sending_garbage_is_dropped_and_the_next_connection_works():
    (b_port,) = free_ports(1)
    b_addr = f"127.0.0.1:{b_port}"
    b = Transport(TransportConfig(), b_addr)
    try:
        data = wire_bytes(AvgRequest(1, 0, "k", np.ones(100_000, dtype=np.float32)))
        with socket.create_connection(("127.0.0.1", b_port + 1)) as half:
            half.sendall(data[: len(data) // 2])
        garbage = socket.create_connection(("127.0.0.1", b_port + 1))
        garbage.sendall(b"GET / HTTP/1.1\r\n\r\n")
        got = []
        deadline = time.monotonic() + 5
        while (not got or not b.transfers_abandoned) and time.monotonic() < deadline:
            got += b.receive(0.05, time.monotonic())
        assert [str(g.error) for g in got] == ["malformed: bulk stream: bad magic"]  # counted as rejected
        assert b.transfers_abandoned == 1  # the half message: a peer that went away, not a bad message
        garbage.close()
        with socket.create_connection(("127.0.0.1", b_port + 1)) as whole:
            whole.sendall(data)
            got = []
            deadline = time.monotonic() + 5
            while not got and time.monotonic() < deadline:
                got += b.receive(0.05, time.monotonic())
        assert got[0].error is None and decode(got[0].frames)[1].exchange == 1
    finally:
        b.close()


def test_stalled_inbound_transfers_are_dropped_by_housekeeping():
    (b_port,) = free_ports(1)
    b = Transport(TransportConfig(bulk=BulkConfig(stall_timeout_s=0.2)), f"127.0.0.1:{b_port}")
    try:
        data = wire_bytes(AvgRequest(1, 0, "k", np.ones(100_000, dtype=np.float32)))
        with socket.create_connection(("127.0.0.1", b_port + 1)) as stalls:
            stalls.sendall(data[:1000])
            deadline = time.monotonic() + 5
            while b.bytes_received < 1000 and time.monotonic() < deadline:
                b.receive(0.05, time.monotonic())
            b.housekeeping(time.monotonic())
            assert b.transfers_abandoned == 0  # still within the stall timeout
            b.housekeeping(time.monotonic() + 1.0)
            assert b.transfers_abandoned == 1
    finally:
        b.close()


def test_the_bulk_port_in_use_is_a_clear_error():
    from p2p.net.transport import TransportError

    (port,) = free_ports(1)
    holder = socket.socket()
    holder.bind(("127.0.0.1", port + 1))
    holder.listen(1)
    try:
        with pytest.raises(TransportError, match=rf"127.0.0.1:{port + 1} .*address already in use"):
            Transport(TransportConfig(), f"127.0.0.1:{port}")
        Transport(TransportConfig(), f"127.0.0.1:{free_ports(1)[0]}").close()  # the ZeroMQ port is released
    finally:
        holder.close()


# -- NaN/Inf checked as the bytes arrive -------------------------------------------------------

@pytest.mark.parametrize("where", [0, 70_001, 199_999])
def test_a_tensor_carrying_nan_or_inf_is_flagged_wherever_it_is(where):
    params = np.ones(200_000, dtype=np.float32)  # 800 KB: several check pieces
    params[where] = np.inf if where else np.nan
    r = reader()
    (frames,) = feed(r, wire_bytes(AvgRequest(1, 0, "k", params)))
    assert r.non_finite and not r.finite_checked
    (frames,) = feed(r, wire_bytes(AvgRequest(2, 0, "k", np.ones(200_000, np.float32))))
    assert r.finite_checked and not r.non_finite  # flags are per message


def test_unaligned_float_frames_after_int8_data_are_checked_too():
    from p2p.averaging.adpsgd import AvgRequestQ
    from p2p.compression import make_compressor
    from p2p.compression.messages import compressed_fields

    packed = compressed_fields(make_compressor("int8").compress(np.linspace(-1, 1, 100_003, dtype=np.float32)))
    r = reader()
    (frames,) = feed(r, wire_bytes(AvgRequestQ(**packed, exchange=1, step=0, model_key="k")))
    assert r.finite_checked and len(frames[1]) % 4 != 0  # the scales start at an odd offset
    _, msg = decode(frames, replace(DEFAULT_LIMITS, check_finite=False))
    assert msg.numel == 100_003


def test_an_unreadable_header_leaves_the_check_to_decode():
    header = b"\xc1" * 10
    r = reader()
    feed(r, _prefix(len(header), 1) + header + struct.pack("!Q", 8) + struct.pack("!2f", np.nan, 1))
    assert not r.finite_checked and not r.non_finite


def test_the_transport_drops_non_finite_messages_and_marks_checked_ones():
    a_port, b_port = free_ports(2)
    a_addr, b_addr = f"127.0.0.1:{a_port}", f"127.0.0.1:{b_port}"
    a, b = Transport(TransportConfig(), a_addr), Transport(TransportConfig(), b_addr)
    try:
        bad = np.ones(500_000, dtype=np.float32)
        bad[123_456] = np.nan
        assert a.send(b_addr, encode(AvgRequest(1, 0, "k", bad), a_addr), time.monotonic())
        assert a.send(b_addr, encode(AvgRequest(2, 0, "k", np.ones_like(bad)), a_addr), time.monotonic())
        rejected, good = exchange(a, b, 2)
        assert rejected.error.reason == "non_finite" and rejected.frames is None
        assert good.finite_checked
        _, msg = decode(good.frames, good.limits(DEFAULT_LIMITS))
        assert msg.exchange == 2 and good.limits(DEFAULT_LIMITS).check_finite is False
        b.done(good)
    finally:
        a.close()
        b.close()


def test_at_the_connection_limit_the_longest_idle_connection_makes_room():
    (b_port,) = free_ports(1)
    b = Transport(TransportConfig(bulk=BulkConfig(max_connections=2)), f"127.0.0.1:{b_port}")
    conns = []
    try:
        for _ in range(3):  # peers that connected once and went silent
            conns.append(socket.create_connection(("127.0.0.1", b_port + 1)))
            deadline = time.monotonic() + 5
            while len(b._in) < min(len(conns), 2) and time.monotonic() < deadline:
                b.receive(0.05, time.monotonic())
        mid = conns[-1]
        mid.sendall(_prefix(10, 1))  # mid-message: never evicted
        deadline = time.monotonic() + 5
        while b.bytes_received == 0 and time.monotonic() < deadline:
            b.receive(0.05, time.monotonic())
        newest = socket.create_connection(("127.0.0.1", b_port + 1))
        conns.append(newest)
        want = {f"tcp:127.0.0.1:{c.getsockname()[1]}".encode() for c in (mid, newest)}
        deadline = time.monotonic() + 5
        while {st.identity for st in b._in.values()} != want and time.monotonic() < deadline:
            b.receive(0.05, time.monotonic())
        assert {st.identity for st in b._in.values()} == want  # an idle one made room; the busy one stayed
        assert b.connections_refused == 0
    finally:
        for c in conns:
            c.close()
        b.close()


def test_an_idle_stream_to_a_peer_that_restarted_is_redialled_not_written_into():
    """kill -9 and a restart at the same address: the sender's old connection is dead. It must
    notice (the peer's close) and dial afresh, so the first message to the new process arrives."""
    a_port, b_port = free_ports(2)
    a = Transport(TransportConfig(), f"127.0.0.1:{a_port}")
    b = Transport(TransportConfig(), f"127.0.0.1:{b_port}")
    frames = encode(AvgRequest(1, 0, "k", np.ones(1 << 18, dtype=np.float32)), f"127.0.0.1:{a_port}")  # 1 MB: bulk
    try:
        assert a.send(f"127.0.0.1:{b_port}", frames, time.monotonic())
        assert len(exchange(a, b, 1)) == 1 and a.streams_closed_by_peer == 0
        b.close()  # the receiving process dies...
        b = None
        deadline = time.monotonic() + 10
        while b is None:  # ...and comes back at the same address (once the old sockets let go of it)
            try:
                b = Transport(TransportConfig(), f"127.0.0.1:{b_port}")
            except TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while a.streams_closed_by_peer == 0 and time.monotonic() < deadline:
            a.receive(0.05, time.monotonic())
        assert a.streams_closed_by_peer == 1
        assert a.send(f"127.0.0.1:{b_port}", frames, time.monotonic())
        got = exchange(a, b, 1)
        assert len(got) == 1 and got[0].error is None  # it arrived at the new process
    finally:
        a.close()
        if b is not None:
            b.close()


# -- with a swarm key (p2p/net/seal.py; the pure parts are in tests/test_seal.py) -----------------
def test_sealed_large_and_small_messages_over_real_sockets_and_other_keys_are_rejected():
    from p2p.net.keyring import Keyring

    ring = Keyring((b"\x01" * 32,))
    a_port, b_port, c_port, d_port = free_ports(4)
    addr = {p: f"127.0.0.1:{p}" for p in (a_port, b_port, c_port, d_port)}
    a = Transport(TransportConfig(), addr[a_port], keyring=ring)
    b = Transport(TransportConfig(), addr[b_port], keyring=ring)
    other = Transport(TransportConfig(), addr[c_port], keyring=Keyring((b"\x02" * 32,)))
    plain = Transport(TransportConfig(), addr[d_port])
    try:
        params = np.random.default_rng(1).standard_normal(1_000_000).astype(np.float32)  # 4 MB: 4 records
        for i in range(2):
            assert a.send(addr[b_port], encode(AvgRequest(i, 0, "k", params * i), addr[a_port]), time.monotonic())
        assert a.send(addr[b_port], encode(StatusRequest(), addr[a_port]), time.monotonic())
        got = exchange(a, b, 3)
        assert len(got) == 3 and all(g.error is None for g in got)
        requests = sorted((m for m in (decode(g.frames, g.limits(DEFAULT_LIMITS))[1] for g in got)
                           if isinstance(m, AvgRequest)), key=lambda m: m.exchange)
        assert [m.exchange for m in requests] == [0, 1]
        assert np.array_equal(requests[1].params, params)
        assert all(g.finite_checked for g in got if len(g.frames) > 1)  # the NaN/Inf pass still ran
        for sender in (other, plain):  # large and small, from another key and from no key
            me = addr[c_port] if sender is other else addr[d_port]
            assert sender.send(addr[b_port], encode(AvgRequest(9, 0, "k", params), me), time.monotonic())
            assert sender.send(addr[b_port], encode(StatusRequest(), me), time.monotonic())
            got = exchange(sender, b, 2)
            assert sorted(g.error.reason for g in got) == (["no_key"] * 2 if sender is other else ["unauthenticated"] * 2)
        assert plain.send(addr[a_port], encode(StatusRequest(), addr[d_port]), time.monotonic())
        got = exchange(plain, a, 1)
        assert a.send(addr[d_port], encode(StatusRequest(), addr[a_port]), time.monotonic())  # keyed -> open node
        (seen,) = exchange(a, plain, 1)
        with pytest.raises(RemoteProtocolError, match="malformed"):
            decode(seen.frames)
    finally:
        for t in (a, b, other, plain):
            t.close()


def test_a_recorded_sealed_connection_replayed_byte_for_byte_is_rejected():
    from p2p.net.keyring import Keyring

    ring = Keyring((b"\x01" * 32,))
    (b_port,) = free_ports(1)
    b = Transport(TransportConfig(), f"127.0.0.1:{b_port}", keyring=ring)
    recorder = socket.socket()
    recorder.bind(("127.0.0.1", 0))
    recorder.listen(1)
    rec_port = recorder.getsockname()[1] - 1  # the transport dials the port after the address
    a_port = free_ports(1)[0]
    a = Transport(TransportConfig(), f"127.0.0.1:{a_port}", keyring=ring)
    try:
        msg = encode(AvgRequest(5, 0, "k", np.ones(300_000, dtype=np.float32)), "a:1")
        assert a.send(f"127.0.0.1:{rec_port}", msg, time.monotonic())
        conn, _ = recorder.accept()
        conn.settimeout(0.2)
        captured = b""
        deadline = time.monotonic() + 5
        while len(captured) < 1_200_000 and time.monotonic() < deadline:
            a.receive(0.01, time.monotonic())
            try:
                captured += conn.recv(1 << 20)
            except socket.timeout:
                pass
        conn.close()
        got = []
        for attempt in range(2):  # the original once, then the replay
            with socket.create_connection(("127.0.0.1", b_port + 1)) as s:
                s.sendall(captured)
                deadline = time.monotonic() + 5
                while not got[attempt:] and time.monotonic() < deadline:
                    got += b.receive(0.05, time.monotonic())
        assert got[0].error is None and decode(got[0].frames)[1].exchange == 5
        assert got[1].error is not None and got[1].error.reason == "replay"
    finally:
        a.close()
        b.close()
        recorder.close()


def test_a_rotated_out_key_loses_its_open_bulk_connections():
    from p2p.net.keyring import Keyring

    old, new = Keyring((b"\x01" * 32,)), Keyring((b"\x02" * 32,))
    a_port, b_port = free_ports(2)
    a_addr, b_addr = f"127.0.0.1:{a_port}", f"127.0.0.1:{b_port}"
    a, b = Transport(TransportConfig(), a_addr, keyring=old), Transport(TransportConfig(), b_addr, keyring=old)
    try:
        params = np.ones(200_000, dtype=np.float32)

        def send_big(i):
            assert a.send(b_addr, encode(AvgRequest(i, 0, "k", params), a_addr), time.monotonic())
            return exchange(a, b, 1, timeout_s=1.0)  # one written into the closed connection is lost

        assert [g.error for g in send_big(1)] == [None]
        b.set_keyring(new)  # b drops the old key: a's open connection must not stay usable
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:  # a sees the close, re-dials with its (old) key
            got = send_big(2)
        assert [g.error.reason for g in got] == ["no_key"]
        a.set_keyring(new)
        got = []
        deadline = time.monotonic() + 10
        while not (got and got[-1].error is None) and time.monotonic() < deadline:
            got = send_big(3)
        assert got[-1].error is None and decode(got[-1].frames)[1].exchange == 3
    finally:
        a.close()
        b.close()


def test_a_sender_trickling_a_message_is_cut_off_after_the_grace():
    """A byte now and then is progress (never a stall), so only the rate check frees the slot."""
    (b_port,) = free_ports(1)
    b = Transport(TransportConfig(bulk=BulkConfig(slow_grace_s=10.0, min_rate_bytes_per_s=1024)), f"127.0.0.1:{b_port}")
    try:
        data = wire_bytes(AvgRequest(1, 0, "k", np.ones(100_000, dtype=np.float32)))
        with socket.create_connection(("127.0.0.1", b_port + 1)) as slow, \
                socket.create_connection(("127.0.0.1", b_port + 1)) as fast:
            slow.sendall(data[:100])
            fast.sendall(data[:20_000])
            deadline = time.monotonic() + 5
            while b.bytes_received < 20_100 and time.monotonic() < deadline:
                b.receive(0.05, 0.0)  # (the transport's clock is ours to drive)
            b.housekeeping(9.0)
            assert b.slow_closed == 0 and len(b._in) == 2  # within the grace
            b.housekeeping(11.0)  # 100 B in 11 s: too slow; 20 kB in 11 s: fast enough
            assert b.slow_closed == 1 and len(b._in) == 1
            fast.sendall(data[20_000:])
            got = []
            while not got and time.monotonic() < deadline:
                got += b.receive(0.05, 12.0)
            assert got[0].error is None and decode(got[0].frames)[1].exchange == 1
            b.housekeeping(60.0)  # between messages: an idle connection is not slow
            assert b.slow_closed == 1 and len(b._in) == 1
    finally:
        b.close()


def test_spoofed_sender_addresses_cannot_grow_the_socket_table_past_its_cap():
    (a_port,) = free_ports(1)
    a = Transport(TransportConfig(max_peer_sockets=4), f"127.0.0.1:{a_port}")
    try:
        neighbour = "127.0.0.1:9"
        a.send(neighbour, encode(StatusRequest(), "x:1"), 0.0)
        a.housekeeping(0.0, keep=[neighbour])
        for i in range(20):  # answers to 20 made-up senders, each sent to once
            a.send(f"127.0.0.1:{20000 + i}", encode(StatusRequest(), "x:1"), 1.0 + i)
        assert len(a._control) == 4 and len(a._last_used) == 4
        assert a.peer_sockets_evicted == 17
        assert neighbour in a._control  # the least recently used, but a neighbour: kept
    finally:
        a.close()


def test_per_address_counts_keep_the_largest_and_fold_made_up_senders_into_one_entry():
    from p2p.net.transport import TopCounts

    counts = TopCounts(keep=3)
    for peer in ("a:1", "b:1"):
        counts.add(peer, 1_000_000)
    for i in range(1000):  # a flood of senders that each sent one small message
        counts.add(f"spoof:{i}", 10)
    assert len(counts) <= 2 * 3 + 1
    assert counts["a:1"] == counts["b:1"] == 1_000_000  # the real peers stay on top
    assert sum(counts.values()) == 2_000_000 + 10_000 and counts[TopCounts.OTHERS] > 0
