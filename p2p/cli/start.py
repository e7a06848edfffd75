"""``p2p start``: one node daemon in the foreground.

Its swarm flags are the settings of ``p2p.config`` (``--diloco-inner-steps`` is the setting
``diloco_inner_steps``, the keyword ``p2p.Swarm`` takes): the flags are mapped onto the same
``SwarmConfig`` and checked by the same code, so an error names the flag to fix. A flag left out
keeps the library's default; the daemon's own flags (task, shard, steps, precision ...) build
the ``NodeConfig`` around it. Every flag can also come from ``--config FILE`` (TOML) or a
``P2P_*`` environment variable (p2p/cli/sources.py: flags > environment > file > defaults).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import typing
from typing import List, Optional

import typer

from p2p.cli.errors import CliError, positive
from p2p.cli.logs import configure_logging
from p2p.cli.sources import merge
from p2p.config import SETTINGS, SettingError, swarm_config

# Flags whose name is not the setting's with dashes.
FLAG_OF = {"node_id": "--id"}


def flag_of(setting: str) -> str:
    return FLAG_OF.get(setting, "--" + setting.replace("_", "-"))


def _opt(setting: str, default=None, *flags: str, **kw):
    """A typer option for a swarm setting, with the setting's help text."""
    return typer.Option(default, *(flags or (flag_of(setting),)), help=SETTINGS[setting].help, **kw)


# The daemon's defaults, applied after the flags, the environment and the config file.
DAEMON_DEFAULTS = {"linger": 10.0, "task": "synthetic", "device": "auto", "precision": "fp32", "shard": "0/1",
                   "eval_every": 2.0, "log_every": 2.0, "threads": 0, "slowdown": 1.0, "log_level": "warning",
                   "log_format": "text"}


def start(
    config: Optional[str] = typer.Option(None, "--config", help="TOML file of settings (keys: these flags with underscores; or P2P_CONFIG)."),
    listen: Optional[str] = _opt("listen"),
    join: List[str] = _opt("join", []),
    advertise: Optional[str] = _opt("advertise"),
    node_id: Optional[str] = _opt("node_id"),
    seed: Optional[int] = _opt("seed"),
    join_timeout: Optional[float] = _opt("join_timeout"),
    min_members: Optional[int] = _opt("min_members"),
    linger: Optional[float] = _opt("linger"),
    algorithm: Optional[str] = _opt("algorithm"),
    topology: Optional[str] = _opt("topology"),
    membership: Optional[str] = _opt("membership"),
    avg_interval: Optional[float] = _opt("avg_interval"),
    exchange_timeout: Optional[float] = _opt("exchange_timeout"),
    round_timeout: Optional[float] = _opt("round_timeout"),
    staleness_aware: Optional[bool] = _opt("staleness_aware", None, "--staleness-aware/--no-staleness-aware"),
    staleness_tau: Optional[float] = _opt("staleness_tau"),
    compression: Optional[str] = _opt("compression"),
    compression_block: Optional[int] = _opt("compression_block"),
    topk_fraction: Optional[float] = _opt("topk_fraction"),
    bandwidth_aware: Optional[bool] = _opt("bandwidth_aware", None, "--bandwidth-aware/--no-bandwidth-aware"),
    comm_fraction: Optional[float] = _opt("comm_fraction"),
    max_interval: Optional[float] = _opt("max_interval"),
    diloco_inner_steps: Optional[str] = _opt("diloco_inner_steps"),
    diloco_outer_lr: Optional[float] = _opt("diloco_outer_lr"),
    diloco_outer_momentum: Optional[float] = _opt("diloco_outer_momentum"),
    diloco_gossip_rounds: Optional[int] = _opt("diloco_gossip_rounds"),
    diloco_overlap: Optional[bool] = _opt("diloco_overlap", None, "--diloco-overlap/--no-diloco-overlap"),
    diloco_overlap_steps: Optional[int] = _opt("diloco_overlap_steps"),
    diloco_dense_rounds: Optional[int] = _opt("diloco_dense_rounds"),
    diloco_warmup_steps: Optional[int] = _opt("diloco_warmup_steps"),
    diloco_warmup_inner_steps: Optional[int] = _opt("diloco_warmup_inner_steps"),
    diloco_warmup_topk_fraction: Optional[float] = _opt("diloco_warmup_topk_fraction"),
    diloco_reduce_scatter: Optional[bool] = _opt("diloco_reduce_scatter", None,
                                                 "--diloco-reduce-scatter/--no-diloco-reduce-scatter"),
    sgp_push_interval: Optional[float] = _opt("sgp_push_interval"),
    elastic_alpha: Optional[float] = _opt("elastic_alpha"),
    gossipgrad_model_every: Optional[int] = _opt("gossipgrad_model_every"),
    choco_gamma: Optional[float] = _opt("choco_gamma"),
    robust_mixing: Optional[bool] = _opt("robust_mixing", None, "--robust-mixing/--no-robust-mixing"),
    swarm_key: Optional[str] = _opt("swarm_key"),
    identity: Optional[str] = _opt("identity"),
    allow: Optional[str] = _opt("allow"),
    hostile: Optional[str] = _opt("hostile", None, "--hostile", hidden=True),
    state_sync: Optional[bool] = _opt("state_sync", None, "--state-sync/--no-state-sync"),
    sync_optimizer: Optional[bool] = _opt("sync_optimizer", None, "--sync-optimizer/--no-sync-optimizer"),
    sync_timeout: Optional[float] = _opt("sync_timeout"),
    sync_max_mbit: Optional[float] = _opt("sync_max_mbit"),
    metrics: Optional[str] = _opt("metrics"),
    checkpoint_dir: Optional[str] = _opt("checkpoint_dir"),
    checkpoint_every: Optional[float] = _opt("checkpoint_every"),
    keep_checkpoints: Optional[int] = _opt("keep_checkpoints"),
    task: Optional[str] = typer.Option(None, help="Built-in task name or MODULE:ATTR (default: synthetic)."),
    device: Optional[str] = typer.Option(None, help="auto (default: CUDA when there is a GPU), cpu, cuda or cuda:N."),
    precision: Optional[str] = typer.Option(None, help="fp32 (default), bf16 or fp16: autocast the forward pass (fp16 with a GradScaler)."),
    data_dir: Optional[str] = typer.Option(None, help="Directory the task reads its data from, if it takes one."),
    shard: Optional[str] = typer.Option(None, help="This peer's data shard I/N (default 0/1: sample all data)."),
    steps: Optional[int] = typer.Option(None, help="Train this many steps, linger, then exit."),
    duration: Optional[float] = typer.Option(None, help="Train this many seconds, linger, then exit."),
    eval_every: Optional[float] = typer.Option(None, help="Seconds between held-out evaluations (default 2)."),
    log_every: Optional[float] = typer.Option(None, help="Seconds between progress lines (default 2; 0: none)."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (default 0: torch's default)."),
    slowdown: Optional[float] = typer.Option(None, hidden=True, help="Test-only: make each step this many times slower."),
    log_level: Optional[str] = typer.Option(None, help="debug, info, warning (default) or error."),
    log_format: Optional[str] = typer.Option(None, help="text (default) or json: progress lines and events as JSON lines."),
) -> None:
    """Run one node in the foreground until SIGINT/SIGTERM (or --steps/--duration)."""
    flags = {k: v for k, v in locals().items() if k != "config"}
    sources = merge(flags, typing.get_type_hints(start), config or os.environ.get("P2P_CONFIG"))
    values = {**DAEMON_DEFAULTS, **sources.values}
    if values.get("listen") is None:
        raise CliError("--listen HOST:PORT is required (a flag, `listen` in --config, or P2P_LISTEN)")
    settings = {name: values.get(name) for name in SETTINGS}
    try:
        swarm = swarm_config(**settings)
    except SettingError as exc:
        raise CliError(f"{sources.where(exc.setting, flag_of(exc.setting))}: {exc.problem}") from None
    task, device, precision, data_dir, shard = (values.get(k) for k in ("task", "device", "precision", "data_dir", "shard"))
    steps, duration, eval_every, log_every = (values.get(k) for k in ("steps", "duration", "eval_every", "log_every"))
    threads, slowdown, log_level, log_format = (values[k] for k in ("threads", "slowdown", "log_level", "log_format"))
    from p2p.training.task import Shard, TaskError, load_task
    from p2p.training.trainer import PRECISIONS

    def where(name: str) -> str:
        return sources.where(name, flag_of(name))

    try:
        shard_value = Shard.parse(shard)
    except ValueError as exc:
        raise CliError(f"{where('shard')}: {exc}") from None
    if steps is not None and steps < 1:
        raise CliError(f"{where('steps')} must be >= 1, got {steps}")
    positive(where("duration"), duration)
    positive(where("eval_every"), eval_every)
    positive(where("log_every"), log_every, allow_zero=True)
    for name, value, choices in (("precision", precision, tuple(PRECISIONS)), ("log_format", log_format, ("text", "json")),
                                 ("log_level", log_level.lower(), ("debug", "info", "warning", "error"))):
        if value not in choices:
            raise CliError(f"{where(name)}: unknown value {value!r} (choose from {', '.join(choices)})")
    if slowdown < 1.0:
        raise CliError(f"{where('slowdown')} must be >= 1, got {slowdown:g}")
    configure_logging(log_level, log_format)
    # `kill -USR1 PID` prints every thread's stack to stderr: what a node that will not stop (or
    # stalls) is doing, without a debugger. LocalSwarm sends it to a peer late to stop.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        task_obj = load_task(task)
    except TaskError as exc:
        raise CliError(str(exc)) from None
    if data_dir is not None:
        if not hasattr(task_obj, "data_dir"):
            raise CliError(f"{where('data_dir')}: task {task!r} reads no data directory")
        task_obj.data_dir = data_dir

    import torch

    from p2p.training.node import Node, NodeConfig, SwarmError

    if threads:
        torch.set_num_threads(threads)
    node_config = NodeConfig(swarm=swarm, task=task, shard=shard_value, device=device, precision=precision,
                             steps=steps, duration_s=duration, eval_every_s=eval_every, log_every_s=log_every,
                             slowdown=slowdown, log_format=log_format)
    try:
        node = Node(node_config, task_obj, print_line=print_line)
    except ValueError as exc:  # e.g. --device cuda without CUDA, a model with integer parameters
        raise CliError(str(exc)) from None
    try:
        node.run()
    except SwarmError as exc:  # port in use, no join peer answered, the network loop failed
        raise CliError(str(exc), code=1) from None
    exit_now()


def print_line(line: str) -> None:
    """One progress line in ONE write: ``print`` writes the text and the newline separately, and
    with unbuffered output (PYTHONUNBUFFERED, as the harnesses run nodes) a log record written
    to the same file between the two landed on the progress line (seen in the fault soak's logs)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def exit_now() -> None:
    """The node has stopped: sockets closed, last checkpoint written, leave announced. Exit
    without the interpreter's teardown of torch and every module: it took 2-4 s on a loaded
    2-core machine (6-10 s from SIGTERM to exit in all), which a supervisor's stop timeout
    (docker's 10 s, the tests' 15 s) counts against the node."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
