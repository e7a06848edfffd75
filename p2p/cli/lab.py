"""``p2p lab ...``: the shaped-network lab (p2p/harness/lab.py) from the command line. Needs root.

    p2p lab up --peers 4 --rate 100mbit      # namespaces p2plab-0..3 on bridge p2plab-br
    p2p lab status                           # namespaces, addresses, rates, link state
    p2p lab run --peers 4 --rate 20mbit --task synthetic --steps 800 -- --avg-interval 0.1
    p2p lab cut 2 / p2p lab restore 2        # from another terminal, while `run` runs
    p2p lab down                             # removes it all (also after a crash)

Every command finds the lab from ``--prefix`` alone (names are derived from it), so no state
file is kept. Errors end in one line on stderr and exit code 2 (bad value) or 1 (failure).
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import typer

from p2p.cli.errors import CliError, read_key_file
from p2p.harness.lab import DEFAULT_PREFIX, DEFAULT_SUBNET, Lab, LabError, LabSwarm, parse_rate

lab_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="A shaped-network lab: one network namespace per peer, tbf-limited links (needs root).",
)

PREFIX = typer.Option(DEFAULT_PREFIX, help="Name prefix of the lab's namespaces and interfaces.")


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"p2p lab: error: {message}", err=True)
    raise typer.Exit(code)


def _lab(peers: int, rate: Optional[str], prefix: str, subnet: str) -> Lab:
    try:
        return Lab(peers, rate, prefix=prefix, subnet=subnet)
    except LabError as exc:
        _fail(str(exc), 2)
        raise  # unreachable


def _attach(prefix: str) -> Lab:
    try:
        return Lab.attach(prefix)
    except LabError as exc:
        _fail(str(exc))
        raise  # unreachable


def _print_lab(lab: Lab, as_json: bool = False) -> None:
    rows = lab.info()
    if as_json:
        print(json.dumps({"prefix": lab.prefix, "subnet": lab.subnet, "bridge": lab.bridge,
                          "bridge_addr": lab.bridge_addr,
                          "peers": [{"index": r.index, "namespace": r.namespace, "addr": r.addr,
                                     "rate": r.rate, "link_up": r.link_up,
                                     "tx_bytes": lab.tx_bytes(r.index), "rx_bytes": lab.rx_bytes(r.index)}
                                    for r in rows]}))
        return
    print(f"lab {lab.prefix}: bridge {lab.bridge} {lab.bridge_addr} ({lab.subnet}), {lab.peers} peers")
    print(f"{'peer':>4}  {'namespace':14s} {'address':15s} {'rate':10s} {'link':5s} {'sent MB':>9s} {'recv MB':>9s}")
    for r in rows:
        print(f"{r.index:4d}  {r.namespace:14s} {r.addr:15s} {r.rate:10s} {'up' if r.link_up else 'CUT':5s} "
              f"{lab.tx_bytes(r.index) / 1e6:9.2f} {lab.rx_bytes(r.index) / 1e6:9.2f}")


@lab_app.command()
def up(
    peers: int = typer.Option(4, help="Number of peers (namespaces)."),
    rate: str = typer.Option("unlimited", help="Per-peer rate, each direction: 100mbit, 20mbit, ..., unlimited."),
    prefix: str = PREFIX,
    subnet: str = typer.Option(DEFAULT_SUBNET, help="IPv4 subnet of the bridge (bridge .1, peer i .i+2)."),
) -> None:
    """Build the lab (replacing an earlier one with the same prefix)."""
    lab = _lab(peers, rate, prefix, subnet)
    try:
        lab.up()
    except LabError as exc:
        _fail(str(exc))
    _print_lab(lab)


@lab_app.command()
def down(prefix: str = PREFIX) -> None:
    """Remove the lab: stop processes inside it, delete its namespaces, veths and bridge."""
    try:
        Lab(1, None, prefix=prefix).down()
    except LabError as exc:
        _fail(str(exc))
    print(f"lab {prefix}: down")


@lab_app.command()
def cut(peer: int = typer.Argument(..., help="Peer index."), prefix: str = PREFIX) -> None:
    """Take one peer's link down (it keeps running, cut off)."""
    lab = _attach(prefix)
    try:
        lab.cut(peer)
    except LabError as exc:
        _fail(str(exc))
    print(f"peer {peer} ({lab.addr(peer)}): link cut")


@lab_app.command()
def restore(peer: int = typer.Argument(..., help="Peer index."), prefix: str = PREFIX) -> None:
    """Bring a cut peer's link back up."""
    lab = _attach(prefix)
    try:
        lab.restore(peer)
    except LabError as exc:
        _fail(str(exc))
    print(f"peer {peer} ({lab.addr(peer)}): link restored")


@lab_app.command()
def status(prefix: str = PREFIX,
           as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """List the lab's namespaces, addresses, rates, link state and byte counters."""
    _print_lab(_attach(prefix), as_json)


def _peer_line(i: int, info: Optional[dict]) -> str:
    if info is None:
        return f"  peer {i}: (no answer)"
    avg = info.get("averaging", {})
    return (f"  peer {i}: {info['phase']:9s} step {info['step']:6d} acc {info['accuracy']:.4f} "
            f"exchanges {avg.get('exchanges_completed', 0)} sent {info['bytes_sent'] / 1e6:.1f} MB "
            f"recv {info['bytes_received'] / 1e6:.1f} MB")


def _query_flags(swarm: LabSwarm) -> str:
    """What `p2p status` needs to be answered by a sealed swarm (an identity: peer 0's)."""
    return ((f" --swarm-key {swarm.swarm_key}" if swarm.swarm_key else "")
            + (f" --identity {swarm.identity_files[0]}" if swarm.identity_files else ""))


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@lab_app.command()
def run(
    peers: Optional[int] = typer.Option(None, help="Peers (default: the lab that is up, else 4)."),
    rate: Optional[str] = typer.Option(None, help="Link rate (default: the lab that is up, else unlimited)."),
    task: str = typer.Option("synthetic", help="Task for every peer."),
    steps: Optional[int] = typer.Option(None, help="Training steps per peer (default: until Ctrl-C)."),
    seed: int = typer.Option(0, help="Run seed (the same on every peer)."),
    port: int = typer.Option(7000, help="Port every peer listens on, at its namespace address."),
    join: str = typer.Option("previous", help="Peer i joins 'previous' (i-1) or 'first' (peer 0)."),
    shard: bool = typer.Option(True, help="Give peer i the data shard i/N."),
    log_dir: Optional[Path] = typer.Option(None, help="Directory for peerI.log (default: a new one under /tmp)."),
    status_every: float = typer.Option(5.0, help="Seconds between status summaries (0: none)."),
    keep_lab: bool = typer.Option(False, help="Leave a lab this command built up when it ends."),
    swarm_key: Optional[str] = typer.Option(None, "--swarm-key", envvar="P2P_SWARM_KEY",
                                            help="Key file (p2p keygen) every peer seals its messages with."),
    identities: bool = typer.Option(False, "--identities", help="Give each peer its own identity and all one allow file, made in the log directory (with a swarm key, if --swarm-key is not given)."),
    prefix: str = PREFIX,
    subnet: str = typer.Option(DEFAULT_SUBNET, help="Subnet, when this command builds the lab."),
    extra: Optional[List[str]] = typer.Argument(None, help="Extra `p2p start` arguments, after --."),
) -> None:
    """Run one `p2p start` per namespace until they finish (or Ctrl-C), then stop them."""
    if steps is not None and steps < 1:
        _fail(f"--steps must be >= 1, got {steps}", 2)
    if not 0 < port < 65536:
        _fail(f"--port must be in 1..65535, got {port}", 2)
    if join not in ("previous", "first"):
        _fail(f"--join must be 'previous' or 'first', got {join!r}", 2)
    try:
        read_key_file(swarm_key)
    except CliError as exc:
        _fail(str(exc), 2)
    try:
        rate_bps = parse_rate(rate) if rate is not None else None
    except LabError as exc:
        _fail(str(exc), 2)
    try:
        existing: Optional[Lab] = Lab.attach(prefix)
    except LabError:
        existing = None
    wanted_rate = rate if rate is not None else (existing.rate if existing else None)
    if existing is not None and (peers is None or peers == existing.peers) and (
            rate is None or rate_bps == existing.rate_bps):
        lab, owned = existing, False
        print(f"using lab {prefix} that is up: {lab.peers} peers, {lab.rate or 'unlimited'}")
    else:
        lab, owned = _lab(peers or 4, wanted_rate, prefix, subnet), True
        try:
            lab.up()
        except LabError as exc:
            _fail(str(exc))
        print(f"lab {prefix} up: {lab.peers} peers at {lab.rate or 'unlimited'} on {lab.subnet}")
    log_path = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=f"{prefix}-run-"))
    node_args = ["--task", task, "--seed", str(seed), "--join-timeout", "60"]
    if steps is not None:
        node_args += ["--steps", str(steps)]
    node_args += list(extra or [])
    per_peer = [["--shard", f"{i}/{lab.peers}"] if shard else [] for i in range(lab.peers)]
    swarm = LabSwarm(lab, log_path, node_args, port=port, per_peer_args=per_peer, join=join, swarm_key=swarm_key,
                     identities=identities)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    codes: list = []
    try:
        swarm.start()
        print(f"{lab.peers} peers started; logs: {log_path}/peer0.log .. peer{lab.peers - 1}.log")
        for i in range(lab.peers):
            print(f"  peer {i}: {swarm.addrs[i]} in namespace {lab.ns(i)}")
        print(f"query one: p2p status --peer {swarm.addrs[0]}{_query_flags(swarm)}; "
              f"cut one: p2p lab cut 1 --prefix {prefix}; stop: Ctrl-C", flush=True)
        last = time.monotonic()
        while any(swarm.alive(i) for i in range(lab.peers)):
            time.sleep(0.2)
            if status_every > 0 and time.monotonic() - last >= status_every:
                last = time.monotonic()
                print(f"[{time.strftime('%H:%M:%S')}]")
                for i in range(lab.peers):
                    print(_peer_line(i, swarm.status(i, timeout_s=0.5)))
                sys.stdout.flush()
    except KeyboardInterrupt:
        print("stopping the peers", flush=True)
    finally:
        codes = swarm.stop(timeout_s=20.0)
        signal.signal(signal.SIGTERM, previous)
        if owned and not keep_lab:
            lab.down()
            print(f"lab {prefix}: down")
    print(f"exit codes: {codes}; logs in {log_path}")
    failed = [i for i, c in enumerate(codes) if c not in (0, None, -signal.SIGINT, -signal.SIGTERM)]
    if failed:
        for i in failed:
            print(f"peer {i} failed (exit {codes[i]}); last lines:\n{swarm.log_tail(i)}", file=sys.stderr)
        raise typer.Exit(1)
