"""What averaging costs training, on loopback: interleaved runs of compute-only and p2p configurations.

No lab and no root: N real processes per run on 127.0.0.1 (``p2p start --min-members N`` with the
arguments bench/slow_links.py gives, or bench/compute_only.py), the methods alternating run by
run (A B A B ...) so that a load that changes over time (the machine is shared) falls on both.
Per run and method:

- cpu_s_per_step: CPU seconds (user + system, from each process's resource usage when it is
  reaped, all its threads) over its steps, mean over peers. The figure that holds under load:
  what p2p's threads (network loop, codecs, status, progress) take from training, start-up
  included; ``startup_cpu_s``: the CPU a peer had used when it began training (read from
  /proc when its first progress line came; p2p: its imports, binding and joining);
- train_time_s: launch until the last peer's last step (start-up included, as slow_links.py);
- train_phase_s: from the last peer's first step to the last peer's last step (start-up
  excluded; the p2p node's last progress line gives both times, compute-only its JSON lines);
- network_cpu_s_per_step: p2p: the CPU seconds of the node's network thread (rounds, codecs,
  robust mixing, status answers; ``p2p status``: network_cpu_s) over its steps, mean over peers:
  averaging's own CPU, apart from evaluations and start-up;
- train_phase_less_eval_s: the training phase less the mean peer's wall seconds spent evaluating
  (``eval_s``: the node's last progress line, compute-only's done line): what the steps alone took;
- gate_wait_s: p2p: seconds the trainer waited at the algorithm's gates (outer rounds), mean over peers;
- evaluations: per peer. Every method evaluates every ``--eval-every`` wall seconds, and on the
  wide task one evaluation (4000 samples) costs ~40 training steps of compute, so a run slowed
  by the load also evaluates more: CPU per step carries that too (``--eval-every 1e9``: only the
  final evaluation).

Overheads are each run's figure over the mean of compute-only's runs, minus 1. Wall figures move
with the machine's load (``uptime`` is recorded at each run's start); CPU seconds far less.

    python bench/step_overhead.py [--runs 3] [--steps 600] [--task nodes.wide:WideTask]
        [--methods compute_only,p2p-diloco-sparse-h25] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (puts the repository on sys.path)

from slow_links import P2P_CONFIGS  # noqa: E402
from slow_links_runs import BENCH, LogTail, p2p_node_args, parse_progress  # noqa: E402


def _cpu_of(pid: int) -> Optional[float]:
    """user + system seconds of a live process (all threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(method: str, peers: int, steps: int, task: str, seed: int, eval_every: float, port: int,
             log_dir: Path, max_time: float) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log_dir.mkdir(parents=True, exist_ok=True)
    argvs = []
    for i in range(peers):
        if method == "compute_only":
            argvs.append([sys.executable, str(BENCH / "compute_only.py"), "--shard", f"{i}/{peers}", "--task", task,
                          "--steps", str(steps), "--seed", str(seed), "--eval-every", str(eval_every), "--iface", "lo"])
        else:
            addr = f"127.0.0.1:{port + 2 * i}"
            argvs.append([sys.executable, "-m", "p2p", "start", "--listen", addr, "--threads", "1",
                          *p2p_node_args(task, steps, seed, eval_every, 0.5, peers, P2P_CONFIGS[method]),
                          "--shard", f"{i}/{peers}", *(["--join", f"127.0.0.1:{port}"] if i else [])])
    load = os.getloadavg()
    t0 = time.time()
    procs = []
    for i, argv in enumerate(argvs):
        with open(log_dir / f"peer{i}.log", "wb") as out:
            procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env))
    tails = [LogTail(log_dir / f"peer{i}.log") for i in range(peers)]
    startup_cpu: list[Optional[float]] = [None] * peers
    finished: list[Optional[float]] = [None] * peers
    usage: list[Optional[float]] = [None] * peers
    codes: list[Optional[int]] = [None] * peers
    while any(c is None for c in codes) and time.time() - t0 < max_time:
        time.sleep(0.25)
        for i, p in enumerate(procs):
            if codes[i] is not None:
                continue
            cpu = _cpu_of(p.pid)  # before reading the log: the CPU at or before the first step
            for line in tails[i].lines():
                step = _step_of(line, method)
                if step is not None and step > 0 and startup_cpu[i] is None:
                    startup_cpu[i] = cpu
                if step is not None and step >= steps and finished[i] is None:
                    finished[i] = time.time() - t0
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = codes[i] = os.waitstatus_to_exitcode(status)
                usage[i] = ru.ru_utime + ru.ru_stime
    for p in procs:
        if p.returncode is None:
            p.kill()
            p.wait()
    started, ended, waits, evals, nets, eval_s = [], [], [], [], [], []
    for i in range(peers):
        first, last, wait, n, net, seconds = _phase(log_dir / f"peer{i}.log", method)
        eval_s.append(seconds)
        nets.append(net)
        started.append(first)
        ended.append(last)
        waits.append(wait)
        evals.append(n)
    ok = all(c == 0 for c in codes) and None not in finished
    return {
        "method": method, "load": [round(x, 2) for x in load], "ok": ok, "codes": codes,
        "train_time_s": round(max(finished), 2) if ok else None,
        "train_phase_s": round(max(ended) - max(started), 2) if ok and None not in started + ended else None,
        # the training phase less the mean peer's seconds evaluating (evaluations follow the wall
        # clock, so a slower run evaluates more: this compares the training alone)
        "train_phase_less_eval_s": (round(max(ended) - max(started) - statistics.mean(eval_s), 2)
                                    if ok and None not in started + ended + eval_s else None),
        "eval_s": [None if e is None else round(e, 2) for e in eval_s],
        "cpu_s_per_step": round(statistics.mean(usage) / steps, 4) if None not in usage else None,
        "cpu_s_each": [None if u is None else round(u, 2) for u in usage],
        "startup_cpu_s": [None if c is None else round(c, 2) for c in startup_cpu],
        "gate_wait_s": round(statistics.mean(waits), 2) if None not in waits else None,
        "evaluations": evals,
        "network_cpu_s_per_step": round(statistics.mean(nets) / steps, 5) if None not in nets else None,
        "logs": str(log_dir)}


def _step_of(line: str, method: str) -> Optional[int]:
    if method == "compute_only":
        try:
            rec = json.loads(line)
        except ValueError:
            return None
        return 1 if rec.get("event") == "start" else int(rec.get("step", 0))
    progress = parse_progress(line)
    return None if progress is None else progress["step"]


def _phase(path: Path, method: str) -> tuple:
    """(first step's start, last step's end, gate wait, evaluations, network thread CPU, seconds
    evaluating) of one peer from its log (compute-only: no network thread, 0)."""
    first = last = wait = evals = net = eval_s = None
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    for line in text:
        if method == "compute_only":
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            evals = (evals or 0) + ("accuracy" in rec)
            if rec.get("event") == "start":
                first = rec["t"]
            elif rec.get("event") == "done":
                last, wait, net, eval_s = rec["t"], 0.0, 0.0, rec.get("eval_s")
        else:
            progress = parse_progress(line)
            if progress and progress["phase"] == "done":
                first, last = progress.get("train_started_at"), progress.get("train_ended_at")
                wait = progress.get("waited", 0.0)
                evals = int(progress["evaluations"]) if "evaluations" in progress else None
                net = progress.get("network_cpu_s")
                eval_s = progress.get("eval_s")
    return first, last, wait, evals, net, eval_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="compute_only,p2p-diloco-sparse-h25")
    ap.add_argument("--runs", type=int, default=3, help="runs of each method, interleaved")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--task", default="nodes.wide:WideTask")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=float, default=2.0)
    ap.add_argument("--port", type=int, default=7400)
    ap.add_argument("--max-time", type=float, default=900.0, help="per run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m != "compute_only" and m not in P2P_CONFIGS]
    if unknown:
        ap.error(f"--methods: unknown {', '.join(unknown)}")
    logs = Path(tempfile.mkdtemp(prefix="step_overhead-"))
    runs = []
    for k in range(args.runs):
        for m in methods:
            r = run_once(m, args.peers, args.steps, args.task, args.seed, args.eval_every, args.port,
                         logs / f"{m}-{k}", args.max_time)
            runs.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    summary = summarise(runs, methods)
    if args.json:
        print(json.dumps({"runs": runs, "summary": summary}))
    else:
        for m, s in summary.items():
            print(f"{m:32s} " + "  ".join(f"{k} {v}" for k, v in s.items()))
    return 0


def summarise(runs: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method: mean and median of each figure, and its overhead over compute-only's mean."""
    base = {key: _mean([r[key] for r in runs if r["method"] == "compute_only"])
            for key in ("train_time_s", "train_phase_s", "train_phase_less_eval_s", "cpu_s_per_step")}
    out = {}
    for m in methods:
        mine = [r for r in runs if r["method"] == m]
        s: dict[str, Any] = {"runs": len(mine), "ok": sum(r["ok"] for r in mine)}
        for key in ("train_time_s", "train_phase_s", "train_phase_less_eval_s", "cpu_s_per_step", "gate_wait_s",
                    "network_cpu_s_per_step"):
            values = [r[key] for r in mine if r[key] is not None]
            s[key] = _mean(values)
            if key in base and base[key] and values:
                over = [v / base[key] - 1 for v in values]
                s[key + "_overhead_mean"] = round(statistics.mean(over), 3)
                s[key + "_overhead_median"] = round(statistics.median(over), 3)
        out[m] = s
    return out


def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return round(statistics.mean(values), 4) if values else None


if __name__ == "__main__":
    sys.exit(main())
