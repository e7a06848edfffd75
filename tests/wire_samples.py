"""One sample instance per registered message type; test_wire checks every tag has one."""

import numpy as np

from p2p.averaging.adpsgd import AvgReply, AvgRequest
from p2p.control import StateReply, StateRequest, StatusReply, StatusRequest

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
