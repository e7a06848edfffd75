"""The node daemon (``p2p start``): a task's training loop over a ``p2p.Swarm``.

It is the loop a user would write with the public API, plus what a long-running service needs:
the model built from the run seed (the same initial model on every peer), the task's batches
from this peer's shard, progress lines, evaluation while it lingers, and clean stops on
SIGINT/SIGTERM. There is one path from an optimizer step to the wire: the Swarm's.

Lifecycle: bind -> join (retrying the seeds for ``join_timeout``) -> train -> linger (keep
mixing, no training) -> stop: the exchange in flight is finished or abandoned within its
timeout, the leave is announced, sockets close.

The daemon owns its process, so it seeds torch's global RNG with this peer's seed after
building the model (dropout and the like differ per peer, reproducibly); a user's loop with
``p2p.Swarm`` keeps its own RNG untouched.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from p2p.config import SwarmConfig
from p2p.training.swarm import JoinError, Swarm, SwarmError, peer_seed
from p2p.training.task import Shard, Task
from p2p.training.trainer import PRECISIONS, LoopState, TrainingLoop

__all__ = ["JoinError", "Node", "NodeConfig", "SwarmError", "resolve_device"]


@dataclass(frozen=True)
class NodeConfig:
    swarm: SwarmConfig  # everything about the swarm membership and averaging
    task: str = "synthetic"  # task spec, for status output
    shard: Shard = Shard()  # this peer's part of the data
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 with a GradScaler)
    steps: Optional[int] = None  # stop training after this many steps (None: until stopped)
    duration_s: Optional[float] = None  # or after this long
    eval_every_s: float = 2.0  # held-out evaluation period
    log_every_s: float = 2.0  # progress line period (0: none)
    slowdown: float = 1.0  # test-only straggler knob: each step takes this many times longer
    log_format: str = "text"  # text | json: progress lines for people, or one JSON object each

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: choose from {', '.join(PRECISIONS)}")


def _number(value: float) -> Optional[float]:
    """JSON has no NaN: a value not measured yet is null."""
    return None if value != value else value


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when there is a GPU; an explicit CUDA device must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


class Node:
    def __init__(self, config: NodeConfig, task: Task, print_line: Callable[[str], None] = print) -> None:
        self.config = config
        self.task = task
        self.print_line = print_line
        self.device = resolve_device(config.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.swarm.seed)  # identical initial model on every peer of the run
            model = task.make_model()
        self.model = model.to(self.device)
        self.swarm = Swarm(self.model, config.swarm, handle_signals=True)
        self.optimizer = self.swarm.wrap(task.make_optimizer(self.model.parameters()))
        self.loop: Optional[TrainingLoop] = None

    def _report(self, state: LoopState) -> None:
        self.swarm.report(loss=state.loss, accuracy=state.accuracy, eval_loss=state.eval_loss)

    def run(self) -> None:
        """Join, train, linger, stop. Raises JoinError if no seed answers in time."""
        cfg, swarm = self.config, self.swarm
        swarm.report(task=cfg.task)
        swarm.start()
        progress = threading.Thread(target=self._progress, name="p2p-progress", daemon=True)
        try:
            if cfg.log_format == "json":
                self.print_line(json.dumps({"event": "started", "time": time.time(), "id": swarm.id, "addr": swarm.address,
                                            "task": cfg.task, "device": str(self.device), "parameters": swarm.flat.numel,
                                            "join": list(cfg.swarm.join)}))
            else:
                self.print_line(f"node {swarm.id} listening on {swarm.address}, task {cfg.task}, device {self.device}, "
                                f"{swarm.flat.numel} parameters, joining {', '.join(cfg.swarm.join) or '(first member)'}")
            seed = peer_seed(cfg.swarm.seed, swarm.id)
            torch.manual_seed(seed)  # the daemon's process: per-peer randomness from here on
            self.loop = TrainingLoop(self.task, self.model, self.optimizer, self.task.train_batches(cfg.shard, seed),
                                     self.device, cfg.precision, cfg.eval_every_s, cfg.slowdown,
                                     steps_done=lambda: swarm.step, on_report=self._report, settle=swarm.settle,
                                     evaluated_model=swarm.evaluation_model, evaluated_step=swarm.evaluation_step)
            if self.loop.scaler is not None:
                swarm.register_state("grad_scaler", self.loop.scaler)
            swarm.when_waiting(self.loop.evaluate_if_due_soon)  # evaluations beside the outer rounds
            if swarm.resumed_from or swarm.synced:
                self.loop.evaluate()  # where the run picks up, before any step of this process
                where = (f"the swarm's state from {swarm.synced.donor}" if swarm.synced
                         else f"checkpoint {swarm.resumed_from}")
                if self.config.log_format == "json":
                    self.print_line(json.dumps({"event": "resumed", "time": time.time(), "step": swarm.step,
                                                "source": where, "accuracy": self.loop.state.accuracy}))
                else:
                    self.print_line(f"resumed at step {swarm.step} from {where}: accuracy {self.loop.state.accuracy:.4f}")
            progress.start()
            self.loop.run(swarm.stop_event, cfg.steps, cfg.duration_s)
            evaluated = swarm.flat.landed  # the loop's last evaluation saw the model as it is now
            bounded = cfg.steps is not None or cfg.duration_s is not None
            swarm.finish(linger_s=0.0)  # the algorithm learns training is over
            if bounded and not swarm.stop_requested:
                self._linger(cfg.swarm.linger_s, evaluated)
        except BaseException:
            swarm.close(linger_s=0.0, checkpoint=False)  # a failed (maybe diverged) run keeps its last good checkpoint
            raise
        swarm.close()
        self.print_line(self._progress_line(final=True))

    def _linger(self, seconds: Optional[float], evaluated: int) -> None:
        """Keep mixing; re-evaluate once the model changed (even if the last deltas came just
        after an evaluation: the reported accuracy must catch up with the mixed model).
        ``evaluated``: the model's version (``FlatParams.landed``) the last evaluation saw; an
        unchanged model is not evaluated again at the end (with ``--linger 0`` it was evaluated
        twice: on the wide task one evaluation costs ~15 training steps of CPU)."""
        flat, last_eval = self.swarm.flat, time.monotonic()

        def on_tick(applied: int) -> None:
            nonlocal last_eval, evaluated
            if flat.landed != evaluated and time.monotonic() - last_eval >= self.config.eval_every_s:
                evaluated = flat.landed  # this thread is the only one that lands deltas
                self.loop.evaluate()
                last_eval = time.monotonic()

        self.swarm.linger(seconds, on_tick)
        if flat.landed != evaluated:
            self.loop.evaluate()

    def _progress(self) -> None:
        if self.config.log_every_s <= 0:
            return
        while not self.swarm.stop_event.wait(self.config.log_every_s):
            if self.swarm.phase in ("stopping", "stopped"):
                return
            self.print_line(self._progress_line())

    def _progress_line(self, final: bool = False) -> str:
        s = self.swarm.status()
        avg, bw = s.get("averaging", {}), s.get("bandwidth", {})
        if self.config.log_format == "json":
            return json.dumps({
                "event": "done" if final else "progress", "time": time.time(), "phase": s["phase"], "step": s["step"],
                "loss": _number(s["loss"]), "accuracy": _number(s["accuracy"]), "steps_per_s": s["steps_per_s"],
                "neighbours": len(s.get("neighbours", ())), "exchanges_completed": avg.get("exchanges_completed", 0),
                "exchanges_started": avg.get("exchanges_started", 0), "bytes_sent": s.get("bytes_sent", 0),
                "bytes_received": s.get("bytes_received", 0), "codec": bw.get("codec"),
                "pause_s": bw.get("interval_s"), "rejected": sum(s.get("rejected", {}).values()),
                "consensus": s.get("consensus"), "robust_refused": avg.get("robust_refused", 0),
                "robust_exclusions": avg.get("robust_exclusions", 0),
                "repairs": avg.get("repairs_completed"), "repairs_started": avg.get("repairs_started"),
                "repair_rounds": avg.get("repair_rounds"), "catch_ups": avg.get("catch_ups_completed"),
                "repair_bytes": avg.get("repair_bytes"), "inner_steps": avg.get("inner_steps"),
                "dense_rounds": avg.get("dense_rounds"), "warmup_dense_rounds": avg.get("warmup_dense_rounds"),
                "warmup_wait_pct": avg.get("warmup_wait_pct"),
                "rounds_partial": avg.get("rounds_partial"), "late": avg.get("late"),
                "round_deadline_ms": avg.get("round_deadline_ms"), "gate_wait_s": s.get("gate_wait_s"),
                "evaluated_at": _number(self.loop.state.evaluated_at) if self.loop else None,
                "evaluated_step": self.loop.state.evaluated_step if self.loop else None,
                **self._trained(final, s)})
        return (f"{'done' if final else s['phase']:9s} step {s['step']:6d}  loss {s['loss']:.4f}  "
                f"acc {s['accuracy']:.4f}  {s['steps_per_s']:6.1f} step/s  "
                f"neighbours {len(s.get('neighbours', ()))}  exchanges {avg.get('exchanges_completed', 0)}"
                f"/{avg.get('exchanges_started', 0)}  sent {s.get('bytes_sent', 0) / 1e6:.1f} MB  "
                f"recv {s.get('bytes_received', 0) / 1e6:.1f} MB  codec {bw.get('codec', '-')}  "
                f"pause {bw.get('interval_s', math.nan):.2f}s  rejected {sum(s.get('rejected', {}).values())}"
                + (f"  refused {avg['robust_refused']}" if avg.get("robust_refused") else "")
                # synchronous rounds (rounds.py): how many ended short, vectors that came too late
                + (f"  partial {avg['rounds_partial']}  late {avg.get('late', 0)}" if "rounds_partial" in avg else "")
                + (f"  deadline {avg['round_deadline_ms'] / 1e3:.1f}s" if "round_deadline_ms" in avg else "")
                + (f"  H {avg['inner_steps']}{' auto' if avg.get('inner_steps_auto') else ''}"
                   f"{' warm-up' if avg.get('warmup_until') else ''}" if "inner_steps" in avg else "")
                + (f"  repairs {avg['repairs_completed']}/{avg['repairs_started']} in {avg['repair_rounds']} rounds "
                   f"{avg['repair_bytes'] / 1e6:.1f} MB" if "repairs_started" in avg else "")
                + (f"  waited {s['gate_wait_s']:.1f}s" if s.get("gate_waits") else "")
                + "".join(f"  {k} {v}" for k, v in self._trained(final, s).items()))

    def _trained(self, final: bool, s: dict) -> dict[str, float]:
        """On the last line: when training began and its last step ended (wall clock), so a
        benchmark can time the training phase without start-up (bench/slow_links.py), and the
        CPU seconds the network thread (exchanges, codecs, status) took."""
        loop = self.loop
        if not final or loop is None or loop.started_at is None or loop.ended_at is None:
            return {}
        return {"train_started_at": loop.started_at, "train_ended_at": loop.ended_at,
                "evaluations": loop.state.evaluations, "eval_s": round(loop.state.eval_s, 3),
                "network_cpu_s": s.get("network_cpu_s")}
