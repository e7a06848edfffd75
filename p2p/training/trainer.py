"""The daemon's training loop over a ``Task``: the plain loop a user would write.

Each step: take a batch, forward and loss under ``torch.autocast`` when a lower precision is
asked (bf16, or fp16 with a ``GradScaler``), backward, ``optimizer.step()``,
``optimizer.zero_grad()``. With a ``SwarmOptimizer`` (p2p/training/optimizer.py) that step is
where averaging happens; with a plain optimizer (the demo's single-process reference) this is
ordinary training. Held-out evaluation runs every ``eval_every_s`` seconds.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch

PRECISIONS: dict[str, Optional[torch.dtype]] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class LoopState:
    """What the training loop reports; written by the training thread only."""

    iterations: int = 0  # batches trained on (fp16 steps a GradScaler skipped included)
    loss: float = math.nan  # moving average of the training loss
    accuracy: float = math.nan  # last held-out accuracy
    eval_loss: float = math.nan
    evaluations: int = 0  # held-out evaluations run (each costs many steps' compute on a small model)
    # Wall clock (time.time()) when the last evaluation began: the moment the model it scored is
    # from (a benchmark times accuracy by it, as its workers do, not by when the line was read)
    evaluated_at: float = math.nan
    evaluated_step: int = -1  # the applied steps the last evaluated model had taken
    eval_s: float = 0.0  # wall seconds spent evaluating, in all


def to_device(batch: tuple, device: torch.device) -> tuple:
    return tuple(t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in batch)


class TrainingLoop:
    def __init__(self, task: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 batches: Iterator[tuple], device: torch.device, precision: str = "fp32",
                 eval_every_s: float = 2.0, slowdown: float = 1.0,
                 steps_done: Optional[Callable[[], int]] = None,
                 on_report: Optional[Callable[[LoopState], None]] = None,
                 settle: Optional[Callable[[], None]] = None,
                 evaluated_model: Optional[Callable[[], torch.nn.Module]] = None,
                 evaluated_step: Optional[Callable[[], int]] = None) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: choose from {', '.join(PRECISIONS)}")
        self.task, self.model, self.optimizer = task, model, optimizer
        self.batches, self.device = batches, device
        self.autocast_dtype = PRECISIONS[precision]
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
        self.eval_every_s = eval_every_s
        # Test-only straggler knob: each step's compute takes `slowdown` times as long (it
        # sleeps the rest); time spent waiting at an averaging gate is not scaled.
        self.slowdown = slowdown
        self.state = LoopState()
        # Wall clock (time.time()) when run() began and when its last step ended, before the
        # settle and the last evaluation: the training phase that bench/slow_links.py compares
        # with compute-only's, start-up excluded
        self.started_at: Optional[float] = None
        self.ended_at: Optional[float] = None
        self.steps_done = steps_done or (lambda: self.state.iterations)  # applied steps
        self.on_report = on_report or (lambda state: None)
        self.settle = settle or (lambda: None)  # before the last evaluation: the averaging round in flight lands
        # the model an evaluation scores (p2p.Swarm.evaluation_model: DiLoCo's outer parameters)
        self.evaluated_model = evaluated_model or (lambda: self.model)
        # the applied steps that model holds (p2p.Swarm.evaluation_step), asked after it
        self.evaluated_step = evaluated_step or self.steps_done
        # When the next evaluation is due (monotonic; run() restarts it): ``eval_every_s`` after
        # the last one ended, as bench/compute_only.py and a user's own loop schedule them
        self._eval_due = time.monotonic() + eval_every_s

    def evaluate_if_due_soon(self) -> None:
        """Evaluate now if the next evaluation is due within half an interval: for the moments
        the trainer would sit idle anyway (p2p.Swarm.when_waiting), so evaluations land there
        rather than mid-period. It stands in for the one due: the one after is scheduled as if
        this one had run on time, so evaluating early never evaluates more often (each costs
        tens of steps' compute on a small model, and on a shared machine other peers' steps)."""
        if time.monotonic() >= self._eval_due - self.eval_every_s / 2:
            self.evaluate()

    def evaluate(self) -> None:
        began, started = time.time(), time.monotonic()
        model = self.evaluated_model()
        model.eval()
        metrics = self.task.evaluate(model, self.device)
        self.model.train()
        self.state.accuracy = float(metrics["accuracy"])
        self.state.eval_loss = float(metrics.get("loss", math.nan))
        self.state.evaluations += 1
        self.state.evaluated_at, self.state.evaluated_step = began, self.evaluated_step()
        ended = time.monotonic()
        self.state.eval_s += ended - started
        # on time or late: eval_every_s after this one ended; early (at a gate): after when the
        # one it stands in for would have ended
        self._eval_due = max(started, self._eval_due) + (ended - started) + self.eval_every_s
        self.on_report(self.state)

    def step(self) -> float:
        """One training step; returns its loss."""
        started = time.monotonic()
        batch = to_device(next(self.batches), self.device)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            loss = self.task.loss(self.model, batch)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            compute = time.monotonic() - started
            self.scaler.step(self.optimizer)  # skipped (no swarm step) when gradients overflowed
            self.scaler.update()
        else:
            loss.backward()
            compute = time.monotonic() - started
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.slowdown > 1.0:  # the compute parts only: backward and forward, not the gate in step()
            time.sleep(compute * (self.slowdown - 1.0))
        self.state.iterations += 1
        return float(loss.detach())

    def run(self, stop: threading.Event, steps: Optional[int], duration_s: Optional[float]) -> None:
        """Train until ``steps`` applied steps, ``duration_s`` seconds, or ``stop``."""
        state = self.state
        self.model.train()
        self.started_at = time.time()
        start = time.monotonic()
        self._eval_due = start + self.eval_every_s
        while not stop.is_set():
            if steps is not None and self.steps_done() >= steps:
                break
            if duration_s is not None and time.monotonic() - start >= duration_s:
                break
            value = self.step()
            self.ended_at = time.time()
            if not math.isfinite(value) and self.scaler is None:
                raise FloatingPointError(f"training loss became {value} at step {self.steps_done()}")
            if math.isfinite(value):
                state.loss = value if math.isnan(state.loss) else 0.95 * state.loss + 0.05 * value
            self.on_report(state)
            if time.monotonic() >= self._eval_due:
                self.evaluate()
        if not stop.is_set():
            self.settle()
        self.evaluate()
