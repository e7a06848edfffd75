"""Run a swarm of real ``p2p start`` processes on this machine (demo, tests, benchmarks).

Each peer is a separate OS process listening on its own loopback port; peer i joins through
peer i-1 (so no peer is special after the first hop). Logs go to one file per peer.

With ``identities=True`` every peer gets its own identity file and all share one allow file
listing every peer's key (p2p/net/identity.py), written next to the logs (a swarm key too, if
none was given: identities need one); the harness queries the peers as peer 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from p2p.harness import forked_nodes
from p2p.net.client import QueryError, state, status
from p2p.net.identity import Identity, public_line
from p2p.net.keyring import load_key_file, new_key_line
from p2p.net.ports import free_ports, pair_free


def consensus_distance(vectors: Sequence[np.ndarray]) -> float:
    """Mean L2 distance of each peer's parameters to the swarm mean."""
    stacked = np.stack([np.asarray(v, dtype=np.float64) for v in vectors])
    return float(np.linalg.norm(stacked - stacked.mean(axis=0), axis=1).mean())


def _write(path: Path, text: str, mode: int) -> str:
    """``text`` into ``path`` with ``mode`` from the start (a key file is never readable by others)."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)  # (O_CREAT's mode passes through the umask; an old file keeps its own)
    os.replace(tmp, path)
    return str(path)


class LocalSwarm:
    def __init__(self, peers: int, log_dir: Path, node_args: Sequence[str] = (),
                 ports: Optional[Sequence[int]] = None, host: str = "127.0.0.1",
                 per_peer_args: Optional[Sequence[Sequence[str]]] = None, swarm_key: Optional[str] = None,
                 identities: bool = False) -> None:
        self._chose_ports = ports is None  # so start_peer may choose again; a caller's are kept
        self.ports = list(ports) if ports is not None else free_ports(peers, host)
        self.host = host
        self.addrs = [f"{host}:{p}" for p in self.ports]
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.per_peer_args = [list(a) for a in per_peer_args] if per_peer_args else [[] for _ in self.addrs]
        self.identity: Optional[Identity] = None  # the harness's own queries are signed as peer 0
        self.identity_files: list[str] = []  # peer i's identity file (identities on)
        if identities:
            swarm_key = swarm_key or _write(self.log_dir / "swarm.key", new_key_line() + "\n", 0o600)
            self._make_identities()
        self.swarm_key = swarm_key
        self.node_args = list(node_args) + (["--swarm-key", swarm_key] if swarm_key else [])
        self.keyring = load_key_file(swarm_key) if swarm_key else None  # to query the peers
        self.procs: list[Optional["subprocess.Popen | forked_nodes.ForkedProcess"]] = [None] * peers

    def _make_identities(self) -> None:
        """peerI.id for each peer (fresh keys every run) and allow.txt with all their keys."""
        made = [Identity.generate() for _ in self.addrs]
        allow = _write(self.log_dir / "allow.txt", "".join(f"{public_line(m.public)}  # peer {i}\n"
                                                           for i, m in enumerate(made)), 0o644)
        for i, identity in enumerate(made):
            self.identity_files.append(_write(self.log_dir / f"peer{i}.id", identity.file_text(), 0o600))
            self.per_peer_args[i] += ["--identity", self.identity_files[i], "--allow", allow]
        self.identity = made[0]

    def command(self, i: int, join: Sequence[str]) -> list[str]:
        cmd = [sys.executable, "-m", "p2p", "start", "--listen", self.addrs[i], "--threads", "1",
               *self.node_args, *self.per_peer_args[i]]
        for address in join:
            cmd += ["--join", address]
        return cmd

    def start_peer(self, i: int, join: Sequence[str]) -> "subprocess.Popen | forked_nodes.ForkedProcess":
        if self.procs[i] is None and self._chose_ports and not pair_free(self.host, self.ports[i]):
            # Chosen free at construction, but the ports come from the ephemeral range, and a peer
            # started late (a joiner, after the others trained) can find one taken meanwhile by an
            # outgoing connection: it would exit at once, "address in use", and a test would wait
            # for its status until its deadline. Before its first start nobody knows its address.
            # Not another peer's pair: one started just before may not have bound it yet (seen:
            # the new port was peer 0's, and peer 0, still importing, exited "address in use").
            others = [p for j, p in enumerate(self.ports) if j != i]
            self.ports[i] = free_ports(1, self.host, avoid=others)[0]
            self.addrs[i] = f"{self.host}:{self.ports[i]}"
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        proc = forked_nodes.popen(self.command(i, join), env, self.log_dir / f"peer{i}.log")
        self.procs[i] = proc
        return proc

    def start(self) -> None:
        for i in range(len(self.addrs)):
            self.start_peer(i, [self.addrs[i - 1]] if i else [])

    def log_tail(self, i: int, lines: int = 5) -> str:
        path = self.log_dir / f"peer{i}.log"
        text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return "\n".join(text[-lines:])

    def alive(self, i: int) -> bool:
        proc = self.procs[i]
        return proc is not None and proc.poll() is None

    def status(self, i: int, timeout_s: float = 1.0) -> Optional[dict]:
        """The peer's status, or None if it is not running or does not answer in time."""
        if not self.alive(i):
            return None
        try:
            return status(self.addrs[i], timeout_s, self.keyring, self.identity)
        except QueryError:
            return None

    def params(self, i: int, timeout_s: float = 5.0) -> Optional[np.ndarray]:
        if not self.alive(i):
            return None
        try:
            return np.array(state(self.addrs[i], timeout_s, self.keyring, self.identity).params)  # copy out of the frame
        except QueryError:
            return None

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def wait(self, timeout_s: Optional[float] = None) -> list[Optional[int]]:
        """Wait for every peer to exit on its own; returns exit codes (None: still running)."""
        return self._exit_codes(None if timeout_s is None else time.monotonic() + timeout_s, kill_late=False)

    def stop(self, timeout_s: float = 15.0) -> list[Optional[int]]:
        """SIGTERM every peer, wait, SIGKILL stragglers. Returns exit codes."""
        for i in range(len(self.procs)):
            self.kill(i, signal.SIGTERM)
        return self._exit_codes(time.monotonic() + timeout_s, kill_late=True)

    def _exit_codes(self, deadline: Optional[float], kill_late: bool) -> list[Optional[int]]:
        """Each peer's exit code once it exits by ``deadline``; after it, SIGKILL (``kill_late``)
        or None."""
        floor = 0.1 if kill_late else 0.0  # a last moment to exit before SIGKILL
        codes: list[Optional[int]] = []
        for proc in self.procs:
            if proc is None:
                codes.append(None)
                continue
            try:
                codes.append(proc.wait(None if deadline is None else max(floor, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if kill_late:
                    codes.append(self._kill_late(self.procs.index(proc)))
                else:
                    codes.append(None)
        return codes

    def _kill_late(self, i: int) -> int:
        """A peer that missed its stop deadline: ask for its threads' stacks (SIGUSR1,
        faulthandler in p2p/cli/start.py), SIGKILL it, and print its log's tail to stderr, so a
        test that fails on its exit code shows what it was stuck in."""
        proc = self.procs[i]
        proc.send_signal(signal.SIGUSR1)
        try:
            return proc.wait(2.0)  # it may still finish meanwhile
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        print(f"local_swarm: peer {i} did not stop in time (SIGKILL); the end of its log, with its stacks:\n"
              f"{self.log_tail(i, 80)}", file=sys.stderr)
        return code

    def __enter__(self) -> "LocalSwarm":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # a test failed in the block: show what each peer was doing
            for i in range(len(self.procs)):
                if self.procs[i] is not None:
                    code = self.procs[i].poll()
                    print(f"local_swarm: peer {i} at {self.addrs[i]} ({'running' if code is None else f'exited {code}'}),"
                          f" the end of its log:\n{self.log_tail(i, 25)}", file=sys.stderr)
        self.stop(timeout_s=5.0)
