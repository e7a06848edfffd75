"""The tests' fork server (p2p/harness/forked_nodes.py) gives a command what a fresh interpreter
would: its environment and arguments, its output in the log, its exit code, death by a signal;
and starts afresh what it cannot fork."""

import signal
import subprocess
import sys

import pytest

from p2p.harness import forked_nodes
from tests.conftest import wait_until

SCRIPT = """
import os, sys, time
print("argv", sys.argv[1:], "env", os.environ.get("FORKED_TEST_VALUE"), flush=True)
if sys.argv[1] == "sleep":
    print("ready", flush=True)
    time.sleep(120)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "child.py"
    path.write_text(SCRIPT)
    return str(path)


def test_a_forked_script_gets_its_arguments_and_environment_and_exits_with_its_code(script, tmp_path):
    log = tmp_path / "child.log"
    proc = forked_nodes.popen([sys.executable, script, "3"], {"FORKED_TEST_VALUE": "seven"}, log)
    assert isinstance(proc, forked_nodes.ForkedProcess)
    assert proc.wait(60) == 3 and proc.poll() == 3 and proc.returncode == 3
    assert "argv ['3'] env seven" in log.read_text()


def test_a_forked_node_runs_the_command_line_and_its_usage_error_exits_2(tmp_path):
    log = tmp_path / "node.log"
    proc = forked_nodes.popen([sys.executable, "-m", "p2p", "start", "--no-such-flag"], {}, log)
    assert proc.wait(60) == 2
    assert "No such option: --no-such-flag" in log.read_text()


def test_a_forked_child_runs_until_killed_and_reports_the_signal(script, tmp_path):
    log = tmp_path / "child.log"
    proc = forked_nodes.popen([sys.executable, script, "sleep"], {}, log)
    wait_until(lambda: "ready" in log.read_text(), 60, what="the child to start")
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL


def test_what_cannot_be_forked_is_started_afresh(tmp_path):
    proc = forked_nodes.popen([sys.executable, "-c", "raise SystemExit(4)"], {}, tmp_path / "c.log")
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 4
