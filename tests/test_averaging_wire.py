"""Every averaging message round-trips through p2p.wire; the averaging tag table is pinned.

``SAMPLES`` holds one instance per averaging message type (tags 22..); tests/wire_samples.py
can extend its list with it so test_wire's "every registered type has a sample" stays true."""

import dataclasses

import numpy as np
import pytest

import p2p.averaging.registry  # noqa: F401  (registers every algorithm's messages)
from p2p.averaging.diloco import OuterDone, OuterShare
from p2p.averaging.outer_catchup import CatchUpMissing, CatchUpRange, CatchUpRequest
from p2p.averaging.outer_repair import RepairChunk, RepairRequest
from p2p.averaging.round_deadline import RoundReceipt
from p2p.averaging.dpsgd import DpsgdParams
from p2p.averaging.elastic import ElasticReply, ElasticRequest
from p2p.averaging.gossipgrad import GradientModelShare, GradientShare
from p2p.averaging.sgp import PushSumShare
from p2p.protocol import RemoteProtocolError
from p2p.wire import decode, encode, registered_tags

PARAMS = np.arange(12, dtype=np.float32) / 7

SAMPLES = [
    PushSumShare(round=5, step=50, weight=0.25, model_key="synthetic/12", params=PARAMS),
    ElasticRequest(exchange=2, step=9, alpha=0.3, model_key="synthetic/12", params=PARAMS),
    ElasticReply(exchange=2, step=10, model_key="synthetic/12", params=PARAMS * 2),
    DpsgdParams(round=7, step=70, degree=4, model_key="synthetic/12", params=PARAMS),
    GradientShare(round=3, step=30, degree=1, model_key="synthetic/12", grad=-PARAMS),
    GradientModelShare(round=4, step=40, degree=1, model_key="synthetic/12", grad=-PARAMS, params=PARAMS),
    OuterShare(round=6, step=600, degree=7, model_key="synthetic/12", params=PARAMS, delta=PARAMS / 3,
               sketch=PARAMS[:4], momentum=PARAMS / 5, inner_steps=64),
    RepairChunk(round=6, offset=12, model_key="synthetic/12", data=PARAMS.astype(np.float16)),
    OuterDone(round=7, step=700, model_key="synthetic/12", sketch=PARAMS[:4], mixed=("a:1", "b:2")),
]

AVERAGING_TAGS = {20: "AvgRequest", 21: "AvgReply", 22: "PushSumShare", 23: "ElasticRequest",
                  24: "ElasticReply", 25: "DpsgdParams", 26: "GradientShare", 27: "GradientModelShare",
                  28: "OuterShare", 29: "RepairRequest", 30: "RepairChunk", 31: "CatchUpRequest",
                  32: "CatchUpMissing", 33: "CatchUpRange", 34: "RoundReceipt", 35: "OuterDone"}


def test_averaging_tags_are_pinned_and_inside_their_range():
    tags = registered_tags()
    assert {t: n for t, n in tags.items() if 20 <= t <= 39} == AVERAGING_TAGS


def test_every_averaging_message_has_a_sample():
    assert {type(m).TAG for m in SAMPLES} == set(AVERAGING_TAGS) - {20, 21, 29, 31, 32, 33, 34}  # no tensors: below


@pytest.mark.parametrize("msg", [RepairRequest(round=6, offset=12, count=4, model_key="synthetic/12"),
                                 CatchUpRequest(round=6, model_key="synthetic/12"),
                                 CatchUpMissing(round=6, model_key="synthetic/12"),
                                 CatchUpRange(first=6, last=9, model_key="synthetic/12"),
                                 RoundReceipt(round=6)], ids=lambda m: type(m).__name__)
def test_tensorless_repair_messages_round_trip(msg):
    assert decode([bytes(f) for f in encode(msg, "10.0.0.1:7000")]) == ("10.0.0.1:7000", msg)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    src, back = decode([bytes(f) for f in encode(msg, "10.0.0.1:7000")])
    assert src == "10.0.0.1:7000" and type(back) is type(msg)
    for f in dataclasses.fields(msg):
        x, y = getattr(msg, f.name), getattr(back, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y)
        else:
            assert x == y


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_non_finite_tensors_are_rejected_by_the_codec(msg):
    poisoned = dataclasses.replace(msg, **{f.name: np.full(12, np.nan, dtype=np.float32)
                                           for f in dataclasses.fields(msg) if f.type in ("np.ndarray", np.ndarray)})
    with pytest.raises(RemoteProtocolError) as info:
        decode([bytes(f) for f in encode(poisoned, "a:1")])
    assert info.value.reason == "non_finite"
