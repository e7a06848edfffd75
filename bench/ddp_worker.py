"""One rank of the PyTorch DistributedDataParallel (gloo) baseline for bench/slow_links.py,
or, with ``--local-sgd-period H``, of PyTorch's own local SGD: ``PostLocalSGDOptimizer`` with a
``PeriodicModelAverager(period=H)`` over gloo (torch.distributed's post-local SGD, Lin et al.,
"Don't use large mini-batches, use local SGD", ICLR 2020), the baseline a user of plain PyTorch
would pick on slow links. No DDP gradient all-reduce then (``--local-sgd-warmup`` 0: local SGD
from the first step; N > 0: N synchronous DDP steps first, as post-local SGD prescribes): each
rank steps on its own shard and every H steps the ranks' parameters are all-reduced to their
mean. Every rank evaluates (the models differ between averages).

Trains a task exactly as a p2p node would (same seed -> same initial model, the task's
optimizer, learning rate and per-peer batch size, data shard rank/world), but synchronously:
every step all-reduces the gradients over gloo. Rank 0 evaluates on the held-out set every
``--eval-every`` seconds (all ranks hold the same model); every rank prints JSON lines (see
bench/_common.py). Run one per lab namespace:

    ip netns exec p2plab-1 python bench/ddp_worker.py --rank 1 --world 4 \
        --master 10.77.0.2:29500 --task tinylm --steps 1500
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (puts the repository on sys.path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="HOST:PORT of rank 0 (its lab address)")
    ap.add_argument("--task", default="tinylm")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=float, default=2.0, help="seconds between evaluations (rank 0)")
    ap.add_argument("--iface", default="eth0", help="interface gloo uses and whose bytes are counted")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--local-sgd-period", type=int, default=0, help="H > 0: PyTorch's post-local SGD, average every H steps")
    ap.add_argument("--local-sgd-warmup", type=int, default=0, help="synchronous DDP steps before local SGD starts")
    args = ap.parse_args(argv)
    if not 0 <= args.rank < args.world:
        ap.error("need 0 <= rank < world")
    if args.iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", args.iface)

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from p2p.training.task import Shard, load_task

    torch.set_num_threads(args.threads)
    task = load_task(args.task)
    torch.manual_seed(args.seed)  # the same initial model on every rank (DDP broadcasts rank 0's too)
    model = task.make_model()
    batches = task.train_batches(Shard(args.rank, args.world), _common.worker_seed(args.seed, f"ddp{args.rank}"))
    next_batch = next(batches)  # load the data before the rendezvous, as a p2p node does before joining
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=900))
    if args.local_sgd_period > 0:
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer

        for p in model.parameters():  # the same start everywhere, as DDP's broadcast gives
            dist.broadcast(p.data, src=0)
        if args.local_sgd_warmup > 0:
            from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (PostLocalSGDState,
                                                                                        post_localSGD_hook)
            forward = DistributedDataParallel(model)
            # subgroup = the whole world: after the warm-up the hook stops all-reducing gradients
            forward.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=dist.group.WORLD,
                                                         start_localSGD_iter=args.local_sgd_warmup),
                                       post_localSGD_hook)
        else:
            forward = model
        averager = PeriodicModelAverager(period=args.local_sgd_period, warmup_steps=args.local_sgd_warmup)
        optimizer = PostLocalSGDOptimizer(optim=task.make_optimizer(model.parameters()), averager=averager)
    else:
        forward = DistributedDataParallel(model)
        optimizer = task.make_optimizer(forward.parameters())

    def stream():
        yield next_batch
        yield from batches

    _common.emit({"t": __import__("time").time(), "step": 0, "event": "start", "rank": args.rank,
                  "tx_bytes": _common.iface_tx_bytes(args.iface)})
    _common.train(task, model, forward, optimizer, stream(), args.steps, args.eval_every,
                  evaluate=args.rank == 0 or args.local_sgd_period > 0, iface=args.iface)
    dist.barrier()  # rank 0 evaluates last: a rank tearing gloo down before it aborts ("terminate called")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
