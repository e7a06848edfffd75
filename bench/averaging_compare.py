"""Every averaging algorithm on the same swarm: speed, time to target, accuracy, bytes.

Runs 4 real peer processes on loopback per algorithm (its natural topology), each training the
larger task on its own shard for a fixed wall-clock budget, polling every peer's status (step,
held-out accuracy, bytes) once a second. Writes a markdown table and a PNG plot (mean held-out
accuracy against wall time, one line per algorithm) under bench/out/.

    python bench/averaging_compare.py [--task tinylm] [--peers 4] [--seconds 240]
                                      [--algorithms adpsgd,dpsgd,...] [--json]

Time to target: first poll at which the *mean* held-out accuracy over the peers reaches the
task's ``target_accuracy``. Steps/s: mean over peers. The machine is shared and noisy (and
4 peers share 2 cores here), so compare algorithms within one run only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2p.averaging.registry import ALGORITHMS, natural_topology  # noqa: E402
from p2p.harness.local_swarm import LocalSwarm  # noqa: E402
from p2p.training.task import load_task  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def run_one(algorithm: str, topology: str, task: str, peers: int, seconds: float, seed: int) -> dict:
    target = load_task(task).target_accuracy
    args = ["--task", task, "--seed", str(seed), "--algorithm", algorithm, "--topology", topology,
            "--duration", str(seconds), "--linger", "-1", "--log-every", "0", "--eval-every", "5"]
    per_peer = [["--shard", f"{i}/{peers}"] for i in range(peers)]
    curve, time_to_target = [], None
    with tempfile.TemporaryDirectory() as logs:
        swarm = LocalSwarm(peers, Path(logs), args, per_peer_args=per_peer)
        start = time.monotonic()
        swarm.start()
        last = [None] * peers
        while True:
            time.sleep(1.0)
            now = time.monotonic() - start
            statuses = [swarm.status(i, timeout_s=2.0) for i in range(peers)]
            last = [s or old for s, old in zip(statuses, last)]
            if all(last):
                accs = [s["accuracy"] for s in last]
                if all(a == a for a in accs):  # no NaN: every peer has evaluated once
                    mean = sum(accs) / peers
                    curve.append((now, mean))
                    if time_to_target is None and mean >= target:
                        time_to_target = now
            if all(last) and all(s["phase"] != "training" for s in last):
                break
            if now > seconds + 120:
                break
            if not all(swarm.alive(i) for i in range(peers)):
                raise RuntimeError(f"{algorithm}: a peer died: {swarm.log_tail(0)}")
        final = [swarm.status(i, timeout_s=5.0) or last[i] for i in range(peers)]
        swarm.stop()
    return {
        "algorithm": algorithm, "topology": topology,
        "steps_per_s": sum(s["steps_per_s"] for s in final) / peers,
        "time_to_target_s": time_to_target,
        "final_accuracy": sum(s["accuracy"] for s in final) / peers,
        "bytes_per_peer": sum(s["bytes_sent"] for s in final) / peers,
        "steps": sum(s["step"] for s in final) / peers,
        "curve": curve,
    }


def write_outputs(results: list[dict], task: str, peers: int, seconds: float) -> None:
    OUT.mkdir(exist_ok=True)
    target = load_task(task).target_accuracy
    lines = [f"{peers} peers, task `{task}`, {seconds:g} s of training each, target accuracy {target}", "",
             "| algorithm | topology | steps/s per peer | time to target (s) | final accuracy | MB sent per peer |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in results:
        ttt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
        lines.append(f"| {r['algorithm']} | {r['topology']} | {r['steps_per_s']:.2f} | {ttt} | "
                     f"{r['final_accuracy']:.4f} | {r['bytes_per_peer'] / 1e6:.1f} |")
    (OUT / "averaging_compare.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        if r["curve"]:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, ys, label=f"{r['algorithm']} ({r['topology']})")
    ax.axhline(target, color="grey", linestyle=":", label="target")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("mean held-out accuracy")
    ax.set_title(f"{peers} peers, {task}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "averaging_compare.png", dpi=120)
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="tinylm")
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for name in args.algorithms.split(","):
        if name not in ALGORITHMS:
            parser.error(f"unknown algorithm {name!r} (available: {', '.join(ALGORITHMS)})")
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results.append(run_one(name, natural_topology(name), args.task, args.peers, args.seconds, args.seed))
    write_outputs(results, args.task, args.peers, args.seconds)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "curve"} for r in results]))


if __name__ == "__main__":
    main()
