"""The `simulate` command, registered on a throwaway typer app like the lead will."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from p2p.cli.simulate import simulate

app = typer.Typer()
app.command("simulate")(simulate)
app.command("noop")(lambda: None)  # two commands, so "simulate" is a real subcommand


def invoke(*args: str):
    return CliRunner().invoke(app, ["simulate", *args])


def test_json_output_is_one_object_and_byte_identical_across_runs():
    args = ("--peers", "20", "--seed", "3", "--loss", "0.01", "--crash", "1", "--duration-s", "40", "--json")
    first, second = invoke(*args), invoke(*args)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout
    doc = json.loads(first.stdout)
    assert doc["seed"] == 3 and doc["peers"] == 20 and doc["detection_s"]["count"] == 1
    for key in ("convergence_periods", "convergence_s", "detection_s", "false_positives",
                "msgs_per_member_s", "bytes_per_member_s", "partition_merge_s"):
        assert key in doc
    assert first.stdout.count("\n") == 1


def test_human_output_is_a_short_table():
    res = invoke("--peers", "10", "--seed", "1", "--duration-s", "20", "--partition", "0.3", "--partition-s", "5",
                 "--join", "1")
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert 5 <= len(lines) <= 12
    assert lines[0].startswith("seed / peers") and "1 / 10" in lines[0]
    assert any(line.startswith("partition merge") for line in lines)


@pytest.mark.parametrize("args, words", [
    (("--loss", "1.0"), "loss"),
    (("--loss", "-0.5"), "loss"),
    (("--peers", "0"), "peers"),
    (("--partition", "1.5"), "partition"),
    (("--partition", "0"), "partition"),
    (("--crash", "5", "--peers", "5"), "crash"),
    (("--membership", "moon"), "--membership"),
    (("--algorithm", "dpsgd", "--duration-s", "30"), "--duration-s: membership simulation only"),
    (("--algorithm", "dpsgd", "--partition", "0.5"), "--partition: membership simulation only"),
])
def test_bad_options_exit_non_zero_with_one_clear_line(args, words):
    res = invoke(*args)
    assert res.exit_code != 0
    assert res.stdout == ""
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and words in err[0]


def test_simulate_with_an_algorithm_runs_the_averaging_simulator():
    import json

    import typer
    from typer.testing import CliRunner

    from p2p.cli.simulate import simulate

    app = typer.Typer()
    app.command()(simulate)
    args = ["--algorithm", "adpsgd", "--topology", "ring", "--peers", "8", "--steps", "120", "--seed", "4", "--json"]
    first, second = CliRunner().invoke(app, args), CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout  # same seed, same bytes
    out = json.loads(first.stdout)
    assert out["algorithm"] == "adpsgd" and out["topology"] == "ring"
    assert out["final_consensus"] < 0.1 * out["initial_consensus"]
    assert out["final_gap"] < 0.1 * out["initial_gap"]
    bad = CliRunner().invoke(app, ["--algorithm", "allreduce"])
    assert bad.exit_code == 2 and "must be one of" in bad.output


def test_simulate_an_algorithm_through_churn_reports_the_swarm_at_the_end():
    args = ("--algorithm", "sgp", "--peers", "8", "--steps", "80", "--seed", "2", "--crash", "1", "--leave", "1",
            "--join", "1", "--json")
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["live_at_end"] == 7 and out["false_positives"] == 0
    assert 0 < out["membership_messages"] < out["messages"]
    assert out["final_consensus"] < 0.1 * out["initial_consensus"]
