"""Keeping a training run, with real processes over real ZeroMQ: checkpoints and resume after
kill -9, joiners that take the swarm's state, a donor that dies mid-transfer, a whole swarm
restarted, bad checkpoints refused, the model exported."""

import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from p2p.harness.local_swarm import LocalSwarm, consensus_distance
from p2p.training.task import load_task
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

FAST = ["--task", "synthetic", "--membership", "local", "--log-every", "1", "--eval-every", "0.5",
        "--join-timeout", "60", "--exchange-timeout", "1"]


def status(swarm, i):
    return swarm.status(i, timeout_s=2.0)


def statuses(swarm, which):
    out = [status(swarm, i) for i in which]
    return out if all(out) else None


def resumed_line(swarm, i, after=0):
    """The last "resumed at step N from ...: accuracy A" line in peer i's log (which all of
    its runs append to), if there are more than ``after`` of them."""
    found = re.findall(r"resumed at step (\d+) from (.*): accuracy (\S+)", swarm.log_tail(i, 10_000))
    if len(found) <= after:
        return None
    step, where, accuracy = found[-1]
    return int(step), where, float(accuracy)


def test_a_node_killed_with_sigkill_resumes_from_its_last_checkpoint(tmp_path):
    # Slowed down (~120 steps/s) so that the last checkpoint and the last evaluation before the
    # kill are at most ~0.15 s (~20 steps) apart: the model they see is nearly the same.
    args = FAST + ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "0.15", "--linger", "-1",
                   "--steps", "100000", "--slowdown", "25", "--eval-every", "0.15"]
    with LocalSwarm(1, tmp_path, args) as swarm:
        swarm.start()
        wait_until(lambda: (s := status(swarm, 0)) and (s["checkpoint"].get("last_step") or 0) > 400, 120,
                   what="a checkpoint past step 400")  # (the deadline includes the start-up: ~45 s at load 15)
        before = status(swarm, 0)
        swarm.kill(0, signal.SIGKILL)
        swarm.procs[0].wait(10)
        files = sorted((tmp_path / "ckpt").glob("ckpt-*.pt"))
        # the last two are kept; three when the kill fell between a save's rename and its pruning
        # (checkpoints.py: the new file is complete before the oldest goes)
        assert 1 <= len(files) <= 3
        saved = torch.load(files[-1], weights_only=True)["step"]
        swarm.start_peer(0, [])
        resumed = wait_until(lambda: resumed_line(swarm, 0), 60, what="the restarted node to resume")
        assert resumed[0] == saved and "ckpt-" in resumed[1]  # the newest checkpoint's step
        assert abs(resumed[2] - before["accuracy"]) <= 0.01  # its first evaluation: within 1 point
        after = wait_until(lambda: (s := status(swarm, 0)) and s["step"] > saved + 100 and s, 60,
                           what="training to go on")
        assert after["checkpoint"]["restored_from"].endswith(files[-1].name)
        # it rejoined as a new incarnation of itself
        assert after["members"][0]["incarnation"] >= 1


def test_a_joiner_starts_from_the_swarms_state_and_does_not_pull_it_back(tmp_path):
    steps = 1500
    args = FAST + ["--linger", "-1", "--min-members", "3"]
    shards = [["--shard", f"{i}/4", "--steps", str(steps)] for i in range(3)] + [["--shard", "3/4", "--steps", str(steps + 300)]]
    with LocalSwarm(4, tmp_path, args, per_peer_args=shards) as swarm:
        for i in range(3):
            swarm.start_peer(i, [swarm.addrs[0]] if i else [])
        old = wait_until(lambda: (s := statuses(swarm, range(3))) and all(x["phase"] == "lingering" for x in s) and s,
                         120, what="the swarm to finish its steps")
        accuracy_before = np.mean([s["accuracy"] for s in old])
        swarm.start_peer(3, [swarm.addrs[1]])
        joined = wait_until(lambda: (s := status(swarm, 3)) and s["sync"].get("phase") == "done" and s, 60,
                            what="the joiner to take the swarm's state")
        sync = joined["sync"]
        donor = swarm.addrs.index(sync["donor"])
        served = [row for row in status(swarm, donor)["served"] if row["joiner"] == swarm.addrs[3]]
        assert served and served[-1]["crc"] == sync["crc"]  # exactly the bytes the donor captured
        assert sync["step"] >= steps  # the donor's step, not 0
        resumed = wait_until(lambda: resumed_line(swarm, 3), 30, what="the joiner's first evaluation")
        assert resumed[0] == sync["step"] and resumed[2] >= accuracy_before - 0.02  # the swarm's model, not a new one
        final = wait_until(lambda: (s := status(swarm, 3)) and s["phase"] == "lingering" and s, 60,
                           what="the joiner to train its steps")
        assert final["step"] == steps + 300  # it continued the donor's count
        after = wait_until(lambda: statuses(swarm, range(4)), 20, what="everyone's status")
        # Nobody pulled back: the old peers, which mixed with the joiner all along, are at least
        # where they stood. The joiner's own last evaluation is of its raw SGD iterate, which runs
        # 2-3 points below the others' smoothed average of it (seen: 0.810-0.825 against 0.843);
        # a fresh model after 300 steps on that shard evaluates at about 0.76.
        accuracies = [s["accuracy"] for s in after]
        assert min(accuracies[:3]) >= accuracy_before - 0.02, (accuracy_before, accuracies)
        assert accuracies[3] >= accuracy_before - 0.05, (accuracy_before, accuracies)
        params = [swarm.params(i) for i in range(4)]
        assert consensus_distance(params) < 0.05 * float(np.linalg.norm(np.mean(params, axis=0)))


def test_a_joiner_whose_donor_dies_mid_transfer_completes_from_another(tmp_path):
    # Donors serve state at 0.2 Mbit/s (a ~0.1 MB state: 4 s), so the transfer is long enough to kill.
    args = FAST + ["--linger", "-1", "--sync-max-mbit", "0.2", "--sync-timeout", "2"]
    with LocalSwarm(4, tmp_path, args, per_peer_args=[["--steps", "300"]] * 3 + [["--steps", "400"]]) as swarm:
        for i in range(3):
            swarm.start_peer(i, [swarm.addrs[0]] if i else [])
        wait_until(lambda: (s := statuses(swarm, range(3))) and all(x["phase"] == "lingering" for x in s), 120,
                   what="the swarm to finish its steps")
        swarm.start_peer(3, [swarm.addrs[0], swarm.addrs[1], swarm.addrs[2]])
        first = wait_until(lambda: (s := status(swarm, 3)) and s["sync"].get("phase") == "transferring"
                           and 0 < s["sync"]["received"] < s["sync"]["total"] and s["sync"],
                           60, interval_s=0.05, what="a transfer to be under way")
        victim = swarm.addrs.index(first["donor"])
        swarm.kill(victim, signal.SIGKILL)
        done = wait_until(lambda: (s := status(swarm, 3)) and s["sync"].get("phase") == "done" and s["sync"], 60,
                          what="the joiner to complete from another member")
        assert done["donor"] != first["donor"] and done["step"] >= 300
        assert wait_until(lambda: (s := status(swarm, 3)) and s["step"] == 400 and s, 60, what="the joiner to train")


def test_a_whole_swarm_killed_at_once_restarts_where_it_was(tmp_path):
    dirs = [tmp_path / f"ckpt{i}" for i in range(3)]
    # --min-members 3: the first node back does not train alone on its shard while the others
    # start (once that ran thousands of steps ahead, and the freshest state, which the others
    # then took, had drifted 7 points under where the swarm was)
    args = FAST + ["--linger", "-1", "--steps", "100000", "--checkpoint-every", "0.5", "--min-members", "3"]
    per_peer = [["--shard", f"{i}/3", "--checkpoint-dir", str(d)] for i, d in enumerate(dirs)]
    with LocalSwarm(3, tmp_path, args, per_peer_args=per_peer) as swarm:
        swarm.start()
        wait_until(lambda: (s := statuses(swarm, range(3))) and all((x["checkpoint"].get("last_step") or 0) > 800 for x in s),
                   90, what="checkpoints past step 800 on every node")
        accuracy = np.mean([s["accuracy"] for s in statuses(swarm, range(3))])
        for i in range(3):
            swarm.kill(i, signal.SIGKILL)
        for i in range(3):
            swarm.procs[i].wait(10)
        saved = [torch.load(sorted(d.glob("ckpt-*.pt"))[-1], weights_only=True)["step"] for d in dirs]
        earlier = [len(re.findall("resumed at step", swarm.log_tail(i, 10_000))) for i in range(3)]  # joins
        swarm.start()  # every node again, each with its checkpoint directory
        lines = [wait_until(lambda i=i: resumed_line(swarm, i, earlier[i]), 60, what=f"node {i} to resume")
                 for i in range(3)]
        for (step, _, acc), own in zip(lines, saved):
            assert step >= own  # its own checkpoint, or a fresher member's state: never step 0
            assert acc >= accuracy - 0.03
        wait_until(lambda: (s := statuses(swarm, range(3))) and all(x["step"] > max(saved) + 100 for x in s), 60,
                   what="the swarm to train on")


def run_cli(*args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "p2p", *args], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr.strip().splitlines()


def test_checkpoints_of_another_model_are_refused_and_damaged_ones_skipped_loudly(tmp_path):
    from p2p.net.ports import free_ports
    from p2p.training.checkpoints import CheckpointStore
    from p2p.training.state import TrainingState

    ckpt = tmp_path / "ckpt"
    CheckpointStore(ckpt).save(TrainingState(5, "TinyLM/834048/00000000", "adpsgd", {}, None, {}))
    (port,) = free_ports(1)
    code, _, err = run_cli("start", "--listen", f"127.0.0.1:{port}", "--task", "synthetic", "--checkpoint-dir", str(ckpt),
                           "--steps", "10")
    assert code == 1 and len(err) == 1
    assert err[0].startswith("p2p: error: checkpoint") and "is of model 'TinyLM/834048/00000000'" in err[0]
    # a node's own checkpoints, the newest damaged: it resumes from the one before, and says so
    code, _, _ = run_cli("start", "--listen", f"127.0.0.1:{port}", "--task", "synthetic", "--steps", "300",
                         "--linger", "0", "--checkpoint-dir", str(tmp_path / "own"), "--checkpoint-every", "0.1",
                         "--keep-checkpoints", "3", "--membership", "local")
    assert code == 0
    files = sorted((tmp_path / "own").glob("ckpt-*.pt"))
    assert len(files) >= 2
    files[-1].write_bytes(files[-1].read_bytes()[:100])
    previous = torch.load(files[-2], weights_only=True)["step"]
    code, out, err = run_cli("start", "--listen", f"127.0.0.1:{port}", "--task", "synthetic", "--steps", "310",
                             "--linger", "0", "--checkpoint-dir", str(tmp_path / "own"), "--membership", "local")
    assert code == 0 and any("unreadable" in line and files[-1].name in line for line in err), err
    assert f"resumed at step {previous} from checkpoint" in out


def test_export_writes_a_state_dict_the_task_model_loads_with_the_reported_accuracy(tmp_path):
    task = load_task("synthetic")
    args = FAST + ["--linger", "-1", "--steps", "400", "--checkpoint-dir", str(tmp_path / "ckpt")]
    with LocalSwarm(1, tmp_path, args) as swarm, ThreadPoolExecutor(3) as pool:
        swarm.start()
        reported = wait_until(lambda: (s := status(swarm, 0)) and s["phase"] == "lingering" and s["accuracy"] > 0 and s,
                              60, what="training to finish")
        # the three exports side by side: two of the live node, one of a directory that is not there
        nothing = pool.submit(run_cli, "export", "--from", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.pt"))
        outs = [tmp_path / "live.pt", tmp_path / "live.safetensors"]
        fmts = ["safetensors" if out.suffix == ".safetensors" else "torch" for out in outs]
        exports = [pool.submit(run_cli, "export", "--peer", swarm.addrs[0], "--out", str(out), "--format", fmt)
                   for out, fmt in zip(outs, fmts)]
        for out, fmt, done in zip(outs, fmts, exports):
            code, stdout, err = done.result()
            assert code == 0, err
            if fmt == "torch":
                weights = torch.load(out, weights_only=True)
            else:
                from safetensors.torch import load_file

                weights = load_file(str(out))
            model = task.make_model()
            model.load_state_dict(weights)
            assert task.evaluate(model)["accuracy"] == pytest.approx(reported["accuracy"], abs=1e-6)
        swarm.stop()
    code, _, err = run_cli("export", "--from", str(tmp_path / "ckpt"), "--out", str(tmp_path / "final.pt"))
    assert code == 0, err
    model = task.make_model()
    model.load_state_dict(torch.load(tmp_path / "final.pt", weights_only=True))  # the clean stop's checkpoint
    assert task.evaluate(model)["accuracy"] == pytest.approx(reported["accuracy"], abs=1e-6)
    code, _, err = nothing.result()
    assert code == 1 and "no such file or directory" in err[0]
