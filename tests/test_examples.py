"""The examples, run as a real swarm: separate processes, real ZeroMQ over loopback, real torch.

The README's loop (examples/plain_loop.py) must converge like the daemon does on the same
task, steps and algorithm: its members agree, and their accuracy is within 2 points of what
``p2p start`` peers reach."""

import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from p2p.harness import forked_nodes
from p2p.harness.local_swarm import LocalSwarm, consensus_distance
from p2p.net.ports import free_ports

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@contextmanager
def example_swarm(script, peers, tmp_path, extra=(), save=False, ports=None):
    """Start ``peers`` copies of an example (each its own shard, joining through the first);
    yields a function that waits for all to exit (``timeout_s``) and returns the JSON line each
    printed last. ``save``: each saves its final model to ``tmp_path/<script>-<i>.pt``. Any
    copy still running when the block ends is killed."""
    ports = ports or free_ports(peers)
    procs, logs = [], []

    def results(timeout_s=180):
        codes = [p.wait(timeout_s) for p in procs]
        texts = [log.read_text() for log in logs]
        assert codes == [0] * peers, texts
        return [json.loads(text.strip().splitlines()[-1]) for text in texts]

    try:
        for i in range(peers):
            cmd = [sys.executable, str(EXAMPLES / script), "--listen", f"127.0.0.1:{ports[i]}", "--peers", str(peers),
                   "--shard", f"{i}/{peers}", *extra]
            cmd += ["--join", f"127.0.0.1:{ports[0]}"] if i else []
            cmd += ["--out", str(tmp_path / f"{script}-{i}.pt")] if save else []
            logs.append(tmp_path / f"{script}-{i}.log")
            procs.append(forked_nodes.popen(cmd, ENV, logs[-1]))
        yield results
    finally:
        for p in procs:
            p.kill()


def daemon_accuracies(algorithm, steps, peers, tmp_path, ports=None):
    """The same task, steps and algorithm run by ``p2p start`` daemons; their final accuracies
    (from each node's last progress line, printed after its linger)."""
    args = ["--task", "synthetic", "--algorithm", algorithm, "--steps", str(steps), "--linger", "5",
            "--min-members", str(peers), "--log-every", "1", "--eval-every", "1", "--join-timeout", "60"]
    shards = [["--shard", f"{i}/{peers}"] for i in range(peers)]
    with LocalSwarm(peers, tmp_path / "daemon", args, ports=ports, per_peer_args=shards) as swarm:
        swarm.start()
        codes = swarm.wait(180)
        assert codes == [0] * peers, [swarm.log_tail(i) for i in range(peers)]
        done = [re.search(r"^done\s+step\s+(\d+)\s+loss\s+\S+\s+acc\s+(\S+)", swarm.log_tail(i, 1), re.M)
                for i in range(peers)]
    assert all(done), [swarm.log_tail(i) for i in range(peers)]
    assert [int(m.group(1)) for m in done] == [steps] * peers
    return [float(m.group(2)) for m in done]


@pytest.mark.parametrize("algorithm", ["adpsgd", "dpsgd", "diloco"])
def test_the_readme_loop_converges_like_the_daemon(algorithm, tmp_path):
    steps, peers = 600, 3
    # The two swarms run side by side (their start-ups and lingers overlap); ports for both
    # are chosen at once, so neither can take the other's before it is bound.
    ports = free_ports(2 * peers)
    with example_swarm("plain_loop.py", peers, tmp_path, ["--algorithm", algorithm, "--steps", str(steps),
                                                          "--linger", "5"], save=True, ports=ports[:peers]) as finished:
        daemon = float(np.mean(daemon_accuracies(algorithm, steps, peers, tmp_path, ports=ports[peers:])))
        results = finished()
    assert all(r["step"] == steps for r in results)
    states = [torch.load(tmp_path / f"plain_loop.py-{i}.pt", weights_only=True) for i in range(peers)]
    vectors = [torch.cat([t.reshape(-1) for t in s.values()]).numpy() for s in states]
    scale = float(np.linalg.norm(np.mean(vectors, axis=0)))
    assert consensus_distance(vectors) < 0.02 * scale  # one model (independent ones are ~25% apart)
    ours = float(np.mean([r["accuracy"] for r in results]))
    assert ours > 0.7 and abs(ours - daemon) <= 0.02, (ours, daemon)


def test_the_mixed_precision_and_hugging_face_style_examples_train_in_a_swarm(tmp_path):
    ports = free_ports(4)  # the two swarms run side by side
    with example_swarm("amp_cuda.py", 2, tmp_path, ["--steps", "300", "--linger", "3"], ports=ports[:2]) as amp_done, \
            example_swarm("hf_style.py", 2, tmp_path, ["--steps", "40", "--linger", "2"], ports=ports[2:]) as hf_done:
        amp, hf = amp_done(), hf_done()
    assert all(r["step"] > 250 and r["accuracy"] > 0.6 for r in amp), amp  # (a GradScaler may skip a few)
    assert {r["dtype"] for r in amp} == {"torch.bfloat16"} or torch.cuda.is_available()
    assert all(r["step"] == 40 and r["loss"] < 4.0 for r in hf), hf  # uniform over bytes: ln 256 = 5.5
