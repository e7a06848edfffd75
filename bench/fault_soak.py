"""Fault soak in the shaped-network lab (issue 12): one run with every fault, one without.

Needs root (network namespaces, tc tbf; p2p/harness/lab.py). Every node is a real ``p2p start``
process in its own namespace, default task ``synthetic`` (13k parameters: the machine this was
written on has 2 cores for up to 10 processes, so the task must be cheap; it peaks within ~20 s
there and then overfits each peer's shard, so for accuracy in the learning regime use
``--task tinylm``, ~2 steps/s per peer with 4 peers on 2 cores), default algorithm
(adpsgd unless ``--algorithm``), default membership timers (``lan``: 1 s probes).

The fault run, with the swarm training throughout (times from when every peer has stepped):

1. ``kill``: after ``--warmup`` s, SIGKILL ``--kill`` peers at once (peer 1; with 8 peers, 1 and
   2), restart them ``--down`` s later with the same ``--checkpoint-dir`` (they resume from it).
2. ``cut``: take the last base peer's link down for ``--cut`` s, then restore it.
3. ``partition``: split the base peers in two halves (``Lab.partition``) for ``--partition`` s,
   then heal.
4. ``join``: two new peers join through peer 0 (state sync); the run goes on ``--tail`` s after
   every live peer lists them alive.

Each phase ends ``--settle`` s after the views merged again (after the restart, restore or heal
if they do not within 90 s). The baseline is the same base peers for the same wall
time with no fault and no joiner.

The figures (one JSON line per run, then a table):

- ``max_gap_s`` per phase: the longest time a survivor went without a completed step, from the
  nodes' own progress lines (``--log-format json``, one every 0.5 s, stamped by the node): the
  longest interval between two moments its step count changed, over the phase's window (from the
  fault to the end of the settle after it). Survivors: peers that were not killed, cut or just
  joined in that phase; in the partition every base peer is one. Resolution: the 0.5 s period.
  Compared with the detection bound ``bound_s``: how long SWIM may take to declare a silent peer
  dead with these timers, (N + 1) probe periods (round-robin probing reaches it within N periods,
  plus the failed probe's own) plus the longest suspicion timeout (Lifeguard's
  ``suspicion_max_timeout_mult`` x ``suspicion_mult`` x max(1, log10 N) x probe period). A
  survivor that stalled longer than that waited for a peer beyond the time membership needs to
  drop it.
- ``merge_s``: seconds from the restore / heal / joiners' start (after kill: the restart) until
  every live peer lists every other live peer as ``alive`` (``p2p status`` member tables, polled
  every ~0.5 s). ``split_s``: seconds from the cut / partition until every peer on each side
  lists the other side as not alive.
- ``cd_*``: consensus distance (mean L2 distance of each live peer's parameters to their mean,
  ``p2p.harness.local_swarm.consensus_distance``) before each fault, at the end of its phase,
  and at the end (``cd_end``); ``cd_before_heal``: just before the partition heals.
- ``acc_mean`` / ``acc_min``: held-out accuracy over the live peers at the end (joiners included;
  ``acc_base_mean`` over the base peers only), against the baseline's ``acc_mean``.
- Nothing lost: ``nan``: parameters non-finite at any sample, or a null/NaN accuracy after a
  peer's first evaluation; ``step_backwards``: a survivor's step count went down (a model reset);
  ``resumed_at``: the step each restarted peer resumed at (must be > 0) and ``joiners_synced_at``
  the step each joiner took from the swarm.

    python bench/fault_soak.py                      # 4 peers (+2 joiners), ~10 minutes for both runs
    python bench/fault_soak.py --peers 8 --kill 2   # 8 peers (+2 joiners), 2 killed at once
    python bench/fault_soak.py --algorithm diloco --json
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402  (puts the repository on sys.path)
import numpy as np  # noqa: E402

from p2p.gossip.config import MembershipConfig  # noqa: E402
from p2p.harness.lab import Lab, LabSwarm  # noqa: E402
from p2p.harness.local_swarm import consensus_distance  # noqa: E402

PORT = 7000
JOINERS = 2


def detection_bound(n: int, cfg: MembershipConfig = MembershipConfig.lan()) -> float:
    """Worst-case seconds for SWIM to declare a silent member of an n-member swarm dead (module doc)."""
    suspicion_max = cfg.suspicion_max_timeout_mult * cfg.suspicion_mult * max(1.0, math.log10(n)) * cfg.probe_interval
    return round((n + 1) * cfg.probe_interval + suspicion_max, 1)


class Soak:
    """One run: a lab of base + joiner namespaces, the swarm in it, and what was sampled."""

    def __init__(self, args: argparse.Namespace, log_dir: Path, faults: bool) -> None:
        self.args, self.log_dir, self.faults = args, log_dir, faults
        self.n = args.peers
        self.total = self.n + (JOINERS if faults else 0)
        self.lab = Lab(self.total, args.rate, prefix=args.prefix, subnet=args.subnet)
        node = ["--task", args.task, "--log-format", "json", "--log-every", "0.5", "--eval-every", "2",
                "--join-timeout", "120", "--seed", "7"]
        if args.algorithm:
            node += ["--algorithm", args.algorithm]
        per_peer = [["--shard", f"{i}/{self.n}", "--checkpoint-dir", str(log_dir / f"ckpt{i}"),
                     "--checkpoint-every", "5"] for i in range(self.n)] + [[]] * (self.total - self.n)
        self.swarm = LabSwarm(self.lab, log_dir, node, port=PORT, per_peer_args=per_peer, join="first")
        self.live: set[int] = set()
        self.events: list[tuple[str, float]] = []  # (name, unix time)
        self.row: dict[str, Any] = {"run": "faults" if faults else "baseline", "peers": self.n,
                                    "algorithm": args.algorithm or "default", "task": args.task, "rate": args.rate}
        self.nan = False
        self.pool = ThreadPoolExecutor(max_workers=self.total)

    # -- probes ---------------------------------------------------------------------------
    def mark(self, name: str) -> float:
        t = time.time()
        self.events.append((name, t))
        print(f"  {time.strftime('%H:%M:%S')} {name}", file=sys.stderr, flush=True)
        return t

    def statuses(self, peers: set[int]) -> dict[int, Optional[dict]]:
        peers = sorted(peers)
        return dict(zip(peers, self.pool.map(lambda i: self.swarm.status(i, 2.0), peers)))

    def cd(self, key: str) -> None:
        """Consensus distance of the live peers now (and the NaN check on their parameters)."""
        peers = sorted(self.live)
        vecs = [v for v in self.pool.map(lambda i: self.swarm.params(i, 10.0), peers) if v is not None]
        if any(not np.isfinite(v).all() for v in vecs):
            self.nan = True
        self.row[key] = round(consensus_distance(vecs), 5) if len(vecs) >= 2 else None
        self.row[key + "_n"] = len(vecs)

    def views_agree(self, groups: list[set[int]], apart: bool, ask: Optional[set[int]] = None) -> bool:
        """Every live peer (of ``ask``: the root namespace cannot query a cut peer) lists the
        live peers of its group alive (``apart``: and those of the other groups not alive;
        else every live peer alive)."""
        addr = {i: self.swarm.addrs[i] for i in self.live}
        for i, s in self.statuses(self.live if ask is None else ask).items():
            if s is None:
                return False
            alive = {m["addr"] for m in s.get("members", []) if m["state"] == "alive"}
            mine = next((g for g in groups if i in g), set(self.live))
            want = {addr[j] for j in (mine if apart else self.live) if j in addr}
            if not want <= alive:
                return False
            if apart and alive & {addr[j] for j in self.live - mine}:
                return False
        return True

    def wait_views(self, key: str, since: float, limit: float, groups: list[set[int]], apart: bool = False,
                   ask: Optional[set[int]] = None) -> Optional[float]:
        """Poll until the views agree; records and returns when (None: not within ``limit``)."""
        deadline = time.time() + limit
        while time.time() < deadline:
            if self.views_agree(groups, apart, ask):
                now = time.time()
                self.row[key] = round(now - since, 1)
                return now
            time.sleep(0.5)
        self.row[key] = None
        return None

    def sleep_until(self, t: float) -> None:
        time.sleep(max(0.0, t - time.time()))

    # -- the run --------------------------------------------------------------------------
    def run(self, duration: Optional[float] = None) -> dict:
        with self.lab:
            try:
                for i in range(self.n):
                    self.start(i)
                _common.wait_for(lambda: all((s := self.swarm.status(i, 2.0)) and s["step"] > 0 for i in range(self.n)),
                                 180, "every peer to step")
                t0 = self.mark("training")
                if self.faults:
                    self.fault_sequence()
                else:
                    self.sleep_until(t0 + duration)
                self.cd("cd_end")
                self.final()
            finally:
                self.mark("stop")
                self.swarm.stop(timeout_s=20.0)
                self.pool.shutdown()
        self.analyse()
        return self.row

    def start(self, i: int) -> None:
        self.swarm.start_peer(i, [self.swarm.addrs[0]] if i else [])
        self.live.add(i)

    def fault_sequence(self) -> None:
        a, n = self.args, self.n
        victims = list(range(1, 1 + a.kill))
        cut = n - 1
        halves = [set(range(n // 2)), set(range(n // 2, n))]
        time.sleep(a.warmup)
        self.cd("cd_before_kill")
        t = self.mark("kill")
        for v in victims:
            self.swarm.kill(v, signal.SIGKILL)
        for v in victims:
            self.swarm.procs[v].wait(10)
            self.live.discard(v)
        self.sleep_until(t + a.down)
        t = self.mark("restart")
        for v in victims:
            self.start(v)
        merged = self.wait_views("merge_kill_s", t, 90, [set(self.live)])
        self.sleep_until((merged or t) + a.settle)
        self.mark("kill_end")
        self.cd("cd_after_kill")

        t = self.mark("cut")
        self.lab.cut(cut)
        others = set(self.live) - {cut}
        self.wait_views("split_cut_s", t, a.cut, [others, {cut}], apart=True, ask=others)
        self.sleep_until(t + a.cut)
        t = self.mark("restore")
        self.lab.restore(cut)
        merged = self.wait_views("merge_cut_s", t, 90, [set(self.live)])
        self.sleep_until((merged or t) + a.settle)
        self.mark("cut_end")
        self.cd("cd_after_cut")

        self.cd("cd_before_partition")
        t = self.mark("partition")
        self.lab.partition([sorted(h) for h in halves])
        self.wait_views("split_partition_s", t, a.partition, halves, apart=True)
        self.sleep_until(t + a.partition - 3)
        self.cd("cd_before_heal")
        self.sleep_until(t + a.partition)
        t = self.mark("heal")
        self.lab.heal()
        merged = self.wait_views("merge_partition_s", t, 90, [set(self.live)])
        self.sleep_until((merged or t) + a.settle)
        self.mark("partition_end")
        self.cd("cd_after_partition")

        t = self.mark("join")
        for j in range(n, n + JOINERS):
            self.start(j)
        merged = self.wait_views("merge_join_s", t, 90, [set(self.live)])
        self.sleep_until((merged or t) + a.tail)  # the joiners train with the swarm for the tail

    def final(self) -> None:
        sts = self.statuses(self.live)
        acc = {i: s.get("accuracy") for i, s in sts.items() if s}
        good = [v for v in acc.values() if v is not None and not math.isnan(v)]
        base = [v for i, v in acc.items() if i < self.n and v is not None and not math.isnan(v)]
        self.row["acc_mean"] = round(float(np.mean(good)), 4) if good else None
        self.row["acc_min"] = round(min(good), 4) if good else None
        self.row["acc_base_mean"] = round(float(np.mean(base)), 4) if base else None
        self.row["answered"] = f"{len(good)}/{len(self.live)}"
        self.row["steps"] = {i: s["step"] for i, s in sts.items() if s}
        if self.faults:
            self.row["joiners_synced_at"] = [sts[j]["sync"].get("step") if sts.get(j) else None
                                             for j in range(self.n, self.total)]

    # -- from the logs --------------------------------------------------------------------
    def analyse(self) -> None:
        ev = dict(self.events)
        self.row["duration_s"] = round(ev["stop"] - ev["training"], 1)
        lives = [read_log(self.log_dir / f"peer{i}.log") for i in range(self.total)]
        for i, incarnations in enumerate(lives):
            for inc in incarnations:
                seen_acc = False
                for _, _, acc in inc["progress"]:
                    if acc is not None:
                        seen_acc = True
                    elif seen_acc:
                        self.nan = True
                    if acc is not None and math.isnan(acc):
                        self.nan = True
        self.row["nan"] = self.nan
        self.row["errors"] = sum(inc["errors"] for incs in lives for inc in incs)
        if not self.faults:
            self.row["max_gap_s"] = {"run": max_gap(lives, range(self.n), ev["training"], ev["stop"])}
            self.row["step_backwards"] = backwards(lives, range(self.n))
            return
        n, a = self.n, self.args
        victims, cut = set(range(1, 1 + a.kill)), n - 1
        windows = {"kill": (ev["kill"], ev["kill_end"], set(range(n)) - victims),
                   "cut": (ev["cut"], ev["cut_end"], set(range(n)) - {cut}),
                   "partition": (ev["partition"], ev["partition_end"], set(range(n))),
                   "join": (ev["join"], ev["stop"], set(range(n)))}
        self.row["max_gap_s"] = {k: max_gap(lives, peers, t0, t1) for k, (t0, t1, peers) in windows.items()}
        self.row["bound_s"] = detection_bound(n)
        self.row["step_backwards"] = backwards(lives, set(range(n)) - victims)
        self.row["checkpoint_step"] = [lives[v][-1]["checkpoint"] if len(lives[v]) > 1 else None for v in sorted(victims)]
        self.row["resumed_at"] = [lives[v][-1]["resumed"] if len(lives[v]) > 1 else None for v in sorted(victims)]
        self.row["killed_at_step"] = [lives[v][0]["progress"][-1][1] if lives[v] and lives[v][0]["progress"] else None
                                      for v in sorted(victims)]


def read_log(path: Path) -> list[dict]:
    """One dict per process that wrote to ``path`` (a restarted peer appends), split at the
    node's ``started`` record: its progress ``(node time, step, accuracy)``, the step training
    picked up at (``resumed``: from a checkpoint and/or the swarm's state), the checkpoint step it
    loaded, and how many error lines it wrote. Event records (``"logger": "p2p.events"``, written
    before ``started`` too) go to the process that follows them until ``started`` is seen."""
    out: list[dict] = []
    pending = {"progress": [], "resumed": None, "checkpoint": None, "errors": 0}
    for rec in _records(path):
        if isinstance(rec, str):
            if "Traceback" in rec or "Error" in rec:
                pending["errors"] += 1
            continue
        event = rec.get("event")
        if "logger" in rec:  # an event of the p2p.events logger
            if event == "resumed" and "path" in rec:
                pending["checkpoint"] = rec.get("step")
            if rec.get("level") in ("error", "critical"):
                pending["errors"] += 1
        elif event == "started":
            out.append(pending)
        elif event == "resumed" and out:
            out[-1]["resumed"] = rec["step"]
        elif event in ("progress", "done") and out:
            out[-1]["progress"].append((rec["time"], rec["step"], rec.get("accuracy")))
        if out and pending is out[-1] and event == "started":
            pending = {"progress": [], "resumed": None, "checkpoint": None, "errors": 0}
    return out


def _records(path: Path) -> Any:
    """The JSON objects of a log, and its other lines as strings (a traceback, a print)."""
    for line in (path.read_text(errors="replace").splitlines() if path.exists() else []):
        line = line.strip()
        try:
            yield json.loads(line) if line.startswith("{") else line
        except json.JSONDecodeError:
            yield line


def max_gap(lives: list[list[dict]], peers: Any, t0: float, t1: float) -> Optional[float]:
    """Longest interval, overlapping [t0, t1], between two step changes of one peer's process."""
    worst = None
    for i in peers:
        for inc in lives[i]:
            changes = [t for k, (t, step, _) in enumerate(inc["progress"]) if k and step != inc["progress"][k - 1][1]]
            if not changes:
                continue
            ends = changes + [inc["progress"][-1][0]]  # the open interval after the last change
            for start, end in zip(changes, ends[1:]):
                if end >= t0 and start <= t1:
                    worst = max(worst or 0.0, end - start)
    return None if worst is None else round(worst, 2)


def backwards(lives: list[list[dict]], peers: Any) -> list[int]:
    """Peers whose step count went down within one process (a model reset)."""
    bad = []
    for i in peers:
        steps = [s for inc in lives[i][:1] for _, s, _ in inc["progress"]]
        if any(b < a for a, b in zip(steps, steps[1:])):
            bad.append(i)
    return bad


COLUMNS = [("run", "run"), ("peers", "N"), ("duration_s", "secs"), ("gap_all", "gap all"), ("gap_kill", "gap kill"), ("gap_cut", "gap cut"),
           ("gap_partition", "gap part"), ("gap_join", "gap join"), ("bound_s", "bound"),
           ("merge_kill_s", "merge restart"), ("split_cut_s", "split cut"), ("merge_cut_s", "merge cut"),
           ("split_partition_s", "split part"), ("merge_partition_s", "merge heal"), ("merge_join_s", "merge join"),
           ("acc_mean", "acc mean"), ("acc_min", "acc min"), ("nan", "NaN"), ("step_backwards", "backwards"),
           ("resumed_at", "resumed at")]
CD = ["cd_before_kill", "cd_after_kill", "cd_after_cut", "cd_before_partition", "cd_before_heal",
      "cd_after_partition", "cd_end"]


def table(rows: list[dict]) -> str:
    flat = []
    for r in rows:
        f = dict(r)
        gaps = r.get("max_gap_s", {})
        for k in ("kill", "cut", "partition", "join"):
            f[f"gap_{k}"] = gaps.get(k)
        f["gap_all"] = gaps.get("run", max((v for v in gaps.values() if v is not None), default=None))
        flat.append(f)
    lines = []
    for cols in (COLUMNS, [("run", "run"), ("peers", "N")] + [(k, k[3:]) for k in CD]):
        cells = [[h for _, h in cols]] + [["-" if f.get(k) is None else str(f.get(k)) for k, _ in cols] for f in flat]
        widths = [max(len(c[j]) for c in cells) for j in range(len(cols))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells] + [""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, default=4, help="base peers (two more join at the end)")
    ap.add_argument("--kill", type=int, default=None, help="peers killed at once (default: 1; 2 with 8 peers)")
    ap.add_argument("--algorithm", default=None, help="default: the daemon's own")
    ap.add_argument("--task", default="synthetic")
    ap.add_argument("--rate", default="50mbit")
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--down", type=float, default=10.0)
    ap.add_argument("--cut", type=float, default=30.0)
    ap.add_argument("--partition", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--tail", type=float, default=45.0)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object with both runs at the end")
    ap.add_argument("--prefix", default="p2psoak", help="lab name prefix")
    ap.add_argument("--subnet", default="10.79.0.0/24", help="lab subnet (pick another if a lab already uses it)")
    ap.add_argument("--logs", help="keep the nodes' logs here")
    args = ap.parse_args()
    if args.kill is None:
        args.kill = 2 if args.peers >= 8 else 1
    if not 1 <= args.kill < args.peers - 1 or args.peers < 4:
        ap.error("need --peers >= 4 and 1 <= --kill < peers - 1 (peer 0 seeds, the last peer is cut)")
    log_root = Path(args.logs or tempfile.mkdtemp(prefix="p2p-fault-soak-"))
    rows = [Soak(args, log_root / "faults", faults=True).run()]
    print(json.dumps(rows[0]), flush=True)
    if not args.no_baseline:
        rows.append(Soak(args, log_root / "baseline", faults=False).run(duration=rows[0]["duration_s"]))
        print(json.dumps(rows[1]), flush=True)
        rows[0]["acc_vs_baseline"] = (round(rows[0]["acc_mean"] - rows[1]["acc_mean"], 4)
                                      if rows[0]["acc_mean"] is not None and rows[1]["acc_mean"] is not None else None)
    print(table(rows))
    if args.json:
        print(json.dumps({"runs": rows}))
    print(f"logs in {log_root}", file=sys.stderr)


if __name__ == "__main__":
    main()
