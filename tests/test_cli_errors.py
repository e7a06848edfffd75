"""`p2p start` answers every user error with one line naming the problem and a non-zero exit."""

import socket
import subprocess
import sys
import time

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


@pytest.mark.parametrize("args, needle", [
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
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--diloco-outer-lr", "nan"], "--diloco-outer-lr: must be a finite number"),
    (["--listen", "127.0.0.1:7000", "--round-timeout", "inf"], "--round-timeout: must be a finite number"),
    (["--listen", "127.0.0.1:7000", "--algorithm", "diloco", "--compression", "topk"], "diloco does not support"),
])
def test_bad_flags_and_task_specs(args, needle):
    if "--device" in args:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    code, out, err = run_start(*args)
    assert code == 2
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
