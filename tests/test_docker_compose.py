"""docker-compose.yml, run for real: build the image, bring the swarm up with a scaled worker,
watch it form one swarm that trains and averages, stop and start one node and see it leave and
come back from its checkpoint, then tear everything down.

Needs a Docker engine and the local base image (bench/docker_setup.sh installs and builds
both on Debian as root); skipped with the reason otherwise, as in CI's clean machines.
The first build takes minutes (torch); later runs reuse the cached layers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.integration]

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "p2p-base:bookworm"  # the Dockerfile's default BASE
WORKERS = 2
MEMBERS = 3 + WORKERS


def _compose_cli() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def _skip_reason() -> str | None:
    if shutil.which("docker") is None or _compose_cli() is None:
        return "no docker CLI with compose here (bench/docker_setup.sh installs them)"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True)
    if info.returncode != 0:
        return f"no Docker engine answers (bench/docker_setup.sh starts one): {info.stderr.strip()[-200:]}"
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        return f"base image {BASE_IMAGE} missing (bench/docker_setup.sh builds it)"
    return None


@pytest.fixture
def compose():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    project = f"p2ptest{uuid.uuid4().hex[:8]}"

    def run(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([*_compose_cli(), "-p", project, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return proc

    try:
        yield run
    finally:
        run("down", "-v", "--remove-orphans", "--timeout", "5", timeout=180, check=False)


def swarm_view(compose) -> list[dict]:
    """peer0's view of the swarm (``p2p status --swarm --json`` inside its container); [] if not yet."""
    proc = compose("exec", "-T", "peer0", "p2p", "status", "--peer", "peer0:7000", "--swarm", "--json",
                   "--timeout", "3", timeout=60, check=False)
    try:
        return json.loads(proc.stdout) if proc.returncode == 0 else []
    except json.JSONDecodeError:
        return []


def poll(what: str, probe, deadline_s: float):
    end, last = time.monotonic() + deadline_s, None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}; last seen: {last}")


def test_the_compose_swarm_forms_trains_and_takes_a_node_back(compose):
    started = time.monotonic()
    compose("build", timeout=1200)
    compose("up", "-d", "--scale", f"worker={WORKERS}", timeout=300)

    def formed():
        rows = swarm_view(compose)
        good = [r for r in rows if r["reachable"] and r["state"] == "alive" and r["status"]["step"] > 0
                and r["status"]["bytes_sent"] > 0 and r["status"]["bytes_received"] > 0
                and len(r["status"]["neighbours"]) == MEMBERS - 1]
        return rows if len(good) == MEMBERS else None

    rows = poll(f"{MEMBERS} members that all list each other and exchange", formed, 240)
    print(f"swarm formed {time.monotonic() - started:.0f}s after the build started")
    # Every member's own view lists all the others (not only peer0's).
    assert all(len(r["status"]["members"]) >= MEMBERS - 1 for r in rows)
    assert sum(1 for r in rows if not str(r["id"]).startswith("peer")) == WORKERS  # scaled workers, by address

    # Health checks hit /healthz, and the metrics endpoint serves Prometheus text to the network.
    containers = compose("ps", "-q").stdout.split()
    assert len(containers) == MEMBERS

    def healthy():
        states = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", *containers],
                                capture_output=True, text=True).stdout.split()
        return states if states == ["healthy"] * MEMBERS else None

    poll("every container healthy", healthy, 120)
    metrics = compose("exec", "-T", "peer1", "python", "-c",
                      "import urllib.request as u; print(u.urlopen('http://peer0:9100/metrics', timeout=5).read().decode())")
    assert "p2p_steps_total" in metrics.stdout and 'p2p_members{state="alive"}' in metrics.stdout

    # peer2 leaves ...
    before = next(r for r in rows if r["id"] == "peer2:7000")["status"]["step"]
    compose("stop", "peer2", timeout=60)
    gone = poll("peer2 leaving peer0's view",
                lambda: [r for r in swarm_view(compose) if r["id"] == "peer2:7000" and not r["reachable"]], 60)
    assert gone[0]["state"] in ("left", "dead", "suspect", "alive")  # alive: not yet noticed, but no longer answering
    # ... and comes back from its checkpoint volume, then catches up with the swarm.
    compose("start", "peer2", timeout=60)
    back = poll("peer2 back and training",
                lambda: [r for r in swarm_view(compose) if r["id"] == "peer2:7000" and r["reachable"]
                         and r["status"]["phase"] == "training" and r["status"]["step"] > before], 120)
    logs = compose("logs", "--no-color", "peer2").stdout
    assert "resumed from /ckpt/ckpt-" in logs, logs[-2000:]
    print(f"peer2 stopped at step >= {before}, back at step {back[0]['status']['step']}; "
          f"whole test {time.monotonic() - started:.0f}s")
