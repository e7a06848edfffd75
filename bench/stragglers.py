"""Stragglers: one peer slowed 5x; how much do the others slow down?

For each algorithm, runs 4 real peers on loopback twice for a fixed wall-clock window: once
all at full speed, once with peer 0 slowed 5x (`p2p start --slowdown 5`, a test-only knob
that sleeps 4x each step's compute time). Prints the other peers' mean steps/s in both runs
and the drop. Asynchronous algorithms should barely notice (target: < 20% drop); D-PSGD
waits for its neighbours every round, by design, and shows it.

    python bench/stragglers.py [--algorithms adpsgd,sgp,elastic,dpsgd] [--seconds 40] [--task synthetic]

Note: on this 2-core machine 4 peers compete for CPU, so a sleeping straggler frees CPU for
the others; compare the drop between algorithms, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2p.averaging.registry import natural_topology  # noqa: E402
from p2p.harness.local_swarm import LocalSwarm  # noqa: E402


def others_rate(algorithm: str, task: str, seconds: float, slow: bool, peers: int = 4) -> float:
    args = ["--task", task, "--algorithm", algorithm, "--topology", natural_topology(algorithm),
            "--membership", "local", "--linger", "-1", "--log-every", "0", "--eval-every", "30",
            "--round-timeout", "5"]
    per_peer = [["--slowdown", "5"] if (slow and i == 0) else [] for i in range(peers)]
    with tempfile.TemporaryDirectory() as logs:
        swarm = LocalSwarm(peers, Path(logs), args, per_peer_args=per_peer)
        swarm.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until every peer trains
            statuses = [swarm.status(i) for i in range(peers)]
            if all(s and s["step"] > 0 for s in statuses):
                break
            time.sleep(0.5)
        first = [swarm.status(i)["step"] for i in range(1, peers)]
        t0 = time.monotonic()
        time.sleep(seconds)
        last = [swarm.status(i)["step"] for i in range(1, peers)]
        elapsed = time.monotonic() - t0
        swarm.stop()
    return sum(b - a for a, b in zip(first, last)) / len(first) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default="adpsgd,sgp,elastic,dpsgd")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--task", default="synthetic")
    args = parser.parse_args()
    print("| algorithm | others' steps/s, all fast | with one 5x straggler | drop |")
    print("| --- | ---: | ---: | ---: |")
    for algorithm in args.algorithms.split(","):
        fast = others_rate(algorithm, args.task, args.seconds, slow=False)
        slowed = others_rate(algorithm, args.task, args.seconds, slow=True)
        print(f"| {algorithm} | {fast:.1f} | {slowed:.1f} | {100 * (1 - slowed / fast):+.0f}% |", flush=True)


if __name__ == "__main__":
    main()
