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
    """What an averaging algorithm may do to the local model (all thread-safe)."""

    numel: int  # parameters in the flat vector
    model_key: str  # identifies the task/model; peers with another key are rejected

    def snapshot(self) -> np.ndarray:
        """A float32 copy of the current parameters (queued deltas included)."""

    def add_delta(self, delta: np.ndarray) -> None:
        """x += delta, applied by the trainer at its next step boundary."""

    @property
    def step(self) -> int:
        """Local optimizer steps completed so far."""

    def gradient(self) -> np.ndarray:
        """A float32 copy of this step's flat gradient (only between ``on_gradient`` and the
        optimizer step, for algorithms with ``wants_gradient``)."""

    def set_gradient(self, grad: np.ndarray) -> None:
        """Replace this step's flat gradient before the optimizer step is taken."""


class Averager(Protocol):
    """Sans-I/O averaging state machine (see p2p/protocol.py), one per peer.

    The driver calls, for every peer message of a type in ``MESSAGES``, ``receive``; on its
    timer, ``tick``. Around each local training step the trainer (through the driver, on the
    network thread) calls the step hooks, in this order for step k = 1, 2, ...:

        may_step(k, now)       -> False makes the trainer wait before computing step k (a round
                                  barrier: D-PSGD, DiLoCo's outer sync). It must turn True by
                                  itself through receive()/tick() within a bounded time
                                  (timeouts drop missing partners), so no peer waits forever.
        on_gradient(k, now, n) -> only if ``wants_gradient``: the gradient of step k is
                                  ready (``port.gradient()``); send it to partners.
        gradient_ready(k, now) -> only if ``wants_gradient``: False makes the trainer wait;
                                  when True the algorithm has called ``port.set_gradient``
                                  (or decided to keep the local one).
        after_step(k, now, n)  -> step k's optimizer update is applied; send what the
                                  algorithm sends per step (D-PSGD round k, push-sum share).

    ``n`` is the current neighbour list (addresses, from the topology over live members).
    Asynchronous algorithms (AD-PSGD, elastic gossip) return True / [] from all hooks and
    work from ``tick`` only. Hooks never block; waiting is the trainer's job.
    """

    name: str
    MESSAGES: tuple[type, ...]
    wants_gradient: bool
    stats: dict[str, int]

    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def next_deadline(self) -> float: ...

    def busy(self) -> bool:
        """An exchange is in flight (shutdown waits for it, bounded by its timeout)."""

    def may_step(self, step: int, now: float) -> bool: ...

    def on_gradient(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def gradient_ready(self, step: int, now: float) -> bool: ...

    def after_step(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]: ...


class AsynchronousHooks:
    """Step hooks of an algorithm that never makes training wait (mix in, then override tick)."""

    wants_gradient = False

    def may_step(self, step: int, now: float) -> bool:
        return True

    def on_gradient(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        return []

    def gradient_ready(self, step: int, now: float) -> bool:
        return True

    def after_step(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        return []


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
