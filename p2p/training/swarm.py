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

Keeping the run (settings ``checkpoint_dir``, ``state_sync``): a member with a checkpoint
directory resumes from its newest checkpoint (model, optimizer, step, the algorithm's state,
what was registered with ``register_state``) and writes one every ``checkpoint_every``
seconds and at a clean stop (p2p/training/keeper.py). Before joining the membership it asks the
swarm for fresher state and downloads it from a live member (p2p/training/joining.py,
p2p/statesync/): a new or restarted machine starts where the swarm is, not from its random
initial model, and nobody averages with it until it does.

It never touches the caller's global state: no ``torch.manual_seed`` (this member's protocol
randomness comes from ``random.Random((seed, id))``), no signal handlers unless
``handle_signals=True``, no logging configuration.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import secrets
import threading
import time
import zlib
from typing import Any, Callable, Optional

import numpy as np
import torch

from p2p.averaging.hostile import Hostile
from p2p.averaging.registry import make_averager
from p2p.averaging.round_deadline import round_wait_cap
from p2p.config import SettingError, SwarmConfig, swarm_config
from p2p.events import event
from p2p.gossip import Membership
from p2p.gossip.messages import ALIVE, DEAD, LEFT, STATE_NAMES, SUSPECT
from p2p.net.control import ModelReply, StateReply
from p2p.net.driver import DriverBusy, DriverStopped, NetworkDriver
from p2p.net.heap import grow_bytes_for
from p2p.net.identity import AllowFile, load_identity_file, public_line
from p2p.net.keyring import KeyFile, KeyFileError
from p2p.net.ports import advertised_address, bind_transport
from p2p.net.transport import TransportError
from p2p.peer import Peer
from p2p.statesync import StateDonor, StateJoiner
from p2p.topology import get_topology
from p2p.training.checkpoints import CheckpointStore
from p2p.training.flat import FlatParams
from p2p.training.joining import JoinError, Synced, SwarmError, offered_members, sync_state, wait_joined
from p2p.training.keeper import StateKeeper
from p2p.training.optimizer import SwarmOptimizer
from p2p.training.signal_stop import SignalStop
from p2p.training.state import StateError, TrainingState, to_bytes
from p2p.training.step_hooks import StepHooks

log = logging.getLogger("p2p.swarm")
JOIN_GRACE_S = 2.0  # after a state sync that took nothing: the least time left to hear a join answer
__all__ = ["JoinError", "Swarm", "SwarmError", "model_key", "peer_seed"]


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

    def cpu_seconds(self) -> Optional[tuple[float, float]]:
        """(the calling thread's CPU seconds, the rest of the process's) while training, else None.
        The averager calls it on the network thread: the first is what exchanges, membership and
        the transfers' kernel work cost, the second what training got (ModelPort)."""
        if self._swarm.phase != "training":
            return None
        network = time.thread_time()
        return network, time.process_time() - network


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
        self._signal_stop: Optional[SignalStop] = None  # SIGINT/SIGTERM -> stop(), while running
        self.address: Optional[str] = None  # the address peers dial, once started
        self.id: Optional[str] = None
        self._driver: Optional[NetworkDriver] = None
        self._key_file: Optional[KeyFile] = None
        self._allow_file: Optional[AllowFile] = None
        cfg = self.config
        store = CheckpointStore(cfg.checkpoint_dir, cfg.keep_checkpoints) if cfg.checkpoint_dir else None
        self._keeper = StateKeeper(model, self.flat, self.model_key, store, cfg.checkpoint_every_s)
        self._servable = False  # holds state a joiner may take (restored, synced, or the first member)
        self._joiner: Optional[StateJoiner] = None
        self._ops: Optional[Any] = None  # the metrics / status page / health endpoint (``metrics``)
        self._outer_model: Optional[torch.nn.Module] = None  # DiLoCo's outer parameters, to evaluate (evaluation_model)
        self._idle_work: Optional[Callable[[], None]] = None  # when_waiting
        self._evaluated_at_step: Optional[int] = None  # evaluation_step
        self.synced: Optional[Synced] = None  # what state sync brought (None: nothing fresher was found)

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "Swarm":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        clean = exc_type is None
        self.close(linger_s=None if clean else 0.0, checkpoint=clean)

    def start(self) -> "Swarm":
        """Bind, resume from a checkpoint, sync the swarm's state, join; returns self. Raises
        SwarmError (JoinError when no join address answers within ``join_timeout``)."""
        if self.phase != "created":
            raise RuntimeError(f"Swarm.start() in phase {self.phase!r}: a Swarm starts once")
        if self.handle_signals and threading.current_thread() is not threading.main_thread():
            raise RuntimeError("handle_signals=True needs Swarm.start() on the main thread (Python's signal rule)")
        cfg = self.config
        try:
            restored = self._keeper.restore(self.metrics.get("task"))
        except StateError as exc:
            raise SwarmError(str(exc)) from None
        if restored is not None:
            self._step = restored.step
        try:
            key_file = KeyFile(cfg.swarm_key) if cfg.swarm_key else None
            identity = load_identity_file(cfg.identity) if cfg.identity else None
            allow_file = AllowFile(cfg.allow) if cfg.allow else None
        except KeyFileError as exc:  # changed since the config was checked
            raise SwarmError(str(exc)) from None
        try:
            transport, bound = bind_transport(cfg.transport, cfg.listen, key_file and key_file.keyring, identity=identity,
                                              allowed=allow_file and allow_file.allowed)
        except TransportError as exc:
            raise SwarmError(str(exc)) from None
        self._key_file, self._allow_file = key_file, allow_file
        if key_file is None:
            event("open_swarm", f"swarm is OPEN: anyone who can reach {bound} can join, read the models and send "
                                f"its own; use --swarm-key (p2p keygen)", logging.WARNING, addr=bound)
        try:
            self.address = advertised_address(bound, cfg.advertise, cfg.join)
        except ValueError as exc:
            transport.close()
            raise SwarmError(str(exc)) from None
        self.id = cfg.node_id or self.address
        try:
            self._build_peer(transport, restored, key_file)
        except BaseException:
            transport.close()
            raise
        self.phase = "joining"
        self._driver.start()
        if cfg.metrics is not None:
            from p2p.ops.http import OpsServer  # prometheus_client only when asked for

            self._ops = OpsServer(cfg.metrics, self.status, lambda: self._driver.last_turn)
        if self.handle_signals:
            self._signal_stop = SignalStop(self.stop_event)
        try:
            deadline = None
            if cfg.state_sync and cfg.join:
                # One join timeout for asking and joining: a state sync that heard nothing (or
                # "nothing fresher") has spent its share of it, and join addresses that stayed
                # silent through it are told apart from a swarm that answers in the time left
                # (at least JOIN_GRACE_S). Before, a wrong address took twice --join-timeout.
                # A state taken by sync (a long transfer) starts a fresh timeout for the join.
                deadline = time.monotonic() + cfg.join_timeout_s
                self._sync()
                deadline = None if self.synced else max(deadline, time.monotonic() + JOIN_GRACE_S)
                self.phase = "joining"
            self._servable = True
            self._driver.act(lambda now: self.peer.start(list(cfg.join), now))
            wait_joined(self._driver, self.peer, cfg, self.stop_event, deadline)
        except BaseException:
            self._shut_down()
            raise
        self.phase = "training"
        self._started_at, self._steps_at_start = time.monotonic(), self._step
        event("joined", f"{self.id} joined the swarm at {self.address}", id=self.id, addr=self.address, step=self._step)
        self._keeper.next_checkpoint = time.monotonic() + cfg.checkpoint_every_s
        return self

    def _build_peer(self, transport: Any, restored: Optional[TrainingState], key_file: Optional[KeyFile]) -> None:
        """Membership (a restart rejoins with a higher incarnation), the averager with its
        restored state, the state donor, the step hooks and the network driver."""
        cfg, now = self.config, time.monotonic()
        # This process's protocol randomness: the run seed and id, plus entropy of its own, so a
        # restarted member never repeats its former self's random ids (CHOCO's stream, nonces).
        rng = random.Random(f"{peer_seed(cfg.seed, self.id)}:{secrets.token_hex(8)}")
        self.port = _ModelPort(self, self.flat, self.model_key)
        incarnation = int(restored.info.get("incarnation", -1)) + 1 if restored is not None else 0
        membership = Membership(cfg.membership, self.id, self.address, rng, now, incarnation=incarnation)
        membership.on_change = lambda *change: _report_member_change(self.id, *change)
        averager = make_averager(cfg.algorithm, cfg.averaging, self.port, rng, now, options=cfg.options)
        if restored is not None:
            self._load_algorithm_state(averager, restored, "checkpoint")
        donor = StateDonor(cfg.sync, self._describe_state, self._capture_for_peer,
                           lambda: offered_members([m.addr for m in membership.alive()], cfg.join))
        self.peer = Peer(self.address, membership, averager, get_topology(cfg.topology_name), donor)
        avg = cfg.averaging
        rounds = getattr(cfg.algorithm_options, "gossip_rounds", 1)
        # A safety net only: the algorithms' own round/exchange timeouts release the trainer first
        # (a round's deadline follows the link up to ``round_wait_cap``: p2p/averaging/round_deadline.py).
        wait_s = max(avg.exchange_timeout_s, avg.round_timeout_s * rounds, round_wait_cap(avg))
        self.hooks = StepHooks(averager, gate_timeout_s=3 * wait_s)
        self.hooks.idle_work = self._idle_work
        # Test-only (``hostile``): corrupt what this member sends to its neighbours.
        tamper = Hostile(cfg.hostile, averager.MESSAGES, rng.getrandbits(32)).tamper if cfg.hostile else None
        self._driver = NetworkDriver(transport, self.peer, self.address, self._status_now, self._state_reply,
                                     avg.exchange_timeout_s, self.hooks, model_reply=self._model_reply, tamper=tamper,
                                     key_file=key_file, allow_file=self._allow_file)
        self._driver.trimmer.grow_bytes = grow_bytes_for(4 * self.flat.numel)  # not a round's swing (heap.py)

    def _accept(self, state: TrainingState) -> None:
        """Load a donor's state (StateError: it does not fit; the next donor's replaces it)."""
        self._keeper.apply(state)
        self._step = state.step
        try:
            self._driver.call(lambda: self._load_algorithm_state(self.peer.averager, state, "peer"))
        except SwarmError as exc:
            raise StateError(str(exc)) from None

    def _load_algorithm_state(self, averager: Any, state: TrainingState, source: str) -> None:
        if state.algorithm != self.config.algorithm:
            log.warning("the %s state kept %s's algorithm state, not %s's: %s starts afresh",
                        source, state.algorithm, self.config.algorithm, self.config.algorithm)
            return
        try:
            averager.load_state_dict(state.algorithm_state, source)
        except ValueError as exc:
            raise SwarmError(f"{source} state of {state.algorithm} does not fit: {exc}") from None

    def _sync(self) -> None:
        """Take the swarm's state if a member holds a fresher one (joining.py)."""
        self.phase = "syncing"
        rng = random.Random(peer_seed(self.config.seed, self.id) ^ 0x5EED)
        synced = sync_state(self._driver, self.peer, self.config, self.model, self.model_key, self._step, rng,
                            self.stop_event, lambda joiner: setattr(self, "_joiner", joiner), self._accept)
        if synced is None:
            return
        self.synced = synced
        event("state_sync", f"took the swarm's state from {synced.donor}: step {synced.state.step}, "
              f"{synced.nbytes / 1e6:.1f} MB in {synced.seconds:.2f} s", logging.WARNING, donor=synced.donor,
              step=synced.state.step, bytes=synced.nbytes, seconds=round(synced.seconds, 3))

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
            self.settle()
            self.hooks.training_done(self._step)
        self.linger(self.config.linger_s if linger_s is None else linger_s)

    def when_waiting(self, work: Optional[Callable[[], None]]) -> None:
        """Run ``work()`` on the training thread whenever ``optimizer.step()`` is held at a gate
        by an averaging round in flight (DiLoCo's blocking outer round), before waiting out the
        rest; None: nothing. For what the loop would do next anyway, e.g. an evaluation that is
        due soon: the round runs beside it, where after the round it would make this peer late for
        the next one, and every peer waits for the last. The time it takes is not counted as
        waiting (status ``gate_wait_s``)."""
        self._idle_work = work
        if self._driver is not None:
            self.hooks.idle_work = work

    def settle(self) -> None:
        """Wait until no averaging round in flight still moves the model (DiLoCo with overlap
        lands its last outer step one round late) and land what it queued: call it after the
        last step, before a final evaluation. ``finish`` does. Bounded by the round's timeout."""
        if self._driver is not None and not self.stop_requested:
            self.hooks.settle(self._step)
            self.flat.apply_pending()

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
            if self._keeper.due(time.monotonic()):  # the model still moves: keep checkpointing it
                self.save_checkpoint(wait=False)
        self.apply_pending()

    def close(self, linger_s: Optional[float] = None, checkpoint: bool = True) -> None:
        """Finish (``finish(linger_s)``), write a last checkpoint (with ``checkpoint_dir``,
        unless ``checkpoint`` is False: the block ended in an exception), announce the leave,
        close the sockets. The exchange in flight is completed or abandoned within its
        timeout; the model is never left half-mixed. Idempotent."""
        if self._driver is None or self.phase in ("stopping", "stopped"):
            return
        if self.phase not in ("joining", "syncing"):
            self.finish(linger_s)
            if checkpoint and not self._driver.finished.is_set():
                self.save_checkpoint(wait=True)
        self._shut_down()
        if self._driver.error is not None:
            raise SwarmError(f"network loop failed: {self._driver.error}") from self._driver.error

    def _shut_down(self) -> None:
        self.phase = "stopping"
        if self._ops is not None:
            self._ops.close()
        self._driver.stop(timeout_s=self.config.averaging.exchange_timeout_s + 2.0)
        self._status_now()  # the network thread is gone: keep its last view for status()
        self.hooks.close_trainer_side()
        self.hooks.close()
        self.flat.apply_pending()  # the network thread is gone: deltas it queued land now
        if self._signal_stop is not None:
            self._signal_stop.close()
            self._signal_stop = None
        self.phase = "stopped"
        self._cached_status["phase"] = "stopped"

    # -- the training thread's side ----------------------------------------------------------
    def wrap(self, optimizer: torch.optim.Optimizer) -> SwarmOptimizer:
        """``optimizer``, averaging beside it: use the result exactly as the original. Its
        state is checkpointed, restored and given to joiners with the model's."""
        wrapped = SwarmOptimizer(optimizer, self)
        self._keeper.attach_optimizer(optimizer)
        return wrapped

    def register_state(self, name: str, obj: Any) -> None:
        """Checkpoint ``obj`` (anything with ``state_dict``/``load_state_dict``: an LR
        scheduler, a GradScaler, your data loader's position) with the run; when resuming, it
        gets its state back now or, when it comes after the checkpoint was read, at once."""
        self._keeper.register(name, obj)

    @property
    def resumed_from(self) -> Optional[str]:
        """The checkpoint this member resumed from (None: it did not)."""
        return self._keeper.restored_from

    def save_checkpoint(self, wait: bool = True) -> None:
        """Write a checkpoint now (training thread, between steps; with ``checkpoint_dir``)."""
        if self._keeper.store is None or self._driver is None:
            return
        try:
            algorithm_state, incarnation = self._driver.call(
                lambda: (self.peer.averager.state_dict(), self.peer.membership.incarnation))
        except (DriverStopped, DriverBusy) as exc:  # training goes on; the next one may succeed
            log.error("checkpoint at step %d skipped: %s", self._step, exc)
            return
        info = {"task": self.metrics.get("task"), "seed": self.config.seed, "node_id": self.id,
                "incarnation": incarnation, "saved_at": time.time()}
        state = self._keeper.capture(self._step, self.config.algorithm, algorithm_state, info)
        self._keeper.save(state, wait)

    @property
    def step(self) -> int:
        """Optimizer steps taken through the wrapped optimizer (skipped AMP steps excluded)."""
        return self._step

    def evaluation_step(self) -> int:
        """The inner steps the last ``evaluation_model()`` holds, to label its evaluation with:
        with DiLoCo, those of the last outer step (an evaluation while the next round is in
        flight, ``when_waiting``, scores the model of H steps before); else ``step``."""
        averager = self.peer.averager if self._driver is not None else None
        if not hasattr(averager, "outer_parameters") or self._evaluated_at_step is None:
            return self.step
        return self._evaluated_at_step

    def evaluation_model(self) -> torch.nn.Module:
        """The model to evaluate (and to compare with other methods at a step or a time): with
        DiLoCo, the swarm's outer parameters (theta_start, on which every peer's last outer step
        agreed; DiLoCo evaluates this global model, Douillard et al. 2023, Sec. 3), loaded into a
        copy of the model kept for it (buffers from the live model); the model itself with every
        other algorithm, whose parameters are the averaged ones.

        Why not DiLoCo's live model: between two outer steps it is one peer's local run, 2-6
        accuracy points under the average on nodes.wide (``bench/diloco_sweep.py`` at H 25:
        0.824 at a boundary, 0.772 ten steps later), so which of those an evaluation happened to
        land on decided the figure: a trainer that waits at every boundary was evaluated right
        after its outer steps, one that overlaps the round (``--diloco-overlap``) anywhere.

        Costs one more copy of the model (on its device), kept between evaluations: swapping the
        outer parameters into the live model instead would hand a joiner's state capture or an
        export, read by the network thread meanwhile, the wrong values, and holding the
        parameter lock through an evaluation would stall that thread (membership probes)."""
        averager = self.peer.averager if self._driver is not None else None
        self._evaluated_at_step = None
        if not hasattr(averager, "outer_parameters"):
            return self.model
        try:  # a copy, and the steps it holds
            values, self._evaluated_at_step = self._driver.call(
                lambda: (np.array(averager.outer_parameters, dtype=np.float32), averager.outer_at_step))
        except (DriverStopped, DriverBusy):  # stopping: the live model (the last outer step landed in it)
            return self.model
        if self._outer_model is None:
            self._outer_model = copy.deepcopy(self.model)
        self._outer_model.load_state_dict(self.model.state_dict())  # buffers (batch norm's statistics)
        self._outer_model.load_state_dict(self.flat.named_values(values, self.model), strict=False)
        return self._outer_model

    def apply_pending(self) -> int:
        """Land the averaging deltas queued since the last step (the wrapper does this at every
        step; call it when the model is not stepping, e.g. before evaluating). Returns how many."""
        return self.flat.apply_pending()

    def _before_optimizer_step(self, closure: bool) -> None:
        if self._driver is None or self.phase != "training" or self._done:
            raise RuntimeError("SwarmOptimizer.step() outside the Swarm's with block (or after finish/close)")
        if self.hooks.wants_gradient:
            if closure:
                raise ValueError(f"{self.config.algorithm} exchanges gradients before the step: "
                                 f"compute them yourself (backward) and call step() without a closure")
            self.hooks.gradient(self._step + 1)  # e.g. GossipGraD: the partner's gradient replaces ours

    def _after_optimizer_step(self) -> None:
        """Step k was applied (and counted, under the lock): tell the algorithm, land queued
        deltas, and wait at the gate of step k + 1 when the algorithm gates (its round must
        finish before the next step)."""
        k = self._step
        hooks = self.hooks
        hooks.after_step(k)
        self.flat.apply_pending()
        if hooks.gates_steps:
            hooks.before_step(k + 1)
            self.flat.apply_pending()
        if self._driver.finished.is_set() and self._driver.error is not None:
            raise SwarmError(f"network loop failed: {self._driver.error}") from self._driver.error
        if self._keeper.due(time.monotonic()):
            self.save_checkpoint(wait=False)

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
            except (DriverStopped, DriverBusy):
                pass
        return {**self._cached_status, **self._training_fields()}

    def _training_fields(self) -> dict[str, Any]:
        hooks = getattr(self, "hooks", None)  # made by start()
        return {"phase": self.phase, "step": self._step, "steps_per_s": round(self.steps_per_s, 3),
                "loss": self.metrics.get("loss", math.nan), "accuracy": self.metrics.get("accuracy", math.nan),
                "eval_loss": self.metrics.get("eval_loss", math.nan),
                # written by the trainer thread, so current after close() too (the last progress line)
                "gate_wait_s": round(hooks.gate_wait_s, 3) if hooks else 0.0, "gate_waits": hooks.gate_waits if hooks else 0,
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
            "send_drops": t.send_drops, "recv_drops": t.recv_drops, "router_rebinds": t.router_rebinds,
            "dealers_flooded": t.dealers_flooded, "transfers_abandoned": t.transfers_abandoned,
            "bulk_connections_refused": t.connections_refused, "bulk_slow_closed": t.slow_closed,
            "peer_sockets": t.peer_sockets, "peer_sockets_evicted": t.peer_sockets_evicted, "redials": t.redials,
            "heap_trims": self._driver.trimmer.trims, "network_cpu_s": round(self._driver.cpu_s, 3),
            "network_turns": self._driver.turns, "rejected": dict(self._driver.rejected),
            "averaging": dict(peer.averager.stats), "consensus": peer.averager.disagreement.value,
            "robust": peer.averager.robust.report(now), "hostile": self.config.hostile,
            "uptime_s": round(now - self._started_at, 3),
            "bandwidth": self._bandwidth(), "gate_timeouts": self.hooks.gate_timeouts,
            "sync": self._sync_status(), "served": list(peer.donor.served), "checkpoint": self._keeper.status(),
            "sent_to": dict(t.sent_to), "received_from": dict(self._driver.received_from),
            "membership": dict(peer.membership.stats), "security": self._security(t.keyring),
            **self._training_fields(),
        }
        self._cached_status = info
        return info

    def _security(self, keyring: Any) -> dict[str, Any]:
        """Open, or sealed with which key, and the identities when on (the rejections are in
        ``rejected``: no_key, bad_key, replay, unauthenticated; unsigned, not_allowed,
        bad_signature, identity_mismatch; sender_mismatch, member_mismatch: p2p/net/member_ids.py)."""
        if keyring is None:
            return {"mode": "open", "summary": "open (no --swarm-key: anyone who reaches this node can join)"}
        keys = self._key_file
        info = {"mode": "encrypted", "summary": keyring.describe(), "cipher": "AES-256-GCM",
                "key_id": keyring.primary_id.hex(), "keys": len(keyring.keys), "key_file": keys.path,
                "reloads": keys.reloads, "key_file_error": keys.last_error}
        allow, identity = self._allow_file, self._driver.transport.identity
        if allow is not None:
            info["identities"] = {"public_key": public_line(identity.public), "allowed": len(allow.allowed),
                                  "allow_file": allow.path, "reloads": allow.reloads,
                                  "allow_file_error": allow.last_error, "bound_ids": len(self._driver.bindings),
                                  "bound_member_ids": len(self._driver.member_ids)}
        return info

    def _bandwidth(self) -> dict[str, Any]:
        """What bandwidth awareness measured and decided (algorithms that adapt report it)."""
        report = getattr(self.peer.averager, "bandwidth_report", None)
        if report is not None:
            return report()
        avg = self.config.averaging
        return {"links": {}, "codec": avg.compression, "interval_s": avg.interval_s}

    def _sync_status(self) -> dict[str, Any]:
        """While syncing: the transfer's progress; after: what came from whom (network thread)."""
        if self._joiner is not None and not self._joiner.finished:
            return self._joiner.progress()
        s = self.synced
        if s is None:
            return {"phase": "none" if self._joiner is not None else "off"}
        return {"phase": "done", "donor": s.donor, "step": s.state.step, "bytes": s.nbytes,
                "seconds": round(s.seconds, 3), "crc": s.crc}

    # -- what the network thread serves -----------------------------------------------------
    def _state_reply(self) -> StateReply:
        return StateReply(self._step, self.model_key, self.flat.snapshot())

    def _describe_state(self) -> Optional[tuple[int, str]]:
        return (self._step, self.model_key) if self._servable else None

    def _capture_for_peer(self, with_optimizer: bool) -> tuple[Any, int, str]:
        averager = self.peer.averager
        for_joiner = getattr(averager, "state_for_joiner", None)
        algorithm_state, values = for_joiner() if for_joiner is not None else (averager.state_dict(), None)
        state = self._keeper.capture_for_peer(lambda: self._step, self.config.algorithm, algorithm_state,
                                              with_optimizer, values)
        return to_bytes(state), state.step, state.model_key

    def _model_reply(self) -> ModelReply:
        """``p2p export --peer``: the model, with DiLoCo its outer parameters (the swarm's model,
        as a joiner takes it and as ``evaluation_model`` scores it; the live model between outer
        steps is this peer's local run)."""
        outer = getattr(self.peer.averager, "outer_parameters", None)
        values = None if outer is None else np.array(outer, dtype=np.float32)
        state = self._keeper.capture_for_peer(lambda: self._step, self.config.algorithm, {}, with_optimizer=False,
                                              model_values=values)
        return ModelReply(state.step, self.model_key, to_bytes(state))


_MEMBER_EVENTS = {ALIVE: "member_alive", SUSPECT: "member_suspect", DEAD: "member_dead", LEFT: "member_left"}


def _report_member_change(me: str, member: str, old: Optional[int], old_inc: int, new: Optional[int],
                          new_inc: int) -> None:
    """Membership's table changes as events (network thread): joins, suspicions, deaths, leaves."""
    if new is None or old == new or member == me:
        return  # reaped, only the incarnation moved, or our own row
    name = "member_joined" if old is None else _MEMBER_EVENTS[new]
    event(name, f"member {member} {name[len('member_'):]} (incarnation {new_inc})", member=member,
          incarnation=new_inc, was=None if old is None else STATE_NAMES[old])


def _member_row(m: Any, now: float) -> dict[str, Any]:
    """A member table row; ``last_heard_s`` is seconds ago on this node's own clock."""
    return {"id": m.id, "addr": m.addr, "state": m.state, "incarnation": m.incarnation,
            "last_heard_s": None if m.last_heard is None else round(now - m.last_heard, 3)}
