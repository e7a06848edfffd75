"""Slow-links benchmark: p2p vs. DDP (gloo) vs. compute-only, across shaped links. Needs root.

For each rate, a fresh lab (p2p/harness/lab.py: one network namespace per peer, ``tc tbf`` on both
directions of each peer's link) runs, one after the other, with identical task, model, data
shards, per-peer batch size, optimizer, learning rate, run seed and step count:

- every configuration in ``P2P_CONFIGS`` (real ``p2p start`` processes, one per namespace);
- ``ddp``: PyTorch DistributedDataParallel over gloo (bench/ddp_worker.py, one rank each);
- ``torch-localsgd-hN`` (e.g. ``torch-localsgd-h25``, ``torch-localsgd-h100``): PyTorch's own
  post-local SGD (``PostLocalSGDOptimizer`` + ``PeriodicModelAverager(period=N)`` over gloo,
  bench/ddp_worker.py ``--local-sgd-period N``): the baseline a plain-PyTorch user picks on slow
  links; the same ranks, shards, seed, optimizer and evaluation rule as ``ddp``, every rank
  evaluated (the models differ between averages);
- ``compute_only``: the same N peers training the same steps with no communication
  (bench/compute_only.py). It does not depend on the rate, so it runs once (in the first
  rate's lab) and its result is repeated under every rate; ``--compute-only-each-rate`` runs it
  again in every rate's lab, so that each rate's ratios compare runs made minutes apart, not up
  to half an hour: on this shared machine the same method's train time moved 4% between two runs
  20 minutes apart (tinylm, int4-h25, 20 Mbit/s: 352.9 and 338.3 s), as much as a per-step
  overhead target's margin. With ``--repeat`` as well it runs in every pass ("compute_only #2",
  ...), and each pass's p2p runs are compared with the compute-only run of their own pass: a
  paired overhead per run, not every repeat against one draw of the machine's speed.

Definitions (the clock, the same for every method: wall seconds from launching the method's
processes, so process start-up, data loading and joining / rendezvous count (p2p nodes get
``--min-members N``: like gloo's rendezvous, nobody trains until all N are up); evaluation runs
inline in every method's training loop every ``--eval-every`` seconds, so its time counts the
same way for all):
- accuracy curve: at each evaluation, the mean over peers of each peer's held-out accuracy at
  that moment, interpolated linearly between its own evaluations either side (its last one
  after it), defined once every peer has been evaluated (DDP ranks hold one model: rank 0's).
  The interpolation is the one time_to_target applies to a single evaluator's curve, so N peers
  evaluating out of phase are scored as DDP's one evaluator is; before stop 36 each peer's
  latest accuracy was averaged, which trailed by about half an evaluation interval
  (_common.mean_accuracy_curve).
  What is scored: each worker's model; a p2p DiLoCo node's outer parameters (the swarm's model:
  its live model between outer steps is a local run, and which of the two an evaluation landed on
  moved its figure by 2-6 points; p2p.Swarm.evaluation_model); post-local SGD's live model
  (PyTorch keeps no averaged copy; its blocking all-reduce puts most evaluations right after one).
  Everyone evaluates every ``--eval-every`` seconds, and each accuracy is timed (and stepped)
  by when its evaluation began: workers log it, p2p nodes' JSON progress lines
  (``--log-format json``, every ``--poll`` seconds) carry it (``evaluated_at``,
  ``evaluated_step``; before, they were timed when read, up to an evaluation plus ~1.5 x
  ``--poll`` late);
- time_to_target_s: when the curve first reaches the task's ``target_accuracy``, interpolated
  linearly between the evaluation before and the first at or above it (null if it never does
  within the steps or ``--max-time``); before stop 29, that first evaluation's time, late by up
  to one evaluation interval (~2.5 s, a quarter of the wide task's ideal bound), by a different
  amount for each method (_common.time_to_target);
- train_time_s: when the last peer finished its steps (null if cut off by ``--max-time``);
- bytes_per_peer: mean over peers of what each put on its link (the bridge-side veth's
  rx_bytes counter: payload plus TCP/IP/Ethernet headers);
- final_accuracy: the curve's last value; steps: the fewest steps any peer completed;
- bytes_to_target: bytes_per_peer counted up to time_to_target_s (sampled every ~0.5 s);
- time_to_high_s, bytes_to_high: the same for a second, higher target (``--target-high``, or
  the task's ``target_accuracy_high``): one that compute-only does not reach within the steps
  but DDP does, so that time to it measures what averaging buys, not raw throughput;
- accuracy_at_equal_steps: the step curve's accuracy at ``equal_steps`` (the mean over peers of
  each one's evaluations, interpolated as the accuracy curve is, and read between the points
  either side of it), the fewest steps per peer that any method at that rate completed (so every
  method is compared after the same number of samples, DDP cut off by --max-time included);
  accuracy_at_fractions: the same at 20%, 40%, 60%, 80% and 100% of ``equal_steps``;
- x ideal (ideal_s, ideal_high_s): the honest limit, ideal data parallelism: DDP's steps to the
  target (interpolated on its step curve as time_to_target_s is; the fewest over this run's rates,
  since exact averaging needs the same steps at any rate and slower rates are evaluated at finer
  step intervals) x compute-only's seconds per step ((train_time_s - start_s) / steps) +
  compute-only's start-up (start_s: launch until the last worker began training), from the
  compute-only run at the same rate as the overheads (with --compute-only-each-rate the one
  made beside it; before stop 36 always the first). What DDP would take with infinite
  bandwidth. Needs ddp and compute_only in the run;
- per-step overhead (step_overhead): train_time_s / compute-only's train_time_s - 1 (start-up
  included in both); less evaluations (phase_less_eval_overhead): (train_phase_s - eval_s) over
  compute-only's the same way, eval_s the wall seconds a peer spent evaluating (mean over peers;
  DDP: rank 0's, which every rank waits for): evaluations follow the wall clock, so a slower
  method also evaluates more, and one evaluation of the wide task costs ~15-40 steps;
- training phase (train_phase_s, phase_overhead): from the last peer's first step to the last
  peer's last step, start-up (imports, data, joining or rendezvous) and the last evaluation
  excluded (p2p nodes' last progress line gives both times, workers' JSON lines the "start" and
  "done" times), and its ratio to compute-only's - 1;
- CPU per step (cpu_s_per_step, cpu_overhead): user + system CPU seconds of the method's
  processes (every thread, start-up and evaluations included; this orchestrator's reaped
  children) / (peers x steps), and its ratio to compute-only's - 1. What the network thread,
  codecs and status work take from training shows here even when the load moves wall times;
  a run slowed by load still evaluates more often (every --eval-every wall seconds), which this
  counts too. Only for runs that completed their steps.
  The trainer's wait at the outer rounds is in the node's "waited Ns" (``p2p status``: gate_wait_s).
Ratios in the table (time to target / compute-only's, / DDP's at the same rate) come from this
one run only: the machine is shared, so compare within a run, never across runs. Even within a
run one try of a method is a coarse sample: on nodes.wide the same configuration's x ideal to
0.80 moved between 1.3 and 1.8 from run to run (stop 34), as evaluations (every --eval-every
seconds, ~0.5 s each) land before or after the crossing. ``--repeat N`` runs every p2p method N
times at each rate, pass after pass (the baselines once), and adds each one's median and range.

    python bench/slow_links.py [--rates unlimited,1000mbit,100mbit,20mbit] [--peers 4]
        [--task tinylm] [--steps N] [--methods p2p-diloco-sparse-h25,ddp,compute_only] [--max-time 600]
        [--only-at ddp:unlimited,torch-localsgd-h25:unlimited/100mbit] [--compute-only-each-rate] [--repeat N]
        [--json] [--quick]        (--methods p2p: every P2P_CONFIGS entry; the full default run: ~75 min)

Writes bench/out/slow_links.md, bench/out/slow_links.png and bench/out/slow_links.json (the
summary plus every curve); logs under bench/out/logs/. ``--json`` prints the summary as one
JSON object on stdout (progress goes to stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (puts the repository on sys.path)

from p2p.harness.lab import Lab, LabError, parse_rate, probe  # noqa: E402
from p2p.training.task import TaskError, load_task  # noqa: E402
from slow_links_report import compare_at_equal_steps, compare_with_bounds, fmt, fmt_mb, markdown, plot  # noqa: E402
from slow_links_runs import LOCAL_SGD, Result, Settings, local_sgd_period, run_p2p, run_workers  # noqa: E402

# ---------------------------------------------------------------------------------------------
# The p2p configurations compared: name -> extra `p2p start` arguments (appended after the
# common ones: --task --steps --seed --shard --eval-every ...). ADD NEW CONFIGURATIONS HERE.
P2P_CONFIGS: dict[str, list[str]] = {
    "p2p-adpsgd": [],  # AD-PSGD pairwise gossip with the node's defaults (bandwidth-aware pause)
    "p2p-adpsgd-int8": ["--compression", "int8"],  # 4x fewer bytes, still exactly mean-preserving
    "p2p-auto": ["--compression", "auto"],  # codec chosen per link from measured exchanges
    "p2p-diloco": ["--algorithm", "diloco"],  # H=50 local steps, then a gossip-averaged outer step
    "p2p-diloco-int8": ["--algorithm", "diloco", "--compression", "int8"],  # int8 pseudo-gradients
    "p2p-diloco-int4": ["--algorithm", "diloco", "--compression", "int4"],  # int4 pseudo-gradients:
    # ~1/7 model per neighbour per outer step; theta_start only to repair copies apart
    "p2p-diloco-int4-h25": ["--algorithm", "diloco", "--compression", "int4", "--diloco-inner-steps", "25",
                            "--diloco-outer-lr", "0.5", "--diloco-outer-momentum", "0.8"],
    # the best here: a gentler outer step twice as often; bench/diloco_sweep.py picked it (+2 points
    # over the paper's 0.7/0.9 at H=50 after 1000 steps; H=20 at 0.7/0.9 lost 3)
    "p2p-diloco-int4-h25-overlap": ["--algorithm", "diloco", "--compression", "int4", "--diloco-inner-steps", "25",
                                    "--diloco-outer-lr", "0.5", "--diloco-outer-momentum", "0.8", "--diloco-overlap"],
    # the same with the outer round beside the next 25 inner steps (Streaming DiLoCo's overlap)
    "p2p-diloco-int4-h25-rs": ["--algorithm", "diloco", "--compression", "int4", "--diloco-inner-steps", "25",
                               "--diloco-outer-lr", "0.5", "--diloco-outer-momentum", "0.8", "--topology", "full",
                               "--diloco-reduce-scatter"],
    # the same round as a reduce-scatter + all-gather (p2p/averaging/outer_scatter.py): 2(N-1)/N
    # model-sizes per peer instead of N-1
    "p2p-diloco-sparse-h25": ["--algorithm", "diloco", "--compression", "sparseloco", "--diloco-inner-steps", "25",
                              "--diloco-outer-lr", "1.0", "--diloco-outer-momentum", "0"],
    # SparseLoCo's round (arXiv:2508.15706): top 2% of each chunk at 2 bits with error feedback,
    # outer lr 1 and no momentum (its rule): ~21x fewer bytes a round than int4 (offsets packed: sparse_wire.py)
    "p2p-diloco-sparse-h25-dense4": ["--algorithm", "diloco", "--compression", "sparseloco", "--diloco-inner-steps",
                                     "25", "--diloco-outer-lr", "1.0", "--diloco-outer-momentum", "0",
                                     "--diloco-dense-rounds", "4"],
    # the same with the swarm's first 4 rounds int4 while the link carries them (diloco.py, "Dense
    # first rounds"): sooner at 100 Mbit/s and more, later at 20 Mbit/s (stop 29)
    "p2p-diloco-sparse-h25-warm": ["--algorithm", "diloco", "--compression", "sparseloco", "--diloco-inner-steps",
                                   "25", "--diloco-outer-lr", "1.0", "--diloco-outer-momentum", "0",
                                   "--diloco-warmup-steps", "300", "--diloco-warmup-inner-steps", "10"],
    # the same with post-local SGD's warm-up (diloco.py, "Warm-up"): H 10 for the first 300 steps,
    # where H 25 was 0.6-2.5 points under DDP at 20% of the run (stop 31), then H 25, level from 40% on
    "p2p-diloco-sparse10-h25-warm": ["--algorithm", "diloco", "--compression", "sparseloco", "--diloco-inner-steps",
                                     "25", "--diloco-outer-lr", "1.0", "--diloco-outer-momentum", "0",
                                     "--diloco-warmup-steps", "300", "--diloco-warmup-inner-steps", "10",
                                     "--topk-fraction", "0.1"],
    # the same at 10% density (every round, the warm-up's and H 25's): in the sweep 0.80 in ~110
    # steps where DDP took ~121 and 2% ~147; in the lab sooner to 0.80 at 100 and 20 Mbit/s, at
    # more per-step overhead (README, stop 40)
    "p2p-diloco-sparse-h25-warm10": ["--algorithm", "diloco", "--compression", "sparseloco", "--diloco-inner-steps",
                                     "25", "--diloco-outer-lr", "1.0", "--diloco-outer-momentum", "0",
                                     "--diloco-warmup-steps", "300", "--diloco-warmup-inner-steps", "10",
                                     "--diloco-warmup-topk-fraction", "0.1"],
    # 10% in the warm-up's rounds only, 2% after: its steps saved, not the later rounds' cost;
    # to 0.80 in 1.10x / 1.16x the ideal bound at 100 / 20 Mbit/s (medians of 5, README, stop 41);
    # from stop 43 only while the link carries them (p2p/averaging/outer_warm.py)
    "p2p-diloco-sparse-h25-overlap-warm10": ["--algorithm", "diloco", "--compression", "sparseloco",
                                             "--diloco-inner-steps", "25", "--diloco-outer-lr", "1.0",
                                             "--diloco-outer-momentum", "0", "--diloco-overlap",
                                             "--diloco-warmup-steps", "300", "--diloco-warmup-inner-steps", "10",
                                             "--diloco-warmup-topk-fraction", "0.1"],
    # the same with the round beside the next inner steps (examples/slow-links.toml's overlap):
    # its 10% rounds land later, and at 20 Mbit/s it was later to 0.80 than 2% (stop 41)
    "p2p-diloco-sparse-h25-overlap2-warm10": ["--algorithm", "diloco", "--compression", "sparseloco",
                                              "--diloco-inner-steps", "25", "--diloco-outer-lr", "1.0",
                                              "--diloco-outer-momentum", "0", "--diloco-overlap",
                                              "--diloco-overlap-steps", "2", "--diloco-warmup-steps", "300",
                                              "--diloco-warmup-inner-steps", "10", "--diloco-warmup-topk-fraction", "0.1"],
    # the same with bounded overlap (diloco.py, "Bounded overlap"): the trainer goes 2 steps beside
    # the round, then waits for it; an outer step at most 2 steps late
    "p2p-diloco-sparse-h25-overlap2-warm": ["--algorithm", "diloco", "--compression", "sparseloco",
                                            "--diloco-inner-steps", "25", "--diloco-outer-lr", "1.0",
                                            "--diloco-outer-momentum", "0", "--diloco-overlap",
                                            "--diloco-overlap-steps", "2", "--diloco-warmup-steps", "300",
                                            "--diloco-warmup-inner-steps", "10"],
    # the same at 2% in the warm-up too
    "p2p-diloco-sparse-h10": ["--algorithm", "diloco", "--compression", "sparseloco", "--diloco-inner-steps", "10",
                              "--diloco-outer-lr", "1.0", "--diloco-outer-momentum", "0"],
    # the same at H=10: bench/diloco_sweep.py had it at DDP's accuracy from 240 steps on, where H=25
    # was 7 points under; 2.5x the rounds, still ~0.1 MB each
    "p2p-diloco-sparse-h10-overlap": ["--algorithm", "diloco", "--compression", "sparseloco",
                                      "--diloco-inner-steps", "10", "--diloco-outer-lr", "1.0",
                                      "--diloco-outer-momentum", "0", "--diloco-overlap"],
    # the same with the round beside the next 10 inner steps: the trainer does not wait at the 2.5x
    # more boundaries, and an outer step one round late is 10 steps stale, not 25
    "p2p-diloco-sparse-h25-overlap": ["--algorithm", "diloco", "--compression", "sparseloco",
                                      "--diloco-inner-steps", "25", "--diloco-outer-lr", "1.0",
                                      "--diloco-outer-momentum", "0", "--diloco-overlap"],
    # the same with the round beside the next 25 inner steps: the trainer never waits on it
    "p2p-diloco-sparse-h25-overlap-warm": ["--algorithm", "diloco", "--compression", "sparseloco",
                                           "--diloco-inner-steps", "25", "--diloco-outer-lr", "1.0",
                                           "--diloco-outer-momentum", "0", "--diloco-overlap",
                                           "--diloco-warmup-steps", "300", "--diloco-warmup-inner-steps", "10"],
    # both: the round beside the next inner steps, H 10 for the first 300 steps
    "p2p-diloco-int4-hauto": ["--algorithm", "diloco", "--compression", "int4", "--diloco-inner-steps", "auto",
                              "--diloco-outer-lr", "0.5", "--diloco-outer-momentum", "0.8"],
    # H chosen from the measured link and step time (p2p/averaging/outer_schedule.py): the fewest
    # inner steps whose outer exchange fits in their compute; not yet benchmarked against h25
    "p2p-localsgd-int4-h25": ["--algorithm", "diloco", "--compression", "int4", "--diloco-inner-steps", "25",
                              "--diloco-outer-lr", "1.0", "--diloco-outer-momentum", "0"],
    # plain periodic model averaging (outer lr 1, no momentum: local SGD, as torch-localsgd-h25)
    # with int4 pseudo-gradients: the same algorithm as PyTorch's, at a seventh of the bytes
    # the round-based algorithms on their natural topologies (issue 16: does a failed round at a
    # slow rate make the next one costlier?)
    "p2p-dpsgd": ["--algorithm", "dpsgd"],  # exponential graph, fp32 parameters every step
    "p2p-gossipgrad": ["--algorithm", "gossipgrad"],  # hypercube partner, fp32 gradients every step
    "p2p-choco-int8": ["--algorithm", "choco", "--compression", "int8"],  # ring, int8 public-copy deltas
    "p2p-sgp": ["--algorithm", "sgp"],  # one-peer exponential push-sum, fp32 parameters
}
# ---------------------------------------------------------------------------------------------

DEFAULT_RATES = "unlimited,1000mbit,100mbit,20mbit"
DEFAULT_STEPS = {"tinylm": 1500, "synthetic": 600}  # other tasks: `bench_steps` attr, else 1000
DEFAULT_EVAL_EVERY = {"tinylm": 5.0, "synthetic": 1.0}
OUT = Path(__file__).resolve().parent / "out"


def log(msg: str) -> None:
    print(f"[slow_links {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the whole benchmark ------------------------------------------------------------------------

def plan_methods(methods: list[str]) -> list[tuple[str, Optional[list[str]]]]:
    """--methods -> [(name, extra p2p args, or None for a worker method)], in order."""
    plan: list[tuple[str, Optional[list[str]]]] = []
    for m in methods:
        if m == "p2p":
            plan += [(name, list(extra)) for name, extra in P2P_CONFIGS.items()]
        elif m in P2P_CONFIGS:
            plan.append((m, list(P2P_CONFIGS[m])))
        elif m in ("ddp", "compute_only"):
            plan.append((m, None))
        elif m.startswith(LOCAL_SGD):
            local_sgd_period(m)  # a clear error for a bad N
            plan.append((m, None))
        else:
            raise ValueError(f"unknown method {m!r}: choose from p2p, ddp, compute_only, {LOCAL_SGD}N, "
                             f"{', '.join(P2P_CONFIGS)}")
    return list(dict((name, (name, extra)) for name, extra in plan).values())  # no repeats


def run_order(plan: list[tuple[str, Optional[list[str]]]], repeat: int,
              paired: bool = False) -> list[tuple[str, str, Optional[list[str]]]]:
    """[(result name, method, extra args)] for one rate: the plan, then (``--repeat``) the p2p
    methods again, pass after pass, named "METHOD #2", "METHOD #3", ...: interleaved, so that a
    slow spell of the shared machine falls on every method rather than on one's runs. ``paired``
    (``--compute-only-each-rate`` with ``--repeat``): compute_only runs again in every pass too,
    and each pass's p2p runs are compared with its own (report: ``compute_only_for``)."""
    order = [(name, name, extra) for name, extra in plan]
    for i in range(2, repeat + 1):
        order += [(f"{name} #{i}", name, extra) for name, extra in plan
                  if extra is not None or (paired and name == "compute_only")]
    return order


def run_all(rates: list[str], plan: list[tuple[str, Optional[list[str]]]], s: Settings, prefix: str,
            subnet: str, out: Path, only_at: Optional[dict[str, set[str]]] = None,
            compute_only_each_rate: bool = False, repeat: int = 1) -> dict[str, dict[str, Result]]:
    results: dict[str, dict[str, Result]] = {}
    compute_only: Optional[Result] = None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for rate in rates:
        label = "unlimited" if parse_rate(rate) is None else rate
        results[label] = {}
        with Lab(s.peers, None if label == "unlimited" else rate, prefix=prefix, subnet=subnet) as lab:
            for key, name, extra in run_order(plan, repeat, paired=compute_only_each_rate):
                if name == "compute_only" and compute_only is not None and not compute_only_each_rate:
                    results[label][name] = Result(**{**asdict(compute_only), "rate": label})
                    continue
                if only_at and name in only_at and label not in only_at[name]:
                    continue  # --only-at (DDP's steps to a target are the same at any rate: x ideal)
                log_dir = out / "logs" / stamp / label / key.replace(" #", "-")
                log(f"{label}: {key} ({s.peers} peers, {s.steps} steps, task {s.task}) ...")
                r = run_p2p(lab, name, extra, s, log_dir) if extra is not None else run_workers(lab, name, s, log_dir)
                r.rate = label
                log(f"{label}: {key}: {r.status}; time to target {fmt(r.time_to_target_s)} s, "
                    f"train time {fmt(r.train_time_s)} s, {fmt_mb(r.bytes_per_peer)} MB/peer, "
                    f"final acc {fmt(r.final_accuracy, 4)}, steps {r.steps}")
                results[label][key] = r
                if name == "compute_only":
                    compute_only = r
        compare_at_equal_steps(results[label])
    compare_with_bounds(results)
    return results


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default=None, help=f"comma-separated (default {DEFAULT_RATES})")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--task", default=None, help="default tinylm (synthetic with --quick)")
    ap.add_argument("--steps", type=int, default=None, help="per peer (default: per task)")
    ap.add_argument("--methods", default="p2p-diloco-sparse-h25,ddp,compute_only",  # our best; "p2p": every config
                    help="comma-separated: p2p (every P2P_CONFIGS entry), a P2P_CONFIGS name, ddp, compute_only, torch-localsgd-hN (PyTorch post-local SGD, average every N steps)")
    ap.add_argument("--only-at", default=None, metavar="METHOD:RATE[/RATE],...",
                    help="run these methods only at these rates (default: every method at every rate). "
                         "DDP's steps to a target do not depend on the link, so `--only-at ddp:unlimited` gives "
                         "the ideal bound without DDP's hours at 20 Mbit/s (no x DDP column at the other rates)")
    ap.add_argument("--compute-only-each-rate", action="store_true",
                    help="run compute_only in every rate's lab, not once: a baseline measured beside each rate's runs "
                         "(with --repeat, in every pass, and each pass's runs compared with its own)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every p2p method this many times at each rate, interleaved (the baselines once, but "
                         "compute_only with --compute-only-each-rate); the report adds each one's median and range")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=float, default=None, help="seconds between evaluations")
    ap.add_argument("--poll", type=float, default=0.5, help="p2p nodes' --log-every, seconds")
    ap.add_argument("--target-high", type=float, default=None,
                    help="a second, higher target (default: the task's target_accuracy_high, if any)")
    ap.add_argument("--max-time", type=float, default=None, help="stop a method after this many seconds")
    ap.add_argument("--prefix", default="p2pbench", help="lab name prefix")
    ap.add_argument("--subnet", default="10.76.0.0/24")
    ap.add_argument("--out", type=Path, default=OUT, help="output directory (default bench/out)")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (~3 min): synthetic task, 2000 steps, one rate (20mbit) unless given")
    args = ap.parse_args(argv)

    out: Path = args.out
    task_name = args.task or ("synthetic" if args.quick else "tinylm")
    rates = (args.rates or ("20mbit" if args.quick else DEFAULT_RATES)).split(",")
    try:
        task = load_task(task_name)
        for rate in rates:
            parse_rate(rate)
    except (TaskError, LabError) as exc:
        ap.error(str(exc))
    if args.peers < 1:
        ap.error("--peers must be >= 1")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    try:
        plan = plan_methods([m.strip() for m in args.methods.split(",") if m.strip()])
    except ValueError as exc:
        ap.error(f"--methods: {exc}")
    if not plan:
        ap.error("--methods: nothing to run")
    only_at: dict[str, set[str]] = {}
    labels = {("unlimited" if parse_rate(r) is None else r) for r in rates}
    for item in (args.only_at or "").split(","):
        if not item.strip():
            continue
        method, _, at = item.strip().partition(":")
        try:
            chosen = {("unlimited" if parse_rate(r) is None else r) for r in at.split("/") if r}
        except LabError as exc:
            ap.error(f"--only-at {item!r}: {exc}")
        if method not in {name for name, _ in plan} or not chosen:
            ap.error(f"--only-at {item!r}: use METHOD:RATE[/RATE] with a method of --methods")
        if not chosen <= labels:
            ap.error(f"--only-at {item!r}: {', '.join(sorted(chosen - labels))} not in --rates")
        only_at[method] = chosen
    default_steps = DEFAULT_STEPS.get(task_name, int(getattr(task, "bench_steps", 1000)))
    steps = args.steps or (2000 if args.quick else default_steps)
    eval_every = args.eval_every or (1.0 if args.quick else DEFAULT_EVAL_EVERY.get(task_name, 2.0))
    max_time = args.max_time or (150.0 if args.quick else 600.0)  # DDP at 20 Mbit/s needs hours for 1500 steps
    high = args.target_high if args.target_high is not None else getattr(task, "target_accuracy_high", None)
    s = Settings(task_name, args.peers, steps, args.seed, eval_every, args.poll, max_time,
                 float(task.target_accuracy), None if high is None else float(high))
    reason = probe()
    if reason:
        print(f"slow_links: {reason}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        results = run_all(rates, plan, s, args.prefix, args.subnet, out, only_at, args.compute_only_each_rate,
                          args.repeat)
    except LabError as exc:
        print(f"slow_links: {exc}", file=sys.stderr)
        return 1
    wall = time.time() - started
    summary = {"task": s.task, "peers": s.peers, "steps": s.steps, "target_accuracy": s.target,
               "target_accuracy_high": s.target_high,
               "eval_every_s": s.eval_every, "max_time_s": s.max_time, "wall_s": round(wall, 1),
               "results": {rate: {m: r.summary() for m, r in by.items()} for rate, by in results.items()}}
    (out / "slow_links.md").write_text(markdown(results, s, wall))
    (out / "slow_links.json").write_text(json.dumps(
        {**summary, "curves": {rate: {m: r.curve for m, r in by.items()} for rate, by in results.items()},
         "step_curves": {rate: {m: r.step_curve for m, r in by.items()} for rate, by in results.items()},
         "bytes_curves": {rate: {m: r.bytes_curve for m, r in by.items()} for rate, by in results.items()}}, indent=1))
    problem = plot(results, s, out / "slow_links.png")
    log(f"wrote {out / 'slow_links.md'}, {out / 'slow_links.json'}"
        + (f"; no plot: {problem}" if problem else f", {out / 'slow_links.png'}") + f" in {wall / 60:.1f} min")
    if args.json:
        print(json.dumps(summary))
    else:
        print((out / "slow_links.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
