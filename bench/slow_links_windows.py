"""Steps per second over short windows of a bench/slow_links.py run, against compute-only's.

Issue 16 asks that training at 20 Mbit/s stay within 10% of compute-only's steps/s throughout
the run, not only on average: a stall of a few seconds hides in a 40-s mean. This reads the
per-peer logs a run left (``bench/out/logs/STAMP/RATE/METHOD/peerI.log``: p2p nodes' JSON
progress lines every ``--poll`` seconds, the workers' lines every 0.5 s, bench/_common.py) and,
per peer, the steps/s of every ``--window``-second window (sliding by a quarter of it) of its
training phase (its first step to its last), interpolated between lines. Per rate and method it
prints the median, 10th percentile and lowest window over all peers, and each as a share of
compute-only's median window (compute-only runs once per benchmark; the first one found).

Evaluations pause every method alike (each ~0.5 s on the wide task, every --eval-every
seconds), so a window that holds one is lower for compute-only too: compare the columns with
compute-only's own row. Runs made before the workers logged every 0.5 s have compute-only
windows smoothed over its evaluations (~2.5 s).

``--split STEP`` adds, per run, the training phase's seconds before and after STEP (from the
last peer's first step to the last peer reaching STEP, and from there to the last peer's last
step; interpolated between lines) against compute-only's: where a method's overhead lies. A
DiLoCo warm-up (``--diloco-warmup-steps 300``) runs its rounds 2.5x as often as after it; the
split at 300 shows what each part costs. Each run is compared with the compute-only run of its
own pass (``METHOD-2`` with ``compute_only-2``, bench/slow_links.py's paired repeats), else the
rate's ``compute_only``.

    python bench/slow_links_windows.py bench/out/logs/STAMP [--window 4] [--split 300]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
from slow_links_report import compute_only_for  # noqa: E402


def progress(path: Path) -> list[tuple[float, int]]:
    """(wall time, step) of every progress-like line of one peer's log."""
    points = []
    for rec in _common.read_jsonl(path):
        t, step = rec.get("t", rec.get("time")), rec.get("step")
        if isinstance(t, (int, float)) and isinstance(step, int) and rec.get("event") in (None, "progress", "done"):
            points.append((float(t), step))
    return sorted(points)


def windows(points: list[tuple[float, int]], width: float) -> np.ndarray:
    """Steps/s of every ``width``-second window of the training phase, sliding by width / 4."""
    if len(points) < 2:
        return np.empty(0)
    t = np.array([p[0] for p in points])
    s = np.array([p[1] for p in points], dtype=float)
    first, last = t[np.argmax(s > 0)], t[np.argmax(s >= s.max())]
    starts = np.arange(first, last - width, width / 4)
    return (np.interp(starts + width, t, s) - np.interp(starts, t, s)) / width


def report(run_dir: Path, width: float) -> list[dict]:
    rows, base = [], None
    for rate_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        for method_dir in sorted(p for p in rate_dir.iterdir() if p.is_dir()):
            per_peer = [windows(progress(log), width) for log in sorted(method_dir.glob("peer*.log"))]
            rates = np.concatenate([w for w in per_peer if w.size] or [np.empty(0)])
            if not rates.size:
                continue
            rows.append({"rate": rate_dir.name, "method": method_dir.name, "median": float(np.median(rates)),
                         "p10": float(np.percentile(rates, 10)), "lowest": float(rates.min()), "windows": int(rates.size)})
            if method_dir.name == "compute_only" and base is None:
                base = rows[-1]["median"]
    for row in rows:
        for key in ("median", "p10", "lowest"):
            row[f"{key}_x"] = round(row[key] / base, 3) if base else None
    return rows


def reaches(points: list[tuple[float, int]], step: int) -> Optional[float]:
    """When a peer's steps reached ``step`` (interpolated between its lines), None if never."""
    if points and points[0][1] >= step:
        return points[0][0]
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if s1 >= step > s0:
            return t0 + (t1 - t0) * (step - s0) / (s1 - s0)
    return None


def result_name(log_dir: str) -> str:
    """A run's log directory as bench/slow_links.py names its result ("METHOD-2": "METHOD #2")."""
    stem, _, n = log_dir.rpartition("-")
    return f"{stem} #{n}" if stem and n.isdigit() else log_dir


def split(run_dir: Path, step: int) -> list[dict]:
    """Per rate and method: the training phase's seconds before and after ``step`` (last peer
    to its first step, to ``step``, to its last step), and each over its pass's compute-only."""
    rows = []
    for rate_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        runs: dict[str, tuple[str, float, float]] = {}  # by result name: (log directory, before, after)
        for method_dir in sorted(p for p in rate_dir.iterdir() if p.is_dir()):
            peers = [progress(log) for log in sorted(method_dir.glob("peer*.log"))]
            peers = [[(t, s) for t, s in pts if s > 0] for pts in peers]
            if not peers or not all(peers):
                continue
            at = [reaches(pts, step) for pts in peers]
            if None in at or max(pts[-1][1] for pts in peers) <= step:
                continue
            first, mid, last = max(p[0][0] for p in peers), max(at), max(p[-1][0] for p in peers)
            runs[result_name(method_dir.name)] = (method_dir.name, mid - first, last - mid)
        for key, (name, before, after) in runs.items():
            co = compute_only_for(key, runs, None)  # the report's pairing: its own pass's, else the rate's
            rows.append({"rate": rate_dir.name, "method": name, "before_s": round(before, 2), "after_s": round(after, 2),
                         "before_x": round(before / co[1], 3) if co else None,
                         "after_x": round(after / co[2], 3) if co else None})
    return rows


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="bench/out/logs/STAMP of a bench/slow_links.py run")
    ap.add_argument("--window", type=float, default=4.0, help="window width in seconds")
    ap.add_argument("--split", type=int, default=None, metavar="STEP",
                    help="also the seconds before and after this step, against compute-only's")
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        ap.error(f"{args.run_dir}: not a directory (want bench/out/logs/STAMP of a bench/slow_links.py run)")
    if not args.window > 0:
        ap.error(f"--window must be > 0 seconds, got {args.window:g}")
    rows = report(args.run_dir, args.window)
    if not rows:
        ap.error(f"{args.run_dir}: no RATE/METHOD/peerI.log with progress lines under it")
    print(f"steps/s per peer over {args.window:g}-s windows (x: share of compute-only's median window)")
    print("| rate | method | median | 10th percentile | lowest | windows |\n| --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = [f"{r[k]:.1f}" + (f" ({r[k + '_x']:.2f}x)" if r[k + "_x"] is not None else "") for k in ("median", "p10", "lowest")]
        print(f"| {r['rate']} | {r['method']} | {' | '.join(cells)} | {r['windows']} |")
    if args.split is not None:
        if args.split < 1:
            ap.error(f"--split must be a step >= 1, got {args.split}")
        print(f"\ntraining phase before and after step {args.split}, seconds (x: over its pass's compute-only)")
        print(f"| rate | method | to step {args.split} | after it |\n| --- | --- | ---: | ---: |")
        for r in split(args.run_dir, args.split):
            cells = [f"{r[k + '_s']:.1f}" + (f" ({r[k + '_x']:.2f}x)" if r[k + "_x"] is not None else "")
                     for k in ("before", "after")]
            print(f"| {r['rate']} | {r['method']} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
