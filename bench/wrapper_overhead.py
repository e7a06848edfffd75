"""Per-step overhead of ``p2p.Swarm`` + ``swarm.wrap(opt)`` over the same plain loop.

One process, one CPU thread, no peers, loopback: the swarm's network thread runs (membership
timers, the algorithm's hooks) but nothing travels, so what is measured is the cost of the
wrapper itself: the lock around the step, landing deltas, the algorithm's step hooks, the
network thread's share of the CPU.

For each task and algorithm it alternates blocks of ``--steps`` steps of the plain loop and of
the wrapped loop on one model (the same batches, the same optimizer) and reports the median
seconds per step of each and the overhead (wrapped / plain - 1). Alternating blocks cancel most
of the drift of a shared VM.

    python bench/wrapper_overhead.py                       # synthetic and tinylm, adpsgd and diloco
    python bench/wrapper_overhead.py --tasks synthetic --algorithms adpsgd --blocks 9 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import p2p  # noqa: E402
from p2p.training.task import Shard, load_task  # noqa: E402

STEPS = {"synthetic": 400, "tinylm": 20}


def block(model, optimizer, task, batches, steps: int) -> float:
    """Seconds per step of ``steps`` steps of the user's loop."""
    started = time.perf_counter()
    for _ in range(steps):
        loss = task.loss(model, next(batches))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.perf_counter() - started) / steps


def measure(task_name: str, algorithm: str, blocks: int, steps: int) -> dict:
    task = load_task(task_name)
    torch.manual_seed(0)
    model = task.make_model()
    plain = task.make_optimizer(model.parameters())
    batches = task.train_batches(Shard(0, 1), 0)
    block(model, plain, task, batches, max(1, steps // 4))  # warm up allocator and caches
    plain_s, wrapped_s = [], []
    settings = {"listen": "127.0.0.1:0", "algorithm": algorithm}
    with p2p.Swarm(model, **settings) as swarm:
        wrapped = swarm.wrap(plain)
        for _ in range(blocks):
            plain_s.append(block(model, plain, task, batches, steps))
            wrapped_s.append(block(model, wrapped, task, batches, steps))
    a, b = statistics.median(plain_s), statistics.median(wrapped_s)
    return {"task": task_name, "algorithm": algorithm, "steps_per_block": steps, "blocks": blocks,
            "plain_ms": round(a * 1e3, 4), "wrapped_ms": round(b * 1e3, 4), "overhead": round(b / a - 1, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="synthetic,tinylm")
    ap.add_argument("--algorithms", default="adpsgd,diloco")
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--steps", type=int, default=None, help="steps per block (default: per task)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for task in args.tasks.split(","):
        for algorithm in args.algorithms.split(","):
            row = measure(task, algorithm, args.blocks, args.steps or STEPS.get(task, 50))
            rows.append(row)
            if not args.json:
                print(f"{row['task']:10s} {row['algorithm']:8s} plain {row['plain_ms']:8.3f} ms/step  "
                      f"wrapped {row['wrapped_ms']:8.3f} ms/step  overhead {100 * row['overhead']:+6.2f}%",
                      flush=True)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
