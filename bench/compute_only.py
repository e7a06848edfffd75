"""The compute-only bound for bench/slow_links.py: one peer training alone, no communication.

Same model init (run seed), optimizer, learning rate, per-peer batch size and data shard as a
p2p node or a DDP rank; it never talks to anyone. The orchestrator runs N of these at once (one
per lab namespace), so they share the CPU as the N peers of the other methods do. JSON lines
on stdout (see bench/_common.py), an evaluation every ``--eval-every`` seconds.

    python bench/compute_only.py --task tinylm --shard 0/4 --steps 1500
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (puts the repository on sys.path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="tinylm")
    ap.add_argument("--shard", default="0/1", help="I/N: this peer's data shard")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=float, default=2.0)
    ap.add_argument("--iface", default="eth0")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import time

    import torch

    from p2p.training.task import Shard, load_task

    shard = Shard.parse(args.shard)
    torch.set_num_threads(args.threads)
    task = load_task(args.task)
    torch.manual_seed(args.seed)
    model = task.make_model()
    optimizer = task.make_optimizer(model.parameters())
    batches = task.train_batches(shard, _common.worker_seed(args.seed, f"peer{shard.index}"))
    first = next(batches)

    def stream():
        yield first
        yield from batches

    _common.emit({"t": time.time(), "step": 0, "event": "start", "shard": args.shard,
                  "tx_bytes": _common.iface_tx_bytes(args.iface)})
    _common.train(task, model, model, optimizer, stream(), args.steps, args.eval_every,
                  evaluate=True, iface=args.iface)


if __name__ == "__main__":
    main()
