"""The command line loads only the command it runs (p2p/cli/app.py, "Why commands load lazily"),
and a command parses the same alone as in the whole app."""

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from p2p.cli.app import COMMANDS, build_app

HEAVY = ("torch", "p2p.config", "p2p.averaging.registry", "p2p.harness.lab", "p2p.sim.engine")


def loaded_after(argv: list[str]) -> set[str]:
    """The heavy modules a fresh interpreter holds after running ``p2p ARGV``."""
    code = ("import sys\nfrom p2p.cli.app import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print('loaded:', *(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    return set(out.stdout.splitlines()[-1].split()[1:])  # the help text comes before


@pytest.mark.parametrize("argv", [["status", "--help"], ["keygen", "--help"], ["export", "--help"]])
def test_a_light_command_does_not_load_the_training_stack(argv):
    assert loaded_after(argv) == set()


def test_start_loads_the_config_but_not_the_lab_or_the_simulator():
    assert loaded_after(["start", "--help"]) == {"p2p.config", "p2p.averaging.registry"}


def test_the_whole_app_is_built_for_the_top_level_help_and_a_misspelt_command():
    assert set(HEAVY) - {"torch"} <= loaded_after(["--help"])
    assert set(HEAVY) - {"torch"} <= loaded_after(["strat"])


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_alone_parses_and_helps_as_in_the_whole_app(name):
    alone, whole = CliRunner().invoke(build_app(name), [name, "--help"]), CliRunner().invoke(build_app(), [name, "--help"])
    assert alone.exit_code == whole.exit_code == 0
    assert alone.output == whole.output
    group = typer.main.get_command(build_app(name))
    assert list(group.list_commands(None)) == [name]  # still a group: "p2p NAME ...", not "p2p ..."
