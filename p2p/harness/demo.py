"""``p2p demo``: a swarm of real peer processes on loopback, watched live, then judged.

1. start N ``p2p start`` processes (each its own data shard, same run seed);
2. while they train, poll each for status (and parameters, for the consensus distance) and
   draw the live view on stderr;
3. when every peer has finished its steps, let them keep mixing until the consensus distance
   stops falling (bounded), fetch every peer's final parameters and evaluate each on the
   task's held-out set here, in one place;
4. stop the swarm and compare with one process trained on all the data for the same number
   of samples (``p2p.harness.reference``).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from p2p.cli.live_view import LiveView
from p2p.harness.reference import reference_accuracy
from p2p.harness.local_swarm import LocalSwarm, consensus_distance
from p2p.net.ports import free_ports
from p2p.training.task import TaskError, load_task


class DemoError(RuntimeError):
    """The demo could not run (bad task, a peer died); the message says which and why."""


@dataclass(frozen=True)
class DemoConfig:
    peers: int = 4
    steps: Optional[int] = None  # per peer; None: the task's ``demo_steps`` (or 500)
    duration_s: Optional[float] = None  # train for this long instead of a step count
    task: str = "synthetic"
    seed: int = 0
    algorithm: str = "adpsgd"
    topology: str = "full"
    compression: str = "none"
    base_port: int = 0  # 0: free ports picked by the OS; else peers use base, base + 2, ... (+1: bulk)
    live: bool = True  # draw the live view on stderr
    log_dir: Optional[str] = None  # keep peer logs here (default: a temporary directory)
    cache_dir: Optional[str] = None  # reference-accuracy cache (None: no cache)
    start_timeout_s: float = 60.0  # every peer must answer status by then
    settle_s: float = 5.0  # at most this long mixing after training, before the final read
    swarm_key: Optional[str] = None  # key file every peer seals its messages with (None: an open swarm)
    identities: bool = False  # an identity per peer, one allow file for all (and a swarm key if none is given)


def _evaluate(task: Any, params: np.ndarray, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    model = task.make_model()
    torch.nn.utils.vector_to_parameters(torch.from_numpy(params), [p for p in model.parameters() if p.requires_grad])
    model.eval()
    return task.evaluate(model, torch.device("cpu"))


def run_demo(config: DemoConfig) -> dict[str, Any]:
    try:
        task = load_task(config.task)
    except TaskError as exc:
        raise DemoError(str(exc)) from None
    steps = config.steps if config.duration_s is None else None
    if steps is None and config.duration_s is None:
        steps = int(getattr(task, "demo_steps", 500))
    torch.set_num_threads(1)
    started = time.monotonic()
    tmp = None
    if config.log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="p2p-demo-")
    log_dir = Path(config.log_dir or tmp.name)
    ports = (list(range(config.base_port, config.base_port + 2 * config.peers, 2)) if config.base_port
             else free_ports(config.peers))
    node_args = ["--task", config.task, "--seed", str(config.seed), "--linger", "-1",
                 "--algorithm", config.algorithm, "--topology", config.topology, "--membership", "local",
                 "--compression", config.compression,
                 "--log-every", "0", "--eval-every", "1", "--join-timeout", str(config.start_timeout_s),
                 # The peers train together: a synthetic run is ~1 s of steps, so a peer still importing
                 # torch would otherwise start after the others finished (CI: 0.786 against 0.825).
                 "--min-members", str(config.peers)]
    node_args += ["--steps", str(steps)] if steps is not None else ["--duration", str(config.duration_s)]
    per_peer = [["--shard", f"{i}/{config.peers}"] for i in range(config.peers)]
    swarm = LocalSwarm(config.peers, log_dir, node_args, ports=ports, per_peer_args=per_peer,
                       swarm_key=config.swarm_key, identities=config.identities)
    view = LiveView(config.live, config.peers)
    metrics = MetricsLog(log_dir / "metrics.jsonl")
    try:
        swarm.start()
        statuses, distance = _watch(swarm, config, steps, view, metrics)
        distance, finals = _settle(swarm, config, view, statuses)
        statuses = [swarm.status(i, timeout_s=2.0) or statuses[i] for i in range(config.peers)]
        metrics.write(statuses, distance)  # the settled end point, so even a short run has a curve
    finally:
        codes = swarm.stop()
        view.close()
        metrics.close()
        if tmp is not None:
            tmp.cleanup()
    bad = [(i, c) for i, c in enumerate(codes) if c not in (0, None)]
    if bad:
        raise DemoError(f"peer {bad[0][0]} exited with code {bad[0][1]} during shutdown")
    total_steps = sum(s["step"] for s in statuses)
    reference = reference_accuracy(config.task, task, config.seed, total_steps * task.batch_size,
                                   Path(config.cache_dir) if config.cache_dir else None)
    peers_out = []
    for i, (s, params) in enumerate(zip(statuses, finals)):
        metrics = _evaluate(task, params, config.seed)
        peers_out.append({"id": s["id"], "steps": s["step"], "loss": metrics["loss"],
                          "accuracy": metrics["accuracy"], "bytes_sent": s["bytes_sent"],
                          "bytes_received": s["bytes_received"]})
    summary = {"peers": peers_out, "consensus_distance": distance, "reference_accuracy": reference,
               "wall_s": time.monotonic() - started, "algorithm": config.algorithm,
               "topology": config.topology, "task": config.task,
               "metrics": str(log_dir / "metrics.jsonl") if config.log_dir is not None else None}
    view.summary(summary)
    return summary


def _fail_if_dead(swarm: LocalSwarm, started: bool) -> None:
    for i in range(len(swarm.addrs)):
        if not swarm.alive(i):
            code = swarm.procs[i].poll() if swarm.procs[i] else None
            raise DemoError(f"peer {i} ({swarm.addrs[i]}) exited with code {code}"
                            f"{' before answering' if not started else ''}: {swarm.log_tail(i, 3)}")


class MetricsLog:
    """The run's samples, one JSON object per line (``p2p plot`` draws them): seconds since the
    start, the peer, its step, loss, accuracy and bytes, and the swarm's consensus distance."""

    def __init__(self, path: Path) -> None:
        self.path, self.started = path, time.monotonic()
        self._file = open(path, "a", encoding="utf-8")

    def write(self, statuses: list, distance: float) -> None:
        t = round(time.monotonic() - self.started, 3)
        for s in statuses:
            if s is not None:
                row = {"t": t, "peer": s["id"], "step": s["step"], "loss": s["loss"], "accuracy": s["accuracy"],
                       "bytes_sent": s["bytes_sent"], "bytes_received": s["bytes_received"], "consensus": distance}
                self._file.write(json.dumps({k: (None if isinstance(v, float) and v != v else v)
                                             for k, v in row.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _watch(swarm: LocalSwarm, config: DemoConfig, steps: Optional[int], view: LiveView, metrics: MetricsLog):
    """Poll until every peer has finished training. Returns last statuses and distance."""
    deadline = time.monotonic() + config.start_timeout_s
    statuses: list[Optional[dict]] = [None] * config.peers
    distance = math.nan
    last_params = 0.0
    while True:
        _fail_if_dead(swarm, started=all(statuses))
        fresh = [swarm.status(i) for i in range(config.peers)]
        statuses = [f or old for f, old in zip(fresh, statuses)]
        if not all(statuses) and time.monotonic() > deadline:
            missing = [i for i, s in enumerate(statuses) if s is None]
            raise DemoError(f"peers {missing} did not answer within {config.start_timeout_s:g}s")
        if all(statuses) and time.monotonic() - last_params > 1.0:
            params = [swarm.params(i) for i in range(config.peers)]
            if all(p is not None for p in params):
                distance = consensus_distance(params)
            last_params = time.monotonic()
        view.update(statuses, distance)
        metrics.write(statuses, distance)
        if all(s and s["phase"] in ("lingering", "stopping", "stopped") for s in statuses):
            return statuses, distance
        time.sleep(0.25)


def _settle(swarm: LocalSwarm, config: DemoConfig, view: LiveView, statuses: list):
    """Let finished peers keep mixing until the consensus distance stops falling."""
    deadline = time.monotonic() + config.settle_s
    best = math.inf
    while True:
        params = [swarm.params(i) for i in range(config.peers)]
        if any(p is None for p in params):
            _fail_if_dead(swarm, started=True)
            raise DemoError("a peer stopped answering state requests")
        distance = consensus_distance(params)
        view.update(statuses, distance)
        if distance > 0.95 * best or distance < 1e-5 or time.monotonic() >= deadline:
            return distance, params
        best = distance
        time.sleep(0.3)
