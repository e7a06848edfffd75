"""One sample instance per registered message type; test_wire checks every tag has one."""

import numpy as np

from p2p.averaging.adpsgd import AvgReply, AvgRequest
from p2p.net.control import StateReply, StateRequest, StatusReply, StatusRequest

PARAMS = np.arange(12, dtype=np.float32) / 7

SAMPLES = [
    AvgRequest(exchange=3, step=10, model_key="synthetic/12", params=PARAMS),
    AvgReply(exchange=3, step=11, model_key="synthetic/12", params=PARAMS * 2),
    StatusRequest(),
    StatusReply(info={"id": "a", "step": 3, "rejected": {"malformed": 1}, "neighbours": ["b"]}),
    StateRequest(),
    StateReply(step=5, model_key="synthetic/12", params=PARAMS),
]

# Every other averaging algorithm's messages (their owners keep the samples beside their tests).
from tests.test_averaging_wire import SAMPLES as _AVERAGING_SAMPLES  # noqa: E402

SAMPLES += [m for m in _AVERAGING_SAMPLES if type(m).__name__ not in {type(s).__name__ for s in SAMPLES}]

# Compression and CHOCO messages (tags 60..79).
from p2p.averaging.choco import ChocoDelta, ChocoReset, ChocoResync  # noqa: E402
from p2p.compression import make_compressor  # noqa: E402
from p2p.compression.messages import CompressedTensor, compressed_fields  # noqa: E402

_Q = compressed_fields(make_compressor("int8", block=4).compress(PARAMS))
SAMPLES += [CompressedTensor(**_Q, stream="synthetic/12", seq=3),
            ChocoDelta(**_Q, stream=12345, seq=4, degree=3, model_key="synthetic/12"),
            ChocoReset(stream=12345, seq=4, degree=3, model_key="synthetic/12", params=PARAMS),
            ChocoResync(have_seq=-1)]

from p2p.averaging.adpsgd import AvgReplyQ, AvgRequestQ  # noqa: E402

SAMPLES += [AvgRequestQ(**_Q, exchange=3, step=10, model_key="synthetic/12"),
            AvgReplyQ(**_Q, exchange=3, step=11, model_key="synthetic/12")]

from p2p.averaging.diloco import OuterShareQ  # noqa: E402
from p2p.averaging.outer_repair import RepairRequest  # noqa: E402

SAMPLES += [RepairRequest(round=6, offset=12, count=4, model_key="synthetic/12")]  # no tensors

from p2p.averaging.outer_catchup import CatchUpMissing, CatchUpRange, CatchUpRequest, CatchUpShare  # noqa: E402

SAMPLES += [CatchUpRequest(round=6, model_key="synthetic/12"), CatchUpMissing(round=6, model_key="synthetic/12"),
            CatchUpRange(first=6, last=9, model_key="synthetic/12"),
            CatchUpShare(**_Q, round=6, sender="10.0.0.2:7000", mixed=("10.0.0.1:7000", "10.0.0.2:7000"),
                         model_key="synthetic/12")]

SAMPLES += [OuterShareQ(**_Q, round=2, step=100, degree=3, model_key="synthetic/12", params=PARAMS,
                        sketch=PARAMS[:4], momentum=-PARAMS),
            OuterShareQ(**_Q, round=3, step=150, degree=3, model_key="synthetic/12",
                        params=np.empty(0, dtype=np.float32), sketch=PARAMS[:4],
                        momentum=np.empty(0, dtype=np.float32)),
            OuterShareQ(**compressed_fields(make_compressor("sparseloco", fraction=0.5, block=4).compress(PARAMS)),
                        round=4, step=200, degree=3, model_key="synthetic/12", params=np.empty(0, dtype=np.float32),
                        sketch=PARAMS[:4], momentum=np.empty(0, dtype=np.float32))]

from p2p.averaging.round_deadline import RoundReceipt  # noqa: E402

SAMPLES += [RoundReceipt(round=6)]

from p2p.averaging.outer_scatter import OuterGather, OuterSlice  # noqa: E402

SAMPLES += [OuterSlice(**_Q, round=5, step=250, degree=2, model_key="synthetic/12", sketch=PARAMS[:4],
                       mixed=("a:1/0123456789abcdef", "b:2/-"), inner_steps=32, members=("a:1", "b:2", "c:3"), index=1),
            OuterGather(**_Q, round=5, model_key="synthetic/12", members=("a:1", "b:2", "c:3"), index=1,
                        included=("a:1", "b:2"))]

# State sync (44..47) and the model export (48, 49).
from p2p.net.control import ModelReply, ModelRequest  # noqa: E402
from p2p.statesync.messages import SyncChunk, SyncChunkRequest, SyncOffer, SyncQuery  # noqa: E402

_BYTES = np.arange(10, dtype=np.uint8)
SAMPLES += [SyncQuery(nonce=7), SyncOffer(nonce=7, step=120, model_key="synthetic/12", members=("a:1", "b:2"),
                                           busy=False, chunk_bytes=0),
            SyncChunkRequest(transfer=3, offset=0, length=1 << 20, optimizer=True),
            SyncChunk(transfer=3, status=0, snapshot=1, step=120, model_key="synthetic/12", total=10, offset=0,
                      data=_BYTES),
            ModelRequest(), ModelReply(step=120, model_key="synthetic/12", data=_BYTES)]
