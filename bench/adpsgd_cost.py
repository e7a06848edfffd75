"""AD-PSGD's cost to training: steps/s of N ``p2p start`` peers averaging against N that train alone.

Both phases run the same daemon (``p2p start``, one torch thread each, loopback, the same task,
seed and shards) for the same ``--duration``; in the compute-only phase nobody joins anybody, so
the network thread idles and nothing is exchanged. The phases alternate (``--repeats``), so a
shared machine's drift hits both. Training is supposed never to wait on AD-PSGD's exchanges:
the ratio averaged / compute-only is the cost.

    python bench/adpsgd_cost.py --peers 4 --duration 30 --repeats 1
    python bench/adpsgd_cost.py --lab-rate 100mbit      # in network namespaces, shaped links (root)
    python bench/adpsgd_cost.py --profile /tmp/prof   # py-spy record one averaging peer (needs py-spy)

Prints one JSON object per phase: mean steps/s per peer, MB sent per peer, exchanges completed,
and each thread's CPU share per peer over most of the training window (read from /proc; the
names come from ``py-spy dump``). On a shared machine steps/s drift with the load; the CPU
shares (network thread against the training thread) are the steadier measure of the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _port(base: int, i: int) -> int:
    return base + 2 * i  # each peer uses its port and the next (the bulk stream)


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _thread_names(pid: int) -> dict[int, str]:
    """Python thread names by native id (py-spy dump; empty without py-spy)."""
    if not shutil.which("py-spy"):
        return {}
    out = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True).stdout
    names = {}
    for line in out.splitlines():
        if line.startswith("Thread "):  # Thread 1234 (idle): "p2p-network"
            names[int(line.split()[1], 0)] = line.rsplit('"', 2)[-2] if line.count('"') >= 2 else "?"
    return names


def run_phase(args: argparse.Namespace, averaging: bool, base_port: int, profile: str | None, lab=None) -> dict:
    procs, outs = [], []
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def addr(i: int) -> str:
        return f"{lab.addr(i)}:{base_port}" if lab is not None else f"127.0.0.1:{_port(base_port, i)}"

    for i in range(args.peers):
        cmd = [sys.executable, "-m", "p2p", "start", "--listen", addr(i),
               "--task", args.task, "--shard", f"{i}/{args.peers}", "--duration", str(args.duration),
               "--threads", "1", "--log-format", "json", "--membership", "local", "--linger", "0",
               "--eval-every", "1000", "--algorithm", args.algorithm, *args.extra]
        if averaging and i > 0:
            cmd += ["--join", addr(0), "--min-members", str(args.peers)]
        elif averaging:
            cmd += ["--min-members", str(args.peers)]
        log = open(Path(args.log_dir) / f"{'avg' if averaging else 'alone'}{base_port}-{i}.jsonl", "w+")
        outs.append(log)
        popen = subprocess.Popen if lab is None else lambda argv, **kw: lab.popen(i, argv, **kw)
        procs.append(popen(cmd, stdout=log, stderr=subprocess.DEVNULL, text=True, env=env))
    spy = None
    deadline = time.monotonic() + 120
    while not all('"training"' in Path(o.name).read_text() for o in outs) and time.monotonic() < deadline:
        time.sleep(0.5)  # poll: measure training, not the start-up imports
    names = [_thread_names(p.pid) for p in procs]
    cpu0, t0 = [_thread_cpu(p.pid) for p in procs], time.monotonic()
    if profile and averaging:
        spy = subprocess.Popen(["py-spy", "record", "--native", "--threads", "-r", "50",
                                "-d", str(int(args.duration / 2)), "-f", "raw", "-o", profile,
                                "-p", str(procs[1].pid)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(max(0.0, args.duration * 0.7 - (time.monotonic() - t0)))
    cpu1, t1 = [_thread_cpu(p.pid) for p in procs], time.monotonic()
    threads: dict[str, float] = {}
    for n, a, b in zip(names, cpu0, cpu1):
        for tid, secs in b.items():
            name = n.get(tid, "other")
            threads[name] = threads.get(name, 0.0) + secs - a.get(tid, 0.0)
    for p in procs:
        p.wait(timeout=args.duration + 120)
    outs = [[json.loads(line) for line in Path(log.name).read_text().splitlines() if line.startswith("{")]
            for log in outs]
    if spy is not None:
        spy.wait(timeout=60)
    done = [next(r for r in reversed(lines) if r.get("event") == "done") for lines in outs]
    # steps/s while training: from the first to the last progress line of each peer
    rates = []
    for lines in outs:
        prog = [r for r in lines if r.get("event") == "progress" and r.get("phase") == "training"]
        if len(prog) >= 2:
            rates.append((prog[-1]["step"] - prog[0]["step"]) / (prog[-1]["time"] - prog[0]["time"]))
    return {"phase": "adpsgd" if averaging else "compute-only", "peers": args.peers,
            "steps_per_s": round(sum(rates) / max(len(rates), 1), 2),
            "steps": [d["step"] for d in done],
            "mb_sent_per_peer": round(sum(d["bytes_sent"] for d in done) / len(done) / 1e6, 1),
            "exchanges_completed": sum(d["exchanges_completed"] for d in done),
            "exchanges_started": sum(d["exchanges_started"] for d in done),
            "cpu_share_per_peer": {k: round(v / (t1 - t0) / len(procs), 3) for k, v in sorted(threads.items())},
            "load": os.getloadavg()[0]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--task", default="nodes.wide:WideTask")
    ap.add_argument("--algorithm", default="adpsgd")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--port", type=int, default=17300)
    ap.add_argument("--profile", default=None, help="py-spy raw output for peer 1 of the averaging phase")
    ap.add_argument("--lab-rate", default=None,
                    help="run the peers in network namespaces with links of this rate (p2p/harness/lab.py; root)")
    ap.add_argument("--log-dir", default="/tmp", help="where each peer's JSON lines go")
    ap.add_argument("--only", choices=("both", "adpsgd", "compute-only"), default="both")
    ap.add_argument("extra", nargs="*", help="more `p2p start` arguments, after --")
    args = ap.parse_args(argv)
    if args.profile and not shutil.which("py-spy"):
        ap.error("--profile needs py-spy on PATH (pip install py-spy)")
    lab = None
    if args.lab_rate:
        from p2p.harness.lab import Lab

        lab = Lab(args.peers, args.lab_rate, prefix="adcost", subnet="10.79.0.0/24").up()
    try:
        for r in range(args.repeats):
            for averaging in (False, True):
                if args.only != "both" and (args.only == "adpsgd") != averaging:
                    continue
                result = run_phase(args, averaging, args.port + 20 * r + (10 if averaging else 0), args.profile, lab)
                print(json.dumps(dict(result, rate=args.lab_rate or "loopback")), flush=True)
    finally:
        if lab is not None:
            lab.down()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
