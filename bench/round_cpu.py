"""CPU one DiLoCo outer round costs each peer, by piece, in one process (no network).

Why: at H = 10 the outer round's CPU on the peer's network thread is a visible share of the
training step's (issue 13: ~0.1 CPU-s per round on the 2.2 M-parameter wide task against
~0.04 s per step). This drives ``--peers`` real ``DiLoCo`` averagers through their sans-I/O
hooks over the real wire encoding (``p2p.wire``), each on a real ``FlatParams`` of the task's
model, and between boundaries moves every model by a fixed pseudo-gradient (a shared
direction plus a peer's own, so robust mixing's direction test passes as in training). No
training steps run: what is timed is the round alone.

    python bench/round_cpu.py [--codec sparseloco] [--topk-fraction 0.02] [--rounds 20] [--peers 4]
        [--task nodes.wide:WideTask] [--outer-lr 1.0 --outer-momentum 0.0]

Prints the round's CPU per peer (``time.thread_time``, no profiler, median over rounds), then a
cProfile pass attributed to pieces (cumulative ms per round per peer, a piece inside another
subtracted from it: ``PIECES``; ``rest`` is what none of them covers). The profiler inflates
Python-heavy pieces; the first line is the figure to compare. The machine is shared: say the
load (printed), and compare runs made one right after the other.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (puts the repository on sys.path)

# label: [(sign, file suffix, function, caller or None)]: cumulative times (of the calls from
# ``caller`` only, when given), a nested piece subtracted from the one it is part of
SNAP, OUTER = ("bench/diloco_sweep.py", "snapshot"), ("averaging/diloco.py", "_outer_step")  # the port's snapshot
PIECES = {
    "snapshot at the boundary": [(1, *SNAP, ("averaging/diloco.py", "after_step"))],
    "sparseloco compress": [(1, "compression/codecs.py", "compress", None)],
    "error feedback and decode (own)": [(1, "averaging/diloco.py", "_set_payload", None),
                                        (-1, "compression/codecs.py", "compress", None)],
    "wire encode": [(1, "p2p/wire.py", "encode", None)],
    "wire decode (no validate)": [(1, "p2p/wire.py", "decode", None), (-1, "compression/codecs.py", "validate", None)],
    "validate received": [(1, "compression/codecs.py", "validate", None)],
    "decode received": [(1, "averaging/outer_codec.py", "received_delta", None),  # this branch
                        (1, "averaging/base.py", "decoded_params", ("averaging/diloco.py", "receive"))],  # before
    "robust mixing": [(1, "averaging/rounds.py", "_mix_consistent", None)],
    "outer step (own passes)": [(1, *OUTER, None), (-1, *SNAP, OUTER), (-1, "bench/diloco_sweep.py", "add_delta", OUTER),
                                (-1, "averaging/outer_mending.py", "outer_step", OUTER)],
    "snapshot in the outer step": [(1, *SNAP, OUTER)],
    "add_delta (queue the step)": [(1, "training/flat.py", "add_delta", None)],
    "apply_pending (trainer)": [(1, "training/flat.py", "apply_pending", None)],
}


def build(args):
    import numpy as np
    import torch

    from bench.diloco_sweep import _Port
    from p2p.averaging.base import AveragingConfig
    from p2p.averaging.diloco import DiLoCo, DiLoCoConfig
    from p2p.training.flat import FlatParams
    from p2p.training.task import load_task

    torch.set_num_threads(1)
    task = load_task(args.task)
    names = [f"peer{i}" for i in range(args.peers)]
    config = AveragingConfig(compression=args.codec, round_timeout_s=3600.0,
                             compression_topk_fraction=args.topk_fraction)
    options = DiLoCoConfig(inner_steps=args.h, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum)
    rng = np.random.default_rng(0)
    flats, ports, algs = [], [], []
    for name in names:
        torch.manual_seed(0)
        flat = FlatParams(task.make_model())
        flats.append(flat)
        ports.append(_Port(flat, f"{args.task}/{flat.numel}"))
        algs.append(DiLoCo(config, ports[-1], random.Random(0), 0.0, options))
        algs[-1].self_addr = name
    n = flats[0].numel
    shared = torch.from_numpy(rng.standard_normal(n, dtype=np.float32) * 1e-3)
    own = [torch.from_numpy(rng.standard_normal(n, dtype=np.float32) * 1e-3) for _ in names]
    return names, flats, ports, algs, shared, own


def run_round(k, names, flats, ports, algs, shared, own, encode, decode, h, profile=None):
    """One outer round of every peer: the timed part is the averagers' and the wire's work."""
    step = k * h
    for f, mine in zip(flats, own):  # the inner steps (not timed): each model moves
        f.apply_pending()
        f.buffer.sub_(shared).sub_(mine)
    if profile is not None:
        profile.enable()
    t0 = time.thread_time()
    for p in ports:
        p.step = step
    outbox = [(src, alg.after_step(step, float(step), [n for n in names if n != src])) for src, alg in zip(names, algs)]
    for src, sends in outbox:
        for s in sends:
            _, msg = decode(encode(s.msg, src))
            j = names.index(s.to)
            algs[j].receive(src, msg, float(step), [n for n in names if n != s.to])
    if not all(alg.may_step(step + 1, float(step)) for alg in algs):
        raise RuntimeError(f"round {k}: the outer round did not finish with every share in")
    for f in flats:
        f.apply_pending()  # the trainer's side of the outer step
    spent = time.thread_time() - t0
    if profile is not None:
        profile.disable()
    return spent / len(algs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", default="sparseloco")
    ap.add_argument("--topk-fraction", type=float, default=None, help="sparseloco's density (default: its 2%%)")
    ap.add_argument("--task", default="nodes.wide:WideTask")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--h", type=int, default=10)
    ap.add_argument("--outer-lr", type=float, default=None)
    ap.add_argument("--outer-momentum", type=float, default=None)
    args = ap.parse_args(argv)
    if args.topk_fraction is not None and not 0 < args.topk_fraction <= 1:
        ap.error(f"--topk-fraction must be in (0, 1], got {args.topk_fraction}")
    from p2p.wire import decode, encode

    state = build(args)
    run_round(1, *state, encode, decode, args.h)  # warm-up: first-use allocations, the residual
    per_peer = [run_round(k, *state, encode, decode, args.h) for k in range(2, 2 + args.rounds)]
    profile = cProfile.Profile()
    base = 2 + args.rounds
    for k in range(base, base + args.rounds):
        run_round(k, *state, encode, decode, args.h, profile)
    stats = pstats.Stats(profile).stats
    scale = 1e3 / (args.rounds * args.peers)
    rows, covered = [], 0.0
    def cum(suffix, func, caller):
        out = 0.0
        for (path, _, name), (_, _, _, ct, callers) in stats.items():
            if name != func or not path.endswith(suffix):
                continue
            if caller is None:
                out += ct
            else:
                out += sum(c[3] for (cp, _, cn), c in callers.items() if cn == caller[1] and cp.endswith(caller[0]))
        return out

    for label, terms in PIECES.items():
        ms = sum(sign * cum(suffix, func, caller) for sign, suffix, func, caller in terms) * scale
        rows.append((label, ms))
        covered += ms
    total = sum(v[2] for v in stats.values()) * scale  # every function's own time: the whole profile
    n = state[1][0].numel
    density = "" if args.topk_fraction is None else f" at {args.topk_fraction:g}"
    print(f"{args.codec}{density}, {n:,} parameters, {args.peers} peers, {args.rounds} rounds; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"round CPU per peer (thread_time, no profiler): median {statistics.median(per_peer) * 1e3:.1f} ms, "
          f"min {min(per_peer) * 1e3:.1f} ms")
    print(f"| piece (cProfile, cumulative) | ms / round / peer |\n|---|---:|")
    for label, ms in rows:
        print(f"| {label} | {ms:.1f} |")
    print(f"| rest | {total - covered:.1f} |\n| total under the profiler | {total:.1f} |")
    if os.environ.get("ROUND_CPU_TOP"):  # the functions behind ``rest``, for finding the next cost
        pstats.Stats(profile).sort_stats("tottime").print_stats(int(os.environ["ROUND_CPU_TOP"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
