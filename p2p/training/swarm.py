"""``p2p.Swarm``: join a swarm from your own training loop.

    with p2p.Swarm(model, listen="0.0.0.0:7000", join=["10.0.0.1:7000"], algorithm="diloco") as swarm:
        opt = swarm.wrap(opt)           # the same optimizer; averaging runs beside it
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()

What it does. ``Swarm(model, **settings)`` checks the settings (``p2p.config``: the same names
as ``p2p start``'s flags) and re-points the model's parameters into flat buffers
(``FlatParams``: nothing else about the model changes). Entering the ``with`` block binds the
two ports, starts one network thread that drives the sans-I/O ``Peer`` (SWIM membership,
topology, the averaging algorithm) over ZeroMQ, and waits until a join address answered.
``wrap(optimizer)`` returns a ``SwarmOptimizer``: its ``step()`` runs the inner step under the
parameter lock, then lands the averaging deltas the network thread queued and, for synchronous
algorithms, waits at the algorithm's gate (D-PSGD's round, DiLoCo's outer step). Leaving the
block ends training: the algorithm is told (so finished peers keep serving their neighbours'
rounds), the member keeps averaging for ``linger`` seconds, announces its leave and closes its
sockets. On an exception it leaves at once; the others carry on without it.

Threads. The caller's thread is the training thread: only it writes the model (optimizer
steps, averaging deltas between steps). The network thread reads the model only through
``FlatParams.snapshot`` (under the lock) and talks to the training thread through ``StepHooks``.

It never touches the caller's global state: no ``torch.manual_seed`` (this member's protocol
randomness comes from ``random.Random((seed, id))``), no signal handlers unless
``handle_signals=True``, no logging configuration.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import threading
import time
import zlib
from typing import Any, Callable, Optional

import torch

from p2p.averaging.registry import make_averager
from p2p.config import SettingError, SwarmConfig, swarm_config
from p2p.gossip import Membership
from p2p.net.control import StateReply
from p2p.net.driver import DriverStopped, NetworkDriver
from p2p.net.ports import advertised_address, bind_transport
from p2p.net.transport import TransportError
from p2p.peer import Peer
from p2p.topology import get_topology
from p2p.training.flat import FlatParams
from p2p.training.optimizer import SwarmOptimizer
from p2p.training.step_hooks import StepHooks

log = logging.getLogger("p2p.swarm")


class SwarmError(RuntimeError):
    """The swarm member cannot go on: no join address answered, a port is taken, or the
    network thread failed. The message says which."""


class JoinError(SwarmError):
    """No join address answered within ``join_timeout``."""


def peer_seed(run_seed: int, node_id: str) -> int:
    """A per-peer seed that is stable across processes (unlike Python's salted hash)."""
    return zlib.crc32(f"{run_seed}:{node_id}".encode())


def model_key(model: torch.nn.Module, numel: int) -> str:
    """Names the model's architecture; peers whose keys differ never mix parameters."""
    shapes = ";".join(f"{name}:{tuple(p.shape)}" for name, p in model.named_parameters() if p.requires_grad)
    return f"{type(model).__name__}/{numel}/{zlib.crc32(shapes.encode()):08x}"


class _ModelPort:
    """The averaging algorithms' view of the model (``ModelPort``, p2p/averaging/base.py)."""

    def __init__(self, swarm: "Swarm", flat: FlatParams, key: str) -> None:
        self._swarm = swarm
        self.numel, self.model_key = flat.numel, key
        self.snapshot, self.add_delta = flat.snapshot, flat.add_delta
        self.gradient, self.set_gradient = flat.gradient, flat.set_gradient

    @property
    def step(self) -> int:
        return self._swarm.step


class Swarm:
    """A member of a swarm, for the caller's own training loop (module docstring)."""

    def __init__(self, model: torch.nn.Module, config: Optional[SwarmConfig] = None, *,
                 handle_signals: bool = False, **settings: Any) -> None:
        if config is not None and settings:
            raise TypeError("give either config= or settings as keywords, not both")
        try:
            self.config = config if config is not None else swarm_config(**settings)
        except SettingError as exc:
            raise ValueError(f"p2p.Swarm: {exc}") from None
        self.model = model
        self.flat = FlatParams(model)
        self.model_key = model_key(model, self.flat.numel)
        self.handle_signals = handle_signals
        self.phase = "created"  # created, joining, training, lingering, stopping, stopped
        self.stop_event = threading.Event()  # set by stop() (or a signal): a loop should end
        self.metrics: dict[str, Any] = {}  # what the caller reported (report()): loss, accuracy, ...
        self._step = 0
        self._started_at = time.monotonic()
        self._steps_at_start = 0
        self._done = False
        self._cached_status: dict[str, Any] = {}
        self._old_handlers: dict[int, Any] = {}
        self.address: Optional[str] = None  # the address peers dial, once started
        self.id: Optional[str] = None
        self._driver: Optional[NetworkDriver] = None

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "Swarm":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(linger_s=0.0 if exc_type is not None else None)

    def start(self) -> "Swarm":
        """Bind, start the network thread and join; returns self. Raises SwarmError (JoinError
        when no join address answers within ``join_timeout``)."""
        if self.phase != "created":
            raise RuntimeError(f"Swarm.start() in phase {self.phase!r}: a Swarm starts once")
        cfg = self.config
        try:
            transport, bound = bind_transport(cfg.transport, cfg.listen)
        except TransportError as exc:
            raise SwarmError(str(exc)) from None
        try:
            self.address = advertised_address(bound, cfg.advertise, cfg.join)
        except ValueError as exc:
            transport.close()
            raise SwarmError(str(exc)) from None
        self.id = cfg.node_id or self.address
        now = time.monotonic()
        rng = random.Random(peer_seed(cfg.seed, self.id))
        self.port = _ModelPort(self, self.flat, self.model_key)
        membership = Membership(cfg.membership, self.id, self.address, rng, now)
        averager = make_averager(cfg.algorithm, cfg.averaging, self.port, rng, now, options=cfg.options)
        self.peer = Peer(self.address, membership, averager, get_topology(cfg.topology_name))
        avg = cfg.averaging
        rounds = getattr(cfg.algorithm_options, "gossip_rounds", 1)
        # A safety net only: the algorithms' own round/exchange timeouts release the trainer first.
        self.hooks = StepHooks(averager, gate_timeout_s=3 * max(avg.exchange_timeout_s, avg.round_timeout_s * rounds))
        self._driver = NetworkDriver(transport, self.peer, self.address, self._status_now, self._state_reply,
                                     avg.exchange_timeout_s, self.hooks)
        self.phase = "joining"
        self._driver.start(list(cfg.join))
        if self.handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, lambda *_: self.stop())
        try:
            self._wait_joined()
        except BaseException:
            self._shut_down()
            raise
        self.phase = "training"
        self._started_at, self._steps_at_start = time.monotonic(), self._step
        return self

    def _wait_joined(self) -> None:
        """Until a join address answered and ``min_members`` are alive (or stop())."""
        cfg = self.config
        deadline = time.monotonic() + cfg.join_timeout_s
        while True:
            try:
                joined, members = self._driver.call(lambda: (self.peer.joined, self.peer.live_members()))
            except DriverStopped:
                raise SwarmError(f"network loop failed: {self._driver.error}") from None
            if (joined and members >= cfg.min_members) or self.stop_event.is_set():
                return
            if time.monotonic() >= deadline:
                if not joined:
                    raise JoinError(f"no join address answered within {cfg.join_timeout_s:g}s "
                                    f"(tried {', '.join(cfg.join)})")
                raise JoinError(f"{members} of the {cfg.min_members} members asked for were alive after "
                                f"{cfg.join_timeout_s:g}s")
            self.stop_event.wait(0.05)

    def stop(self) -> None:
        """Ask a loop that checks ``stop_requested`` to end (thread- and signal-safe)."""
        self.stop_event.set()

    @property
    def stop_requested(self) -> bool:
        return self.stop_event.is_set()

    def finish(self, linger_s: Optional[float] = None) -> None:
        """Training is over: tell the algorithm (finished peers keep answering their
        neighbours' rounds), then keep averaging for ``linger_s`` seconds (default: the
        ``linger`` setting; None: until ``stop()``). Idempotent."""
        if self._driver is None or self._done:
            return
        self._done = True
        if not self.stop_requested:
            self.hooks.training_done(self._step)
        self.linger(self.config.linger_s if linger_s is None else linger_s)

    def linger(self, seconds: Optional[float], on_tick: Optional[Callable[[int], None]] = None) -> None:
        """Keep landing averaging deltas (no training) for ``seconds`` (None: until ``stop()``);
        ``on_tick(deltas just landed)`` is called every 20 ms meanwhile."""
        if seconds is not None and seconds <= 0:
            self.apply_pending()
            return
        self.phase = "lingering"
        end = math.inf if seconds is None else time.monotonic() + seconds
        while not self.stop_event.wait(0.02) and time.monotonic() < end:
            applied = self.apply_pending()
            if on_tick is not None:
                on_tick(applied)
        self.apply_pending()

    def close(self, linger_s: Optional[float] = None) -> None:
        """Finish (``finish(linger_s)``), announce the leave, close the sockets. The exchange
        in flight is completed or abandoned within its timeout; the model is never left
        half-mixed. Idempotent."""
        if self._driver is None or self.phase in ("stopping", "stopped"):
            return
        if self.phase != "joining":
            self.finish(linger_s)
        self._shut_down()
        if self._driver.error is not None:
            raise SwarmError(f"network loop failed: {self._driver.error}") from self._driver.error

    def _shut_down(self) -> None:
        self.phase = "stopping"
        self._driver.stop(timeout_s=self.config.averaging.exchange_timeout_s + 2.0)
        self._status_now()  # the network thread is gone: keep its last view for status()
        self.hooks.close_trainer_side()
        self.hooks.close()
        self.flat.apply_pending()  # the network thread is gone: deltas it queued land now
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()
        self.phase = "stopped"
        self._cached_status["phase"] = "stopped"

    # -- the training thread's side ----------------------------------------------------------
    def wrap(self, optimizer: torch.optim.Optimizer) -> SwarmOptimizer:
        """``optimizer``, averaging beside it: use the result exactly as the original."""
        return SwarmOptimizer(optimizer, self)

    @property
    def step(self) -> int:
        """Optimizer steps taken through the wrapped optimizer (skipped AMP steps excluded)."""
        return self._step

    def apply_pending(self) -> int:
        """Land the averaging deltas queued since the last step (the wrapper does this at every
        step; call it when the model is not stepping, e.g. before evaluating). Returns how many."""
        return self.flat.apply_pending()

    def _before_optimizer_step(self) -> None:
        if self._driver is None or self.phase != "training":
            raise RuntimeError("SwarmOptimizer.step() outside the Swarm's with block (or after close)")
        if self.hooks.wants_gradient:
            self.hooks.gradient(self._step + 1)  # e.g. GossipGraD: the partner's gradient replaces ours

    def _after_optimizer_step(self) -> None:
        """Step k was applied: tell the algorithm, land queued deltas, and wait at the gate of
        step k + 1 when the algorithm gates (its round must finish before the next step)."""
        k = self._step = self._step + 1
        hooks = self.hooks
        hooks.after_step(k)
        self.flat.apply_pending()
        if hooks.gates_steps:
            hooks.before_step(k + 1)
            self.flat.apply_pending()
        if self._driver.finished.is_set() and self._driver.error is not None:
            raise SwarmError(f"network loop failed: {self._driver.error}") from self._driver.error

    # -- what the caller sees ----------------------------------------------------------------
    def report(self, **metrics: Any) -> None:
        """Numbers to show in ``status()`` and ``p2p status`` (e.g. loss=..., accuracy=...)."""
        self.metrics.update(metrics)

    @property
    def steps_per_s(self) -> float:
        elapsed = time.monotonic() - self._started_at
        return (self._step - self._steps_at_start) / elapsed if elapsed > 0 else 0.0

    def status(self) -> dict[str, Any]:
        """This member's view: phase, step, neighbours, members, bytes, codec, averaging
        counters, what ``report`` was given (as ``p2p status`` shows it). Asked of the network
        thread, which owns them; after ``close()``, as it was last seen."""
        if self._driver is not None:
            try:
                return self._driver.call(self._status_now)
            except DriverStopped:
                pass
        return {**self._cached_status, **self._training_fields()}

    def _training_fields(self) -> dict[str, Any]:
        return {"phase": self.phase, "step": self._step, "steps_per_s": round(self.steps_per_s, 3),
                "loss": self.metrics.get("loss", math.nan), "accuracy": self.metrics.get("accuracy", math.nan),
                "eval_loss": self.metrics.get("eval_loss", math.nan),
                **{k: v for k, v in self.metrics.items() if k not in ("loss", "accuracy", "eval_loss")}}

    def _status_now(self) -> dict[str, Any]:
        """The full status (network thread: it owns the Peer and the transport)."""
        t, peer, now = self._driver.transport, self.peer, time.monotonic()
        info = {
            "id": self.id, "addr": self.address, "task": self.metrics.get("task", "-"),
            "device": str(self.flat.device), "dtypes": [str(d).replace("torch.", "") for d in self.flat.dtypes],
            "parameters": self.flat.numel, "algorithm": peer.averager.name, "topology": self.config.topology_name,
            "neighbours": peer.neighbours(),
            "members": [_member_row(m, now) for m in peer.membership.table()],
            "bytes_sent": t.bytes_sent, "bytes_received": t.bytes_received,
            "messages_sent": t.messages_sent, "messages_received": t.messages_received,
            "send_drops": t.send_drops, "transfers_abandoned": t.transfers_abandoned,
            "bulk_connections_refused": t.connections_refused, "rejected": dict(self._driver.rejected),
            "averaging": dict(peer.averager.stats), "consensus": peer.averager.disagreement.value,
            "uptime_s": round(now - self._started_at, 3),
            "bandwidth": self._bandwidth(), "gate_timeouts": self.hooks.gate_timeouts,
            **self._training_fields(),
        }
        self._cached_status = info
        return info

    def _bandwidth(self) -> dict[str, Any]:
        """What bandwidth awareness measured and decided (algorithms that adapt report it)."""
        report = getattr(self.peer.averager, "bandwidth_report", None)
        if report is not None:
            return report()
        avg = self.config.averaging
        return {"links": {}, "codec": avg.compression, "interval_s": avg.interval_s}

    def _state_reply(self) -> StateReply:
        return StateReply(self._step, self.model_key, self.flat.snapshot())


def _member_row(m: Any, now: float) -> dict[str, Any]:
    """A member table row; ``last_heard_s`` is seconds ago on this node's own clock."""
    return {"id": m.id, "addr": m.addr, "state": m.state, "incarnation": m.incarnation,
            "last_heard_s": None if m.last_heard is None else round(now - m.last_heard, 3)}
