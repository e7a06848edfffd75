"""DiLoCo's outer aggregate against a hostile worker, in one process: no network, no timing.

bench/hostile.py runs real peers, whose accuracy also depends on how the machine's load
spreads their steps and rounds; this replays the same setup (synthetic task, ``--shard i/n``,
H = 20 inner steps of the task's SGD, outer Nesterov lr 0.7 / momentum 0.9, 300 steps) with n
workers in lockstep, the last ``--hostile`` of them sending their pseudo-gradient corrupted as
``p2p start --hostile MODE`` does (p2p/averaging/hostile.py), and one outer aggregate:

- ``mean``: the plain mean (no robust mixing);
- ``clip``: every pseudo-gradient clipped to 2x the median norm, then the mean (the rule before
  the direction test);
- ``robust``: ``robust_mean`` (p2p/averaging/robust.py, "One answer for one set").

Prints the held-out accuracy of the final outer parameters, and the honest pseudo-gradients'
spread (mean distance to their mean / its norm) at a few outer steps.

    python bench/hostile_offline.py [--workers 5] [--hostile 1] [--seed 0] [--cases clean:mean,signflip:clip,signflip:robust]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodes.synthetic import SyntheticTask  # noqa: E402
from p2p.averaging.hostile import Hostile  # noqa: E402
from p2p.averaging.robust import median_of_nonzero, robust_mean  # noqa: E402
from p2p.training.task import Shard  # noqa: E402


def aggregate(rule: str, deltas: list[np.ndarray]) -> np.ndarray:
    if rule == "mean":
        return np.mean(deltas, axis=0)
    if rule == "clip":
        norms = [float(np.linalg.norm(d)) for d in deltas]
        tau = 2.0 * median_of_nonzero(norms)
        return np.mean([d * np.float32(min(1.0, tau / n)) if n > 0 else d for d, n in zip(deltas, norms)], axis=0)
    return robust_mean(deltas, 2.0)[0]


def run(task: SyntheticTask, n: int, hostile: int, mode: str | None, rule: str, seed: int,
        steps: int = 300, h: int = 20) -> tuple[float, list[float]]:
    flat = lambda m: torch.nn.utils.parameters_to_vector(m.parameters()).detach().numpy().copy()  # noqa: E731
    load = lambda m, v: torch.nn.utils.vector_to_parameters(torch.from_numpy(v.copy()), m.parameters())  # noqa: E731
    torch.manual_seed(seed)
    final = task.make_model()
    start = flat(final)
    models = [task.make_model() for _ in range(n)]
    for m in models:
        load(m, start)
    opts = [task.make_optimizer(m.parameters()) for m in models]
    batches = [task.train_batches(Shard(i, n), seed * 100 + i) for i in range(n)]
    bad = Hostile(mode, (), 7 + seed) if mode else None
    momentum, spreads = np.zeros_like(start), []
    for _ in range(steps // h):
        for m, opt, data in zip(models, opts, batches):
            for _ in range(h):
                opt.zero_grad()
                task.loss(m, next(data)).backward()
                opt.step()
        deltas = [start - flat(m) for m in models]
        honest = deltas[:n - hostile] if bad else deltas
        mean = np.mean(honest, axis=0)
        spreads.append(float(np.mean([np.linalg.norm(d - mean) for d in honest]) / np.linalg.norm(mean)))
        if bad:
            deltas = honest + [bad.corrupt(d) for d in deltas[n - hostile:]]
        avg = aggregate(rule, deltas)
        momentum = np.float32(0.9) * momentum + avg
        start = (start - np.float32(0.7) * (avg + np.float32(0.9) * momentum)).astype(np.float32)
        for m in models:
            load(m, start)
    load(final, start)
    return task.evaluate(final)["accuracy"], spreads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--hostile", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", default="clean:mean,clean:robust,signflip:clip,signflip:robust,noise:clip,noise:robust")
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = SyntheticTask()
    for case in args.cases.split(","):
        mode, rule = case.split(":")
        acc, spreads = run(task, args.workers, args.hostile, None if mode == "clean" else mode, rule, args.seed)
        print(f"{args.workers}:{args.hostile if mode != 'clean' else 0} {mode:8} {rule:6} accuracy {acc:.4f}  "
              f"honest spread {' '.join(f'{s:.2f}' for s in spreads[::4])}", flush=True)


if __name__ == "__main__":
    main()
