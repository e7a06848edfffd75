"""The slow-links benchmark's pieces: its measurement definitions, and the DDP baseline worker
really running across lab namespaces (``netns``: needs root; skips elsewhere, saying why)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2p.harness.lab import Lab, probe

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import _common  # noqa: E402
import slow_links  # noqa: E402
import slow_links_report  # noqa: E402
import slow_links_runs  # noqa: E402
import slow_links_windows  # noqa: E402
import diloco_repair  # noqa: E402

PREFIX = f"p2pb{os.getpid() % 100000}"
SUBNET = f"10.75.{os.getpid() % 250}.0/24"


def test_mean_accuracy_curve_starts_once_every_peer_is_evaluated_and_interpolates_each_peer():
    series = [[(1.0, 0.2), (3.0, 0.6)], [(2.0, 0.4), (4.0, math.nan), (5.0, 0.8)]]
    # at 2.0 peer 0 is halfway between its 0.2 and 0.6; at 3.0 peer 1 a third of the way from 0.4
    # to 0.8 (its NaN skipped); at 5.0 peer 0 holds its last evaluation
    expected = [(2.0, pytest.approx(0.4)), (3.0, pytest.approx((0.6 + 0.4 + 0.4 / 3) / 2)), (5.0, pytest.approx(0.7))]
    assert _common.mean_accuracy_curve(series) == expected
    assert _common.mean_accuracy_curve([[(1.0, 0.9)], []]) == []  # one peer never evaluated


def test_peers_evaluating_out_of_phase_reach_a_target_when_one_evaluator_of_the_same_model_would():
    """Two peers holding one model whose accuracy is 0.1 t, evaluated every 2 s half an interval
    apart: scored like one evaluator (DDP's rank 0), they reach 0.5 at t = 5, not half an
    interval late as the mean of their latest evaluations had it (5.5)."""
    def evaluations(first):
        return [(t, 0.1 * t) for t in range(first, 10, 2)]
    one = _common.time_to_target(_common.mean_accuracy_curve([evaluations(0)]), 0.5)
    two = _common.time_to_target(_common.mean_accuracy_curve([evaluations(0), evaluations(1)]), 0.5)
    assert one == pytest.approx(5.0) and two == pytest.approx(5.0)


@pytest.mark.parametrize("curve, target, expected", [
    ([(1.0, 0.3), (2.0, 0.5), (3.0, 0.45)], 0.5, 2.0),
    ([(1.0, 0.3), (3.0, 0.7), (4.0, 0.45)], 0.5, 2.0),  # between the last point under and the first over
    ([(1.0, 0.6), (2.0, 0.7)], 0.5, 1.0),  # there at the first point: no earlier one to go back to
    ([(100, 0.79), (160, 0.82)], 0.8, 120.0),  # a step curve: steps to target
    ([(1.0, 0.3), (2.0, 0.49)], 0.5, None),
    ([], 0.5, None),
])
def test_time_to_target_is_the_first_crossing_interpolated(curve, target, expected):
    assert _common.time_to_target(curve, target) == pytest.approx(expected)


def test_methods_are_compared_at_the_fewest_steps_any_completed():
    ddp = slow_links_runs.Result("ddp", "100mbit", step_curve=[(100, 0.30), (250, 0.41), (300, 0.45)])
    ours = slow_links_runs.Result("p2p-x", "100mbit", step_curve=[(120, 0.31), (240, 0.40), (900, 0.6)])
    idle = slow_links_runs.Result("compute_only", "100mbit")  # nothing evaluated: left out
    slow_links_report.compare_at_equal_steps({"ddp": ddp, "p2p-x": ours, "compute_only": idle})
    assert ddp.equal_steps == ours.equal_steps == 300  # DDP stopped first (--max-time)
    assert ddp.accuracy_at_equal_steps == 0.45
    assert ours.accuracy_at_equal_steps == pytest.approx(0.40 + 0.2 * 60 / 660)  # between its 240 and 900
    assert idle.accuracy_at_equal_steps is None
    assert slow_links_report.accuracy_at_step([(10, 0.5)], 5) is None


def test_accuracy_is_also_compared_at_fifths_of_the_equal_steps():
    ddp = slow_links_runs.Result("ddp", "20mbit", step_curve=[(50, 0.2), (100, 0.3), (200, 0.5)])
    ours = slow_links_runs.Result("p2p-x", "20mbit", step_curve=[(40, 0.1), (120, 0.35), (400, 0.7)])
    slow_links_report.compare_at_equal_steps({"ddp": ddp, "p2p-x": ours})
    assert [k for k, _ in ours.accuracy_at_fractions] == [40, 80, 120, 160, 200]
    # read between the points either side, as a crossing is; nothing before the first point
    assert [a for _, a in ours.accuracy_at_fractions] == pytest.approx([0.1, 0.225, 0.35, 0.4, 0.45])
    assert [a for _, a in ddp.accuracy_at_fractions][0] is None
    assert [a for _, a in ddp.accuracy_at_fractions][1:] == pytest.approx([0.26, 0.34, 0.42, 0.5])


def test_the_ideal_bound_is_ddps_steps_at_compute_only_speed_after_its_start_up():
    s = slow_links_runs.Settings("t", 4, 1000, 0, 1.0, 0.5, 600, target=0.8, target_high=0.9)
    co = slow_links_runs.Result("compute_only", "unlimited", train_time_s=110.0, start_s=10.0, steps=1000)
    fast_ddp = slow_links_runs.Result("ddp", "unlimited", steps_to_target=480, steps_to_high=None)
    slow_ddp = slow_links_runs.Result("ddp", "20mbit", steps_to_target=450, steps_to_high=700)
    ours = slow_links_runs.Result("p2p-x", "20mbit", time_to_target_s=110.0, train_time_s=132.0)
    results = {"unlimited": {"compute_only": co, "ddp": fast_ddp},
               "20mbit": {"compute_only": slow_links_runs.Result(**{**co.__dict__, "rate": "20mbit"}),
                          "ddp": slow_ddp, "p2p-x": ours}}
    slow_links_report.compare_with_bounds(results)
    assert ours.ideal_s == pytest.approx(450 * 0.1 + 10.0)  # the fewest DDP steps over the rates
    assert ours.ideal_high_s == pytest.approx(700 * 0.1 + 10.0)
    assert ours.step_overhead == pytest.approx(0.2)
    table = slow_links_report.markdown(results, s, wall_s=60.0)
    assert "| 20mbit | p2p-x | 110.0 | 2.00 |" in table  # time to target ÷ ideal
    assert "+20%" in table and "## Accuracy at equal steps" in table


def test_overheads_compare_with_the_compute_only_run_at_the_same_rate():
    # --compute-only-each-rate: a compute-only run in each rate's lab, each slower or faster
    fast = slow_links_runs.Result("compute_only", "unlimited", train_time_s=110.0, start_s=10.0, steps=1000,
                                  cpu_s_per_step=0.010)
    slow = slow_links_runs.Result("compute_only", "20mbit", train_time_s=121.0, start_s=11.0, steps=1000,
                                  cpu_s_per_step=0.011)
    ours = {rate: slow_links_runs.Result("p2p-x", rate, train_time_s=132.0, cpu_s_per_step=0.0121)
            for rate in ("unlimited", "20mbit")}
    ddp = slow_links_runs.Result("ddp", "unlimited", steps_to_target=480)
    slow_links_report.compare_with_bounds({"unlimited": {"compute_only": fast, "ddp": ddp, "p2p-x": ours["unlimited"]},
                                           "20mbit": {"compute_only": slow, "p2p-x": ours["20mbit"]}})
    assert ours["unlimited"].step_overhead == pytest.approx(0.2) and ours["20mbit"].step_overhead == pytest.approx(132 / 121 - 1, abs=1e-4)
    assert ours["unlimited"].cpu_overhead == pytest.approx(0.21) and ours["20mbit"].cpu_overhead == pytest.approx(0.1)
    # the rate's compute-only: 0.11 s a step and 11 s of start-up in the 20mbit lab
    assert ours["unlimited"].ideal_s == pytest.approx(480 * 0.1 + 10.0)
    assert ours["20mbit"].ideal_s == pytest.approx(480 * 0.11 + 11.0)


def test_no_ideal_bound_without_a_ddp_that_reached_the_target():
    co = slow_links_runs.Result("compute_only", "20mbit", train_time_s=110.0, start_s=10.0, steps=1000)
    ddp = slow_links_runs.Result("ddp", "20mbit")  # cut off by --max-time before the target
    ours = slow_links_runs.Result("p2p-x", "20mbit", time_to_target_s=50.0, train_time_s=100.0)
    slow_links_report.compare_with_bounds({"20mbit": {"compute_only": co, "ddp": ddp, "p2p-x": ours}})
    assert ours.ideal_s is None and ours.step_overhead == pytest.approx(100 / 110 - 1, abs=1e-4)


def test_bytes_to_target_is_read_at_the_first_sample_at_or_after_the_time():
    class FakeLab:
        sent = [0, 0]

        def tx_bytes(self, i):
            return self.sent[i]

    lab = FakeLab()
    sampler = slow_links_runs.BytesSampler(lab, [0, 0], t0=0.0)
    sampler.curve = [(0.0, 0.0), (1.0, 10.0), (2.0, 30.0)]
    assert (sampler.at(0.5), sampler.at(2.0), sampler.at(9.0), sampler.at(None)) == (10.0, 30.0, 30.0, None)


def test_methods_expand_to_every_p2p_configuration_then_the_baselines():
    plan = slow_links.plan_methods(["p2p", "ddp", "compute_only"])
    assert [name for name, _ in plan] == [*slow_links.P2P_CONFIGS, "ddp", "compute_only"]
    assert all(extra is None for name, extra in plan if name in ("ddp", "compute_only"))
    assert [name for name, _ in slow_links.plan_methods(["ddp", "p2p", "ddp"])][0] == "ddp"
    with pytest.raises(ValueError, match="unknown method"):
        slow_links.plan_methods(["allreduce"])


def test_repeats_run_the_p2p_methods_again_pass_after_pass_and_the_baselines_once():
    plan = slow_links.plan_methods(["p2p-diloco-sparse-h25", "ddp", "p2p-diloco-int4-h25", "compute_only"])
    order = slow_links.run_order(plan, 3)
    assert [key for key, _, _ in order] == [
        "p2p-diloco-sparse-h25", "ddp", "p2p-diloco-int4-h25", "compute_only",
        "p2p-diloco-sparse-h25 #2", "p2p-diloco-int4-h25 #2", "p2p-diloco-sparse-h25 #3", "p2p-diloco-int4-h25 #3"]
    assert all(extra == slow_links.P2P_CONFIGS[method] for key, method, extra in order if "#" in key)
    assert slow_links.run_order(plan, 1) == [(name, name, extra) for name, extra in plan]


def test_paired_repeats_run_compute_only_in_every_pass_and_compare_each_pass_with_its_own():
    plan = slow_links.plan_methods(["p2p-diloco-sparse-h25", "ddp", "compute_only"])
    order = slow_links.run_order(plan, 3, paired=True)
    assert [key for key, _, _ in order] == [
        "p2p-diloco-sparse-h25", "ddp", "compute_only", "p2p-diloco-sparse-h25 #2", "compute_only #2",
        "p2p-diloco-sparse-h25 #3", "compute_only #3"]
    # pass 2's machine was 10% slower: its p2p run is compared with its own compute-only run
    co = {key: slow_links_runs.Result("compute_only", "100mbit", train_time_s=t, start_s=10.0, steps=1000)
          for key, t in (("compute_only", 100.0), ("compute_only #2", 110.0))}
    ours = {key: slow_links_runs.Result("p2p-x", "100mbit", train_time_s=t) for key, t in
            (("p2p-x", 105.0), ("p2p-x #2", 115.5), ("p2p-x #3", 120.0))}
    ddp = slow_links_runs.Result("ddp", "100mbit", steps_to_target=400)
    slow_links_report.compare_with_bounds({"100mbit": {**co, **ours, "ddp": ddp}})
    assert ours["p2p-x"].step_overhead == pytest.approx(0.05)
    assert ours["p2p-x #2"].step_overhead == pytest.approx(0.05)
    assert ours["p2p-x #2"].ideal_s == pytest.approx(400 * 0.1 + 10.0)
    assert ours["p2p-x #3"].step_overhead == pytest.approx(0.2)  # no pass-3 compute-only: the rate's first
    assert co["compute_only #2"].step_overhead == pytest.approx(0.0)


def test_repeats_are_summarised_by_median_and_range_and_count_the_runs_that_never_got_there():
    s = slow_links_runs.Settings("t", 4, 1000, 0, 1.0, 0.5, 600, target=0.8, target_high=0.9)
    runs = {"p2p-x": (12.0, 20.0, 0.05), "p2p-x #2": (10.0, None, 0.15), "p2p-x #3": (15.0, 24.0, -0.02)}
    by = {name: slow_links_runs.Result("p2p-x", "20mbit", time_to_target_s=t, time_to_high_s=high,
                                       step_overhead=o, ideal_s=8.0, ideal_high_s=16.0)
          for name, (t, high, o) in runs.items()}
    by["ddp"] = slow_links_runs.Result("ddp", "20mbit", time_to_target_s=14.0)
    lines = slow_links_report.repeats_table({"20mbit": by}, s)
    rows = [line for line in lines if line.startswith("| 20mbit")]
    assert rows == ["| 20mbit | p2p-x | 3 | 12.0 [10.0–15.0] | 1.50 [1.25–1.88] | 22.0 [20.0–24.0], 1 never "
                    "| 1.38 [1.25–1.50], 1 never | +5% [-2%–+15%] |"]  # a method run once has no row
    assert slow_links_report.repeats_table({"20mbit": {"ddp": by["ddp"]}}, s) == []
    assert "## Repeats" in slow_links_report.markdown({"20mbit": by}, s, wall_s=60.0)


def test_torch_local_sgd_methods_name_their_period():
    plan = slow_links.plan_methods(["torch-localsgd-h25", "torch-localsgd-h100"])
    assert plan == [("torch-localsgd-h25", None), ("torch-localsgd-h100", None)]  # worker methods
    assert [slow_links_runs.local_sgd_period(name) for name, _ in plan] == [25, 100]
    for bad in ("torch-localsgd-h", "torch-localsgd-h0", "torch-localsgd-hx"):
        with pytest.raises(ValueError, match="N >= 1"):
            slow_links.plan_methods([bad])


def test_progress_lines_of_a_node_are_parsed_as_they_grow(tmp_path):
    log = tmp_path / "peer0.log"
    tail = slow_links_runs.LogTail(log)
    assert tail.lines() == []  # not created yet
    log.write_text("node 10.0.0.2:7000 listening on ...\n"
                   "training  step    120  loss 2.1000  acc 0.3125    3.1 step/s  neighbours 3  exchanges 4/4"
                   "  sent 1.0 MB  recv 1.0 MB  rejected 0\ntraining  step    1")
    lines = tail.lines()
    assert len(lines) == 2
    match = slow_links_runs._PROGRESS.match(lines[1])
    assert match.groups() == ("training", "120", "0.3125")
    with open(log, "a") as fh:
        fh.write("30  loss 2.0  acc nan  x\ndone      step    130  loss 1.9  acc 0.3500  ...\n")
    first, last = tail.lines()
    assert slow_links_runs._PROGRESS.match(first).group(2) == "130"
    assert slow_links_runs._PROGRESS.match(last).groups() == ("done", "130", "0.3500")


@pytest.mark.parametrize("args, words", [(["--rates", "fast"], "rate 'fast'"),
                                         (["--methods", "allreduce"], "unknown method"),
                                         (["--task", "nope"], "unknown task"),
                                         (["--rates", "20mbit", "--only-at", "ddp:unlimited"], "not in --rates"),
                                         (["--rates", "20mbit", "--only-at", "gloo:20mbit"], "a method of --methods"),
                                         (["--repeat", "0"], "--repeat must be >= 1")])
def test_the_benchmark_refuses_bad_arguments_in_one_line(args, words, capsys):
    with pytest.raises(SystemExit) as exc:
        slow_links.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.netns
def test_ddp_worker_trains_with_gloo_across_two_shaped_namespaces():
    reason = probe()
    if reason is not None:
        pytest.skip(f"network lab unavailable: {reason}")
    lab = Lab(2, "50mbit", prefix=PREFIX, subnet=SUBNET)
    procs = []
    try:
        lab.up()
        for rank in range(2):
            procs.append(lab.popen(rank, [sys.executable, str(BENCH / "ddp_worker.py"), "--rank", str(rank),
                                          "--world", "2", "--master", f"{lab.addr(0)}:29500", "--task", "synthetic",
                                          "--steps", "150", "--eval-every", "0.2"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-2000:]
        records = [[json.loads(line) for line in out.splitlines() if line.startswith("{")] for out, _ in outs]
        done = [r[-1] for r in records]
        assert all(d["event"] == "done" and d["step"] == 150 for d in done)
        assert done[0]["accuracy"] > 0.5  # rank 0 evaluates the shared model
        assert "accuracy" not in done[1]
        # 150 all-reduces of ~13k float32 gradients went over each peer's shaped link
        for rank in range(2):
            assert lab.tx_bytes(rank) > 150 * 13_000 * 4 * 0.5
            assert done[rank]["tx_bytes"] - records[rank][0]["tx_bytes"] > 150 * 13_000 * 4 * 0.5
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        lab.down()


def test_overhead_is_also_reported_without_start_up_and_in_cpu_seconds():
    co = slow_links_runs.Result("compute_only", "20mbit", train_time_s=110.0, train_phase_s=100.0, cpu_s_per_step=0.02)
    ours = slow_links_runs.Result("p2p-x", "20mbit", train_time_s=132.0, train_phase_s=105.0, cpu_s_per_step=0.021)
    results = {"20mbit": {"compute_only": co, "p2p-x": ours}}
    slow_links_report.compare_with_bounds(results)
    assert ours.step_overhead == pytest.approx(0.2)
    assert ours.phase_overhead == pytest.approx(0.05) and ours.cpu_overhead == pytest.approx(0.05)
    table = slow_links_report.markdown(results, slow_links_runs.Settings("t", 4, 1000, 0, 1.0, 0.5, 600, 0.8), 60.0)
    assert "| 20mbit | p2p-x | 132.0 | +20% | 105.0 | +5% | — | 0.0210 | +5% |" in table
    co.eval_s, ours.eval_s = 20.0, 30.0  # the slower run evaluated more: without that, +(75 / 80 - 1)
    slow_links_report.compare_with_bounds(results)
    assert ours.phase_less_eval_overhead == pytest.approx(75 / 80 - 1)


def test_a_nodes_last_progress_line_gives_its_training_phase_and_gate_wait():
    parse = slow_links_runs.parse_progress
    assert parse("training  step     75  loss 1.6574  acc nan     2.6 step/s  H 25") == {
        "phase": "training", "step": 75, "acc": pytest.approx(float("nan"), nan_ok=True)}
    last = parse("done      step    300  loss 0.7076  acc 0.8173     1.5 step/s  neighbours 1  H 25  "
                 "waited 25.7s  train_started_at 1795676832.861  train_ended_at 1795677017.618  evaluations 41  "
                 "network_cpu_s 12.5")
    assert (last["phase"], last["step"], last["waited"], last["evaluations"]) == ("done", 300, 25.7, 41)
    assert last["network_cpu_s"] == 12.5
    assert last["train_ended_at"] - last["train_started_at"] == pytest.approx(184.757)
    assert parse("node abc listening on 127.0.0.1:7000") is None


def test_a_nodes_json_progress_line_times_its_accuracy_by_the_evaluation():
    """The benchmarks start nodes with --log-format json: an accuracy is timed and stepped by its
    evaluation, as the workers' are, not by when the line was read."""
    parse = slow_links_runs.parse_progress
    assert "--log-format" in slow_links_runs.p2p_node_args("t", 10, 0, 1.0, 0.5, 4, [])
    line = parse('{"event": "progress", "time": 1795676840.5, "phase": "training", "step": 80, "loss": 1.2, '
                 '"accuracy": 0.61, "gate_wait_s": 1.5, "evaluated_at": 1795676839.25, "evaluated_step": 74}')
    assert line == {"phase": "training", "step": 80, "acc": 0.61, "waited": 1.5, "evaluated_at": 1795676839.25,
                    "evaluated_step": 74}
    before = parse('{"event": "progress", "phase": "training", "step": 3, "accuracy": null, "evaluated_at": null, '
                   '"evaluated_step": -1}')
    assert before["step"] == 3 and before["acc"] != before["acc"] and "evaluated_at" not in before
    last = parse('{"event": "done", "phase": "lingering", "step": 300, "accuracy": 0.8, "train_started_at": 10.0, '
                 '"train_ended_at": 200.0, "evaluations": 41, "eval_s": 30.5, "network_cpu_s": 12.5}')
    assert (last["phase"], last["eval_s"], last["train_ended_at"]) == ("done", 30.5, 200.0)
    assert parse('{"event": "resumed", "step": 3}') is None and parse("{not json") is None


def test_short_windows_show_a_stall_that_the_mean_hides(tmp_path):
    """bench/slow_links_windows.py: 100 steps/s for 20 s with a 2-s stall in the middle (a mean
    of 90 steps/s) has a lowest 4-s window of half the rate; compute-only's steady 100 steps/s
    is the reference every share is taken of."""
    def log(path, stall):
        path.parent.mkdir(parents=True)
        t, step, lines = 1000.0, 0, []
        while step < 1800:
            lines.append(json.dumps({"t": t, "step": step}))
            t += 0.5
            step += 0 if stall and 1009.0 <= t < 1011.0 else 50  # 2 s without steps
        path.write_text("\n".join(lines) + "\n" + json.dumps({"time": t, "step": step, "event": "done"}) + "\n")

    log(tmp_path / "20mbit" / "compute_only" / "peer0.log", stall=False)
    log(tmp_path / "20mbit" / "p2p-x" / "peer0.log", stall=True)
    rows = {r["method"]: r for r in slow_links_windows.report(tmp_path, 4.0)}
    assert rows["compute_only"]["median"] == pytest.approx(100.0) and rows["compute_only"]["lowest_x"] == pytest.approx(1.0)
    assert rows["p2p-x"]["median_x"] == pytest.approx(1.0)
    assert rows["p2p-x"]["lowest_x"] == pytest.approx(0.5, abs=0.01)


def test_the_split_shows_where_a_run_is_slower_against_its_own_passs_compute_only(tmp_path):
    """bench/slow_links_windows.py --split 300: a run at half compute-only's speed to step 300 and
    at its speed after is 2x before and 1x after; a second pass's run is compared with its own
    pass's compute-only (here 10% slower than the first)."""
    def log(path, before_s, after_s, t=1000.0):
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"t": t + before_s * k / 300, "step": k}) for k in range(1, 300)]
        lines += [json.dumps({"t": t + before_s + after_s * k / 900, "step": 300 + k}) for k in range(0, 901, 3)]
        path.write_text("\n".join(lines) + "\n")

    for peer in range(2):
        log(tmp_path / "100mbit" / "compute_only" / f"peer{peer}.log", 20.0, 60.0)
        log(tmp_path / "100mbit" / "compute_only-2" / f"peer{peer}.log", 22.0, 66.0)
        log(tmp_path / "100mbit" / "p2p-x" / f"peer{peer}.log", 40.0, 60.0, t=1000.0 + peer)  # peer 1 a second late
        log(tmp_path / "100mbit" / "p2p-x-2" / f"peer{peer}.log", 22.0, 72.6)
    rows = {r["method"]: r for r in slow_links_windows.split(tmp_path, 300)}
    first = rows["p2p-x"]  # from the last peer's first step: peer 1's
    assert first["before_s"] == pytest.approx(40.0 * 299 / 300, abs=0.05) and first["after_s"] == pytest.approx(60.0)
    assert first["before_x"] == pytest.approx(2.0, abs=0.01) and first["after_x"] == pytest.approx(1.0, abs=0.01)
    assert rows["p2p-x-2"]["before_x"] == pytest.approx(1.0, abs=0.01) and rows["p2p-x-2"]["after_x"] == pytest.approx(1.1)
    assert rows["compute_only-2"]["before_x"] == pytest.approx(1.0)


def _rounds_progress(steps_per_s: float, seconds: float) -> "diloco_repair.Progress":
    progress = diloco_repair.Progress([])
    progress.lines = [[(t / 10, int(t / 10 * steps_per_s), {}) for t in range(int(seconds * 10) + 1)]]
    return progress


def test_the_repair_bench_reads_rounds_back_at_codec_level_in_pairs_and_sees_a_real_repair():
    # one round a second (H 25 at 25 steps/s); every round's bytes land half in it and half in
    # the next, alternating 1.3 / 0.2 MB against a steady 0.7: back at level at once, read in pairs
    h, marks = 25, {"steady": 0.0, "cut": 10.0, "restore": 12.0, "end": 30.0}
    progress = _rounds_progress(25.0, 30.0)
    sizes = [0.7] * 10 + [0.7, 0.7] + [1.3 if k % 2 == 0 else 0.2 for k in range(18)]

    def bytes_sent(repair_mb: float = 0.0) -> list[tuple[float, float]]:
        total, tx = 0.0, [(0.0, 0.0)]
        for k, mb in enumerate(sizes):
            total += (mb + (repair_mb if k in (13, 14, 15) else 0.0)) * 1e6
            tx.append((k + 1.0, total))
        return tx

    result = diloco_repair.analyse(progress, bytes_sent(), marks, h, 4.0, cut=3, round_s=1.0)
    assert result["codec_level_mb"] == pytest.approx(0.7) and result["rounds_to_codec_level"] == 1
    # a repair of 1.5 MB a round in the 2nd-4th rounds after the restore (rounds 13-15): back
    # from the 5th, the first whose pair holds none of it
    result = diloco_repair.analyse(progress, bytes_sent(repair_mb=1.5), marks, h, 4.0, cut=3, round_s=1.0)
    assert result["rounds_to_codec_level"] == 5
