"""The contract between an averaging algorithm, the model it mixes, and the driver.

An algorithm never touches torch or a socket. It sees the local model only through a
``ModelPort`` (a flat float32 vector it can copy and add deltas to) and talks only by returning
``Send`` records. Deltas instead of overwrites keep concurrent exchanges and local SGD steps
composable: each exchange adds a zero-sum pair of deltas to the two peers, so the swarm mean is
preserved however exchanges interleave with training and with each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import numpy as np

from p2p.compression import decompress
from p2p.compression.messages import CompressedFields
from p2p.protocol import RemoteProtocolError, Send


class ModelPort(Protocol):
    """What an averaging algorithm may do to the local model (all thread-safe).

    Optional: ``cpu_seconds()`` -> (CPU seconds of the calling network thread, of the rest of
    the process) so far while training, None otherwise; the pairwise algorithms pace their
    exchanges against the compute with it (p2p/bandwidth.py). Simulated ports have none."""

    numel: int  # parameters in the flat vector
    model_key: str  # identifies the task/model; peers with another key are rejected

    def snapshot(self) -> np.ndarray:
        """A float32 copy of the current parameters (queued deltas included)."""

    def add_delta(self, delta: np.ndarray) -> None:
        """x += delta, applied by the trainer at its next step boundary (the port copies or adds
        ``delta``; the caller may reuse its buffer afterwards)."""

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

    Optional: ``training_done(step, now)``, called once after the last step (and after the
    gate that finished its round) when the peer goes on lingering without training. The
    synchronous algorithms then answer their neighbours' rounds from ``tick`` instead of
    leaving them to time out; SGP answers shares so weight flows back (p2p/averaging/sgp.py).

    State (checkpoints and state sync): ``state_dict()`` returns copies of what the algorithm
    keeps besides the model (DiLoCo's outer parameters and momentum, the push-sum weight,
    CHOCO's public copies, round counters), as ``str -> np.ndarray | int | float`` (keys may
    hold "/"). ``load_state_dict(state, source)`` takes it back: ``source`` is "checkpoint"
    (this peer's own state) or "peer" (a donor's, for a joiner: it adopts what describes the
    swarm, such as DiLoCo's outer parameters, and keeps what is its own, such as its push-sum
    weight). A malformed state raises ValueError. Optional ``state_for_joiner()`` returns
    (the state a donor gives, the model vector a joiner should take instead of the donor's live
    model); without it a donor gives ``state_dict()`` and its live model.

    Optional: ``send_dropped(to, msg, now)``, called (through ``Peer.send_dropped``) when the
    driver dropped one of the algorithm's messages unsent because its queue to ``to`` was full
    (a slow link): an algorithm that gave something away with it takes it back (SGP's weight).

    Which steps need the hooks at all (``AsynchronousHooks.gate_wanted`` /
    ``after_step_wanted``): pure functions of the step number and the algorithm's settings,
    which the trainer's thread may call. Every hook the network thread serves costs the trainer
    a wake-up and, at a gate, a round trip between threads; an algorithm that acts once per H
    steps (DiLoCo) says so and the other steps cost nothing. On a step they exclude, ``may_step``
    must be True and ``after_step`` must send nothing.

    ``n`` is the current neighbour list (addresses, from the topology over live members),
    computed for the round ``topology_round()`` returns just before the call, so time-varying
    topologies (one-peer exponential, hypercube) follow the algorithm's own round counter.
    Asynchronous algorithms (AD-PSGD, elastic gossip) return True / [] from all hooks and
    work from ``tick`` only. Hooks never block; waiting is the trainer's job.
    """

    name: str
    natural_topology: str  # the topology name it is designed for (registry default)
    MESSAGES: tuple[type, ...]
    wants_gradient: bool
    stats: dict[str, int]  # counters; every algorithm has exchanges_started / exchanges_completed
    disagreement: "Disagreement"  # how far the partners' models are from ours, as exchanges show

    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def next_deadline(self) -> float: ...

    def busy(self) -> bool:
        """An exchange is in flight (shutdown waits for it, bounded by its timeout)."""

    def may_step(self, step: int, now: float) -> bool: ...

    def on_gradient(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def gradient_ready(self, step: int, now: float) -> bool: ...

    def after_step(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]: ...

    def topology_round(self) -> int:
        """The round to pass to the topology when computing ``neighbours`` for the next call."""


class AsynchronousHooks:
    """No-op step hooks to mix in: an algorithm overrides only the hooks it uses. The trainer's
    proxy (p2p/training/step_hooks.py) skips the hooks left as these no-ops: an algorithm that does not
    override ``may_step`` never gates a step, one that does not override ``after_step`` is
    never called after one. A fully asynchronous algorithm overrides none and works from
    ``tick`` and ``receive`` only."""

    wants_gradient = False

    def may_step(self, step: int, now: float) -> bool:
        return True

    def on_gradient(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        return []

    def gradient_ready(self, step: int, now: float) -> bool:
        return True

    def after_step(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        return []

    def topology_round(self) -> int:
        return 0

    def gate_wanted(self, step: int) -> bool:
        """Whether ``may_step(step)`` can be False (module docstring of ``Averager``)."""
        return True

    def after_step_wanted(self, step: int) -> bool:
        """Whether ``after_step(step)`` can send or change anything."""
        return True


@dataclass(frozen=True)
class AveragingConfig:
    """Settings every averaging algorithm shares. An algorithm's own settings live in its own
    config class (``DiLoCoConfig``, ``ElasticConfig``, ...: the class attribute ``Config``),
    passed to it as ``options``."""

    interval_s: float = 0.05  # pause between the end of one exchange and the start of the next
    exchange_timeout_s: float = 2.0  # an exchange with no reply by then is dropped, not retried
    round_timeout_s: float = 5.0  # synchronous rounds (dpsgd, gossipgrad, diloco) stop waiting for missing neighbours after this
    staleness_aware: bool = False  # scale a partner's mixing weight by 1/(1 + staleness/tau) when its step count is behind ours
    staleness_tau: float = 10.0  # steps of staleness that halve a partner's weight (staleness_aware only)
    # Read by p2p/compression (compressor_from_config) and the algorithms that compress:
    compression: str = "none"  # codec for compressed averaging: none | int8 | sign | topk ...
    compression_block: Optional[int] = None  # int8/sign block size (None: the codec's default)
    compression_topk_fraction: Optional[float] = None  # topk: fraction of entries kept (None: 0.01)
    # Bandwidth awareness (p2p/bandwidth.py), used by the pairwise algorithms:
    bandwidth_aware: bool = True  # stretch the interval, prefer fast partners from measured exchanges
    comm_fraction: float = 0.5  # keep exchanges to at most this share of wall time
    max_interval_s: float = 30.0  # never wait longer than this between exchanges
    robust_mixing: bool = True  # clip or refuse a partner's vector far from ours, shun repeat offenders (p2p/averaging/robust.py)

    def __post_init__(self) -> None:
        if not 0 < self.comm_fraction <= 1 or self.max_interval_s < self.interval_s:
            raise ValueError("comm_fraction must be in (0, 1] and max_interval_s >= interval_s")
        if self.interval_s < 0 or self.exchange_timeout_s <= 0:
            raise ValueError("interval_s must be >= 0 and exchange_timeout_s > 0")
        if self.round_timeout_s <= 0 or self.staleness_tau <= 0:
            raise ValueError("round_timeout_s and staleness_tau must be > 0")


@dataclass(frozen=True)
class NoOptions:
    """The ``Config`` of an algorithm with no settings of its own."""


class Disagreement:
    """How far this peer's model is from its partners', as its exchanges show it: an EWMA of
    ``||x_j - x_i|| / ||x_i||`` over the partners' vectors it mixes. A local, free estimate of the
    consensus distance (``status()["consensus"]``): no extra messages, one norm per vector
    received. None until the first exchange."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.value: Optional[float] = None

    def observe(self, difference: np.ndarray, mine: np.ndarray) -> None:
        """``difference`` = x_j - x_i for one partner, ``mine`` = x_i."""
        self.observe_norms(float(np.linalg.norm(difference)), float(np.linalg.norm(mine)))

    def observe_norms(self, difference: float, mine: float) -> None:
        """The same from ``||x_j - x_i||`` and ``||x_i||`` (a caller that has them, or computes
        ``||x_i||`` once for several partners)."""
        rel = difference / max(mine, 1e-30)
        self.value = rel if self.value is None else (1 - self.alpha) * self.value + self.alpha * rel


def state_array(state: dict, key: str, numel: int) -> np.ndarray:
    """A float32 vector of ``numel`` entries from a state dict, or ValueError naming the key."""
    value = state.get(key)
    if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.shape != (numel,):
        raise ValueError(f"state {key!r}: want float32[{numel}], got "
                         f"{getattr(value, 'dtype', type(value).__name__)}{list(getattr(value, 'shape', []))}")
    if not np.isfinite(value).all():
        raise ValueError(f"state {key!r} carries NaN or Inf")
    return value.copy()


def state_int(state: dict, key: str, low: int = 0) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"state {key!r}: want an integer >= {low}, got {value!r}")
    return int(value)


def staleness_weight(my_step: int, their_step: int, tau: float) -> float:
    """Factor on a partner's mixing weight (Zhang et al., "Staleness-aware async-SGD", IJCAI 2016,
    divide by staleness): 1 when the partner is as fresh as us or fresher, 1 / (1 + s / tau) when
    its model is s = my_step - their_step steps older. The weight taken off goes to our own
    model, so the update stays a convex combination; it is deliberately not symmetric (the
    fresher peer keeps more of itself), which gives up exact mean preservation: off by default."""
    staleness = my_step - their_step
    return 1.0 if staleness <= 0 else 1.0 / (1.0 + staleness / tau)


def decoded_params(msg: CompressedFields, port: ModelPort) -> np.ndarray:
    """A peer's compressed model-sized vector, decoded and checked against our model (its
    size before decoding, so a wrong-sized payload is never expanded)."""
    if msg.numel != port.numel:
        raise RemoteProtocolError("bad_tensor", f"{msg.numel} parameters, want {port.numel}")
    params = decompress(msg.payload(), port.numel)
    check_params(params, msg.model_key, port)
    return params


def check_params(params: np.ndarray, model_key: str, port: ModelPort) -> None:
    """Reject a peer's parameter vector that cannot be mixed into ours."""
    if model_key != port.model_key:
        raise RemoteProtocolError("wrong_model", f"peer trains {model_key!r}, we train {port.model_key!r}")
    if params.dtype != np.float32 or params.shape != (port.numel,):
        raise RemoteProtocolError("bad_tensor", f"params {params.dtype}{list(params.shape)}, want float32[{port.numel}]")
