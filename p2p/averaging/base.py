"""The contract between an averaging algorithm, the model it mixes, and the driver.

An algorithm never touches torch or a socket. It sees the local model only through a
``ModelPort`` (a flat float32 vector it can copy and add deltas to) and talks only by returning
``Send`` records. Deltas instead of overwrites keep concurrent exchanges and local SGD steps
composable: each exchange adds a zero-sum pair of deltas to the two peers, so the swarm mean is
preserved however exchanges interleave with training and with each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from p2p.protocol import RemoteProtocolError, Send


class ModelPort(Protocol):
    """What an averaging algorithm may do to the local model."""

    numel: int  # parameters in the flat vector
    model_key: str  # identifies the task/model; peers with another key are rejected

    def snapshot(self) -> np.ndarray:  # a float32 copy of the current parameters
        ...

    def add_delta(self, delta: np.ndarray) -> None:  # x += delta (applied at a step boundary)
        ...

    @property
    def step(self) -> int:  # local optimizer steps taken so far
        ...


class Averager(Protocol):
    """Sans-I/O averaging state machine (see p2p/protocol.py)."""

    name: str
    stats: dict[str, int]

    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def next_deadline(self) -> float: ...

    def busy(self) -> bool:  # an exchange is in flight (shutdown waits for it, bounded)
        ...


@dataclass(frozen=True)
class AveragingConfig:
    """Settings shared by the averaging algorithms."""

    interval_s: float = 0.05  # pause between the end of one exchange and the start of the next
    exchange_timeout_s: float = 2.0  # an exchange with no reply by then is dropped, not retried

    def __post_init__(self) -> None:
        if self.interval_s < 0 or self.exchange_timeout_s <= 0:
            raise ValueError("interval_s must be >= 0 and exchange_timeout_s > 0")


def check_params(params: np.ndarray, model_key: str, port: ModelPort) -> None:
    """Reject a peer's parameter vector that cannot be mixed into ours."""
    if model_key != port.model_key:
        raise RemoteProtocolError("wrong_model", f"peer trains {model_key!r}, we train {port.model_key!r}")
    if params.dtype != np.float32 or params.shape != (port.numel,):
        raise RemoteProtocolError("bad_tensor", f"params {params.dtype}{list(params.shape)}, want float32[{port.numel}]")
