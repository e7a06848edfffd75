"""`p2p demo` for every algorithm (natural topology) and every topology with AD-PSGD.

Prints a markdown table of each run's worst peer accuracy against the single-process
reference (same total samples), the consensus distance, wall time and bytes per peer.

    python bench/demo_matrix.py [--peers 4] [--steps 800] [--task synthetic]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2p.averaging.registry import ALGORITHMS, natural_topology  # noqa: E402
from p2p.topology import TOPOLOGIES  # noqa: E402


def demo(algorithm: str, topology: str, args) -> dict:
    cmd = [sys.executable, "-m", "p2p", "demo", "--json", "--no-live", "--peers", str(args.peers),
           "--task", args.task, "--algorithm", algorithm, "--topology", topology, "--seed", str(args.seed)]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"algorithm": algorithm, "topology": topology, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=0, help="0: the task's demo default")
    parser.add_argument("--task", default="synthetic")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    runs = [(a, natural_topology(a)) for a in ALGORITHMS]
    runs += [("adpsgd", t) for t in TOPOLOGIES if t != natural_topology("adpsgd")]
    print("| algorithm | topology | worst peer acc | reference | diff (pt) | consensus dist | wall s | MB sent/peer |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for algorithm, topology in runs:
        r = demo(algorithm, topology, args)
        if "error" in r:
            print(f"| {algorithm} | {topology} | error: {r['error']} | | | | | |", flush=True)
            continue
        worst = min(p["accuracy"] for p in r["peers"])
        sent = sum(p["bytes_sent"] for p in r["peers"]) / len(r["peers"]) / 1e6
        print(f"| {algorithm} | {topology} | {worst:.4f} | {r['reference_accuracy']:.4f} | "
              f"{100 * (worst - r['reference_accuracy']):+.2f} | {r['consensus_distance']:.2e} | "
              f"{r['wall_s']:.1f} | {sent:.1f} |", flush=True)


if __name__ == "__main__":
    main()
