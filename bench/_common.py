"""Shared pieces of the benchmark workers and the slow-links orchestrator.

Workers (``ddp_worker.py``, ``compute_only.py``) train a task exactly as a p2p node does (same
model init from the run seed, same optimizer, learning rate and per-peer batch size, the data
shard ``i/N``) and write one JSON object per line on stdout: ``{"t": unix time, "step": ...,
"accuracy": ..., "loss": ..., "tx_bytes": ...}`` after each held-out evaluation, and a last line
with ``"event": "done"``.
"""

from __future__ import annotations

import bisect
import json
import math
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` from anywhere: find p2p and nodes/
    sys.path.insert(0, str(ROOT))


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}")


def worker_seed(run_seed: int, name: str) -> int:
    """Per-worker data-order seed (stable across processes), as p2p.training.node.peer_seed."""
    return zlib.crc32(f"{run_seed}:{name}".encode())


def iface_tx_bytes(dev: str = "eth0") -> Optional[int]:
    """Bytes sent by ``dev`` in this process's network namespace (None if it has no such dev)."""
    try:
        return int(Path("/sys/class/net", dev, "statistics", "tx_bytes").read_text())
    except (OSError, ValueError):
        return None


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def train(task: Any, model: torch.nn.Module, forward_model: torch.nn.Module, optimizer: Any,
          batches: Iterable[tuple], steps: int, eval_every_s: float, evaluate: bool,
          iface: str = "eth0", after_step: Optional[Callable[[int], None]] = None,
          progress_every_s: float = 0.5) -> None:
    """The worker loop: ``steps`` optimizer steps; every ``eval_every_s`` (and at the end) a
    held-out evaluation of ``model`` if ``evaluate``, else a progress line without accuracy.
    Between them a progress line (step, no accuracy) every ``progress_every_s``, as a p2p node's
    ``--log-every``: steps/s over short windows (bench/slow_links_windows.py) then compare at the
    same resolution (with evaluation lines only, a worker's windows were smoothed over ~2.5 s)."""
    model.train()
    it = iter(batches)
    start = last_eval = last_line = time.monotonic()
    ema = math.nan
    eval_s = 0.0  # wall seconds spent evaluating (the done record's eval_s, as a p2p node's last line)

    def report(step: int, final: bool = False, evaluated: bool = True) -> None:
        nonlocal eval_s
        record: dict[str, Any] = {"t": time.time(), "step": step, "loss": ema,
                                  "tx_bytes": iface_tx_bytes(iface), "elapsed_s": time.monotonic() - start}
        if evaluate and evaluated:
            began = time.monotonic()
            model.eval()
            metrics = task.evaluate(model, "cpu")
            model.train()
            eval_s += time.monotonic() - began
            record.update(accuracy=float(metrics["accuracy"]), eval_loss=float(metrics.get("loss", math.nan)))
        if final:
            record.update(event="done", eval_s=round(eval_s, 3))
        emit(record)

    for step in range(1, steps + 1):
        x = next(it)
        optimizer.zero_grad(set_to_none=False)
        loss = task.loss(forward_model, x)
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss became {value} at step {step}")
        ema = value if math.isnan(ema) else 0.95 * ema + 0.05 * value
        if after_step is not None:
            after_step(step)
        now = time.monotonic()
        if now - last_eval >= eval_every_s and step < steps:
            report(step)
            last_eval = last_line = time.monotonic()
        elif now - last_line >= progress_every_s and step < steps:
            report(step, evaluated=False)
            last_line = now
    report(steps, final=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return parse_jsonl(path.read_text(errors="replace")) if path.exists() else []


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The JSON objects among ``text``'s lines (other lines, e.g. a node's text logs, skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def mean_accuracy_curve(series: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Per-peer (t, accuracy) samples -> (t, mean over peers of each peer's accuracy at t), at
    every evaluation from the first moment every peer has been evaluated. A peer's accuracy at t
    is interpolated linearly between its evaluations either side of t (after its last: that one),
    the rule time_to_target applies between the points of one evaluator's curve, so that a method
    whose N peers each evaluate (p2p, compute-only, post-local SGD) is scored as DDP's one
    evaluator is. Why not each peer's latest accuracy (before stop 36): with evaluations ~2.5 s
    apart and the peers' out of phase, that mean trails the peers' own curves by about half an
    interval. On nodes.wide DiLoCo's peers, which hold one outer model, were scored 0.1-1.6 s
    (median 0.7 s) and ~25 steps late to 0.80, against an ideal bound of 8 s computed from DDP's
    interpolated curve (stop 34's runs, re-scored)."""
    clean = [sorted((t, a) for t, a in s if not math.isnan(a)) for s in series]
    if not clean or not all(clean):
        return []
    start = max(s[0][0] for s in clean)
    times = sorted({t for s in clean for t, _ in s if t >= start})
    return [(t, sum(interpolated(s, t) for s in clean) / len(clean)) for t in times]


def interpolated(samples: Sequence[tuple[float, float]], t: float) -> float:
    """``samples``' value at ``t`` (sorted by time, t at or after the first): linear between the
    samples either side, the last one's after it."""
    i = bisect.bisect_right([x for x, _ in samples], t)
    if i == 0:
        raise ValueError(f"{t} is before the first sample ({samples[0][0] if samples else 'none'})")
    if i >= len(samples):
        return samples[-1][1]
    (t0, a0), (t1, a1) = samples[i - 1], samples[i]
    return a0 + (a1 - a0) * (t - t0) / (t1 - t0)


def time_to_target(curve: Sequence[tuple[float, float]], target: float) -> Optional[float]:
    """When ``curve`` first reaches ``target`` (None if never): between the last point below it
    and the first at or above it, by linear interpolation; the first point if it is already
    there. Why not the first point at or above: evaluations land every ~2.5 s (--eval-every 2
    plus an evaluation), 60-75 steps of the wide task, and that rounded every time up to the
    next one, for one method by 0.1 s and for the next by 2.4 s (stop 29: DiLoCo's peers at
    0.799 at 8.3 s counted at 10.6 s). Works on step curves as well (steps to target)."""
    before = None
    for t, value in curve:
        if value >= target:
            if before is None:
                return t
            t0, v0 = before
            return round(t0 + (t - t0) * (target - v0) / (value - v0), 3)
        before = (t, value)
    return None
