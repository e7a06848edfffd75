"""Operating a swarm, with real nodes: Prometheus metrics and the status page over real HTTP,
/healthz, the whole-swarm view with a member killed, config files, JSON logs, plots."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import p2p
from p2p.harness.local_swarm import LocalSwarm
from p2p.net.ports import free_ports
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

FAST = ["--task", "synthetic", "--membership", "local", "--eval-every", "0.5", "--join-timeout", "30"]


def get(url, timeout=5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError:
        return 0, ""  # not listening (yet)


def scrape(addr):
    code, text = get(f"http://{addr}/metrics")
    assert code == 200
    return {m.name: m for m in text_string_to_metric_families(text)}


def value(families, name, **labels):
    for sample in families[name].samples:
        if all(sample.labels.get(k) == v for k, v in labels.items()) and sample.name.endswith(("_total", name)):
            return sample.value
    raise KeyError((name, labels))


def test_metrics_status_page_and_health_of_live_nodes(tmp_path):
    http = free_ports(2)
    per_peer = [["--metrics", f"127.0.0.1:{port}", "--shard", f"{i}/2"] for i, port in enumerate(http)]
    with LocalSwarm(2, tmp_path, FAST + ["--linger", "-1", "--log-every", "0"], per_peer_args=per_peer) as swarm:
        swarm.start()
        addr = f"127.0.0.1:{http[0]}"
        wait_until(lambda: get(f"http://{addr}/healthz")[0] == 200, 60, what="the node's HTTP endpoint")
        other = swarm.addrs[1]

        def sent_to_other(f):
            return next((m.value for m in f["p2p_sent_bytes"].samples if m.labels.get("peer") == other), 0)

        first = wait_until(lambda: (f := scrape(addr)) and value(f, "p2p_steps") > 50 and sent_to_other(f) > 0 and f,
                           60, what="training and averaging")
        later = wait_until(lambda: (f := scrape(addr)) and value(f, "p2p_steps") > value(first, "p2p_steps") + 100
                           and value(f, "p2p_accuracy") > 0
                           and value(f, "p2p_exchanges", outcome="completed") > value(first, "p2p_exchanges", outcome="completed")
                           and f, 60, what="the step counter to move, an evaluation, another exchange")
        for family in ("p2p_steps", "p2p_steps_per_second", "p2p_loss", "p2p_accuracy", "p2p_sent_bytes",
                       "p2p_received_bytes", "p2p_exchanges", "p2p_rejected_messages", "p2p_members",
                       "p2p_membership_events", "p2p_consensus_estimate", "p2p_averaging_pause_seconds",
                       "p2p_state_sync_seconds", "p2p_checkpoints_written", "p2p_node_info"):
            assert family in later, family
        assert later["p2p_steps"].type == "counter" and later["p2p_loss"].type == "gauge"
        assert value(later, "p2p_sent_bytes", peer=other) > value(first, "p2p_sent_bytes", peer=other) > 0
        assert value(later, "p2p_exchanges", outcome="completed") > value(first, "p2p_exchanges", outcome="completed")
        assert value(later, "p2p_members", state="alive") == 2
        assert 0 < value(later, "p2p_accuracy") <= 1
        assert value(later, "p2p_swarm_encrypted") == 0 and value(later, "p2p_swarm_keys") == 0  # no --swarm-key
        code, page = get(f"http://{addr}/")
        assert code == 200 and "<h1>p2p node" in page and other in page and "alive" in page
        assert "security: open" in page
        assert get(f"http://{addr}/nothing")[0] == 404
        if shutil.which("chromium"):  # the page as a browser draws it (a screenshot in the test's output)
            shot = tmp_path / "status-page.png"
            subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            "--disable-background-networking", f"--user-data-dir={tmp_path / 'chrome'}",
                            f"--screenshot={shot}", "--window-size=1200,800", f"http://{addr}/"],
                           capture_output=True, timeout=60)
            assert shot.exists() and shot.stat().st_size > 10_000
            print(f"status page screenshot: {shot}")


def test_healthz_fails_once_the_network_loop_has_died():
    model = torch.nn.Linear(4, 2)
    with p2p.Swarm(model, listen="127.0.0.1:0", metrics="127.0.0.1:0", membership="local") as swarm:
        base = f"http://{swarm._ops.address}"
        assert get(f"{base}/healthz") == (200, "ok\n")

        def broken(now):
            raise RuntimeError("a bug in protocol code")

        swarm.peer.tick = broken  # the loop's next timer tick raises: the network thread ends
        code, text = wait_until(lambda: (r := get(f"{base}/healthz")) and r[0] == 503 and r, 10,
                                what="/healthz to turn unhealthy")
        assert "network loop has stopped" in text
        with pytest.raises(p2p.SwarmError, match="a bug in protocol code"):
            swarm.close()


def run(*args, env=None, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "p2p", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def test_the_swarm_view_lists_every_member_and_a_killed_one_as_unreachable_in_time(tmp_path):
    with LocalSwarm(4, tmp_path, FAST + ["--linger", "-1", "--log-every", "0"]) as swarm:
        swarm.start()
        wait_until(lambda: all((s := swarm.status(i)) and len(s["neighbours"]) == 3 for i in range(4)), 60,
                   what="four members that see each other")
        swarm.kill(3, signal.SIGKILL)
        started = time.monotonic()
        code, out, err = run("status", "--peer", swarm.addrs[0], "--swarm", "--json", "--timeout", "1")
        assert code == 0, err
        assert time.monotonic() - started < 10  # one timeout for the dead one, not one per member in turn
        rows = {r["addr"]: r for r in json.loads(out)}
        assert set(rows) == set(swarm.addrs)
        assert [rows[a]["reachable"] for a in swarm.addrs] == [True, True, True, False]
        assert all(rows[a]["status"]["step"] > 0 for a in swarm.addrs[:3])
        code, out, _ = run("status", "--peer", swarm.addrs[1], "--swarm", "--timeout", "1")  # the table
        assert code == 0 and "4 members, 3 answering" in out


def test_a_config_file_and_the_environment_drive_a_node_and_flags_win(tmp_path):
    (port,) = free_ports(1)
    config, typo, out_of_range = tmp_path / "node.toml", tmp_path / "typo.toml", tmp_path / "range.toml"
    config.write_text(f'listen = "127.0.0.1:{port}"\ntask = "synthetic"\nsteps = 50\nlinger = 0\nlog_every = 0\n'
                      'membership = "local"\n')
    typo.write_text(config.read_text() + "stepz = 3\n")
    out_of_range.write_text(f'listen = "127.0.0.1:{port}"\ncomm_fraction = 2.0\n')
    with ThreadPoolExecutor(2) as pool:  # the two refused files (they bind nothing) beside the two runs
        refused = [pool.submit(run, "start", "--config", str(path)) for path in (typo, out_of_range)]
        code, out, err = run("start", "--config", str(config), env={"P2P_STEPS": "80"})
        assert code == 0, err
        assert "done      step     80" in out  # the environment over the file
        # the last line says when training began and ended (benchmarks time the training phase from it)
        assert re.search(r"done .* train_started_at \d+\.\d+  train_ended_at \d+\.\d+  evaluations [1-9]\d*  "
                         r"eval_s \d+\.\d+  network_cpu_s \d+\.\d+", out), out
        code, out, err = run("start", "--config", str(config), "--steps", "60", "--eval-every", "1000",
                             env={"P2P_STEPS": "80"})
        assert code == 0 and "done      step     60" in out  # the flag over both
        assert "evaluations 1" in out  # the last one only: an unchanged model is not evaluated twice
        code, out, err = refused[0].result()
        assert code == 2 and err.strip() == f"p2p: error: {typo}: unknown key 'stepz' (keys are the flags of p2p start, with underscores)"
        code, out, err = refused[1].result()
        assert code == 2 and err.strip() == f"p2p: error: {out_of_range}: comm_fraction: must be > 0 and <= 1, got 2"


def test_json_logs_are_json_line_by_line_with_the_nodes_events(tmp_path):
    args = FAST + ["--log-format", "json", "--log-every", "0.5", "--steps", "300", "--linger", "3", "--min-members", "2"]
    with LocalSwarm(2, tmp_path, args) as swarm:
        swarm.start()
        assert swarm.wait(90) == [0, 0]
    lines = (tmp_path / "peer1.log").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    events = {r.get("event") for r in records}
    assert {"started", "progress", "done", "joined", "member_joined"} <= events, events
    done = [r for r in records if r.get("event") == "done"][-1]
    assert done["step"] == 300 and 0 < done["accuracy"] <= 1
    assert done["train_started_at"] < done["train_ended_at"] and done["evaluations"] >= 1
    assert done["network_cpu_s"] > 0  # the network thread's CPU seconds (status: network_cpu_s)
    assert 0 < done["eval_s"] < done["train_ended_at"] - done["train_started_at"] + 30
    # each line times its accuracy by the evaluation behind it (benchmarks use it, bench/slow_links.py)
    scored = [r for r in records if r.get("event") in ("progress", "done") and r["accuracy"] is not None]
    assert scored and all(r["evaluated_at"] <= r["time"] and 0 <= r["evaluated_step"] <= r["step"] for r in scored)
    assert [r["evaluated_at"] for r in scored] == sorted(r["evaluated_at"] for r in scored)
    assert done["evaluated_step"] == 300 and done["evaluated_at"] >= done["train_ended_at"]
    joined = [r for r in records if r.get("event") == "member_joined"]
    assert joined[0]["member"] == swarm.addrs[0] and joined[0]["level"] == "info"


def test_the_demo_writes_its_metrics_and_p2p_plot_draws_them(tmp_path):
    run_dir = tmp_path / "run"
    code, out, err = run("demo", "--peers", "2", "--steps", "200", "--keep-logs", str(run_dir), "--no-live", "--json",
                         timeout=180)
    assert code == 0, err
    assert json.loads(out)["metrics"] == str(run_dir / "metrics.jsonl")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_peer = {s["id"]: [r for r in rows if r["peer"] == s["id"]] for s in json.loads(out)["peers"]}
    assert {r["peer"] for r in rows} == set(by_peer)
    for samples in by_peer.values():  # a curve per peer that ends where training ended
        assert len(samples) >= 2 and samples[-1]["step"] == 200 and samples[-1]["accuracy"] is not None
        assert [r["t"] for r in samples] == sorted(r["t"] for r in samples)
    png = tmp_path / "curves.png"
    code, out, err = run("plot", str(run_dir), "--out", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    print(f"curves: {png}")
    code, _, err = run("plot", str(tmp_path / "nothing"))
    assert code == 1 and "no such file or directory" in err
