"""Client queries a running node answers on its listening socket (``p2p status``, the demo).

Clients have no listening address of their own, so the node answers on the connection the
request came in on (see p2p/net/transport.py). Tags 40..59 are reserved for control messages
(44..47: state sync, p2p/statesync/messages.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from p2p.wire import message


@message(40)
@dataclass(frozen=True)
class StatusRequest:
    pass


@message(41)
@dataclass(frozen=True)
class StatusReply:
    info: dict  # node, training and averaging counters; see Swarm.status (p2p/training/swarm.py)


@message(42)
@dataclass(frozen=True)
class StateRequest:
    pass


@message(43)
@dataclass(frozen=True)
class StateReply:
    step: int
    model_key: str
    params: np.ndarray


@message(48)
@dataclass(frozen=True)
class ModelRequest:
    """The node's current model (``p2p export --peer``)."""


@message(49)
@dataclass(frozen=True)
class ModelReply:
    step: int
    model_key: str
    data: np.ndarray  # uint8: a safetensors blob of the model's state_dict (p2p/training/state.py)

