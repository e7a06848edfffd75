"""DiLoCo's repair at low bandwidth: per-round bytes and steps/s around a cut link. Needs root.

Issue 16: a peer whose copy of theta_start fell apart used to be repaired by sending
theta_start + momentum in fp32 both ways to every neighbour in the next round; at 20 Mbit/s
that outlasted the round timeout and repeated for ever. This runs the case in the lab
(p2p/harness/lab.py: one network namespace per peer, ``tc tbf`` on both directions):

1. ``--peers`` real ``p2p start`` nodes, DiLoCo (H = ``--h``) with ``--compression``: ``int4``
   (outer lr 0.5, momentum 0.8: bench/slow_links.py ``p2p-diloco-int4-h25``) or ``sparseloco``
   (2% top-k at 2 bits with error feedback, outer lr 1, momentum 0: ``p2p-diloco-sparse-h25``),
   a communication-heavy task (default ``nodes.wide:WideTask``, 2.2 M parameters, a step of a
   few ms);
2. ``--pre`` seconds of steady state, from ``--settle`` seconds after every peer took 2 outer
   steps (all start together: ``--min-members``) and no repair is in flight;
3. the last peer's link cut (``Lab.cut``) for ``--cut-rounds`` outer rounds (the duration
   from the steady state's round time), then restored;
4. ``--post`` seconds more, then every node stopped.
With ``--compute-only`` (default on) the same peers first train alone for ``--pre`` seconds
(bench/compute_only.py, one per namespace: the same CPU sharing), for steps/s to compare with.

Definitions:
- round k: the k-th outer boundary of peer 0 (never cut) to the next; bytes per round: what
  every peer put on its link in that time (bridge-side veth counters, sampled every 0.1 s,
  interpolated at the boundaries), summed over peers;
- codec level: the median bytes per round of the steady state; back at codec level: the first
  round after the restore from which every round, averaged with the round after it, carries at
  most 1.5x that (``rounds_to_codec_level``: that round's index, 1 for the first round after
  the restore). Averaged in pairs because the other peers' boundaries are up to a fraction of a
  round off peer 0's, so a share lands in the round before or after: with sparseloco (~0.7 MB a
  round for the swarm) single steady rounds read 0.3-1.1 MB, and one round of 1.3 MB followed
  by one of 0.2 MB read as "not back" for 34 rounds (stop 31);
- steps/s: each peer's steps over sliding ``--window``-second windows (from its JSON progress
  lines); the floor is the lowest window ratio against the peer's own steady-state rate
  (``vs_steady``) and against compute-only's mean rate (``vs_compute_only``), over the
  windows that end after the restore, and separately over those inside the cut. Compute-only's
  own floor (its lowest window over its mean) is the machine's noise, for comparison.

    python bench/diloco_repair.py [--rate 20mbit] [--peers 4] [--h 25] [--pre 15] [--post 25]
        [--cut-rounds 2] [--settle 5] [--task nodes.wide:WideTask] [--compression int4|sparseloco]
        [--overlap] [--no-compute-only] [--prefix P --subnet S] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (puts the repository on sys.path)

from p2p.harness.lab import Lab, LabError, LabSwarm, probe  # noqa: E402

BENCH = Path(__file__).resolve().parent
LEVEL_FACTOR = 1.5  # "at codec level": at most this many times the steady state's median round
# The outer step per codec, as bench/slow_links.py's configs p2p-diloco-int4-h25 / p2p-diloco-sparse-h25
CODEC_ARGS = {"int4": ["--compression", "int4", "--diloco-outer-lr", "0.5", "--diloco-outer-momentum", "0.8"],
              "sparseloco": ["--compression", "sparseloco", "--diloco-outer-lr", "1.0", "--diloco-outer-momentum", "0"]}


def log(msg: str) -> None:
    print(f"[diloco_repair {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Progress:
    """Each peer's JSON progress lines as they come: [(wall time, step, averaging stats)]."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths, self.offsets = paths, [0] * len(paths)
        self.lines: list[list[tuple[float, int, dict]]] = [[] for _ in paths]

    def read(self) -> None:
        for i, path in enumerate(self.paths):
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[i])
                    data = fh.read()
            except FileNotFoundError:
                continue
            complete = data[:data.rfind(b"\n") + 1]
            self.offsets[i] += len(complete)
            for raw in complete.splitlines():
                try:
                    rec = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("event") in ("progress", "done") and "step" in rec:
                    self.lines[i].append((float(rec["time"]), int(rec["step"]), rec))

    def step(self, i: int) -> int:
        return self.lines[i][-1][1] if self.lines[i] else 0


def _interp(samples: list[tuple[float, float]], t: float) -> float:
    """Linear interpolation of (time, value) samples at t."""
    for (t0, v0), (t1, v1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return samples[-1][1] if t > samples[-1][0] else samples[0][1]


def boundaries(lines: list[tuple[float, int, dict]], h: int) -> list[tuple[float, int]]:
    """(time, k) when the peer's step first reached k * h, interpolated between its progress lines."""
    out, done = [], 0
    for (t0, s0, _), (t1, s1, _) in zip(lines, lines[1:]):
        while (done + 1) * h <= s1:
            k = done + 1
            target = k * h
            if target >= s0 and s1 > s0:
                out.append((t0 + (t1 - t0) * (target - s0) / (s1 - s0), k))
            done = k
    return out


def window_rates(lines: list[tuple[float, int, dict]], window: float, start: float, end: float) -> list[tuple[float, float]]:
    """(window end, steps/s over [end - window, end]) every second from start + window to end."""
    pts = [(t, float(s)) for t, s, _ in lines]
    if len(pts) < 2:
        return []
    out, t = [], start + window
    while t <= min(end, pts[-1][0]):
        out.append((t, (_interp(pts, t) - _interp(pts, t - window)) / window))
        t += 1.0
    return out


def compute_only_rate(lab: Lab, task: str, seconds: float, log_dir: Path, window: float) -> tuple[float, float]:
    """Mean steps/s of the peers training alone (bench/compute_only.py, one per namespace), and
    their own floor: the lowest ``window``-second window over that peer's mean, the lowest over
    the peers (the machine's noise: a p2p floor near it is not the protocol's)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = []
    for i in range(lab.peers):
        out = open(log_dir / f"compute{i}.log", "wb")
        procs.append(lab.popen(i, [sys.executable, str(BENCH / "compute_only.py"), "--task", task, "--shard",
                                   f"{i}/{lab.peers}", "--steps", "1000000", "--eval-every", "2"],
                               stdout=out, stderr=subprocess.STDOUT, env=env))
    deadline = time.time() + 180  # start-up (imports) is not compute: the window opens once all run
    while time.time() < deadline and not all(any("step" in r for r in _common.read_jsonl(log_dir / f"compute{i}.log"))
                                             for i in range(lab.peers)):
        time.sleep(0.5)
    time.sleep(seconds)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(15)
    rates, floors = [], []
    for i in range(lab.peers):
        recs = [r for r in _common.read_jsonl(log_dir / f"compute{i}.log") if "step" in r]
        recs = recs[1:]  # the first evaluation comes after start-up
        if len(recs) >= 2 and recs[-1]["t"] > recs[0]["t"]:
            rate = (recs[-1]["step"] - recs[0]["step"]) / (recs[-1]["t"] - recs[0]["t"])
            rates.append(rate)
            windows = window_rates([(r["t"], r["step"], {}) for r in recs], window, recs[0]["t"], recs[-1]["t"])
            if windows:
                floors.append(min(v for _, v in windows) / rate)
    return (statistics.mean(rates) if rates else float("nan")), (min(floors) if floors else float("nan"))


def run_cut(lab: Lab, log_dir: Path, task: str = "nodes.wide:WideTask", h: int = 25, pre_s: float = 15.0,
            post_s: float = 25.0, cut_rounds: float = 2.0, window_s: float = 4.0, settle_s: float = 5.0,
            compression: str = "int4", extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One run (module docstring); returns the measurements."""
    n = lab.peers
    cut = n - 1
    args = ["--task", task, "--steps", "10000000", "--eval-every", "1000000", "--log-every", "0.25",
            "--log-format", "json", "--linger", "0", "--join-timeout", "60", "--algorithm", "diloco",
            *CODEC_ARGS[compression], "--diloco-inner-steps", str(h), "--min-members", str(n), *extra]
    swarm = LabSwarm(lab, log_dir, args, port=7000, per_peer_args=[["--shard", f"{i}/{n}"] for i in range(n)])
    progress = Progress([log_dir / f"peer{i}.log" for i in range(n)])
    tx: list[tuple[float, float]] = []  # (time, bytes all peers put on their links)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            tx.append((time.time(), float(sum(lab.tx_bytes(i) for i in range(n)))))

    sampler = threading.Thread(target=sample, daemon=True)
    marks: dict[str, float] = {}
    try:
        swarm.start()
        sampler.start()
        deadline = time.time() + 180  # start-up on a loaded machine takes a while
        while min(progress.step(i) for i in range(n)) < 2 * h:
            if time.time() > deadline or not all(swarm.alive(i) for i in range(n)):
                raise RuntimeError(f"the swarm did not get going; logs in {log_dir}")
            time.sleep(0.2)
            progress.read()
        # Every peer starts from the seed's model once all are up (--min-members): no copy is
        # apart at the start; should one be (a slow joiner), the steady state waits for its repair.
        while any(not lines or lines[-1][2].get("repairs") != lines[-1][2].get("repairs_started")
                  for lines in progress.lines):
            if time.time() > deadline + 60:
                raise RuntimeError(f"the start-up repairs did not end; logs in {log_dir}")
            time.sleep(0.5)
            progress.read()
        time.sleep(settle_s)
        marks["steady"] = time.time()
        time.sleep(pre_s)
        progress.read()
        rounds = [t for t, _ in boundaries(progress.lines[0], h) if t >= marks["steady"]]
        round_s = (rounds[-1] - rounds[0]) / (len(rounds) - 1) if len(rounds) >= 2 else 2.0
        marks["cut"] = time.time()
        lab.cut(cut)
        time.sleep(cut_rounds * round_s)
        lab.restore(cut)
        marks["restore"] = time.time()
        time.sleep(post_s)
        marks["end"] = time.time()
        progress.read()
    finally:
        stop.set()
        swarm.stop(timeout_s=20.0)
    progress.read()
    return analyse(progress, tx, marks, h, window_s, cut, round_s)


def analyse(progress: Progress, tx: list[tuple[float, float]], marks: dict[str, float], h: int,
            window_s: float, cut: int, round_s: float) -> dict[str, Any]:
    t0 = marks["steady"]
    bounds = [(t, k) for t, k in boundaries(progress.lines[0], h) if marks["steady"] <= t <= marks["end"]]
    rounds = []
    for (ta, k), (tb, _) in zip(bounds, bounds[1:]):
        rounds.append({"round": k, "t": round(ta - t0, 2), "s": round(tb - ta, 2),
                       "mb": round((_interp(tx, tb) - _interp(tx, ta)) / 1e6, 2),
                       "phase": "steady" if tb <= marks["cut"] else "cut" if ta < marks["restore"] else "after"})
    steady = [r["mb"] for r in rounds if r["phase"] == "steady"]
    level = statistics.median(steady) if steady else float("nan")
    after = [r for r in rounds if r["phase"] == "after"]
    paired = [(a["mb"] + b["mb"]) / 2 for a, b in zip(after, after[1:])]  # Definitions: in pairs
    back = None  # rounds after the restore until (and including) the first at codec level
    for j in range(len(paired)):
        if all(v <= LEVEL_FACTOR * level for v in paired[j:]):
            back = j + 1
            break
    peers = []
    for i, lines in enumerate(progress.lines):
        pre = [(t, s) for t, s, _ in lines if marks["steady"] <= t <= marks["cut"]]
        rate = (pre[-1][1] - pre[0][1]) / (pre[-1][0] - pre[0][0]) if len(pre) >= 2 and pre[-1][0] > pre[0][0] else float("nan")
        windows = window_rates(lines, window_s, marks["steady"], marks["end"])
        in_cut = [v for t, v in windows if marks["cut"] < t <= marks["restore"] + window_s]
        post = [v for t, v in windows if t > marks["restore"] + window_s]
        stats = lines[-1][2] if lines else {}
        peers.append({"peer": i, "cut": i == cut, "steady_steps_per_s": round(rate, 2),
                      "min_window_after": round(min(post), 2) if post else None,
                      "min_window_in_cut": round(min(in_cut), 2) if in_cut else None,
                      "repairs": stats.get("repairs"), "catch_ups": stats.get("catch_ups"),
                      "repair_rounds": stats.get("repair_rounds"),
                      "repair_mb": round((stats.get("repair_bytes") or 0) / 1e6, 2)})
    return {"h": h, "round_s": round(round_s, 2), "cut_s": round(marks["restore"] - marks["cut"], 2),
            "codec_level_mb": level, "rounds_to_codec_level": back, "rounds": rounds, "peers": peers}


def ratios(result: dict[str, Any], compute_only: Optional[float]) -> None:
    """Add each peer's floor ratios (module docstring) in place, and the swarm's floors (the
    lowest over the peers) as ``floor_{after,in_cut}_vs_{steady,compute_only}``."""
    for p in result["peers"]:
        for key in ("after", "in_cut"):
            low = p[f"min_window_{key}"]
            p[f"{key}_vs_steady"] = round(low / p["steady_steps_per_s"], 3) if low is not None else None
            p[f"{key}_vs_compute_only"] = round(low / compute_only, 3) if low is not None and compute_only else None
    for key in ("after", "in_cut"):
        for base in ("steady", "compute_only"):
            values = [p[f"{key}_vs_{base}"] for p in result["peers"] if p[f"{key}_vs_{base}"] is not None]
            result[f"floor_{key}_vs_{base}"] = min(values) if values else None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="20mbit")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--h", type=int, default=25, help="DiLoCo inner steps")
    ap.add_argument("--task", default="nodes.wide:WideTask")
    ap.add_argument("--pre", type=float, default=15.0, help="seconds of steady state before the cut")
    ap.add_argument("--post", type=float, default=25.0, help="seconds after the link is restored")
    ap.add_argument("--cut-rounds", type=float, default=2.0, help="outer rounds the link stays cut")
    ap.add_argument("--window", type=float, default=4.0, help="seconds per steps/s window")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between start-up and the steady state")
    ap.add_argument("--compute-only", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--prefix", default="p2prep")
    ap.add_argument("--subnet", default="10.74.0.0/24")
    ap.add_argument("--compression", choices=sorted(CODEC_ARGS), default="int4",
                    help="the round's codec and its outer step (module docstring)")
    ap.add_argument("--overlap", action="store_true", help="--diloco-overlap: the outer round beside the inner steps")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.peers < 2:
        ap.error("--peers must be >= 2 (one is cut)")
    reason = probe()
    if reason:
        print(f"diloco_repair: {reason}", file=sys.stderr)
        return 2
    log_dir = Path(tempfile.mkdtemp(prefix="diloco_repair_"))
    try:
        with Lab(args.peers, args.rate, prefix=args.prefix, subnet=args.subnet) as lab:
            compute = compute_floor = None
            if args.compute_only:
                log(f"compute-only: {args.peers} peers alone for {args.pre:.0f}s ...")
                compute, compute_floor = compute_only_rate(lab, args.task, args.pre, log_dir, args.window)
            log(f"p2p diloco {args.compression} H={args.h} at {args.rate}, cut peer {args.peers - 1} for {args.cut_rounds} rounds ...")
            result = run_cut(lab, log_dir, args.task, args.h, args.pre, args.post, args.cut_rounds, args.window,
                             args.settle, args.compression, extra=("--diloco-overlap",) if args.overlap else ())
    except LabError as exc:
        print(f"diloco_repair: {exc}", file=sys.stderr)
        return 1
    result["compute_only_steps_per_s"] = None if compute is None else round(compute, 2)
    result["compute_only_floor_vs_own_mean"] = None if compute_floor is None else round(compute_floor, 3)
    result["rate"], result["compression"], result["logs"] = args.rate, args.compression, str(log_dir)
    ratios(result, compute)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"rate {args.rate}, {args.peers} peers, H={args.h}, round {result['round_s']}s, link of peer "
          f"{args.peers - 1} cut {result['cut_s']}s; {args.compression} level {result['codec_level_mb']:.2f} MB/round "
          f"(swarm); back at it {result['rounds_to_codec_level']} round(s) after the restore; compute-only "
          f"{result['compute_only_steps_per_s']} steps/s per peer, its own lowest {args.window:.0f}-s window "
          f"{result['compute_only_floor_vs_own_mean']}x its mean (the machine's noise)")
    print("round   t(s)   len(s)  swarm MB  phase")
    for r in result["rounds"]:
        print(f"{r['round']:5d} {r['t']:7.1f} {r['s']:7.2f} {r['mb']:9.2f}  {r['phase']}")
    print("peer  steady step/s  min after (x steady, x compute-only)  min in cut (x steady)  repairs  rounds  MB")
    for p in result["peers"]:
        print(f"{p['peer']:4d}{'*' if p['cut'] else ' '} {p['steady_steps_per_s']:12.1f}  {p['min_window_after']} "
              f"({p['after_vs_steady']}, {p['after_vs_compute_only']})  {p['min_window_in_cut']} ({p['in_cut_vs_steady']})"
              f"  {p['repairs']}  {p['repair_rounds']}  {p['repair_mb']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
