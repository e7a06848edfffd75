"""DiLoCo at 20 Mbit/s in the lab (issue 16), real processes in network namespaces with shaped
links: a peer cut off for two outer rounds comes back, its copy of the outer parameters is
repaired once (a bounded pull or a replay), nobody repairs in a loop, and every peer keeps
training. The figures (bytes per round, steps/s around the cut) come from bench/diloco_repair.py."""

from __future__ import annotations


import pytest

from p2p.harness.lab import LabSwarm
from tests.conftest import wait_until
from tests.test_lab import labs, netns_ok  # noqa: F401  (fixtures: skip without root; cleanup)

pytestmark = pytest.mark.integration

H = 10
NUMEL = 2_176_010  # nodes.wide:WideTask
ARGS = ["--task", "nodes.wide:WideTask", "--steps", "100000", "--eval-every", "1000000", "--log-every", "0",
        "--linger", "0", "--join-timeout", "60", "--membership", "local", "--algorithm", "diloco",
        "--compression", "int4", "--diloco-inner-steps", str(H), "--min-members", "3"]


def statuses(swarm):
    out = [swarm.status(i, timeout_s=5) for i in range(3)]
    return out if all(out) else None


def test_a_diloco_peer_cut_off_for_two_rounds_is_repaired_once_and_nobody_stalls(labs, tmp_path):
    lab = labs(3, "20mbit")
    with LabSwarm(lab, tmp_path, ARGS, per_peer_args=[["--shard", f"{i}/3"] for i in range(3)]) as swarm:
        swarm.start()
        steady = wait_until(lambda: (s := statuses(swarm)) and all(x["averaging"]["outer_steps"] >= 3 for x in s) and s,
                            120, interval_s=0.5, what="three outer steps on every peer")
        assert all(x["averaging"]["repairs_started"] == 0 for x in steady)  # one seed, all start together
        lab.cut(2)
        cut_at = steady[0]["averaging"]["outer_steps"]
        wait_until(lambda: (s := swarm.status(0, timeout_s=5)) and s["averaging"]["outer_steps"] >= cut_at + 2, 90,
                   interval_s=0.5, what="two outer rounds without peer 2")
        lab.restore(2)

        def repaired():
            s = statuses(swarm)
            back = s and s[2]["averaging"]
            return s if back and back["repairs_completed"] + back["repairs_replayed"] >= 1 else None

        after = wait_until(repaired, 150, interval_s=0.5, what="peer 2's copy to be repaired")

        def outer_steps_past(base, k):
            # outer_steps count the steps a peer took (one that jumped rounds took fewer): each its own
            return lambda: (s := statuses(swarm)) and all(
                now["averaging"]["outer_steps"] >= was["averaging"]["outer_steps"] + k for was, now in zip(base, s)) and s

        settled = wait_until(outer_steps_past(after, 2), 60, interval_s=0.5, what="two outer steps after the repair")
        later = wait_until(outer_steps_past(settled, 3), 60, interval_s=0.5, what="three more outer steps")
        for was, now in zip(after, later):
            assert now["step"] >= was["step"] + 5 * H  # every trainer kept going
        for s in later:  # nobody repairs in a loop, and no pull is larger than one state
            avg = s["averaging"]
            assert avg["repairs_started"] <= 3, avg
            assert avg["repair_bytes"] <= avg["repairs_started"] * 6 * NUMEL, avg
        # One copy again: in the last three rounds no peer saw a sketch apart from its own.
        assert [s["averaging"]["copies_apart"] for s in later] == [s["averaging"]["copies_apart"] for s in settled]
        assert swarm.stop() == [0, 0, 0]
