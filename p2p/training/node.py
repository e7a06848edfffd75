"""The node daemon: one peer = transport + network driver + training loop, composed.

Threads: the caller's thread runs the training loop (and so receives SIGINT/SIGTERM); one
network thread drives the sans-I/O Peer. The two meet only in ``FlatParams`` (snapshot /
queued deltas) and in ``TrainingState`` (read-only for the network thread).

Lifecycle: bind -> join (retrying the seeds with backoff for ``join_timeout_s``) -> train ->
linger (keep mixing, no training) -> stop: the exchange in flight is finished or abandoned
within its timeout, the leave is announced, sockets close. The model is never left half-mixed:
deltas are applied only by the training thread, between steps.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from p2p.averaging.base import AveragingConfig
from p2p.averaging.registry import make_averager, natural_topology
from p2p.net.control import StateReply
from p2p.net.driver import NetworkDriver
from p2p.training.flat import FlatParams
from p2p.gossip import Membership, MembershipConfig
from p2p.peer import Peer
from p2p.training.step_hooks import StepHooks
from p2p.training.task import Shard, Task
from p2p.topology import get_topology
from p2p.training.trainer import TrainingLoop, TrainingState
from p2p.net.transport import Transport, TransportConfig

log = logging.getLogger("p2p.training.node")


class JoinError(RuntimeError):
    """No ``--join`` address answered within the join timeout."""


@dataclass(frozen=True)
class NodeConfig:
    listen: str  # HOST:PORT to bind (0.0.0.0 allowed)
    advertise: str  # HOST:PORT peers dial; also the default node id
    task: str  # task spec, for status output
    join: tuple[str, ...] = ()  # any known members; empty = first member of a new swarm
    node_id: Optional[str] = None  # defaults to ``advertise``
    seed: int = 0  # run seed: same model init on every peer; data order from (seed, node id)
    shard: Shard = Shard()  # this peer's part of the data
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    steps: Optional[int] = None  # stop training after this many steps (None: until stopped)
    duration_s: Optional[float] = None  # or after this long
    linger_s: Optional[float] = 10.0  # keep averaging this long after training (None: until stopped)
    join_timeout_s: float = 30.0  # give up joining after this long
    eval_every_s: float = 2.0  # held-out evaluation period
    log_every_s: float = 2.0  # progress line period (0: none)
    slowdown: float = 1.0  # test-only straggler knob: each step takes this many times longer
    algorithm: str = "adpsgd"  # averaging algorithm (p2p.averaging.registry)
    topology: Optional[str] = None  # topology name (p2p.topology); None: the algorithm's natural one
    averaging: AveragingConfig = AveragingConfig()
    membership: MembershipConfig = field(default_factory=MembershipConfig.local)
    transport: TransportConfig = TransportConfig()

    @property
    def id(self) -> str:
        return self.node_id or self.advertise

    @property
    def topology_name(self) -> str:
        return self.topology or natural_topology(self.algorithm)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


def peer_seed(run_seed: int, node_id: str) -> int:
    """A per-peer seed that is stable across processes (unlike Python's salted hash)."""
    return zlib.crc32(f"{run_seed}:{node_id}".encode())


class _ModelPort:
    """The ModelPort (p2p/averaging/base.py) over a FlatParams and the training state."""

    def __init__(self, flat: FlatParams, state: TrainingState, model_key: str) -> None:
        self.flat, self._state, self.model_key = flat, state, model_key
        self.numel = flat.numel
        self.snapshot = flat.snapshot
        self.add_delta = flat.add_delta
        self.gradient = flat.gradient
        self.set_gradient = flat.set_gradient

    @property
    def step(self) -> int:
        return self._state.step


class Node:
    def __init__(self, config: NodeConfig, task: Task, print_line: Callable[[str], None] = print) -> None:
        self.config = config
        self.task = task
        self.print_line = print_line
        self.stop_event = threading.Event()
        self.state = TrainingState()
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)  # identical initial model on every peer of the run
        self.model = task.make_model().to(self.device)
        self.flat = FlatParams(self.model)
        self.optimizer = task.make_optimizer(self.model.parameters())
        seed = peer_seed(config.seed, config.id)
        torch.manual_seed(seed)  # per-peer randomness (dropout etc.) from here on
        self.port = _ModelPort(self.flat, self.state, f"{task.name}/{self.flat.numel}")
        now = time.monotonic()
        rng = random.Random(seed)
        membership = Membership(config.membership, config.id, config.advertise, rng, now)
        averager = make_averager(config.algorithm, config.averaging, self.port, rng, now)
        self.peer = Peer(config.advertise, membership, averager, get_topology(config.topology_name))
        avg = config.averaging
        # A safety net only: the algorithms' own round/exchange timeouts release the trainer first.
        self.hooks = StepHooks(averager, gate_timeout_s=3 * max(
            avg.exchange_timeout_s, avg.round_timeout_s * avg.diloco_gossip_rounds))
        self.loop = TrainingLoop(task, self.model, self.flat, self.optimizer,
                                 task.train_batches(config.shard, seed), self.device, self.state,
                                 config.eval_every_s, config.slowdown, self.hooks)
        self.transport = Transport(config.transport, config.listen)  # raises TransportError
        self.driver = NetworkDriver(self.transport, self.peer, config.advertise, self.status_info,
                                    self._state_reply, config.averaging.exchange_timeout_s, self.hooks)

    # -- queries answered by the network thread ------------------------------------------
    def status_info(self) -> dict[str, Any]:
        s, t = self.state, self.transport
        return {
            "id": self.config.id, "addr": self.config.advertise, "task": self.config.task,
            "device": str(self.device), "phase": s.phase, "step": s.step, "loss": s.loss,
            "accuracy": s.accuracy, "eval_loss": s.eval_loss, "steps_per_s": s.steps_per_s,
            "algorithm": self.peer.averager.name, "topology": self.config.topology_name,
            "neighbours": self.peer.neighbours(),
            "members": [_member_row(m, time.monotonic()) for m in self.peer.membership.table()],
            "bytes_sent": t.bytes_sent, "bytes_received": t.bytes_received,
            "messages_sent": t.messages_sent, "messages_received": t.messages_received,
            "send_drops": t.send_drops, "transfers_abandoned": t.transfers_abandoned,
            "bulk_connections_refused": t.connections_refused, "rejected": dict(self.driver.rejected),
            "averaging": dict(self.peer.averager.stats), "uptime_s": time.monotonic() - s.started_at,
            "bandwidth": self._bandwidth(),
        }

    def _bandwidth(self) -> dict[str, Any]:
        """What bandwidth awareness measured and decided (algorithms that adapt report it)."""
        report = getattr(self.peer.averager, "bandwidth_report", None)
        if report is not None:
            return report()
        return {"links": {}, "codec": self.config.averaging.compression, "interval_s": self.config.averaging.interval_s}

    def _state_reply(self) -> StateReply:
        return StateReply(self.state.step, self.port.model_key, self.flat.snapshot())

    # -- lifecycle --------------------------------------------------------------------------
    def request_stop(self, *_: Any) -> None:
        self.stop_event.set()

    def run(self) -> None:
        """Join, train, linger, stop. Raises JoinError if no seed answers in time."""
        cfg = self.config
        self.state.phase = "joining"
        self.driver.start(list(cfg.join))
        progress = threading.Thread(target=self._progress, name="p2p-progress", daemon=True)
        try:
            self._wait_joined()
            progress.start()
            self.loop.run(self.stop_event, cfg.steps, cfg.duration_s)
            if not self.stop_event.is_set() and (cfg.steps is not None or cfg.duration_s is not None):
                self.loop.linger(self.stop_event, cfg.linger_s)
        finally:
            self.state.phase = "stopping"
            self.driver.stop(timeout_s=cfg.averaging.exchange_timeout_s + 2.0)
            self.hooks.close_trainer_side()
            self.hooks.close()
            self.flat.apply_pending()  # the network thread is gone: deltas it queued land now
            self.state.phase = "stopped"
        if self.driver.error is not None:
            raise RuntimeError(f"network loop failed: {self.driver.error}") from self.driver.error
        self.print_line(self._progress_line(final=True))

    def _wait_joined(self) -> None:
        deadline = time.monotonic() + self.config.join_timeout_s
        while not self.peer.membership.joined:
            if self.stop_event.is_set():
                return
            if self.driver.finished.is_set():
                raise RuntimeError(f"network loop failed: {self.driver.error}")
            if time.monotonic() >= deadline:
                raise JoinError(f"no --join peer answered within {self.config.join_timeout_s:g}s "
                                f"(tried {', '.join(self.config.join)})")
            time.sleep(0.05)

    def _progress(self) -> None:
        if self.config.log_every_s <= 0:
            return
        while not self.stop_event.wait(self.config.log_every_s):
            if self.state.phase in ("stopping", "stopped"):
                return
            self.print_line(self._progress_line())

    def _progress_line(self, final: bool = False) -> str:
        s, t = self.state, self.transport
        avg = self.peer.averager.stats
        bw = self._bandwidth()
        return (f"{'done' if final else s.phase:9s} step {s.step:6d}  loss {s.loss:.4f}  "
                f"acc {s.accuracy:.4f}  {s.steps_per_s:6.1f} step/s  "
                f"neighbours {len(self.peer.neighbours())}  exchanges {avg['exchanges_completed']}"
                f"/{avg['exchanges_started']}  sent {t.bytes_sent / 1e6:.1f} MB  "
                f"recv {t.bytes_received / 1e6:.1f} MB  codec {bw['codec']}  pause {bw['interval_s']:.2f}s  "
                f"rejected {sum(self.driver.rejected.values())}")


def _member_row(m: Any, now: float) -> dict[str, Any]:
    """A member table row; ``last_heard_s`` is seconds ago on this node's own clock."""
    return {"id": m.id, "addr": m.addr, "state": m.state, "incarnation": m.incarnation,
            "last_heard_s": None if m.last_heard is None else round(now - m.last_heard, 3)}
