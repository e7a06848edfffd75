"""A Hugging Face-style loop: AdamW with weight-decay groups, linear warmup and decay, gradient
accumulation and clipping, a model whose forward returns ``.loss`` -- and p2p beside it.

The scheduler, the clipping and the accumulation stay exactly as they were: ``swarm.wrap``
returns an optimizer the scheduler accepts, and averaging happens once per optimizer step
(every ``--accumulate`` micro-batches). The model is the built-in byte-level transformer LM
trained on the Python standard library's sources (nothing is downloaded).

    python examples/hf_style.py --listen 127.0.0.1:7000
    python examples/hf_style.py --listen 127.0.0.1:7002 --join 127.0.0.1:7000
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch
from torch.nn import functional as F

import p2p
from nodes.tinylm import TinyLMTask
from p2p.training.task import Shard


@dataclass
class CausalLMOutput:
    loss: torch.Tensor
    logits: torch.Tensor


class TinyLMForCausalLM(torch.nn.Module):
    """The shape of a transformers model: ``model(input_ids=..., labels=...).loss``."""

    def __init__(self, task: TinyLMTask) -> None:
        super().__init__()
        self.lm = task.make_model()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> CausalLMOutput:
        logits = self.lm(input_ids)
        return CausalLMOutput(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)), logits)


def linear_schedule_with_warmup(optimizer: torch.optim.Optimizer, warmup: int, total: int):
    """What ``transformers.get_linear_schedule_with_warmup`` does, without the dependency."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: step / max(1, warmup) if step < warmup else max(0.0, (total - step) / max(1, total - warmup)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:7000")
    ap.add_argument("--peers", type=int, default=1, help="wait for this many members before training")
    ap.add_argument("--join", action="append", default=[])
    ap.add_argument("--algorithm", default="diloco")
    ap.add_argument("--shard", default="0/1")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps")
    ap.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--linger", type=float, default=5.0)
    args = ap.parse_args()

    task = TinyLMTask()
    torch.manual_seed(args.seed)
    model = TinyLMForCausalLM(task)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]  # biases and LayerNorms
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.98))
    batches = task.train_batches(Shard.parse(args.shard), seed=args.seed)

    with p2p.Swarm(model, listen=args.listen, join=args.join, algorithm=args.algorithm, seed=args.seed,
                   linger=args.linger, min_members=args.peers) as swarm:
        optimizer = swarm.wrap(optimizer)
        scheduler = linear_schedule_with_warmup(optimizer, warmup=args.steps // 10, total=args.steps)
        model.train()
        for step in range(1, args.steps + 1):
            for _ in range(args.accumulate):
                input_ids, labels = next(batches)
                outputs = model(input_ids=input_ids, labels=labels)
                (outputs.loss / args.accumulate).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if step % 50 == 0:
                print(f"step {step}  loss {outputs.loss.item():.4f}  lr {scheduler.get_last_lr()[0]:.2e}  "
                      f"{swarm.status().get('algorithm')}", flush=True)
    metrics = task.evaluate(model.lm)
    print(json.dumps({"step": swarm.step, "accuracy": metrics["accuracy"], "loss": metrics["loss"]}), flush=True)


if __name__ == "__main__":
    main()
