"""Start ``p2p start`` nodes (and the examples' scripts) as forks of one interpreter that has
already imported torch.

Why: a fresh ``python -m p2p start`` spends ~6 s of CPU on imports before it reads a flag
(``import torch`` ~3.4 s, and ``torch._dynamo``, which torch loads at a process's first
optimizer, ~3 s more; on a 2-core machine that is 7-9 s to a node's first status), and the test
suite starts well over a hundred nodes. Python's ``forkserver`` (multiprocessing) keeps one
process that imported ``PRELOAD`` and ran nothing else, and forks a child from it for each
node: the child runs the same command line (``p2p.cli.app.main``; a script as ``__main__``) in
its own process with its own sockets, model, environment and log, exits with the command's
code, and dies by a signal like any process. What it skips is the imports, and that is what PyTorch's own
DataLoader workers rely on too (a fork after ``import torch``, before any thread pool runs).

Used by the tests only (``use_forks``, set by tests/conftest.py, so no subprocess inherits it):
the demo, the lab and users' commands always start a fresh interpreter, and the tests of the
command line (its errors, ``p2p demo``, ``export``, restarts by ``run_cli``) and of start-up
itself (bench/startup.py) run ``python -m p2p`` as users do.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

# What a node imports before its first status (p2p start's own modules load lazily: app.py), and
# what the examples' scripts import.
PRELOAD = ["numpy", "zmq", "torch", "torch._dynamo", "torch.optim", "torch.utils.data", "p2p", "p2p.cli.app",
           "p2p.cli.start", "nodes.synthetic"]
# Read once by libraries as they load (OpenBLAS sizes its thread pool at import): the server's
# imports must see what every node is started with.
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

use_forks = False  # True: ``popen`` forks (tests/conftest.py sets it; never inherited by a subprocess)
_context: Optional[multiprocessing.context.BaseContext] = None


def popen(command: Sequence[str], env: dict, log_path: Path) -> "subprocess.Popen | ForkedProcess":
    """``command`` (``python -m p2p ...`` or ``python SCRIPT ...``) started with ``env``, its
    stdout and stderr appended to ``log_path``: forked from the server when ``use_forks``, else a
    fresh interpreter."""
    if use_forks and forkable(command):
        return ForkedProcess(command, env, log_path)
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=env)


def forkable(command: Sequence[str]) -> bool:
    """``python -m p2p ...`` or ``python SCRIPT.py ...`` (anything else is started afresh)."""
    return list(command[1:3]) == ["-m", "p2p"] or (len(command) > 1 and str(command[1]).endswith(".py"))


def _server() -> multiprocessing.context.BaseContext:
    """The fork server's context, its server started on first use with ``THREAD_ENV`` in its
    environment (this process's own environment is left as it was)."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        saved = {k: os.environ.get(k) for k in THREAD_ENV}
        os.environ.update(THREAD_ENV)
        try:
            from multiprocessing import forkserver
            forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _context = context
    return _context


def _run(command: Sequence[str], env: dict, log_path: str) -> None:
    """In the forked child: the environment, the log as stdout and stderr, then the command as
    the interpreter would run it (``-m p2p``: the command line's ``main``; a script: run as
    ``__main__``); a ``SystemExit``'s code is the process's exit code."""
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered, as PYTHONUNBUFFERED logs
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    args = list(command[1:])
    if args[:2] == ["-m", "p2p"]:
        sys.argv = ["p2p", *args[2:]]
        from p2p.cli.app import main
        main(args[2:])
    else:
        sys.argv = args
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))  # as ``python SCRIPT`` does
        runpy.run_path(args[0], run_name="__main__")


class ForkedProcess:
    """The part of ``subprocess.Popen`` that LocalSwarm and the tests use, for a forked child."""

    def __init__(self, command: Sequence[str], env: dict, log_path: Path) -> None:
        if not forkable(command):
            raise ValueError(f"forked_nodes runs `python -m p2p ...` or `python SCRIPT.py ...`, not {command}")
        open(log_path, "ab").close()  # there from the start, as Popen's would be
        # daemon: a child left running when the tests end is killed, not waited for
        self._process = _server().Process(target=_run, args=(list(command), dict(env), str(log_path)),
                                          name="p2p-forked", daemon=True)
        self._process.start()
        self.pid = self._process.pid
        self.args = list(command)

    @property
    def returncode(self) -> Optional[int]:
        return self._process.exitcode

    def poll(self) -> Optional[int]:
        return self._process.exitcode

    def wait(self, timeout: Optional[float] = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it exited meanwhile
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
