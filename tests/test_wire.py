"""Wire codec: every message type round-trips; every kind of bad frame is rejected, not raised
as anything but RemoteProtocolError."""

import dataclasses

import msgpack
import numpy as np
import pytest

import p2p.averaging.adpsgd  # noqa: F401  (registers messages)
import p2p.net.control  # noqa: F401
from p2p.averaging.adpsgd import AvgRequest
from p2p.net.control import StatusRequest
from p2p.protocol import LocalProtocolError, RemoteProtocolError
from p2p.wire import PROTOCOL_VERSION, Limits, decode, encode, message, registered_tags
from tests.wire_samples import SAMPLES


def _equal(a, b):
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
        else:
            assert x == y


def _wire(frames):
    """What the receiver sees: bytes per frame (as if copied off the socket)."""
    return [bytes(f) for f in frames]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    src, back = decode(_wire(encode(msg, "10.0.0.1:7000")))
    assert src == "10.0.0.1:7000"
    _equal(msg, back)


def test_every_registered_type_has_a_sample():
    sampled = {type(m).TAG for m in SAMPLES}
    own = {tag for tag, name in registered_tags().items() if tag >= 20}
    assert own <= sampled, f"add samples for {sorted(own - sampled)}"


def test_tensor_frames_are_zero_copy_views():
    msg = SAMPLES[0]
    frames = encode(msg, "a:1")
    assert isinstance(frames[1], memoryview) and frames[1].obj is not None
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.float32), msg.params)


def test_tags_are_append_only():
    # Pinned: changing a tag breaks every deployed peer. Append new ones, never renumber.
    tags = registered_tags()
    assert tags[20] == "AvgRequest" and tags[21] == "AvgReply"
    assert tags[40] == "StatusRequest" and tags[41] == "StatusReply"
    assert tags[42] == "StateRequest" and tags[43] == "StateReply"


def test_reusing_a_tag_is_a_local_error():
    with pytest.raises(LocalProtocolError):
        @message(20)
        @dataclasses.dataclass(frozen=True)
        class Clash:
            x: int


def test_non_dataclass_cannot_register():
    with pytest.raises(LocalProtocolError):
        message(999)(type("Plain", (), {}))


def _header(version=PROTOCOL_VERSION, tag=20, src="a:1", values=None, specs=None):
    values = [1, 2, "synthetic/12", None] if values is None else values
    specs = [["float32", [12]]] if specs is None else specs
    return msgpack.packb([version, tag, src, values, specs])


GOOD_TENSOR = np.zeros(12, dtype=np.float32).tobytes()
NAN = np.full(12, np.nan, dtype=np.float32).tobytes()
INF = np.full(12, np.inf, dtype=np.float32).tobytes()

BAD_FRAMES = {
    "no frames": ([], "malformed"),
    "garbage header": ([b"\xc1\xff\x00garbage", GOOD_TENSOR], "malformed"),
    "header not an array": ([msgpack.packb({"v": 1}), GOOD_TENSOR], "malformed"),
    "truncated header": ([_header()[:-3], GOOD_TENSOR], "malformed"),
    "future version": ([_header(version=PROTOCOL_VERSION + 1), GOOD_TENSOR], "version"),
    "version zero": ([_header(version=0), GOOD_TENSOR], "version"),
    "unknown type": ([_header(tag=9999), GOOD_TENSOR], "unknown_type"),
    "string tag": ([_header(tag="20"), GOOD_TENSOR], "unknown_type"),
    "missing field": ([_header(values=[1, 2, None]), GOOD_TENSOR], "malformed"),
    "wrong field type": ([_header(values=["x", 2, "k", None]), GOOD_TENSOR], "malformed"),
    "bool as int": ([_header(values=[True, 2, "k", None]), GOOD_TENSOR], "malformed"),
    "missing tensor frame": ([_header()], "malformed"),
    "extra frame": ([_header(), GOOD_TENSOR, GOOD_TENSOR], "malformed"),
    "too many frames": ([_header()] + [GOOD_TENSOR] * 20, "oversized"),
    "size mismatch": ([_header(), GOOD_TENSOR[:-4]], "bad_tensor"),
    "bad dtype": ([_header(specs=[["object", [12]]]), GOOD_TENSOR], "bad_tensor"),
    "negative dim": ([_header(specs=[["float32", [-12]]]), GOOD_TENSOR], "bad_tensor"),
    "bad spec": ([_header(specs=[["float32"]]), GOOD_TENSOR], "malformed"),
    "NaN values": ([_header(), NAN], "non_finite"),
    "Inf values": ([_header(), INF], "non_finite"),
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_bad_frames_are_rejected(name):
    frames, reason = BAD_FRAMES[name]
    with pytest.raises(RemoteProtocolError) as info:
        decode(frames)
    assert info.value.reason == reason


def test_oversized_header_and_tensor_are_rejected():
    limits = Limits(max_header_bytes=64, max_tensor_bytes=16)
    big = encode(StatusRequest(), "x" * 100)
    with pytest.raises(RemoteProtocolError) as info:
        decode(_wire(big), limits)
    assert info.value.reason == "oversized"
    with pytest.raises(RemoteProtocolError) as info:
        decode([_header(), GOOD_TENSOR], Limits(max_tensor_bytes=16))
    assert info.value.reason == "oversized"


def test_message_validation_runs_on_decode():
    @message(998)
    @dataclasses.dataclass(frozen=True)
    class Positive:
        n: int

        def __post_init__(self):
            if self.n < 0:
                raise ValueError("n must be >= 0")

    with pytest.raises(RemoteProtocolError) as info:
        decode([msgpack.packb([PROTOCOL_VERSION, 998, "a:1", [-1], []])])
    assert info.value.reason == "malformed"


def test_unsendable_dtype_is_a_local_error():
    with pytest.raises(LocalProtocolError):
        encode(AvgRequest(1, 1, "k", np.array(["a"], dtype=object)), "a:1")


@pytest.mark.parametrize("values, finite", [
    ([1.0, -2.0, 3.0], True),
    ([1e30, 1e30], True),  # the fast path overflows; the exact check must still accept
    ([1.0, np.nan], False),
    ([np.inf, 1.0], False),
    ([-np.inf, -np.inf], False),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_all_finite(values, finite, dtype):
    from p2p.wire import all_finite

    with np.errstate(over="ignore"):
        arr = np.array(values, dtype=dtype)
    expected = bool(np.isfinite(arr).all())  # float16 turns 1e30 into inf
    assert all_finite(arr) == expected
    if dtype is not np.float16:
        assert expected == finite
