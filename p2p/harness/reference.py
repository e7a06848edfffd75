"""The yardstick: one process training on all the data for the same number of samples.

The demo compares every peer's held-out accuracy with this. Results are cached per
(task, seed, steps, batch size, lr) in a JSON file so repeated demos do not pay for it twice.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Optional

import torch

from p2p.training.task import Shard
from p2p.training.trainer import TrainingLoop

CACHE_VERSION = 2  # 2: the loop zeroes gradients to None, as users' loops do


def train_reference(task: Any, seed: int, steps: int) -> dict[str, float]:
    """Train one model on the whole training set for ``steps`` steps; return held-out metrics."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the same initial model as the peers of a run with this seed
        model = task.make_model()
        loop = TrainingLoop(task, model, task.make_optimizer(model.parameters()),
                            task.train_batches(Shard(0, 1), seed), torch.device("cpu"), eval_every_s=float("inf"))
        loop.run(threading.Event(), steps, None)
    return {"accuracy": loop.state.accuracy, "loss": loop.state.eval_loss}


def reference_accuracy(task_spec: str, task: Any, seed: int, samples: int,
                       cache_dir: Optional[Path]) -> float:
    steps = max(1, round(samples / task.batch_size))
    key = f"v{CACHE_VERSION}|{task_spec}|{seed}|{steps}|{task.batch_size}|{task.lr}"
    cache_file = Path(cache_dir) / "reference.json" if cache_dir else None
    cache: dict[str, Any] = {}
    if cache_file and cache_file.exists():
        try:
            cache = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cache = {}  # a corrupt cache is recomputed, not fatal
    if key in cache:
        return float(cache[key])
    accuracy = train_reference(task, seed, steps)["accuracy"]
    if cache_file:
        cache[key] = accuracy
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        tmp.replace(cache_file)
    return accuracy
