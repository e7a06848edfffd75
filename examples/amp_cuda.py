"""Mixed precision on a GPU: ``torch.autocast`` + ``GradScaler`` in your loop, p2p beside it.

The model and the swarm's flat buffers stay on the GPU; only what goes on the wire is copied to
the host. fp16 needs the GradScaler (a step it skips on inf/NaN is not a swarm step); bf16 has
fp32's range and needs none. Without a GPU it runs on the CPU with bf16 autocast.

    python examples/amp_cuda.py --listen 127.0.0.1:7000 --dtype fp16
    python examples/amp_cuda.py --listen 127.0.0.1:7002 --join 127.0.0.1:7000 --dtype fp16
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.nn import functional as F

import p2p
from nodes.synthetic import SyntheticTask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:7000")
    ap.add_argument("--peers", type=int, default=1, help="wait for this many members before training")
    ap.add_argument("--join", action="append", default=[])
    ap.add_argument("--algorithm", default="diloco")
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="bf16")
    ap.add_argument("--shard", default="0/1")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--linger", type=float, default=5.0)
    ap.add_argument("--out", help="save the final model's state_dict here")
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if args.dtype == "fp16" and device.type == "cuda" else torch.bfloat16
    data = SyntheticTask()
    index, count = (int(part) for part in args.shard.split("/"))
    x_all, y_all = data.train_x[index::count].to(device), data.train_y[index::count].to(device)
    gen = torch.Generator(device=device).manual_seed(args.seed + index)
    torch.manual_seed(args.seed)
    model = data.make_model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    with p2p.Swarm(model, listen=args.listen, join=args.join, algorithm=args.algorithm, seed=args.seed,
                   linger=args.linger, min_members=args.peers) as swarm:
        opt = swarm.wrap(opt)
        started = time.monotonic()
        for _ in range(args.steps):
            pick = torch.randint(0, len(y_all), (64,), device=device, generator=gen)
            with torch.autocast(device.type, dtype=dtype):
                loss = F.cross_entropy(model(x_all[pick]), y_all[pick])
            scaler.scale(loss).backward()
            scaler.step(opt)  # skipped, and not counted, when the gradients overflowed
            scaler.update()
            opt.zero_grad()
        steps_per_s = swarm.step / (time.monotonic() - started)
    metrics = data.evaluate(model, device)
    print(json.dumps({"device": str(device), "dtype": str(dtype), "step": swarm.step, "steps_per_s": steps_per_s,
                      "accuracy": metrics["accuracy"], "loss": metrics["loss"]}), flush=True)
    if args.out:
        torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
