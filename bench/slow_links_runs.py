"""Running one method of the slow-links benchmark in one lab, and what a run yields.

``run_p2p`` starts real ``p2p start`` nodes in the lab's namespaces and follows their
progress lines; ``run_workers`` runs DDP ranks (bench/ddp_worker.py) or compute-only workers
(bench/compute_only.py) and reads their JSON lines. Both sample each peer's link counter over
time (``BytesSampler``) and return a ``Result``; the definitions are in bench/slow_links.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (puts the repository on sys.path)

from p2p.harness.lab import Lab, LabSwarm  # noqa: E402

BENCH = Path(__file__).resolve().parent
P2P_PORT, DDP_PORT = 7000, 29500


@dataclass
class Result:
    method: str
    rate: str
    time_to_target_s: Optional[float] = None
    bytes_per_peer: Optional[float] = None
    final_accuracy: Optional[float] = None
    steps: int = 0
    train_time_s: Optional[float] = None
    status: str = "ok"  # ok | max-time | failed: ...
    bytes_to_target: Optional[float] = None  # mean over peers of bytes sent up to time_to_target_s
    time_to_high_s: Optional[float] = None  # the same for the higher target (Settings.target_high)
    bytes_to_high: Optional[float] = None
    accuracy_at_equal_steps: Optional[float] = None  # at the steps DDP reached too (see equal_steps)
    equal_steps: Optional[int] = None
    accuracy_at_fractions: list[tuple[int, Optional[float]]] = field(default_factory=list)  # (steps, acc) at 20..100% of equal_steps
    start_s: Optional[float] = None  # workers: when the last one began its first step (after imports, data, rendezvous)
    steps_to_target: Optional[float] = None  # where the step curve reaches the target (interpolated)
    steps_to_high: Optional[float] = None
    ideal_s: Optional[float] = None  # the ideal bound at this rate (bench/slow_links.py, "x ideal")
    ideal_high_s: Optional[float] = None
    step_overhead: Optional[float] = None  # train time / compute-only's - 1
    train_phase_s: Optional[float] = None  # last peer's first step to last peer's last step (no start-up)
    phase_overhead: Optional[float] = None  # train_phase_s / compute-only's - 1
    # wall seconds a peer spent evaluating (mean over peers; DDP: rank 0's, which every rank waits for)
    eval_s: Optional[float] = None
    phase_less_eval_overhead: Optional[float] = None  # (train_phase_s - eval_s) / compute-only's - 1
    cpu_s_per_step: Optional[float] = None  # CPU seconds (all processes, all threads) / (peers x steps)
    cpu_overhead: Optional[float] = None  # cpu_s_per_step / compute-only's - 1
    bytes_each: list[int] = field(default_factory=list)
    curve: list[tuple[float, float]] = field(default_factory=list)  # (s since launch, mean acc)
    step_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, mean acc)
    bytes_curve: list[tuple[float, float]] = field(default_factory=list)  # (s, mean bytes sent per peer)

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("curve", "step_curve", "bytes_curve"):
            d.pop(key)
        return d


@dataclass(frozen=True)
class Settings:
    task: str
    peers: int
    steps: int
    seed: int
    eval_every: float
    poll: float
    max_time: float
    target: float
    target_high: Optional[float] = None  # a second target: one compute-only does not reach, DDP does


# -- running one method in one lab ------------------------------------------------------------

def _stop(procs: list[subprocess.Popen], timeout_s: float = 15.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# A node's progress line (p2p/training/node.py): "<phase> step N  loss L  acc A  ..."; the last is
# "done", and ends with when training began and ended (train_started_at T  train_ended_at T, wall
# clock), how many evaluations it ran (evaluations N) and its network thread's CPU seconds
# (network_cpu_s S); any line may say how long the trainer waited at the algorithm's gates (waited Ss)
_PROGRESS = re.compile(r"^(\w+)\s+step\s+(\d+)\s+loss\s+\S+\s+acc\s+(\S+)")
_WAITED = re.compile(r"\bwaited (\d+(?:\.\d+)?)s\b")
_TRAINED = re.compile(r"\b(train_started_at|train_ended_at|evaluations|eval_s|network_cpu_s) (\d+(?:\.\d+)?)\b")
# The same from a node started with --log-format json (what the benchmarks start): its lines also
# say when the evaluation behind "acc" began and at which step (evaluated_at, evaluated_step), so
# an accuracy is timed as the workers' are, not by when its line was read (up to an evaluation
# plus a --log-every period later)
_JSON_FIELDS = {"gate_wait_s": "waited", "train_started_at": "train_started_at", "train_ended_at": "train_ended_at",
                "evaluations": "evaluations", "eval_s": "eval_s", "network_cpu_s": "network_cpu_s",
                "evaluated_at": "evaluated_at", "evaluated_step": "evaluated_step"}


def _parse_json_progress(line: str) -> Optional[dict[str, Any]]:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("event") not in ("progress", "done"):
        return None
    acc = rec.get("accuracy")
    out: dict[str, Any] = {"phase": "done" if rec["event"] == "done" else rec.get("phase", "training"),
                           "step": int(rec.get("step", 0)), "acc": math.nan if acc is None else float(acc)}
    for key, name in _JSON_FIELDS.items():
        value = rec.get(key)
        if value is not None and not (name == "evaluated_step" and value < 0):
            out[name] = float(value)
    return out


def parse_progress(line: str) -> Optional[dict[str, Any]]:
    """A node's progress line, text or JSON, as {phase, step, acc[, waited, train_started_at,
    train_ended_at, evaluations, eval_s, network_cpu_s, evaluated_at, evaluated_step]}."""
    line = line.strip()
    if line.startswith("{"):
        return _parse_json_progress(line)
    match = _PROGRESS.match(line)
    if not match:
        return None
    out: dict[str, Any] = {"phase": match.group(1), "step": int(match.group(2)), "acc": float(match.group(3))}
    waited = _WAITED.search(line)
    if waited:
        out["waited"] = float(waited.group(1))
    out.update((k, float(v)) for k, v in _TRAINED.findall(line))
    return out


def p2p_node_args(task: str, steps: int, seed: int, eval_every: float, poll: float, peers: int,
                  extra: list[str]) -> list[str]:
    """The ``p2p start`` arguments of a benchmark node, but --listen, --join and --shard."""
    # --min-members: training starts when all peers are up, as the gloo methods' rendezvous does;
    # without it the first peer trained alone while the others started, and a late one took the
    # swarm's state by sync (26 MB, 30-55 s at 20 Mbit/s), so runs differed by who came up when
    return ["--task", task, "--steps", str(steps), "--seed", str(seed), "--eval-every", str(eval_every),
            "--log-every", str(poll), "--log-format", "json", "--linger", "0", "--join-timeout", "120",
            "--min-members", str(peers), *extra]


class LogTail:
    """New complete lines of a growing log file, each time ``lines()`` is called."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in complete]


def run_p2p(lab: Lab, name: str, extra: list[str], s: Settings, log_dir: Path) -> Result:
    """One p2p configuration. Progress comes from the nodes' own progress lines (every
    ``--poll`` seconds, timestamped when read), not from status queries: a busy node can take
    seconds to answer those, and they would add traffic to the shaped links."""
    res = Result(name, lab.rate or "unlimited")
    node_args = p2p_node_args(s.task, s.steps, s.seed, s.eval_every, s.poll, s.peers, extra)
    per_peer = [["--shard", f"{i}/{s.peers}"] for i in range(s.peers)]
    swarm = LabSwarm(lab, log_dir, node_args, port=P2P_PORT, per_peer_args=per_peer)
    tails = [LogTail(log_dir / f"peer{i}.log") for i in range(s.peers)]
    series: list[list[tuple[float, float]]] = [[] for _ in range(s.peers)]
    by_step: list[list[tuple[int, float]]] = [[] for _ in range(s.peers)]
    steps = [0] * s.peers
    finished: list[Optional[float]] = [None] * s.peers
    trained: list[Optional[tuple[float, float]]] = [None] * s.peers
    eval_s: list[Optional[float]] = [None] * s.peers
    tx0 = [lab.tx_bytes(i) for i in range(s.peers)]
    t0 = time.time()
    sent = BytesSampler(lab, tx0, t0)
    cpu0 = children_cpu_s()

    def read(now: float) -> None:
        for i, tail in enumerate(tails):
            for line in tail.lines():
                progress = parse_progress(line)
                if progress is None:
                    continue
                steps[i] = max(steps[i], progress["step"])
                acc = progress["acc"]
                if "train_started_at" in progress:  # the last line
                    trained[i] = (progress["train_started_at"], progress["train_ended_at"])
                    eval_s[i] = progress.get("eval_s")
                if "evaluated_at" in progress:  # timed and stepped by the evaluation itself
                    at, step = progress["evaluated_at"] - t0, int(progress.get("evaluated_step", steps[i]))
                    if not math.isnan(acc) and (not series[i] or series[i][-1][0] != at):
                        series[i].append((at, acc))
                        by_step[i].append((step, acc))
                elif not math.isnan(acc) and (not series[i] or series[i][-1][1] != acc or progress["phase"] == "done"):
                    series[i].append((now, acc))
                    by_step[i].append((steps[i], acc))
                if finished[i] is None and steps[i] >= s.steps:
                    finished[i] = now

    try:
        swarm.start()
        while any(swarm.alive(i) for i in range(s.peers)):
            time.sleep(s.poll / 2)
            read(time.time() - t0)
            sent.sample()
            if time.time() - t0 > s.max_time:
                res.status = "max-time"
                break
    finally:
        codes = swarm.stop(timeout_s=20.0)
    read(time.time() - t0)
    if res.status == "ok" and any(c != 0 for c in codes):
        res.status = f"failed: exit codes {codes} (logs in {log_dir})"
    if all(t is not None for t in trained):
        res.start_s = round(max(a for a, _ in trained) - t0, 3)
        res.train_phase_s = round(max(b for _, b in trained) - max(a for a, _ in trained), 3)
    if all(e is not None for e in eval_s):
        res.eval_s = round(sum(eval_s) / len(eval_s), 3)
    _finish(res, lab, sent, series, by_step, steps, finished, s, cpu0)
    return res


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's reaped children (all their threads): a
    method's processes are reaped before the next starts, so the difference around one run is
    theirs (and the `ip netns exec` that execs each; the lab's tc and ip commands run before)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class BytesSampler:
    """Mean bytes per peer put on the links since launch, sampled over time (for bytes to target)."""

    def __init__(self, lab: Lab, tx0: list[int], t0: float) -> None:
        self.lab, self.tx0, self.t0 = lab, tx0, t0
        self.curve: list[tuple[float, float]] = [(0.0, 0.0)]

    def sample(self) -> None:
        total = sum(self.lab.tx_bytes(i) - b for i, b in enumerate(self.tx0))
        self.curve.append((round(time.time() - self.t0, 3), total / len(self.tx0)))

    def at(self, t: Optional[float]) -> Optional[float]:
        """Bytes per peer at the first sample at or after ``t``."""
        if t is None:
            return None
        return next((b for ts, b in self.curve if ts >= t), self.curve[-1][1])


LOCAL_SGD = "torch-localsgd-h"  # torch-localsgd-hN: PyTorch's post-local SGD averaging every N steps


def local_sgd_period(method: str) -> int:
    """N of a ``torch-localsgd-hN`` method name (ValueError on anything else)."""
    text = method[len(LOCAL_SGD):] if method.startswith(LOCAL_SGD) else ""
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"method {method!r}: expected {LOCAL_SGD}N with N >= 1 steps, e.g. {LOCAL_SGD}25")
    return int(text)


def run_workers(lab: Lab, method: str, s: Settings, log_dir: Path) -> Result:
    res = Result(method, lab.rate or "unlimited")
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    tx0 = [lab.tx_bytes(i) for i in range(s.peers)]
    t0 = time.time()
    sent = BytesSampler(lab, tx0, t0)
    cpu0 = children_cpu_s()
    try:
        for i in range(s.peers):
            if method == "ddp" or method.startswith(LOCAL_SGD):
                argv = [sys.executable, str(BENCH / "ddp_worker.py"), "--rank", str(i), "--world", str(s.peers),
                        "--master", f"{lab.addr(0)}:{DDP_PORT}"]
                if method.startswith(LOCAL_SGD):
                    argv += ["--local-sgd-period", str(local_sgd_period(method))]
            else:
                argv = [sys.executable, str(BENCH / "compute_only.py"), "--shard", f"{i}/{s.peers}"]
            argv += ["--task", s.task, "--steps", str(s.steps), "--seed", str(s.seed),
                     "--eval-every", str(s.eval_every)]
            with open(log_dir / f"peer{i}.log", "wb") as out:
                procs.append(lab.popen(i, argv, stdout=out, stderr=subprocess.STDOUT, env=env))
        while any(p.poll() is None for p in procs):
            if time.time() - t0 > s.max_time:
                res.status = "max-time"
                break
            time.sleep(0.5)
            sent.sample()
    finally:
        _stop(procs)
    codes = [p.returncode for p in procs]
    if res.status == "ok" and any(c != 0 for c in codes):
        res.status = f"failed: exit codes {codes} (logs in {log_dir})"
    series: list[list[tuple[float, float]]] = [[] for _ in range(s.peers)]
    by_step: list[list[tuple[int, float]]] = [[] for _ in range(s.peers)]
    steps = [0] * s.peers
    finished: list[Optional[float]] = [None] * s.peers
    ended: list[Optional[float]] = [None] * s.peers  # the last step's end (the done line's time, before its evaluation)
    eval_s: list[Optional[float]] = [None] * s.peers
    for i in range(s.peers):
        for rec in _common.read_jsonl(log_dir / f"peer{i}.log"):
            t = rec["t"] - t0
            steps[i] = max(steps[i], int(rec.get("step", 0)))
            if "accuracy" in rec:
                series[i].append((t, float(rec["accuracy"])))
                by_step[i].append((int(rec.get("step", 0)), float(rec["accuracy"])))
            if rec.get("event") == "done":
                finished[i] = ended[i] = t
                eval_s[i] = rec.get("eval_s")
            if rec.get("event") == "start":
                res.start_s = t if res.start_s is None else max(res.start_s, t)
    if res.start_s is not None and all(e is not None for e in ended):
        res.train_phase_s = round(max(ended) - res.start_s, 3)
    if method == "ddp":  # one model: rank 0's evaluations are every rank's
        series, by_step = [series[0]], [by_step[0]]
        eval_s = eval_s[:1]  # (and every rank waits for them at its next all-reduce)
    if eval_s and all(e is not None for e in eval_s):
        res.eval_s = round(sum(eval_s) / len(eval_s), 3)
    _finish(res, lab, sent, series, by_step, steps, finished, s, cpu0)
    return res


def _finish(res: Result, lab: Lab, sent: BytesSampler, series, by_step, steps, finished, s: Settings,
            cpu0: float) -> None:
    sent.sample()
    if res.status == "ok" and min(steps, default=0) >= s.steps:
        res.cpu_s_per_step = round((children_cpu_s() - cpu0) / (s.peers * s.steps), 4)
    res.bytes_each = [lab.tx_bytes(i) - sent.tx0[i] for i in range(s.peers)]
    res.bytes_per_peer = sum(res.bytes_each) / s.peers
    res.bytes_curve = [(t, round(b)) for t, b in sent.curve]
    res.curve = [(round(t, 3), round(a, 5)) for t, a in _common.mean_accuracy_curve(series)]
    res.step_curve = [(int(k), round(a, 5)) for k, a in _common.mean_accuracy_curve(by_step)]
    res.time_to_target_s = _common.time_to_target(res.curve, s.target)
    res.steps_to_target = _common.time_to_target(res.step_curve, s.target)
    res.bytes_to_target = sent.at(res.time_to_target_s)
    if s.target_high is not None:
        res.time_to_high_s = _common.time_to_target(res.curve, s.target_high)
        res.bytes_to_high = sent.at(res.time_to_high_s)
        res.steps_to_high = _common.time_to_target(res.step_curve, s.target_high)
    res.final_accuracy = res.curve[-1][1] if res.curve else None
    res.steps = min(steps) if steps else 0
    res.train_time_s = (round(max(f for f in finished), 3)
                        if all(f is not None for f in finished) and res.steps >= s.steps else None)
