"""``p2p demo``: a swarm of real peer processes on this machine, watched live, then judged."""

from __future__ import annotations

import json
import os
from typing import Optional

import typer

from p2p.cli.errors import CliError, positive, read_key_file
from p2p.config import SETTINGS, SettingError, swarm_config


def demo(
    peers: int = typer.Option(4, help="Number of peer processes."),
    steps: Optional[int] = typer.Option(None, help="Training steps per peer (default: the task's demo default)."),
    duration: Optional[float] = typer.Option(None, help="Train for this many seconds instead of --steps."),
    task: str = typer.Option("synthetic", help="Built-in task name or MODULE:ATTR."),
    seed: int = typer.Option(0, help="Run seed."),
    algorithm: str = typer.Option("adpsgd", help=SETTINGS["algorithm"].help),
    topology: Optional[str] = typer.Option(None, help=SETTINGS["topology"].help),
    compression: str = typer.Option("none", help=SETTINGS["compression"].help),
    as_json: bool = typer.Option(False, "--json", help="Print only the summary, as one JSON object, on stdout."),
    base_port: int = typer.Option(0, help="First port to use; peers take every other port, each also using the next one for large messages (0: pick free ports)."),
    live: bool = typer.Option(True, help="Show the live view on stderr."),
    swarm_key: Optional[str] = typer.Option(None, "--swarm-key", envvar="P2P_SWARM_KEY",
                                            help="Key file (p2p keygen): every peer seals its messages with it."),
    identities: bool = typer.Option(False, "--identities", help="Give each peer its own identity and all one allow file, made in the run's directory (with a swarm key, if --swarm-key is not given)."),
    keep_logs: Optional[str] = typer.Option(None, help="Directory to keep the peers' logs and the run's metrics.jsonl in (p2p plot DIR draws them)."),
) -> None:
    """Run a swarm of peers on this machine and report how close they get to one process."""
    from p2p.harness.demo import DemoConfig, DemoError, run_demo

    if peers < 1:
        raise CliError(f"--peers must be >= 1, got {peers}")
    if steps is not None and steps < 1:
        raise CliError(f"--steps must be >= 1, got {steps}")
    positive("--duration", duration)
    try:  # refuse what the nodes would refuse, before starting any
        checked = swarm_config(algorithm=algorithm, topology=topology, compression=compression)
    except SettingError as exc:
        raise CliError(f"--{exc.setting.replace('_', '-')}: {exc.problem}") from None
    if not 0 <= base_port < 65536 - 2 * peers:
        raise CliError(f"--base-port must leave room for {2 * peers} ports (each peer also uses the next port)")
    config = DemoConfig(peers=peers, steps=steps, duration_s=duration, task=task, seed=seed,
                        algorithm=algorithm, topology=checked.topology_name, compression=compression,
                        base_port=base_port, live=live, log_dir=keep_logs, cache_dir=cache_dir(),
                        swarm_key=swarm_key, identities=identities)
    read_key_file(swarm_key)  # a bad key file is one line here, not one per peer
    try:
        summary = run_demo(config)
    except DemoError as exc:
        raise CliError(str(exc), code=1) from None
    if as_json:
        print(json.dumps(summary))


def cache_dir() -> str:
    """Where the demo caches reference accuracies: $XDG_CACHE_HOME/p2p or ~/.cache/p2p."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "p2p")
