"""`p2p start` answers every user error with one line naming the problem and a non-zero exit."""

import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from p2p.net.ports import free_ports

pytestmark = pytest.mark.integration


def run_start(*args, timeout=60):
    proc = subprocess.run([sys.executable, "-m", "p2p", "start", *args], capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr.strip().splitlines()


def one_error_line(lines):
    errors = [line for line in lines if line.startswith("p2p: error:")]
    assert len(lines) == 1 and len(errors) == 1, lines
    return errors[0]


BAD_FLAGS = [
    (["--listen", "127.0.0.1:7000", "--bogus"], "No such option: --bogus"),
    (["--join", "127.0.0.1:7001"], "--listen HOST:PORT is required"),
    (["--listen", "127.0.0.1:7000", "--log-format", "xml"], "--log-format: unknown value 'xml'"),
    (["--listen", "127.0.0.1:7000", "--metrics", "nohost"], "--metrics: address 'nohost'"),
    (["--listen", "127.0.0.1"], "--listen"),
    (["--listen", "127.0.0.1:99999"], "port must be 1..65535"),
    (["--listen", "127.0.0.1:65535"], "no room for the bulk port"),
    (["--listen", "127.0.0.1:7000", "--advertise", "0.0.0.0:7000"], "--advertise: address '0.0.0.0:7000': a wildcard host"),
    (["--listen", "127.0.0.1:7000", "--diloco-inner-steps", "5"], "--diloco-inner-steps: is a setting of algorithm diloco, not of adpsgd"),
    (["--listen", "127.0.0.1:7000", "--precision", "fp8"], "--precision: unknown value 'fp8'"),
    (["--listen", "127.0.0.1:7000", "--join", "nohost"], "--join"),
    (["--listen", "127.0.0.1:7000", "--shard", "5/4"], "--shard"),
    (["--listen", "127.0.0.1:7000", "--steps", "0"], "--steps"),
    (["--listen", "127.0.0.1:7000", "--seed", "abc"], "Invalid value for '--seed'"),
    (["--listen", "127.0.0.1:7000", "--task", "no_such_module:Task"], "cannot import module 'no_such_module'"),
    (["--listen", "127.0.0.1:7000", "--task", "nodes.synthetic:Nope"], "has no attribute 'Nope'"),
    (["--listen", "127.0.0.1:7000", "--task", "mnist"], "unknown task 'mnist'"),
    (["--listen", "127.0.0.1:7000", "--device", "cuda:0"], "CUDA is not available"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "allreduce"], "--algorithm: unknown value 'allreduce'"),
    (["--listen", "127.0.0.1:7000", "--topology", "star"], "--topology: unknown value 'star'"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-outer-momentum", "1"], "--diloco-outer-momentum"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-outer-lr", "0"], "--diloco-outer-lr"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-inner-steps", "fast"],
     "--diloco-inner-steps: expected an integer >= 1 or auto, got 'fast'"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-inner-steps", "0"],
     "--diloco-inner-steps: must be >= 1"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--topology", "ring", "--diloco-gossip-rounds", "3",
      "--diloco-inner-steps", "auto"], "inner_steps 'auto' needs gossip_rounds 1"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-outer-lr", "nan"], "--diloco-outer-lr: must be a finite number"),
    (["--listen", "127.0.0.1:7000", "--round-timeout", "inf"], "--round-timeout: must be a finite number"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "topk"], "diloco does not support"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "sparseloco", "--diloco-gossip-rounds", "2"],
     "only with one gossip round"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "sparseloco", "--compression-block", "20000"],
     "sparseloco block must be an int in [1, 16384]"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "sparseloco", "--diloco-reduce-scatter"],
     "diloco reduce-scatter takes the dense codecs, not 'sparseloco'"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "int4", "--diloco-dense-rounds", "4"],
     "--diloco-dense-rounds: needs --compression sparseloco"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-inner-steps", "auto", "--diloco-warmup-steps", "100"],
     "--diloco-warmup-steps: warmup_steps needs a fixed inner_steps"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-warmup-inner-steps", "0"],
     "--diloco-warmup-inner-steps: must be >= 1"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "sparseloco", "--diloco-warmup-steps",
      "300", "--diloco-warmup-topk-fraction", "1.5"], "--diloco-warmup-topk-fraction: must be > 0 and <= 1"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "sparseloco",
      "--diloco-warmup-topk-fraction", "0.1"], "--diloco-warmup-topk-fraction: warmup_topk_fraction needs warmup_steps"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "int4", "--diloco-warmup-steps", "300",
      "--diloco-warmup-topk-fraction", "0.1"], "--diloco-warmup-topk-fraction: needs --compression sparseloco"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-overlap-steps", "2"],
     "--diloco-overlap-steps: overlap_steps needs overlap"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-overlap", "--diloco-overlap-steps", "0"],
     "--diloco-overlap-steps: must be >= 1"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--topology", "ring", "--diloco-reduce-scatter"],
     "--diloco-reduce-scatter: needs --topology full"),
]


def cuda_case(args):
    """A case that expects no CUDA, on a machine that has it (skipped: it would train)."""
    if "--device" not in args:
        return False
    import torch
    return torch.cuda.is_available()


# Runs each case in a process of its own, forked from one that imported the CLI (and torch)
# once: the real entry point (p2p.cli.app.main), exit code and stderr of a process per case,
# without 32 Python, numpy and torch start-ups (~1.4-3 CPU-s each: this module's fixture took
# ~33 s of the suite). The parent starts no threads before forking; the test below still runs
# `python -m p2p start` whole.
FORKED_CASES = r"""
import json, os, sys
import torch  # (what the cases that get as far as loading a task import; no threads yet)
import p2p.training.node
from p2p.cli.app import main
children = []
for argv in json.loads(sys.argv[1]):  # all at once (an error's stderr fits in the pipe)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        try:
            main(["start", *argv])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 99
        sys.stderr.flush()
        os._exit(code)
    os.close(write)
    children.append((pid, read))
out = []
for pid, read in children:
    with os.fdopen(read, "rb") as pipe:
        err = pipe.read().decode(errors="replace")
    out.append((os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), err))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def bad_flag_runs():
    """Every BAD_FLAGS command run once, each in its own process (FORKED_CASES): index -> (code,
    stderr lines), None for a case this machine skips. They all fail before binding a port, so
    the shared --listen address is never contended."""
    import json

    cases = [i for i, (args, _) in enumerate(BAD_FLAGS) if not cuda_case(args)]
    proc = subprocess.run([sys.executable, "-c", FORKED_CASES, json.dumps([BAD_FLAGS[i][0] for i in cases])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = {i: (code, err.strip().splitlines()) for i, (code, err) in zip(cases, json.loads(proc.stdout))}
    return {i: results.get(i) for i in range(len(BAD_FLAGS))}


def test_a_bad_flag_and_a_bad_task_spec_each_end_python_m_p2p_with_one_line():
    """The same answers from whole `python -m p2p start` processes (the forked runs above share
    one interpreter start-up): one of a flag, one of a task spec, run side by side."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda case: run_start(*case[0]), (BAD_FLAGS[0], BAD_FLAGS[14])))
    for (code, _, err), (_, needle) in zip(runs, (BAD_FLAGS[0], BAD_FLAGS[14])):
        assert code == 2 and needle in one_error_line(err)


@pytest.mark.parametrize("index", range(len(BAD_FLAGS)), ids=[f"{i}-{needle}" for i, (_, needle) in enumerate(BAD_FLAGS)])
def test_bad_flags_and_task_specs(index, bad_flag_runs):
    args, needle = BAD_FLAGS[index]
    if cuda_case(args):
        pytest.skip("this machine has CUDA")
    code, err = bad_flag_runs[index]
    assert code == 2, err
    assert needle in one_error_line(err)


def test_port_in_use():
    (port,) = free_ports(1)
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        code, _, err = run_start("--listen", f"127.0.0.1:{port}")
    finally:
        holder.close()
    assert code == 1
    assert "address already in use" in one_error_line(err)


def test_join_address_that_never_answers_gives_up_after_the_timeout():
    listen, silent = free_ports(2)
    t0 = time.monotonic()
    code, _, err = run_start("--listen", f"127.0.0.1:{listen}", "--join", f"127.0.0.1:{silent}",
                             "--join-timeout", "2")
    elapsed = time.monotonic() - t0
    assert code == 1
    line = one_error_line([l for l in err if "WARNING" not in l])
    assert "no join address answered within 2s" in line and f"127.0.0.1:{silent}" in line
    assert elapsed >= 2.0  # it kept retrying for the whole timeout


def test_every_swarm_setting_is_a_flag_of_p2p_start():
    import inspect

    from p2p.cli.start import flag_of, start
    from p2p.config import SETTINGS

    params = inspect.signature(start).parameters
    for name in SETTINGS:
        assert name in params, f"setting {name} has no flag"
        assert flag_of(name) in params[name].default.param_decls[0], name


def test_swarm_key_files_others_can_read_or_that_hold_no_key_are_one_line(tmp_path):
    import os

    from p2p.net.keyring import new_key_line

    loose = tmp_path / "loose.key"
    loose.write_text(new_key_line() + "\n")
    os.chmod(loose, 0o644)
    empty = tmp_path / "empty.key"
    empty.write_text("# nothing yet\n")
    os.chmod(empty, 0o600)
    code, _, err = run_start("--listen", "127.0.0.1:7000", "--swarm-key", str(loose))
    assert code == 2 and f"--swarm-key: swarm key file {loose} is accessible to other users" in one_error_line(err)
    assert f"chmod 600 {loose}" in err[0]
    env = dict(os.environ, P2P_SWARM_KEY=str(empty))  # the environment maps to the same setting
    proc = subprocess.run([sys.executable, "-m", "p2p", "start", "--listen", "127.0.0.1:7000"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "holds no key" in one_error_line(proc.stderr.strip().splitlines())
    assert "P2P_SWARM_KEY" in proc.stderr


def test_keygen_prints_a_key_or_writes_a_new_file_only_its_owner_can_read(tmp_path):
    import os

    from p2p.net.keyring import load_key_file

    out = subprocess.run([sys.executable, "-m", "p2p", "keygen"], capture_output=True, text=True, timeout=60)
    path = tmp_path / "printed.key"
    path.write_text(out.stdout)
    os.chmod(path, 0o600)
    assert out.returncode == 0 and len(load_key_file(str(path)).keys) == 1
    target = tmp_path / "swarm.key"
    for attempt in range(2):
        made = subprocess.run([sys.executable, "-m", "p2p", "keygen", "--out", str(target)], capture_output=True,
                              text=True, timeout=60)
        if attempt == 0:
            assert made.returncode == 0 and os.stat(target).st_mode & 0o777 == 0o600
            first = load_key_file(str(target))
        else:  # never overwritten
            assert made.returncode == 2 and "exists" in one_error_line(made.stderr.strip().splitlines())
            assert load_key_file(str(target)) == first
