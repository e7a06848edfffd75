"""The ``p2p`` command line: flags -> frozen config objects -> library calls.

This is the only place that reads flags (and, for the cache directory, the environment).
Every user error ends in one line on stderr that names the problem and a non-zero exit:
2 for a bad flag or value, 1 for a runtime failure (port in use, no peer answered).
"""

from __future__ import annotations

import json
import logging
import math
import signal
import sys
from typing import List, Optional

import typer
from typer.exceptions import TyperException

from p2p.net.addresses import AddressError, bulk_address, parse_address

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Decentralized peer-to-peer training of PyTorch models over ZeroMQ.",
)


class CliError(Exception):
    """A user error: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _check_address(flag: str, value: str, *, allow_wildcard: bool = True) -> str:
    try:
        parse_address(value, allow_wildcard=allow_wildcard)
    except AddressError as exc:
        raise CliError(f"{flag}: {exc}") from None
    return value


# Names the CLI offers, kept here so --help needs no heavy imports; tests check they match
# the registries (p2p.averaging.registry.ALGORITHMS, p2p.topology.TOPOLOGIES).
ALGORITHM_NAMES = ("dpsgd", "adpsgd", "sgp", "elastic", "gossipgrad", "diloco", "choco")
TOPOLOGY_NAMES = ("ring", "torus", "exponential", "one-peer-exponential", "hypercube", "random", "full")
MEMBERSHIP_PRESETS = ("lan", "wan", "local")
ROUND_TIMEOUT_S = 5.0  # per-step rounds (dpsgd, gossipgrad): a missing neighbour costs this per step
DILOCO_ROUND_TIMEOUT_S = 20.0  # once per H steps: covers a 12 MB round at 20 Mbit/s (7 s) with room; a joiner costs one


COMPRESSION_NAMES = ("none", "fp16", "bf16", "int8", "int4", "topk", "sign", "auto")


def _averaging_config(algorithm: str, topology: Optional[str], **fields):
    """Build the AveragingConfig, and check the algorithm can run as asked, before any socket
    is opened: every problem is one line naming the flag to change."""
    from p2p.averaging.base import AveragingConfig
    from p2p.averaging.registry import check_combination, make_averager, natural_topology
    from p2p.protocol import LocalProtocolError

    try:
        config = AveragingConfig(**fields)
    except ValueError as exc:  # messages name the field; the flag is the same with dashes
        raise CliError(f"averaging settings: {exc} (flags: p2p start --help)") from None
    try:
        check_combination(algorithm, topology or natural_topology(algorithm), config.compression)
        probe = _ProbePort()
        make_averager(algorithm, config, probe, __import__("random").Random(0), 0.0)
    except (ValueError, LocalProtocolError) as exc:
        raise CliError(f"--algorithm {algorithm}: {exc}") from None
    return config


class _ProbePort:
    """A stand-in model, so that an algorithm can vet its configuration before the real one."""

    numel, model_key, step = 4, "probe/4", 0

    def snapshot(self):
        import numpy as np

        return np.zeros(4, dtype=np.float32)

    def add_delta(self, delta) -> None:
        pass

    def gradient(self):
        return self.snapshot()

    def set_gradient(self, grad) -> None:
        pass


def _check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise CliError(f"{flag}: unknown value {value!r} (choose from {', '.join(choices)})")


def _positive(flag: str, value: Optional[float], *, allow_zero: bool = False) -> None:
    if value is not None and not math.isfinite(value):
        raise CliError(f"{flag} must be a finite number, got {value:g}")
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise CliError(f"{flag} must be {'>= 0' if allow_zero else '> 0'}, got {value:g}")


@app.command()
def start(
    listen: str = typer.Option(..., help="HOST:PORT to listen on (0.0.0.0 allowed with --advertise)."),
    join: List[str] = typer.Option([], help="HOST:PORT of any member; repeat for several. None: start a new swarm."),
    advertise: Optional[str] = typer.Option(None, help="HOST:PORT peers should dial (default: --listen)."),
    task: str = typer.Option("synthetic", help="Built-in task name or MODULE:ATTR."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    data_dir: Optional[str] = typer.Option(None, help="Directory the task reads its data from, if it takes one."),
    seed: int = typer.Option(0, help="Run seed: the same on every peer (same initial model)."),
    node_id: Optional[str] = typer.Option(None, "--id", help="Node id (default: the advertised address)."),
    shard: str = typer.Option("0/1", help="This peer's data shard I/N (0/1: sample all data)."),
    steps: Optional[int] = typer.Option(None, help="Train this many steps, linger, then exit."),
    duration: Optional[float] = typer.Option(None, help="Train this many seconds, linger, then exit."),
    linger: Optional[float] = typer.Option(10.0, help="Seconds to keep averaging after training (-1: until stopped)."),
    join_timeout: float = typer.Option(30.0, help="Seconds to keep retrying --join addresses."),
    algorithm: str = typer.Option("adpsgd", help="Averaging algorithm: " + ", ".join(ALGORITHM_NAMES) + "."),
    topology: Optional[str] = typer.Option(None, help="Topology: " + ", ".join(TOPOLOGY_NAMES) + " (default: the algorithm's own)."),
    membership: str = typer.Option("lan", help="Membership timer preset: lan, wan or local (fast, for one machine)."),
    avg_interval: float = typer.Option(0.05, help="Seconds between averaging exchanges."),
    exchange_timeout: float = typer.Option(2.0, help="Seconds before an unanswered exchange is dropped."),
    round_timeout: Optional[float] = typer.Option(None, help="Synchronous algorithms stop waiting for a missing neighbour after this (default: 5 s; diloco 20 s, its rounds move whole models)."),
    diloco_inner_steps: int = typer.Option(50, help="DiLoCo: local steps between outer synchronisations."),
    diloco_outer_lr: float = typer.Option(0.7, help="DiLoCo: outer (Nesterov) learning rate on the averaged pseudo-gradient."),
    diloco_outer_momentum: float = typer.Option(0.9, help="DiLoCo: outer Nesterov momentum, in [0, 1)."),
    staleness_aware: bool = typer.Option(False, help="Down-weight partners whose models are many steps behind."),
    sgp_push_interval: float = typer.Option(0.02, help="SGP: push a share at most this often (seconds)."),
    compression: str = typer.Option("none", help="Tensor compression: " + ", ".join(COMPRESSION_NAMES) + " (auto: adapt to the link)."),
    compression_block: Optional[int] = typer.Option(None, help="Block size for int8/int4/sign compression."),
    topk_fraction: Optional[float] = typer.Option(None, help="Fraction of entries topk keeps (default 0.01)."),
    choco_gamma: Optional[float] = typer.Option(None, help="CHOCO consensus step size (default: suggested for the codec)."),
    bandwidth_aware: bool = typer.Option(True, help="Adapt the averaging interval and partners to measured links."),
    comm_fraction: float = typer.Option(0.5, help="Bandwidth awareness: keep exchanges under this share of wall time."),
    eval_every: float = typer.Option(2.0, help="Seconds between held-out evaluations."),
    log_every: float = typer.Option(2.0, help="Seconds between progress lines (0: none)."),
    threads: int = typer.Option(0, help="torch CPU threads (0: torch's default)."),
    slowdown: float = typer.Option(1.0, hidden=True, help="Test-only: make each step this many times slower."),
    log_level: str = typer.Option("warning", help="debug, info, warning or error."),
) -> None:
    """Run one node in the foreground until SIGINT/SIGTERM (or --steps/--duration)."""
    from p2p.gossip.config import PRESETS as MEMBERSHIP_CONFIGS
    from p2p.training.task import Shard, TaskError, load_task

    _check_address("--listen", listen)
    try:
        bulk_address(listen)  # large messages use the next port
    except AddressError as exc:
        raise CliError(f"--listen: {exc}") from None
    if advertise is None:
        if parse_address(listen)[0] in ("0.0.0.0", "::", "*"):
            raise CliError("--listen on a wildcard address needs --advertise HOST:PORT that peers can dial")
        advertise = listen
    _check_address("--advertise", advertise, allow_wildcard=False)
    for address in join:
        _check_address("--join", address, allow_wildcard=False)
    try:
        shard_value = Shard.parse(shard)
    except ValueError as exc:
        raise CliError(f"--shard: {exc}") from None
    if steps is not None and steps < 1:
        raise CliError(f"--steps must be >= 1, got {steps}")
    for flag, value in (("--duration", duration), ("--join-timeout", join_timeout),
                        ("--exchange-timeout", exchange_timeout), ("--eval-every", eval_every)):
        _positive(flag, value)
    for flag, value in (("--avg-interval", avg_interval), ("--log-every", log_every)):
        _positive(flag, value, allow_zero=True)
    _check_choice("--algorithm", algorithm, ALGORITHM_NAMES)
    if topology is not None:
        _check_choice("--topology", topology, TOPOLOGY_NAMES)
    _check_choice("--membership", membership, MEMBERSHIP_PRESETS)
    if round_timeout is None:  # DiLoCo's outer rounds move models (12 MB at 20 Mbit/s: 5 s)
        round_timeout = DILOCO_ROUND_TIMEOUT_S if algorithm == "diloco" else ROUND_TIMEOUT_S
    _positive("--round-timeout", round_timeout)
    if diloco_inner_steps < 1:
        raise CliError(f"--diloco-inner-steps must be >= 1, got {diloco_inner_steps}")
    _positive("--diloco-outer-lr", diloco_outer_lr)
    if not 0 <= diloco_outer_momentum < 1:
        raise CliError(f"--diloco-outer-momentum must be in [0, 1), got {diloco_outer_momentum:g}")
    if not 0 < comm_fraction <= 1:
        raise CliError(f"--comm-fraction must be in (0, 1], got {comm_fraction:g}")
    _check_choice("--compression", compression, COMPRESSION_NAMES)
    if slowdown < 1.0:
        raise CliError(f"--slowdown must be >= 1, got {slowdown:g}")
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise CliError(f"--log-level: unknown level {log_level!r}")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        task_obj = load_task(task)
    except TaskError as exc:
        raise CliError(str(exc)) from None
    if data_dir is not None:
        if not hasattr(task_obj, "data_dir"):
            raise CliError(f"--data-dir: task {task!r} reads no data directory")
        task_obj.data_dir = data_dir

    import torch

    from p2p.training.node import JoinError, Node, NodeConfig
    from p2p.net.transport import TransportError

    if threads:
        torch.set_num_threads(threads)
    config = NodeConfig(
        listen=listen, advertise=advertise, task=task, join=tuple(join), node_id=node_id, seed=seed,
        shard=shard_value, device=device, steps=steps, duration_s=duration,
        linger_s=None if linger is not None and linger < 0 else linger, join_timeout_s=join_timeout,
        eval_every_s=eval_every, log_every_s=log_every, slowdown=slowdown,
        algorithm=algorithm, topology=topology, membership=MEMBERSHIP_CONFIGS[membership](),
        averaging=_averaging_config(
            algorithm, topology, interval_s=avg_interval, exchange_timeout_s=exchange_timeout,
            round_timeout_s=round_timeout, diloco_inner_steps=diloco_inner_steps,
            diloco_outer_lr=diloco_outer_lr,
            diloco_outer_momentum=diloco_outer_momentum, staleness_aware=staleness_aware, sgp_push_interval_s=sgp_push_interval,
            compression=compression, compression_block=compression_block,
            compression_topk_fraction=topk_fraction, choco_gamma=choco_gamma,
            bandwidth_aware=bandwidth_aware, comm_fraction=comm_fraction,
            max_interval_s=max(30.0, avg_interval)),
    )
    try:
        node = Node(config, task_obj, print_line=lambda line: print(line, flush=True))
    except TransportError as exc:
        raise CliError(str(exc), code=1) from None
    except ValueError as exc:  # e.g. --device cuda without CUDA
        raise CliError(str(exc)) from None
    signal.signal(signal.SIGTERM, node.request_stop)
    signal.signal(signal.SIGINT, node.request_stop)
    print(f"node {config.id} listening on {listen}, task {task}, device {node.device}, "
          f"{node.flat.numel} parameters, joining {', '.join(join) or '(first member)'}", flush=True)
    try:
        node.run()
    except JoinError as exc:
        raise CliError(str(exc), code=1) from None


@app.command()
def status(
    peer: str = typer.Option(..., help="HOST:PORT of any running node."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    timeout: float = typer.Option(3.0, help="Seconds to wait for the answer."),
) -> None:
    """Show a running node's member table and training progress."""
    from p2p.net.client import QueryError
    from p2p.net.client import status as query_status
    from p2p.cli.status_view import render_status

    _check_address("--peer", peer, allow_wildcard=False)
    _positive("--timeout", timeout)
    try:
        info = query_status(peer, timeout)
    except QueryError as exc:
        raise CliError(str(exc), code=1) from None
    if as_json:
        print(json.dumps(info, sort_keys=True))
    else:
        render_status(info)


@app.command()
def demo(
    peers: int = typer.Option(4, help="Number of peer processes."),
    steps: Optional[int] = typer.Option(None, help="Training steps per peer (default: the task's demo default)."),
    duration: Optional[float] = typer.Option(None, help="Train for this many seconds instead of --steps."),
    task: str = typer.Option("synthetic", help="Built-in task name or MODULE:ATTR."),
    seed: int = typer.Option(0, help="Run seed."),
    algorithm: str = typer.Option("adpsgd", help="Averaging algorithm: " + ", ".join(ALGORITHM_NAMES) + "."),
    topology: Optional[str] = typer.Option(None, help="Topology (default: the algorithm's own)."),
    compression: str = typer.Option("none", help="Tensor compression: " + ", ".join(COMPRESSION_NAMES) + "."),
    as_json: bool = typer.Option(False, "--json", help="Print only the summary, as one JSON object, on stdout."),
    base_port: int = typer.Option(0, help="First port to use; peers take every other port, each also using the next one for large messages (0: pick free ports)."),
    live: bool = typer.Option(True, help="Show the live view on stderr."),
    keep_logs: Optional[str] = typer.Option(None, help="Directory to keep the peers' logs in."),
) -> None:
    """Run a swarm of peers on this machine and report how close they get to one process."""
    from p2p.harness.demo import DemoConfig, DemoError, run_demo

    if peers < 1:
        raise CliError(f"--peers must be >= 1, got {peers}")
    if steps is not None and steps < 1:
        raise CliError(f"--steps must be >= 1, got {steps}")
    _positive("--duration", duration)
    _check_choice("--algorithm", algorithm, ALGORITHM_NAMES)
    if topology is not None:
        _check_choice("--topology", topology, TOPOLOGY_NAMES)
    _check_choice("--compression", compression, COMPRESSION_NAMES)
    _averaging_config(algorithm, topology, compression=compression)  # refuse what nodes would
    if not 0 <= base_port < 65536 - 2 * peers:
        raise CliError(f"--base-port must leave room for {2 * peers} ports (each peer also uses the next port)")
    from p2p.averaging.registry import natural_topology

    config = DemoConfig(peers=peers, steps=steps, duration_s=duration, task=task, seed=seed,
                        algorithm=algorithm, topology=topology or natural_topology(algorithm),
                        compression=compression, base_port=base_port, live=live, log_dir=keep_logs,
                        cache_dir=_cache_dir())
    try:
        summary = run_demo(config)
    except DemoError as exc:
        raise CliError(str(exc), code=1) from None
    if as_json:
        print(json.dumps(summary))


def _register_subcommands() -> None:
    from p2p.cli.simulate import simulate

    app.command("simulate", help="Run membership (or, with --algorithm, averaging) in the deterministic simulator.")(simulate)
    from p2p.cli.lab import lab_app

    app.add_typer(lab_app, name="lab", help="A shaped-network lab: one network namespace per peer (needs root).")


_register_subcommands()


def _cache_dir() -> str:
    """Where the demo caches reference accuracies: $XDG_CACHE_HOME/p2p or ~/.cache/p2p."""
    import os

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "p2p")


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning every user error into one line and an exit code."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="p2p", standalone_mode=False)
    except CliError as exc:
        print(f"p2p: error: {exc}", file=sys.stderr)
        sys.exit(exc.code)
    except typer.Abort:
        sys.exit(130)
    except TyperException as exc:  # typer's (vendored click's) usage errors: bad flag, bad value
        if not hasattr(exc, "format_message"):
            raise
        print(f"p2p: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)
