"""DiLoCo's outer step and codec against DDP at equal steps, in one process (no network).

Why: the slow-links benchmark takes ~8 minutes of this machine per method and rate; this asks
the cheaper question first: with identical task, data shards, per-peer batch, optimizer, lr
and seed, how accurate is each DiLoCo variant after k steps, against DDP (gradients averaged
every step) and compute-only (no communication)? It runs the real ``p2p.averaging.diloco``
objects over the real wire encoding (``p2p.wire``), on a full graph where every share
arrives: what the lab would give on a perfect network. Each variant runs in its own process
(one torch thread), ``--jobs`` at a time.

    python bench/diloco_sweep.py [--variants ddp,compute_only,int4:50:0.7:0.9,...]
        [--steps 1500] [--eval-at 250,500,...] [--peers 4] [--jobs 2] [--json]

A variant is ``ddp``, ``compute_only`` or ``CODEC:H:OUTER_LR:OUTER_MOMENTUM`` (CODEC: none,
one of p2p.averaging.diloco.CODECS; sparseloco at its default 2% density, meant for
``sparseloco:H:1.0:0.0``, SparseLoCo's outer rule; ``sparseloco@0.1`` keeps 10% of each chunk,
as ``--topk-fraction 0.1``; H ``25w300``: H 25 after a warm-up of 300 steps at H 10, as
``--diloco-warmup-steps 300``; optional further fields: ``d4``, the swarm's first 4 rounds int4,
as ``--diloco-dense-rounds 4``; ``wf0.1``, the warm-up's rounds at 10% of each chunk, as
``--diloco-warmup-topk-fraction 0.1``; ``o3``, overlap (``--diloco-overlap``) with every share
arriving 3 inner steps after it was sent, or at the gate that waits for it; with ``t2`` too,
bounded overlap, the gate 2 steps past the boundary, as ``--diloco-overlap-steps 2``). Prints one row per
variant: accuracy (mean over peers) at each evaluation step, and the DiLoCo bytes each peer sent
(wire payload, all rounds). DiLoCo's accuracy is its outer parameters' (theta_start), as the
nodes score it: the live model between outer steps is one peer's local run, and an evaluation
step that is not a multiple of H would score that instead (2-6 points lower on nodes.wide at H
25). With overlap, the outer parameters at an evaluation hold the rounds that have landed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (puts the repository on sys.path)

from p2p.averaging.diloco import CODECS as DILOCO_CODECS  # noqa: E402

DEFAULT_VARIANTS = "ddp,compute_only,int4:50:0.7:0.9,int4:50:0.7:0.8,int4:25:0.5:0.8,int4:50:1.4:0.0"


class _Port:
    """FlatParams (the node's own flat buffer) plus the step count and model key DiLoCo reads."""

    def __init__(self, flat, model_key: str) -> None:
        self.flat, self.model_key, self.step, self.numel = flat, model_key, 0, flat.numel

    def snapshot(self):
        return self.flat.snapshot()

    def add_delta(self, delta) -> None:
        self.flat.add_delta(delta)


def outer_model(model, flat, values):
    """A copy of ``model`` holding DiLoCo's outer parameters ``values`` (its buffers kept)."""
    import copy

    copied = copy.deepcopy(model)
    copied.load_state_dict(flat.named_values(values, model), strict=False)
    return copied


def run_variant(variant: str, steps: int, eval_at: list[int], peers: int, task_name: str, seed: int) -> dict:
    import torch

    from p2p.averaging.base import AveragingConfig
    from p2p.averaging.diloco import DiLoCo, DiLoCoConfig
    from p2p.training.flat import FlatParams
    from p2p.training.task import Shard, load_task
    from p2p.wire import decode, encode

    torch.set_num_threads(1)
    task = load_task(task_name)
    names = [f"peer{i}" for i in range(peers)]
    models, flats, opts, batches, ports, algs = [], [], [], [], [], []
    for i, name in enumerate(names):
        torch.manual_seed(seed)  # the same initial model on every peer, as p2p.training.node does
        model = task.make_model()
        flat = FlatParams(model)
        models.append(model), flats.append(flat)
        opts.append(task.make_optimizer(model.parameters()))
        batches.append(task.train_batches(Shard(i, peers), zlib.crc32(f"{seed}:{name}".encode())))
    if variant not in ("ddp", "compute_only"):
        codec, h, lr, mom, *fields = variant.split(":")
        extra = dict(_extra(f) for f in fields)
        codec, _, fraction = codec.partition("@")  # sparseloco@0.1: 10% of each chunk (--topk-fraction)
        config = AveragingConfig(compression=codec, round_timeout_s=3600.0,
                                 compression_topk_fraction=float(fraction) if fraction else None)
        h, _, warmup = h.partition("w")  # 25w300: H 25 after a warm-up of 300 steps at H 10
        # d4: the first 4 rounds int4, dense (--diloco-dense-rounds 4); wf0.1: the warm-up's
        # density; o3: overlap, shares 3 steps on the way; t2: its gate 2 steps past the boundary
        options = DiLoCoConfig(inner_steps=int(h), outer_lr=float(lr), outer_momentum=float(mom),
                               warmup_steps=int(warmup) if warmup else 0,
                               dense_rounds=int(extra.get("d", 0)), overlap="o" in extra,
                               warmup_topk_fraction=float(extra["wf"]) if "wf" in extra else None,
                               overlap_steps=int(extra["t"]) if "t" in extra else None)
        delay = int(extra.get("o", 0))
        for flat in flats:
            ports.append(_Port(flat, f"{task_name}/{flat.numel}"))
            algs.append(DiLoCo(config, ports[-1], random.Random(seed), 0.0, options))
    sent = 0
    in_flight: list = []  # (the step it arrives after, from, to, message), in that order
    acc: dict[int, float] = {}
    t0 = time.time()
    for k in range(1, steps + 1):
        for i in range(peers):
            flats[i].apply_pending()  # the outer step DiLoCo queued, as the trainer does
            models[i].train()
            opts[i].zero_grad(set_to_none=True)
            task.loss(models[i], next(batches[i])).backward()
        if variant == "ddp":  # all-reduce: every rank steps on the mean gradient
            mean = sum(f.gradient() for f in flats) / peers
            for f in flats:
                f.set_gradient(mean)
        for i in range(peers):
            opts[i].step()
        if algs:
            now = float(k)
            for p in ports:
                p.step = k
            for src, alg in zip(names, algs):
                for s in alg.after_step(k, now, [n for n in names if n != src]):
                    frames = encode(s.msg, src)
                    sent += sum(memoryview(f).nbytes for f in frames[1:])
                    in_flight.append((k + delay, src, s.to, decode(frames)[1]))
            # the shares due by now arrive; a gate that waits (overlap: a round a period behind)
            # takes the rest, as a trainer waiting for them would
            gated = [alg for alg in algs if alg.gate_wanted(k + 1)]
            while in_flight and (in_flight[0][0] <= k or not all(alg.may_step(k + 1, now) for alg in gated)):
                _, src, to, msg = in_flight.pop(0)
                algs[names.index(to)].receive(src, msg, now, [n for n in names if n != to])
            if not all(alg.may_step(k + 1, now) for alg in gated):
                raise RuntimeError(f"step {k}: an outer round did not finish with every share in")
        if k in eval_at:
            for f in flats:
                f.apply_pending()
            evaluated = models[:1] if variant == "ddp" else models
            if algs:  # the outer parameters, as the nodes score DiLoCo (p2p.Swarm.evaluation_model)
                evaluated = [outer_model(m, f, a.outer_parameters) for m, f, a in zip(models, flats, algs)]
            acc[k] = round(sum(task.evaluate(m)["accuracy"] for m in evaluated) / len(evaluated), 4)
            print(f"[diloco_sweep] {variant}: step {k} accuracy {acc[k]} ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    return {"variant": variant, "accuracy": acc, "bytes_per_peer": sent // peers,
            "outer_steps": algs[0].stats["outer_steps"] if algs else 0,
            "params_sent": sum(a.stats["params_sent"] for a in algs)}


def _fraction(text: str) -> bool:
    try:
        return 0 < float(text) <= 1
    except ValueError:
        return False


def _extra(field: str) -> Optional[tuple[str, str]]:
    """A variant's optional field, dROUNDS, wfFRACTION, oSTEPS or tSTEPS, as (its letters, its value);
    None if it is none of them."""
    name = "wf" if field.startswith("wf") else field[:1]
    value = field[len(name):]
    if (name == "wf" and _fraction(value)) or (name in ("d", "o", "t") and value.isdigit()):
        return name, value
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--eval-at", default=None, help="comma-separated steps (default: every 250 and the last)")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--task", default="tinylm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="variants run at once (one process each)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant, print its JSON
    args = ap.parse_args(argv)
    eval_at = sorted({int(x) for x in args.eval_at.split(",")} if args.eval_at
                     else set(range(250, args.steps + 1, 250)) | {args.steps})
    if args.one:
        print(json.dumps(run_variant(args.one, args.steps, eval_at, args.peers, args.task, args.seed)))
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        parts = v.split(":")
        codec, at, fraction = parts[0].partition("@")
        h, w, warmup = parts[1].partition("w") if len(parts) > 1 else ("", "", "")
        if v not in ("ddp", "compute_only") and (len(parts) < 4 or codec not in DILOCO_CODECS
                                                  or (at and not _fraction(fraction))
                                                  or not h.isdigit() or (w and not warmup.isdigit())
                                                  or not all(_extra(e) for e in parts[4:])
                                                  or (any(e[:1] == "t" for e in parts[4:])
                                                      and not any(e[:1] == "o" for e in parts[4:]))):
            ap.error(f"--variants: {v!r} is not ddp, compute_only or "
                     "CODEC[@FRACTION]:H[wWARMUP]:OUTER_LR:OUTER_MOMENTUM[:dROUNDS][:wfFRACTION][:oSTEPS[:tSTEPS]]")

    def one(v: str) -> dict:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", v, "--steps", str(args.steps),
               "--eval-at", ",".join(map(str, eval_at)), "--peers", str(args.peers), "--task", args.task,
               "--seed", str(args.seed)]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if done.returncode:
            return {"variant": v, "error": f"exit {done.returncode}"}
        return json.loads(done.stdout)

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, variants))
    if args.json:
        print(json.dumps({"steps": args.steps, "peers": args.peers, "task": args.task, "results": results}))
        return 0
    ddp = next(({int(k): v for k, v in r["accuracy"].items()} for r in results
                if r["variant"] == "ddp" and "accuracy" in r), None)
    print("| variant (codec:H:outer lr:outer momentum) | " + " | ".join(f"acc @{k}" for k in eval_at)
          + " | vs DDP @last | DiLoCo MB/peer |")
    print("|---|" + "---:|" * (len(eval_at) + 2))
    for r in results:
        if "error" in r:
            print(f"| {r['variant']} | {r['error']} |")
            continue
        acc = {int(k): v for k, v in r["accuracy"].items()}
        gap = f"{(acc[eval_at[-1]] - ddp[eval_at[-1]]) * 100:+.1f} pt" if ddp and r["variant"] != "ddp" else ""
        print(f"| {r['variant']} | " + " | ".join(f"{acc[k]:.4f}" for k in eval_at)
              + f" | {gap} | {r['bytes_per_peer'] / 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
