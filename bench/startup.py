"""Start-up: seconds from launching N processes on this machine until each one trains.

Why: issue 13's ideal bound counts compute-only's start-up, and time to an early target on the
wide task is ~8 s, so every tenth of a second a node spends before its first step shows there.
This launches, alternately (R runs each, interleaved so that the machine's load hits both alike):

- ``p2p``: N ``p2p start`` nodes on loopback, each joining the one before (as the lab and
  LocalSwarm start them), ``--min-members N`` (nobody trains until all N are up, like gloo's
  rendezvous), DiLoCo with the slow-link codec, JSON logs;
- ``compute_only``: N bench/compute_only.py workers (same task, model, shard and seed; no
  network).

and reads from their logs when each began training (p2p: ``train_started_at`` of the last line;
compute-only: the "start" line, after its model, optimizer and first batch). For p2p it splits
the critical path at the moment the last node is up (its first log line: imports, model,
sockets): ``--min-members`` holds every first step until then, and what follows (that node's
optimizer, state sync and join, the others learning of it) is p2p's own.

    python bench/startup.py [--peers 4] [--runs 3] [--task nodes.wide:WideTask]

Prints one line per run and mode (each peer's seconds from launch to its first step, sorted)
and the medians over runs of the last peer's start and of the two p2p phases.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (puts the repository on sys.path; parse_jsonl)

from p2p.net.ports import free_ports  # noqa: E402


def p2p_argv(i: int, ports: list[int], peers: int, task: str) -> list[str]:
    argv = [sys.executable, "-m", "p2p", "start", "--task", task, "--steps", "30", "--seed", "0",
            "--eval-every", "2", "--log-format", "json", "--linger", "0", "--log-every", "0.5",
            "--listen", f"127.0.0.1:{ports[i]}", "--min-members", str(peers), "--shard", f"{i}/{peers}",
            "--algorithm", "diloco", "--compression", "sparseloco", "--diloco-inner-steps", "25"]
    return argv + (["--join", f"127.0.0.1:{ports[i - 1]}"] if i else [])


def compute_only_argv(i: int, peers: int, task: str) -> list[str]:
    return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "compute_only.py"),
            "--task", task, "--shard", f"{i}/{peers}", "--steps", "30", "--seed", "0", "--eval-every", "2"]


def log_time(record: dict) -> float:
    """A record's unix time: the logger's ISO ``time`` or the node's float one."""
    t = record["time"]
    return datetime.fromisoformat(t).timestamp() if isinstance(t, str) else float(t)


def run_once(mode: str, peers: int, task: str) -> dict:
    ports = free_ports(peers) if mode == "p2p" else []
    launched = time.time()
    procs = [subprocess.Popen(p2p_argv(i, ports, peers, task) if mode == "p2p" else compute_only_argv(i, peers, task),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(peers)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode for p in procs):
        bad = next(o for p, o in zip(procs, outputs) if p.returncode)
        raise SystemExit(f"startup: a {mode} process failed:\n{bad[-2000:]}")
    starts, ups = [], []
    for text in outputs:
        records = _common.parse_jsonl(text)
        if mode == "compute_only":
            starts.append(next(r["t"] for r in records if r.get("event") == "start") - launched)
            continue
        ups.append(log_time(next(r for r in records if "time" in r)) - launched)
        starts.append(next(r["train_started_at"] for r in records if "train_started_at" in r) - launched)
    # p2p's critical path: --min-members holds every first step until the last node is up (its
    # first log line: imports, model, sockets); then that node builds its optimizer, joins
    # (state sync, membership) and every node starts
    phases = (max(ups), max(starts) - max(ups)) if ups else ()
    return {"starts": sorted(starts), "phases": phases}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--task", default="nodes.wide:WideTask")
    args = ap.parse_args(argv)
    if args.peers < 1 or args.runs < 1:
        ap.error(f"--peers and --runs must be >= 1, got {args.peers} and {args.runs}")
    last: dict[str, list[float]] = {"p2p": [], "compute_only": []}
    phases: list[tuple[float, float]] = []
    print(f"startup: {args.peers} processes per run, task {args.task}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}")
    for run in range(args.runs):
        for mode in ("compute_only", "p2p"):
            result = run_once(mode, args.peers, args.task)
            last[mode].append(result["starts"][-1])
            if result["phases"]:
                phases.append(result["phases"])
            print(f"run {run + 1} {mode:12s} first step at " + " ".join(f"{s:.2f}" for s in result["starts"]) + " s")
    co, p2p = statistics.median(last["compute_only"]), statistics.median(last["p2p"])
    print(f"last peer's first step, median of {args.runs}: p2p {p2p:.2f} s, compute-only {co:.2f} s "
          f"(p2p {p2p - co:+.2f} s)")
    names = ("launch to the last node up (imports, model, sockets)",
             "last node up to the last first step (optimizer, join, state sync, min-members)")
    for k, name in enumerate(names):
        print(f"  p2p {name}: median {statistics.median(p[k] for p in phases):.2f} s, "
              f"max {max(p[k] for p in phases):.2f} s")


if __name__ == "__main__":
    main()
