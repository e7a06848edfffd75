"""State sync and crash recovery in the shaped-network lab: the figures of the checkpoint issue.

Needs root (network namespaces, tc tbf). Every node is a real ``p2p start`` process in its own
namespace; the task is ``tinylm`` (834k parameters: 3.3 MB of float32; with AdamW's two moments
the state a joiner takes is about 10 MB).

The swarm runs DiLoCo (int4, H=25: the slow-link configuration), so the donors' own traffic is
one compressed pseudo-gradient every 25 steps and the link is otherwise the joiner's.

1. ``sync``: three donors train; a fourth node joins and takes their state. Its own report
   (``p2p status``: ``sync.seconds``, from its first query to the last byte, and ``sync.bytes``)
   against the floor, bytes x 8 / link rate: for the parameters alone (the issue's "model
   bytes") and for everything moved. With the optimizer state and without
   (``--no-sync-optimizer``), at each ``--rates``; once with the donors idle (they trained
   ``--warmup`` steps and linger: the link is the joiner's alone) and once while they train.
2. ``joiners``: four joiners at once into a four-node swarm: the slowest one's sync time
   against one joiner alone (the same lab, rate and donors).
3. ``crash``: four peers train to the task's target accuracy with checkpoints every few
   seconds. In one run peer 1 is killed with SIGKILL at ``--kill-at`` seconds and restarted
   10 s later with its checkpoint directory (it resumes, then takes the swarm's fresher state);
   in the other nothing happens. Time to target = seconds from launch until every running peer
   reports an accuracy at or above the target; the crash's cost is the difference.

    python bench/state_sync.py                                 # all three, ~15 minutes
    python bench/state_sync.py --parts sync --rates 100mbit,20mbit --json
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402  (puts the repository on sys.path)
from slow_links_runs import _PROGRESS, LogTail  # noqa: E402

from p2p.harness.lab import Lab, LabSwarm, parse_rate  # noqa: E402
from p2p.net.client import QueryError, status  # noqa: E402

PREFIX, SUBNET, PORT = "p2psync", "10.78.0.0/24", 7000
PARAMS_BYTES = 834_048 * 4  # tinylm's float32 parameters


SLOW_LINK_DILOCO = ["--algorithm", "diloco", "--compression", "int4", "--diloco-inner-steps", "25",
                    "--diloco-outer-lr", "0.5", "--diloco-outer-momentum", "0.8"]


def node_args(extra: list[str]) -> list[str]:
    return ["--task", "tinylm", "--membership", "local", "--log-every", "1", "--eval-every", "2",
            "--join-timeout", "120", "--linger", "-1", *SLOW_LINK_DILOCO, *extra]


def poll_status(addr: str) -> Optional[dict]:
    try:
        return status(addr, 3.0)
    except QueryError:
        return None


def sync_run(rate: Optional[str], donors: int, joiners: int, warmup: int, extra: list[str], log_dir: Path,
             idle: bool = False) -> list[dict]:
    """``donors`` train; past ``warmup`` steps (``idle``: once they stopped there and linger),
    ``joiners`` start at once; their sync reports."""
    with Lab(donors + joiners, rate, prefix=PREFIX, subnet=SUBNET) as lab:
        lab.up()
        # The donors start together (--min-members): none is fresher than another, none syncs.
        steps = str(warmup if idle else 100000)
        per_peer = [["--shard", f"{i}/{donors}", "--steps", steps, "--min-members", str(donors)]
                    for i in range(donors)]
        per_peer += [["--steps", "100000"] + extra] * joiners
        swarm = LabSwarm(lab, log_dir, node_args([]), port=PORT, per_peer_args=per_peer, join="first")
        try:
            for i in range(donors):
                swarm.start_peer(i, [swarm.addrs[0]] if i else [])
            _common.wait_for(lambda: all((s := poll_status(swarm.addrs[i])) and s["step"] >= warmup
                                 and (not idle or s["phase"] == "lingering") for i in range(donors)),
                     600, f"the donors to pass step {warmup}")
            for j in range(donors, donors + joiners):
                swarm.start_peer(j, [swarm.addrs[0]])
            reports = [_common.wait_for(lambda j=j: (s := poll_status(swarm.addrs[j])) and s["sync"].get("phase") == "done"
                                and s["sync"], 600, f"joiner {j} to sync") for j in range(donors, donors + joiners)]
        finally:
            swarm.stop(timeout_s=20.0)
    return reports


def part_sync(rates: list[str], warmup: int, log_root: Path) -> list[dict]:
    rows = []
    for rate in rates:
        bps = parse_rate(rate)
        for donors_idle in (True, False):
            for label, extra in (("with optimizer", []), ("without optimizer", ["--no-sync-optimizer"])):
                rows.append(sync_row(rate, bps, donors_idle, label, extra, warmup, log_root))
    return rows


def sync_row(rate: str, bps: Optional[int], idle: bool, label: str, extra: list[str], warmup: int,
             log_root: Path) -> dict:
    (r,) = sync_run(rate, 3, 1, warmup, extra, log_root / f"sync-{rate}-{len(extra)}-{idle}", idle=idle)
    row = {"rate": rate, "donors": "idle" if idle else "training", "state": label, "bytes": r["bytes"],
           "seconds": r["seconds"], "donor_step": r["step"]}
    if bps:
        row["floor_params_s"] = round(PARAMS_BYTES * 8 / bps, 3)
        row["floor_moved_s"] = round(r["bytes"] * 8 / bps, 3)
        row["x_params_floor"] = round(r["seconds"] / row["floor_params_s"], 2)
        row["x_moved_floor"] = round(r["seconds"] / row["floor_moved_s"], 2)
    print(json.dumps(row), flush=True)
    return row


def part_joiners(rate: str, warmup: int, log_root: Path) -> dict:
    (alone,) = sync_run(rate, 4, 1, warmup, [], log_root / "joiners-1")
    together = sync_run(rate, 4, 4, warmup, [], log_root / "joiners-4")
    slowest = max(together, key=lambda r: r["seconds"])
    row = {"rate": rate, "alone_s": alone["seconds"], "slowest_of_4_s": slowest["seconds"],
           "ratio": round(slowest["seconds"] / alone["seconds"], 2),
           "donors_used": sorted({r["donor"] for r in together}), "bytes_each": alone["bytes"]}
    print(json.dumps(row), flush=True)
    return row


def crash_run(rate: Optional[str], target: float, kill_at: Optional[float], max_time: float, log_dir: Path) -> dict:
    """Four peers to ``target``; with ``kill_at``, peer 1 is killed then and restarted 10 s on."""
    with Lab(4, rate, prefix=PREFIX, subnet=SUBNET) as lab:
        lab.up()
        per_peer = [["--shard", f"{i}/4", "--checkpoint-dir", str(log_dir / f"ckpt{i}"), "--checkpoint-every", "5"]
                    for i in range(4)]
        swarm = LabSwarm(lab, log_dir, node_args(["--steps", "100000", "--log-every", "0.5"]), port=PORT,
                         per_peer_args=per_peer, join="first")
        tails = [LogTail(log_dir / f"peer{i}.log") for i in range(4)]
        latest = [math.nan] * 4
        down = set()
        t0 = time.monotonic()
        reached, restarted = None, False
        try:
            swarm.start()
            while time.monotonic() - t0 < max_time:
                time.sleep(0.25)
                now = time.monotonic() - t0
                for i, tail in enumerate(tails):
                    for line in tail.lines():
                        m = _PROGRESS.match(line.strip())
                        if m and m.group(3) != "nan":
                            latest[i] = float(m.group(3))
                if kill_at is not None and now >= kill_at and not down and not restarted:
                    swarm.kill(1, signal.SIGKILL)
                    swarm.procs[1].wait(10)
                    down.add(1)
                    latest[1] = math.nan  # what it said before the crash no longer counts
                if 1 in down and now >= kill_at + 10:
                    swarm.start_peer(1, [swarm.addrs[0]])
                    down.discard(1)
                    restarted = True
                running = [i for i in range(4) if i not in down]
                if all(latest[i] >= target for i in running) and (kill_at is None or restarted):
                    reached = now
                    break
        finally:
            swarm.stop(timeout_s=20.0)
    return {"kill_at": kill_at, "time_to_target_s": None if reached is None else round(reached, 1)}


def part_crash(rate: str, target: float, kill_at: float, max_time: float, log_root: Path) -> dict:
    clean = crash_run(rate, target, None, max_time, log_root / "crash-none")
    crashed = crash_run(rate, target, kill_at, max_time, log_root / "crash-kill")
    row = {"rate": rate, "target": target, "no_crash_s": clean["time_to_target_s"],
           "crash_s": crashed["time_to_target_s"], "kill_at_s": kill_at, "down_s": 10}
    if clean["time_to_target_s"] and crashed["time_to_target_s"]:
        row["extra_s"] = round(crashed["time_to_target_s"] - clean["time_to_target_s"], 1)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="sync,joiners,crash")
    ap.add_argument("--rates", default="100mbit,20mbit", help="for the sync part")
    ap.add_argument("--joiners-rate", default="100mbit")
    ap.add_argument("--crash-rate", default="100mbit")
    ap.add_argument("--warmup", type=int, default=20, help="donor steps before a joiner starts")
    ap.add_argument("--target", type=float, default=0.52, help="tinylm's target accuracy")
    ap.add_argument("--kill-at", type=float, default=60.0)
    ap.add_argument("--max-time", type=float, default=900.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    ap.add_argument("--logs", help="keep the nodes' logs here")
    args = ap.parse_args()
    log_root = Path(args.logs or tempfile.mkdtemp(prefix="p2p-state-sync-"))
    out: dict[str, Any] = {}
    parts = args.parts.split(",")
    if "sync" in parts:
        out["sync"] = part_sync(args.rates.split(","), args.warmup, log_root)
    if "joiners" in parts:
        out["joiners"] = part_joiners(args.joiners_rate, args.warmup, log_root)
    if "crash" in parts:
        out["crash"] = part_crash(args.crash_rate, args.target, args.kill_at, args.max_time, log_root)
    if args.json:
        print(json.dumps(out))
    print(f"logs in {log_root}", file=sys.stderr)


if __name__ == "__main__":
    main()
