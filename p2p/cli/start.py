"""``p2p start``: one node daemon in the foreground.

Its swarm flags are the settings of ``p2p.config`` (``--diloco-inner-steps`` is the setting
``diloco_inner_steps``, the keyword ``p2p.Swarm`` takes): the flags are mapped onto the same
``SwarmConfig`` and checked by the same code, so an error names the flag to fix. A flag left out
keeps the library's default; the daemon's own flags (task, shard, steps, precision ...) build
the ``NodeConfig`` around it.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import typer

from p2p.cli.errors import CliError, positive
from p2p.config import SETTINGS, SettingError, swarm_config

# Flags whose name is not the setting's with dashes.
FLAG_OF = {"node_id": "--id"}


def flag_of(setting: str) -> str:
    return FLAG_OF.get(setting, "--" + setting.replace("_", "-"))


def _opt(setting: str, default=None, *flags: str, **kw):
    """A typer option for a swarm setting, with the setting's help text."""
    return typer.Option(default, *(flags or (flag_of(setting),)), help=SETTINGS[setting].help, **kw)


def start(
    listen: str = _opt("listen", ...),
    join: List[str] = _opt("join", []),
    advertise: Optional[str] = _opt("advertise"),
    node_id: Optional[str] = _opt("node_id"),
    seed: Optional[int] = _opt("seed"),
    join_timeout: Optional[float] = _opt("join_timeout"),
    min_members: Optional[int] = _opt("min_members"),
    linger: Optional[float] = _opt("linger", 10.0),
    algorithm: Optional[str] = _opt("algorithm"),
    topology: Optional[str] = _opt("topology"),
    membership: str = _opt("membership", "lan"),
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
    diloco_inner_steps: Optional[int] = _opt("diloco_inner_steps"),
    diloco_outer_lr: Optional[float] = _opt("diloco_outer_lr"),
    diloco_outer_momentum: Optional[float] = _opt("diloco_outer_momentum"),
    diloco_gossip_rounds: Optional[int] = _opt("diloco_gossip_rounds"),
    sgp_push_interval: Optional[float] = _opt("sgp_push_interval"),
    elastic_alpha: Optional[float] = _opt("elastic_alpha"),
    gossipgrad_model_every: Optional[int] = _opt("gossipgrad_model_every"),
    choco_gamma: Optional[float] = _opt("choco_gamma"),
    state_sync: Optional[bool] = _opt("state_sync", None, "--state-sync/--no-state-sync"),
    sync_optimizer: Optional[bool] = _opt("sync_optimizer", None, "--sync-optimizer/--no-sync-optimizer"),
    sync_timeout: Optional[float] = _opt("sync_timeout"),
    sync_max_mbit: Optional[float] = _opt("sync_max_mbit"),
    checkpoint_dir: Optional[str] = _opt("checkpoint_dir"),
    checkpoint_every: Optional[float] = _opt("checkpoint_every"),
    keep_checkpoints: Optional[int] = _opt("keep_checkpoints"),
    task: str = typer.Option("synthetic", help="Built-in task name or MODULE:ATTR."),
    device: str = typer.Option("auto", help="auto (CUDA when there is a GPU), cpu, cuda or cuda:N."),
    precision: str = typer.Option("fp32", help="fp32, bf16 or fp16: autocast the forward pass (fp16 with a GradScaler)."),
    data_dir: Optional[str] = typer.Option(None, help="Directory the task reads its data from, if it takes one."),
    shard: str = typer.Option("0/1", help="This peer's data shard I/N (0/1: sample all data)."),
    steps: Optional[int] = typer.Option(None, help="Train this many steps, linger, then exit."),
    duration: Optional[float] = typer.Option(None, help="Train this many seconds, linger, then exit."),
    eval_every: float = typer.Option(2.0, help="Seconds between held-out evaluations."),
    log_every: float = typer.Option(2.0, help="Seconds between progress lines (0: none)."),
    threads: int = typer.Option(0, help="torch CPU threads (0: torch's default)."),
    slowdown: float = typer.Option(1.0, hidden=True, help="Test-only: make each step this many times slower."),
    log_level: str = typer.Option("warning", help="debug, info, warning or error."),
) -> None:
    """Run one node in the foreground until SIGINT/SIGTERM (or --steps/--duration)."""
    values = dict(locals())
    settings = {name: values[name] for name in SETTINGS}
    try:
        swarm = swarm_config(**settings)
    except SettingError as exc:
        raise CliError(f"{flag_of(exc.setting)}: {exc.problem}") from None
    from p2p.training.task import Shard, TaskError, load_task
    from p2p.training.trainer import PRECISIONS

    try:
        shard_value = Shard.parse(shard)
    except ValueError as exc:
        raise CliError(f"--shard: {exc}") from None
    if steps is not None and steps < 1:
        raise CliError(f"--steps must be >= 1, got {steps}")
    positive("--duration", duration)
    positive("--eval-every", eval_every)
    positive("--log-every", log_every, allow_zero=True)
    if precision not in PRECISIONS:
        raise CliError(f"--precision: unknown value {precision!r} (choose from {', '.join(PRECISIONS)})")
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

    from p2p.training.node import Node, NodeConfig, SwarmError

    if threads:
        torch.set_num_threads(threads)
    config = NodeConfig(swarm=swarm, task=task, shard=shard_value, device=device, precision=precision,
                        steps=steps, duration_s=duration, eval_every_s=eval_every, log_every_s=log_every,
                        slowdown=slowdown)
    try:
        node = Node(config, task_obj, print_line=lambda line: print(line, flush=True))
    except ValueError as exc:  # e.g. --device cuda without CUDA, a model with integer parameters
        raise CliError(str(exc)) from None
    try:
        node.run()
    except SwarmError as exc:  # port in use, no join peer answered, the network loop failed
        raise CliError(str(exc), code=1) from None
