"""A plain PyTorch training loop that trains as one member of a swarm.

Compared with the same loop on one machine, two lines are added (marked ``# p2p``: the
``with p2p.Swarm(...)`` line and ``swarm.wrap(opt)``) and the loop is indented under the
``with``. Start one copy per machine; every copy but the first joins through any running one:

    python examples/plain_loop.py --listen 0.0.0.0:7000 --peers 3 --shard 0/3                        # machine A
    python examples/plain_loop.py --listen 0.0.0.0:7000 --peers 3 --join 10.0.0.1:7000 --shard 1/3   # machine B
    python examples/plain_loop.py --listen 0.0.0.0:7000 --peers 3 --join 10.0.0.1:7000 --shard 2/3   # machine C

(``--peers 3``: each waits until all three are up before its first step.)

On one machine give each copy its own port (127.0.0.1:7000, :7002, :7004: each also uses the
next port). The data is the built-in synthetic classification set; bring your own DataLoader.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import p2p
from nodes.synthetic import SyntheticTask  # a generated data set and its model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:7000", help="HOST:PORT this member listens on")
    ap.add_argument("--peers", type=int, default=1, help="wait for this many members before training")
    ap.add_argument("--join", action="append", default=[], help="HOST:PORT of any member (repeat)")
    ap.add_argument("--algorithm", default="adpsgd", help="averaging algorithm (p2p start --help)")
    ap.add_argument("--shard", default="0/1", help="this machine's part of the data, I/N")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--linger", type=float, default=5.0, help="seconds to keep averaging after the last step")
    ap.add_argument("--out", help="save the final model's state_dict here")
    args = ap.parse_args()

    data = SyntheticTask()
    index, count = (int(part) for part in args.shard.split("/"))
    loader = DataLoader(TensorDataset(data.train_x[index::count], data.train_y[index::count]), batch_size=32,
                        shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(args.seed + index))
    torch.manual_seed(args.seed)  # the same initial model on every machine
    model = data.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    with p2p.Swarm(model, listen=args.listen, join=args.join, algorithm=args.algorithm,  # p2p
                   seed=args.seed, linger=args.linger, min_members=args.peers) as swarm:
        opt = swarm.wrap(opt)  # p2p
        step = 0
        while step < args.steps:
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                step += 1
                if step % 200 == 0:
                    s = swarm.status()
                    print(f"step {step}  loss {loss.item():.4f}  neighbours {len(s.get('neighbours', []))}  "
                          f"sent {s.get('bytes_sent', 0) / 1e6:.1f} MB", flush=True)
                if step == args.steps:
                    break
    # Leaving the block kept averaging for --linger seconds, then left the swarm.
    metrics = data.evaluate(model)
    print(json.dumps({"step": swarm.step, "accuracy": metrics["accuracy"], "loss": metrics["loss"]}), flush=True)
    if args.out:
        torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
