"""Slow-links benchmark: p2p vs. DDP (gloo) vs. compute-only, across shaped links. Needs root.

For each rate, a fresh lab (p2p/lab.py: one network namespace per peer, ``tc tbf`` on both
directions of each peer's link) runs, one after the other, with identical task, model, data
shards, per-peer batch size, optimizer, learning rate, run seed and step count:

- every configuration in ``P2P_CONFIGS`` (real ``p2p start`` processes, one per namespace);
- ``ddp``: PyTorch DistributedDataParallel over gloo (bench/ddp_worker.py, one rank each);
- ``compute_only``: the same N peers training the same steps with no communication
  (bench/compute_only.py). It does not depend on the rate, so it runs once (in the first
  rate's lab) and its result is repeated under every rate.

Definitions (all times are wall seconds from launching the method's processes, so process
start-up, data loading and joining / rendezvous count):
- accuracy curve: at each moment, the mean over peers of each peer's latest held-out
  accuracy, defined once every peer has been evaluated (DDP ranks hold one model: rank 0's).
  Everyone evaluates every ``--eval-every`` seconds; workers log the exact time, p2p nodes'
  progress lines (``--log-every --poll``) are timestamped when read, so a p2p accuracy can
  show up to ~1.5 x ``--poll`` late;
- time_to_target_s: first time the curve reaches the task's ``target_accuracy`` (null if it
  never does within the steps or ``--max-time``);
- train_time_s: when the last peer finished its steps (null if cut off by ``--max-time``);
- bytes_per_peer: mean over peers of what each put on its link (the bridge-side veth's
  rx_bytes counter: payload plus TCP/IP/Ethernet headers);
- final_accuracy: the curve's last value; steps: the fewest steps any peer completed;
- bytes_to_target: bytes_per_peer counted up to time_to_target_s (sampled every ~0.5 s);
- accuracy_at_equal_steps: the mean accuracy of each peer's last evaluation made at or before
  ``equal_steps``, the fewest steps per peer that any method at that rate completed (so every
  method is compared after the same number of samples, DDP cut off by --max-time included).
Ratios in the table (time to target / compute-only's, / DDP's at the same rate) come from this
one run only: the machine is shared, so compare within a run, never across runs.

    python bench/slow_links.py [--rates unlimited,1000mbit,100mbit,20mbit] [--peers 4]
        [--task tinylm] [--steps N] [--methods p2p-diloco-int8,ddp,compute_only] [--max-time 600]
        [--json] [--quick]        (--methods p2p: every P2P_CONFIGS entry; the full default run: ~75 min)

Writes bench/out/slow_links.md, bench/out/slow_links.png and bench/out/slow_links.json (the
summary plus every curve); logs under bench/out/logs/. ``--json`` prints the summary as one
JSON object on stdout (progress goes to stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (puts the repository on sys.path)

from p2p.lab import Lab, LabError, LabSwarm, parse_rate, probe  # noqa: E402
from p2p.task import TaskError, load_task  # noqa: E402

# ---------------------------------------------------------------------------------------------
# The p2p configurations compared: name -> extra `p2p start` arguments (appended after the
# common ones: --task --steps --seed --shard --eval-every ...). ADD NEW CONFIGURATIONS HERE
# (e.g. compressed averaging, once `p2p start` has flags for it).
P2P_CONFIGS: dict[str, list[str]] = {
    "p2p-adpsgd": [],  # AD-PSGD pairwise gossip with the node's defaults (bandwidth-aware pause)
    "p2p-adpsgd-int8": ["--compression", "int8"],  # 4x fewer bytes, still exactly mean-preserving
    "p2p-auto": ["--compression", "auto"],  # codec chosen per link from measured exchanges
    "p2p-diloco": ["--algorithm", "diloco"],  # H=50 local steps, then a gossip-averaged outer step
    "p2p-diloco-int8": ["--algorithm", "diloco", "--compression", "int8"],  # int8 pseudo-gradients,
    # theta_start every 8th outer step: ~1/4 model per neighbour per 50 steps (the best here)
}
# ---------------------------------------------------------------------------------------------

DEFAULT_RATES = "unlimited,1000mbit,100mbit,20mbit"
DEFAULT_STEPS = {"tinylm": 1500, "synthetic": 600}  # other tasks: `bench_steps` attr, else 1000
DEFAULT_EVAL_EVERY = {"tinylm": 5.0, "synthetic": 1.0}
BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
P2P_PORT, DDP_PORT = 7000, 29500


def log(msg: str) -> None:
    print(f"[slow_links {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Result:
    method: str
    rate: str
    time_to_target_s: Optional[float] = None
    bytes_per_peer: Optional[float] = None
    final_accuracy: Optional[float] = None
    steps: int = 0
    train_time_s: Optional[float] = None
    status: str = "ok"  # ok | max-time | failed: ...
    bytes_to_target: Optional[float] = None  # mean over peers of bytes sent up to time_to_target_s
    accuracy_at_equal_steps: Optional[float] = None  # at the steps DDP reached too (see equal_steps)
    equal_steps: Optional[int] = None
    bytes_each: list[int] = field(default_factory=list)
    curve: list[tuple[float, float]] = field(default_factory=list)  # (s since launch, mean acc)
    step_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, mean acc)
    bytes_curve: list[tuple[float, float]] = field(default_factory=list)  # (s, mean bytes sent per peer)

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("curve", "step_curve", "bytes_curve"):
            d.pop(key)
        return d


@dataclass(frozen=True)
class Settings:
    task: str
    peers: int
    steps: int
    seed: int
    eval_every: float
    poll: float
    max_time: float
    target: float


# -- running one method in one lab ------------------------------------------------------------

def _stop(procs: list[subprocess.Popen], timeout_s: float = 15.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# A node's progress line (p2p/node.py): "<phase> step N  loss L  acc A  ..."; the last is "done".
_PROGRESS = re.compile(r"^(\w+)\s+step\s+(\d+)\s+loss\s+\S+\s+acc\s+(\S+)")


class LogTail:
    """New complete lines of a growing log file, each time ``lines()`` is called."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in complete]


def run_p2p(lab: Lab, name: str, extra: list[str], s: Settings, log_dir: Path) -> Result:
    """One p2p configuration. Progress comes from the nodes' own progress lines (every
    ``--poll`` seconds, timestamped when read), not from status queries: a busy node can take
    seconds to answer those, and they would add traffic to the shaped links."""
    res = Result(name, lab.rate or "unlimited")
    node_args = ["--task", s.task, "--steps", str(s.steps), "--seed", str(s.seed),
                 "--eval-every", str(s.eval_every), "--log-every", str(s.poll), "--linger", "0",
                 "--join-timeout", "120", *extra]
    per_peer = [["--shard", f"{i}/{s.peers}"] for i in range(s.peers)]
    swarm = LabSwarm(lab, log_dir, node_args, port=P2P_PORT, per_peer_args=per_peer)
    tails = [LogTail(log_dir / f"peer{i}.log") for i in range(s.peers)]
    series: list[list[tuple[float, float]]] = [[] for _ in range(s.peers)]
    by_step: list[list[tuple[int, float]]] = [[] for _ in range(s.peers)]
    steps = [0] * s.peers
    finished: list[Optional[float]] = [None] * s.peers
    tx0 = [lab.tx_bytes(i) for i in range(s.peers)]
    t0 = time.time()
    sent = BytesSampler(lab, tx0, t0)

    def read(now: float) -> None:
        for i, tail in enumerate(tails):
            for line in tail.lines():
                match = _PROGRESS.match(line.strip())
                if not match:
                    continue
                steps[i] = max(steps[i], int(match.group(2)))
                acc = float(match.group(3))
                if not math.isnan(acc) and (not series[i] or series[i][-1][1] != acc or match.group(1) == "done"):
                    series[i].append((now, acc))
                    by_step[i].append((steps[i], acc))
                if finished[i] is None and steps[i] >= s.steps:
                    finished[i] = now

    try:
        swarm.start()
        while any(swarm.alive(i) for i in range(s.peers)):
            time.sleep(s.poll / 2)
            read(time.time() - t0)
            sent.sample()
            if time.time() - t0 > s.max_time:
                res.status = "max-time"
                break
    finally:
        codes = swarm.stop(timeout_s=20.0)
    read(time.time() - t0)
    if res.status == "ok" and any(c != 0 for c in codes):
        res.status = f"failed: exit codes {codes} (logs in {log_dir})"
    _finish(res, lab, sent, series, by_step, steps, finished, s)
    return res


class BytesSampler:
    """Mean bytes per peer put on the links since launch, sampled over time (for bytes to target)."""

    def __init__(self, lab: Lab, tx0: list[int], t0: float) -> None:
        self.lab, self.tx0, self.t0 = lab, tx0, t0
        self.curve: list[tuple[float, float]] = [(0.0, 0.0)]

    def sample(self) -> None:
        total = sum(self.lab.tx_bytes(i) - b for i, b in enumerate(self.tx0))
        self.curve.append((round(time.time() - self.t0, 3), total / len(self.tx0)))

    def at(self, t: Optional[float]) -> Optional[float]:
        """Bytes per peer at the first sample at or after ``t``."""
        if t is None:
            return None
        return next((b for ts, b in self.curve if ts >= t), self.curve[-1][1])


def run_workers(lab: Lab, method: str, s: Settings, log_dir: Path) -> Result:
    res = Result(method, lab.rate or "unlimited")
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    tx0 = [lab.tx_bytes(i) for i in range(s.peers)]
    t0 = time.time()
    sent = BytesSampler(lab, tx0, t0)
    try:
        for i in range(s.peers):
            if method == "ddp":
                argv = [sys.executable, str(BENCH / "ddp_worker.py"), "--rank", str(i), "--world", str(s.peers),
                        "--master", f"{lab.addr(0)}:{DDP_PORT}"]
            else:
                argv = [sys.executable, str(BENCH / "compute_only.py"), "--shard", f"{i}/{s.peers}"]
            argv += ["--task", s.task, "--steps", str(s.steps), "--seed", str(s.seed),
                     "--eval-every", str(s.eval_every)]
            with open(log_dir / f"peer{i}.log", "wb") as out:
                procs.append(lab.popen(i, argv, stdout=out, stderr=subprocess.STDOUT, env=env))
        while any(p.poll() is None for p in procs):
            if time.time() - t0 > s.max_time:
                res.status = "max-time"
                break
            time.sleep(0.5)
            sent.sample()
    finally:
        _stop(procs)
    codes = [p.returncode for p in procs]
    if res.status == "ok" and any(c != 0 for c in codes):
        res.status = f"failed: exit codes {codes} (logs in {log_dir})"
    series: list[list[tuple[float, float]]] = [[] for _ in range(s.peers)]
    by_step: list[list[tuple[int, float]]] = [[] for _ in range(s.peers)]
    steps = [0] * s.peers
    finished: list[Optional[float]] = [None] * s.peers
    for i in range(s.peers):
        for rec in _common.read_jsonl(log_dir / f"peer{i}.log"):
            t = rec["t"] - t0
            steps[i] = max(steps[i], int(rec.get("step", 0)))
            if "accuracy" in rec:
                series[i].append((t, float(rec["accuracy"])))
                by_step[i].append((int(rec.get("step", 0)), float(rec["accuracy"])))
            if rec.get("event") == "done":
                finished[i] = t
    if method == "ddp":  # one model: rank 0's evaluations are every rank's
        series, by_step = [series[0]], [by_step[0]]
    _finish(res, lab, sent, series, by_step, steps, finished, s)
    return res


def _finish(res: Result, lab: Lab, sent: BytesSampler, series, by_step, steps, finished, s: Settings) -> None:
    sent.sample()
    res.bytes_each = [lab.tx_bytes(i) - sent.tx0[i] for i in range(s.peers)]
    res.bytes_per_peer = sum(res.bytes_each) / s.peers
    res.bytes_curve = [(t, round(b)) for t, b in sent.curve]
    res.curve = [(round(t, 3), round(a, 5)) for t, a in _common.mean_accuracy_curve(series)]
    res.step_curve = [(int(k), round(a, 5)) for k, a in _common.mean_accuracy_curve(by_step)]
    res.time_to_target_s = _common.time_to_target(res.curve, s.target)
    res.bytes_to_target = sent.at(res.time_to_target_s)
    res.final_accuracy = res.curve[-1][1] if res.curve else None
    res.steps = min(steps) if steps else 0
    res.train_time_s = (round(max(f for f in finished), 3)
                        if all(f is not None for f in finished) and res.steps >= s.steps else None)


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
        else:
            raise ValueError(f"unknown method {m!r}: choose from p2p, ddp, compute_only, "
                             f"{', '.join(P2P_CONFIGS)}")
    return list(dict((name, (name, extra)) for name, extra in plan).values())  # no repeats


def run_all(rates: list[str], plan: list[tuple[str, Optional[list[str]]]], s: Settings, prefix: str,
            subnet: str, out: Path) -> dict[str, dict[str, Result]]:
    results: dict[str, dict[str, Result]] = {}
    compute_only: Optional[Result] = None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for rate in rates:
        label = "unlimited" if parse_rate(rate) is None else rate
        results[label] = {}
        with Lab(s.peers, None if label == "unlimited" else rate, prefix=prefix, subnet=subnet) as lab:
            for name, extra in plan:
                if name == "compute_only" and compute_only is not None:
                    results[label][name] = Result(**{**asdict(compute_only), "rate": label})
                    continue
                log_dir = out / "logs" / stamp / label / name
                log(f"{label}: {name} ({s.peers} peers, {s.steps} steps, task {s.task}) ...")
                r = run_p2p(lab, name, extra, s, log_dir) if extra is not None else run_workers(lab, name, s, log_dir)
                r.rate = label
                log(f"{label}: {name}: {r.status}; time to target {_fmt(r.time_to_target_s)} s, "
                    f"train time {_fmt(r.train_time_s)} s, {_fmt_mb(r.bytes_per_peer)} MB/peer, "
                    f"final acc {_fmt(r.final_accuracy, 4)}, steps {r.steps}")
                results[label][name] = r
                if name == "compute_only":
                    compute_only = r
        compare_at_equal_steps(results[label])
    return results


def accuracy_at_step(step_curve: list[tuple[int, float]], step: int) -> Optional[float]:
    """The mean accuracy of the last evaluations made at or before ``step``."""
    before = [a for k, a in step_curve if k <= step]
    return before[-1] if before else None


def compare_at_equal_steps(by_method: dict[str, Result]) -> None:
    """Accuracy of every method at the same number of steps per peer (= the same total samples):
    the fewest any method of this rate completed, so a method cut off by --max-time counts too."""
    runs = [r for r in by_method.values() if r.step_curve]
    if not runs:
        return
    equal = min(max(k for k, _ in r.step_curve) for r in runs)
    for r in runs:
        r.equal_steps = equal
        r.accuracy_at_equal_steps = accuracy_at_step(r.step_curve, equal)


def _fmt(x: Optional[float], digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _fmt_mb(x: Optional[float]) -> str:
    return "—" if x is None else f"{x / 1e6:.1f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "—" if a is None or b is None or b <= 0 else f"{a / b:.2f}"


def markdown(results: dict[str, dict[str, Result]], s: Settings, wall_s: float) -> str:
    lines = [f"# Slow links: task `{s.task}`, {s.peers} peers, {s.steps} steps per peer",
             "",
             f"Target held-out accuracy {s.target:g} (mean over peers of their latest evaluation); "
             f"times are wall seconds from launch. Ratios are within this run only. "
             f"Benchmark wall time {wall_s / 60:.1f} min.",
             "",
             "| rate | method | time to target (s) | × compute-only | × DDP | MB to target / peer "
             "| DDP's ÷ ours | accuracy at equal steps (steps) | vs DDP (pt) | final accuracy | steps "
             "| train time (s) | MB sent / peer | status |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for rate, by_method in results.items():
        co = by_method.get("compute_only")
        ddp = by_method.get("ddp")
        for name, r in by_method.items():
            equal = "—" if r.accuracy_at_equal_steps is None else f"{r.accuracy_at_equal_steps:.4f} ({r.equal_steps})"
            vs_ddp = ("—" if r.accuracy_at_equal_steps is None or ddp is None or ddp.accuracy_at_equal_steps is None
                      else f"{100 * (r.accuracy_at_equal_steps - ddp.accuracy_at_equal_steps):+.1f}")
            fewer = ("—" if ddp is None or name == "compute_only" or not r.bytes_to_target
                     or ddp.bytes_to_target is None else f"{ddp.bytes_to_target / r.bytes_to_target:.0f}×")
            lines.append(
                f"| {rate} | {name} | {_fmt(r.time_to_target_s)} "
                f"| {_ratio(r.time_to_target_s, co.time_to_target_s if co else None)} "
                f"| {_ratio(r.time_to_target_s, ddp.time_to_target_s if ddp else None)} "
                f"| {_fmt_mb(r.bytes_to_target)} | {fewer} | {equal} | {vs_ddp} "
                f"| {_fmt(r.final_accuracy, 4)} | {r.steps} | {_fmt(r.train_time_s)} "
                f"| {_fmt_mb(r.bytes_per_peer)} | {r.status} |")
    lines += ["", "compute_only runs once (it sends nothing, so the rate does not matter) and is "
              "repeated under every rate. \"MB to target\": mean bytes a peer put on its link until "
              "the time to target (counted at the bridge: payload plus TCP/IP/Ethernet headers). "
              "\"Accuracy at equal steps\": each method's mean accuracy from its last evaluations at "
              "or before the fewest steps per peer any method at that rate completed (equal steps = "
              "equal total samples: the same peers, batch size and data).", ""]
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Result]], s: Settings, path: Path) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib, or the project's `bench` extra)"
    fig, ax = plt.subplots(figsize=(10, 6))
    styles = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1))]
    methods = sorted({m for by in results.values() for m in by})
    colors = {m: f"C{k}" for k, m in enumerate(methods)}
    drawn_compute = False
    for k, (rate, by_method) in enumerate(results.items()):
        for name, r in by_method.items():
            if not r.curve or (name == "compute_only" and drawn_compute):
                continue
            label = "compute_only (any rate)" if name == "compute_only" else f"{name} @ {rate}"
            drawn_compute |= name == "compute_only"
            t, a = zip(*r.curve)
            ax.plot(t, a, linestyle=styles[k % len(styles)], color=colors[name], label=label)
    ax.axhline(s.target, color="grey", linewidth=0.8)
    ax.set_xlabel("wall time since launch (s)")
    ax.set_ylabel("held-out accuracy (mean over peers)")
    ax.set_title(f"{s.task}: {s.peers} peers, {s.steps} steps, shaped links")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default=None, help=f"comma-separated (default {DEFAULT_RATES})")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--task", default=None, help="default tinylm (synthetic with --quick)")
    ap.add_argument("--steps", type=int, default=None, help="per peer (default: per task)")
    ap.add_argument("--methods", default="p2p-diloco-int8,ddp,compute_only",  # our best; "p2p": every config
                    help="comma-separated: p2p (every P2P_CONFIGS entry), a P2P_CONFIGS name, ddp, compute_only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=float, default=None, help="seconds between evaluations")
    ap.add_argument("--poll", type=float, default=0.5, help="p2p nodes' --log-every, seconds")
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
    try:
        plan = plan_methods([m.strip() for m in args.methods.split(",") if m.strip()])
    except ValueError as exc:
        ap.error(f"--methods: {exc}")
    if not plan:
        ap.error("--methods: nothing to run")
    default_steps = DEFAULT_STEPS.get(task_name, int(getattr(task, "bench_steps", 1000)))
    steps = args.steps or (2000 if args.quick else default_steps)
    eval_every = args.eval_every or (1.0 if args.quick else DEFAULT_EVAL_EVERY.get(task_name, 2.0))
    max_time = args.max_time or (150.0 if args.quick else 600.0)  # DDP at 20 Mbit/s needs hours for 1500 steps
    s = Settings(task_name, args.peers, steps, args.seed, eval_every, args.poll, max_time,
                 float(task.target_accuracy))
    reason = probe()
    if reason:
        print(f"slow_links: {reason}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        results = run_all(rates, plan, s, args.prefix, args.subnet, out)
    except LabError as exc:
        print(f"slow_links: {exc}", file=sys.stderr)
        return 1
    wall = time.time() - started
    summary = {"task": s.task, "peers": s.peers, "steps": s.steps, "target_accuracy": s.target,
               "eval_every_s": s.eval_every, "max_time_s": s.max_time, "wall_s": round(wall, 1),
               "results": {rate: {m: r.summary() for m, r in by.items()} for rate, by in results.items()}}
    (out / "slow_links.md").write_text(markdown(results, s, wall))
    (out / "slow_links.json").write_text(json.dumps(
        {**summary, "curves": {rate: {m: r.curve for m, r in by.items()} for rate, by in results.items()}}, indent=1))
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
