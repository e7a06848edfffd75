"""DiLoCo at 20 Mbit/s in the lab (issue 16): real ``p2p start`` processes in network namespaces
with shaped links, SparseLoCo's round (our slow-link configuration). A peer whose link is cut
for two outer rounds comes back; within 3 rounds of the restore its copy of the outer
parameters is mended by a catch-up (p2p/averaging/outer_catchup.py: the missed rounds'
compressed shares in one range request, not theta_start), the swarm's bytes per round are back at the codec's level,
and the copies agree again; with overlap, a round later. Rounds and bytes are the nodes' own counters (``p2p status``),
never timings; the figures with timings (steps/s around the cut) come from
bench/diloco_repair.py.

Needs root and ``ip netns`` (skips otherwise). ``TEST_LAB_PREFIX`` / ``TEST_LAB_SUBNET``
name the lab (default: per process, so two runs on one machine do not collide; not P2P_...:
the node reads those as its settings)."""

from __future__ import annotations

import math
import os
import time

import pytest

from p2p.harness.lab import Lab, LabSwarm, probe
from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.netns]

PREFIX = os.environ.get("TEST_LAB_PREFIX", f"p2pd{os.getpid() % 100000}")
SUBNET = os.environ.get("TEST_LAB_SUBNET", f"10.79.{os.getpid() % 250}.0/24")
PEERS = 3
NUMEL = 2_176_010  # nodes.wide:WideTask
# An outer round of about this long, whatever the machine: the heal and the range catch-up fit
# in 3 such rounds, but not in 3 rounds of 0.65 s (H 25 on a machine twice as fast as the one
# the test was written on: 3 of 8 runs failed, none of 4 at H 50). After the restore the link
# needs ~1.5 s in absolute time (TCP's backed-off retransmissions, the cut peer's stuck round
# and its 2 s floor, rounds.py's patience) before the cut peer even compares a sketch again.
# Stop 35: at 1.4 s (H 43) the catch-up missed the third round in 2 of ~14 runs of the blocking
# case under the suite's load (its code unchanged that stop), the cut peer still 3 rounds behind.
ROUND_S = 2.0
MIN_H = 25  # the period


NODE_OVERHEAD = 2.0  # a node's step over the bare step, cores shared aside (measured: 26 ms vs
# 9 ms x 1.5 on 2 cores: the trainer's hooks, the network thread, the status queries)


def inner_steps(round_s: float = ROUND_S) -> int:
    """H for ~``round_s`` rounds: one WideTask step timed here, alone on one thread, scaled by
    the nodes' sharing of the cores (three single-threaded trainers on ``os.cpu_count()``) and
    ``NODE_OVERHEAD``."""
    import torch

    from p2p.training.task import Shard, load_task

    torch.set_num_threads(1)
    task = load_task("nodes.wide:WideTask")
    model = task.make_model()
    optimizer = task.make_optimizer(model.parameters())
    batches = task.train_batches(Shard(0, PEERS), 0)
    for n, timed in ((5, False), (30, True)):  # warm-up, then timed
        began = time.perf_counter()
        for _ in range(n):
            optimizer.zero_grad()
            task.loss(model, next(batches)).backward()
            optimizer.step()
    step_s = (time.perf_counter() - began) / n * max(1.0, PEERS / (os.cpu_count() or 1)) * NODE_OVERHEAD
    return max(MIN_H, math.ceil(round_s / step_s))


def args(h: int, overlap: bool) -> list[str]:
    return ["--task", "nodes.wide:WideTask", "--steps", "100000", "--eval-every", "1000000", "--log-every", "0",
            "--linger", "0", "--join-timeout", "60", "--membership", "local", "--algorithm", "diloco",
            "--compression", "sparseloco", "--diloco-inner-steps", str(h), "--diloco-outer-lr", "1.0",
            "--diloco-outer-momentum", "0", "--min-members", str(PEERS)] + (["--diloco-overlap"] if overlap else [])
LEVEL = 1.5  # "at the codec's level": at most this many times the steady state's bytes per round


@pytest.fixture
def lab():
    # In CI since stop 26 (rounds.py's "Overtaken" rule): 22 of 22, 11 of them beside one busy
    # loop (load 2.4-7.3, 31-75 s). Stop 25's failure (7 of 8 under load): the cut peer came back
    # two outer steps behind in time, on the same rounds and steps, and mixed another set than the
    # others every round (tests/test_diloco_overtaken.py reproduces it); before stop 25's heal,
    # one run in ten also lost a node to libzmq's `!_io_error` abort (p2p/net/control_port.py,
    # "Never pause a connection"). Stop 27: on a machine twice as fast, H 25 made 0.65 s rounds and
    # 3 of 8 runs failed (the catch-up landed in round 4); H is now sized for ~1.4 s rounds (5 of 5).
    reason = probe()
    if reason is not None:
        pytest.skip(f"network lab unavailable: {reason}")
    made = Lab(PEERS, "20mbit", prefix=PREFIX, subnet=SUBNET)
    try:
        yield made.up()
    finally:
        made.down()


def statuses(swarm):
    out = [swarm.status(i, timeout_s=5) for i in range(PEERS)]
    if not all(out):
        assert all(swarm.alive(i) for i in range(PEERS)), [swarm.log_tail(i) for i in range(PEERS)]
        return None
    return out


def at_round(swarm, k, what):
    """Every peer's status once peer 0 (never cut) took its k-th outer step."""
    s = wait_until(lambda: (s := statuses(swarm)) and s[0]["averaging"]["outer_steps"] >= k and s,
                   120, interval_s=0.1, what=what)
    print(what, counters(s), flush=True)  # the timeline, shown when the test fails
    return s


def sent(s):
    return sum(x["bytes_sent"] for x in s)


def repairs(s):
    return [(x["averaging"]["repairs_started"], x["averaging"]["repair_bytes"]) for x in s]


def counters(s):
    """The repair counters of every peer (for a failing assertion's message)."""
    keys = ("outer_steps", "repairs_started", "repairs_completed", "catch_ups_started", "catch_ups_completed",
            "repairs_replayed", "replays_missing", "repairs_failed", "repair_stale", "repair_chunks_missed",
            "repairs_diverged", "repair_bytes", "copies_apart", "rounds_partial", "rounds_passed", "rounds_overtaken",
            "jumps", "repair_in_flight", "gates_passed")
    return [{**{k: x["averaging"].get(k) for k in keys}, "send_drops": x["send_drops"]} for x in s]


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap"])
def test_a_peer_cut_for_two_rounds_is_caught_up_within_four_and_the_rounds_shrink_back(lab, tmp_path, overlap):
    cut = PEERS - 1
    h = inner_steps()
    print("H", h, flush=True)
    shards = [["--shard", f"{i}/{PEERS}"] for i in range(PEERS)]
    with LabSwarm(lab, tmp_path, args(h, overlap), per_peer_args=shards) as swarm:
        swarm.start()
        wait_until(lambda: (s := statuses(swarm)) and all(x["averaging"]["outer_steps"] >= 2 for x in s),
                   300, interval_s=0.2, what="two outer steps on every peer")  # start-up: imports
        # The steady state: bytes per round of the whole swarm, over 3 rounds without a repair
        # (all start from one seed together; on a loaded machine a late share can still split
        # the copies now and then: such a window is not the codec's level, take the next).
        for _ in range(5):
            a = at_round(swarm, statuses(swarm)[0]["averaging"]["outer_steps"] + 1, "a steady round")
            b = at_round(swarm, a[0]["averaging"]["outer_steps"] + 3, "three steady rounds")
            if repairs(a) == repairs(b) and not any(x["averaging"]["repair_in_flight"] for x in a + b):
                break
        else:
            pytest.fail(f"no 3 rounds without a repair before the cut: {counters(b)}")
        rounds = b[0]["averaging"]["outer_steps"] - a[0]["averaging"]["outer_steps"]
        level = (sent(b) - sent(a)) / rounds

        lab.cut(cut)  # (its status cannot be asked meanwhile: peer 0's alone)
        wait_until(lambda: (s := swarm.status(0, timeout_s=5)) and
                   s["averaging"]["outer_steps"] >= b[0]["averaging"]["outer_steps"] + 2,
                   120, interval_s=0.1, what="two outer rounds without the cut peer")
        lab.restore(cut)
        k0 = wait_until(lambda: swarm.status(0, timeout_s=5), 30, what="peer 0's status")["averaging"]["outer_steps"]
        print("restored at peer 0's outer step", k0, flush=True)

        # Within 4 rounds of the restore: the cut peer caught up by the rounds' shares (a range
        # catch-up: the cut's ~4 rounds of ~92 KB per sender), never by pulling theta_start; a
        # round still in flight during the first catch-up may take a second, smaller one (seen
        # at load 3: 822 KB then 548 KB), and a cut in the middle of a round can split the others
        # too (they mend that by a replay or a catch-up). None is a pull.
        # 4, not 3: a donor serves a round only once its next round confirmed it (outer_catchup.py,
        # "Only confirmed rounds are served"), a round later than before; alone the catch-up
        # landed by the third in 3 of 3 runs, but under the full suite's load once not (stop 41).
        # With overlap one round more: a catch-up lands at an outer step, and there a round is in
        # flight beside the next period (1 of 5 runs needed the fourth, before the rule above).
        c = at_round(swarm, k0 + 4 + overlap, "four rounds after the restore")
        back, was = c[cut]["averaging"], b[cut]["averaging"]
        # Blocking rounds never let a trainer past a gate. With overlap, whether the others pass
        # one is timing, not checked here: they do where the cut peer holds their round past
        # their next boundary (diloco.py, "Overlap"), but a cut peer that leaves their views
        # before their next round begins holds none (seen under the suite's load: no round of
        # theirs short, no gate passed). tests/test_diloco_overlap.py shows the pass by the clock.
        passed = [x["averaging"]["gates_passed"] - y["averaging"]["gates_passed"] for x, y in zip(c, b)]
        assert overlap or passed == [0] * PEERS, passed
        # (With overlap, 4 of 15 runs in stop 39 landed two catch-ups apart and then pulled: the
        # donor had served a round its copy replayed a round later. A donor now serves a round
        # once the next one confirmed it: outer_catchup.py, "Only confirmed rounds are served".)
        assert back["catch_ups_completed"] > was["catch_ups_completed"], (counters(b), counters(c))
        # From then on (the next three rounds) the rounds carry the codec's bytes, nothing
        # pulled, nothing left in flight.
        d = at_round(swarm, c[0]["averaging"]["outer_steps"] + 3, "three more rounds")
        rounds = d[0]["averaging"]["outer_steps"] - c[0]["averaging"]["outer_steps"]
        assert (sent(d) - sent(c)) / rounds <= LEVEL * level, ((sent(d) - sent(c)) / rounds, level, counters(d))
        for x, y in zip(d, b):
            now, before = x["averaging"], y["averaging"]
            assert now["repair_bytes"] - before["repair_bytes"] < NUMEL, (counters(b), counters(d))  # no pull
            assert now["repairs_started"] - before["repairs_started"] <= 2, (counters(b), counters(d))
            assert not now["repair_in_flight"], (counters(b), counters(d))
        # One copy again: no round since compared a sketch apart (copies_apart counts those).
        e = at_round(swarm, d[0]["averaging"]["outer_steps"] + 2, "two more rounds")
        assert [x["averaging"]["copies_apart"] for x in e] == [x["averaging"]["copies_apart"] for x in d], counters(e)
        for before, now in zip(b, e):
            assert now["step"] > before["step"]  # every trainer kept going
        assert swarm.stop() == [0] * PEERS
