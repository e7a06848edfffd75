"""The local training loop: the one thread that writes the model.

Each step: apply the averaging deltas other threads queued, take a batch, forward, backward,
optimizer step under the parameter lock. It never waits on the network. Evaluation on the
task's held-out set runs every ``eval_every_s`` seconds. After the last step the loop keeps
applying deltas (the *linger* phase) so the peer keeps mixing with the swarm until stopped.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch

from p2p.training.flat import FlatParams
from p2p.training.step_hooks import StepHooks


@dataclass
class TrainingState:
    """What the training thread reports; plain fields, written by one thread only."""

    phase: str = "starting"  # starting, joining, training, lingering, stopped
    step: int = 0
    loss: float = math.nan  # moving average of the training loss
    accuracy: float = math.nan  # last held-out accuracy
    eval_loss: float = math.nan
    deltas_applied: int = 0
    started_at: float = field(default_factory=time.monotonic)
    steps_per_s: float = 0.0


def to_device(batch: tuple, device: torch.device) -> tuple:
    return tuple(t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in batch)


class TrainingLoop:
    def __init__(self, task: Any, model: torch.nn.Module, flat: FlatParams, optimizer: Any,
                 batches: Iterator[tuple], device: torch.device, state: TrainingState,
                 eval_every_s: float = 2.0, slowdown: float = 1.0, hooks: Optional[StepHooks] = None) -> None:
        self.task, self.model, self.flat, self.optimizer = task, model, flat, optimizer
        self.hooks = hooks  # the averager's step hooks; None when training alone
        self.batches, self.device, self.state = batches, device, state
        self.eval_every_s = eval_every_s
        # Test-only straggler knob: each step's compute takes `slowdown` times as long (it
        # sleeps the rest); waiting at the averager's gates is not scaled.
        self.slowdown = slowdown

    def evaluate(self) -> None:
        self.model.eval()
        metrics = self.task.evaluate(self.model, self.device)
        self.model.train()
        self.state.accuracy = float(metrics["accuracy"])
        self.state.eval_loss = float(metrics.get("loss", math.nan))

    def step(self) -> float:
        """One local step; the averager's hooks may gate it (see p2p/averaging/base.py)."""
        k = self.state.step + 1
        hooks = self.hooks
        self.state.deltas_applied += self.flat.apply_pending()
        if hooks is not None and hooks.gates_steps:
            hooks.before_step(k)
            self.state.deltas_applied += self.flat.apply_pending()  # e.g. the round just mixed
        started = time.monotonic()
        batch = to_device(next(self.batches), self.device)
        self.flat.zero_grad()
        loss = self.task.loss(self.model, batch)
        loss.backward()
        compute = time.monotonic() - started
        if hooks is not None:
            hooks.gradient(k)
        started = time.monotonic()
        with self.flat.lock:
            self.optimizer.step()
        compute += time.monotonic() - started
        if self.slowdown > 1.0:  # the straggler knob scales compute only, never time spent waiting
            time.sleep(compute * (self.slowdown - 1.0))
        if hooks is not None:
            hooks.after_step(k)
        return float(loss.detach())

    def run(self, stop: threading.Event, steps: Optional[int], duration_s: Optional[float]) -> None:
        state = self.state
        state.phase = "training"
        self.model.train()
        start = last_eval = time.monotonic()
        ema = None
        while not stop.is_set():
            if steps is not None and state.step >= steps:
                break
            if duration_s is not None and time.monotonic() - start >= duration_s:
                break
            value = self.step()
            if not math.isfinite(value):
                raise FloatingPointError(f"training loss became {value} at step {state.step}")
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            state.loss = ema
            state.step += 1
            now = time.monotonic()
            state.steps_per_s = state.step / max(now - start, 1e-9)
            if now - last_eval >= self.eval_every_s:
                self.evaluate()
                last_eval = now
        if self.hooks is not None and self.hooks.gates_steps and not stop.is_set():
            # Finish the round the last step began (D-PSGD's mix, DiLoCo's outer step): those
            # land in the gate before the next step, which would otherwise never come.
            self.hooks.before_step(state.step + 1)
            state.deltas_applied += self.flat.apply_pending()
        if self.hooks is not None and not stop.is_set():
            self.hooks.training_done(state.step)  # from now on the averager serves the others
        self.evaluate()

    def linger(self, stop: threading.Event, linger_s: Optional[float]) -> None:
        """Keep applying averaging deltas (no training) until stopped or ``linger_s`` passes."""
        self.state.phase = "lingering"
        end = None if linger_s is None else time.monotonic() + linger_s
        last_eval = time.monotonic()
        unevaluated = 0  # deltas applied since the last evaluation
        while not stop.wait(0.02):
            if end is not None and time.monotonic() >= end:
                break
            applied = self.flat.apply_pending()
            self.state.deltas_applied += applied
            unevaluated += applied
            # Re-evaluate once the model changed, even if the last deltas came just after an
            # evaluation: the reported accuracy must catch up with the mixed model.
            if unevaluated and time.monotonic() - last_eval >= self.eval_every_s:
                self.evaluate()
                last_eval, unevaluated = time.monotonic(), 0
        self.state.deltas_applied += self.flat.apply_pending()
        self.evaluate()
