"""docker-compose.yml and the Dockerfile, checked statically against the CLI (no engine needed;
tests/test_docker_compose.py runs them for real where an engine is): every service's command,
with the shared settings file and environment it gets, must parse as a `p2p start` command line,
and the swarm must be wired up."""

import typing
from pathlib import Path

import typer
import yaml

from p2p.cli.app import app
from p2p.cli.sources import merge
from p2p.cli.start import start
from p2p.net.addresses import parse_address

ROOT = Path(__file__).resolve().parent.parent


def parse(argv):
    """Parse argv with the real CLI (types, unknown flags, required options) without running it."""
    group = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="p2p")
    name, *rest = argv
    command = group.get_command(ctx, name)
    assert command is not None, f"no such command {name!r}"
    return name, command.make_context(name, rest, parent=ctx).params


def settings(service: dict) -> dict:
    """What `p2p start` in this service's container sees: its flags over its P2P_* environment
    over the mounted config file (the file read from the repository path the volume mounts)."""
    command, flags = parse(service["command"])
    assert command == "start"
    env = dict(service.get("environment", {}))
    mounts = dict(v.split(":")[:2][::-1] for v in service.get("volumes", []) if v.startswith("./"))
    config = env.pop("P2P_CONFIG", None)
    assert config in mounts, f"P2P_CONFIG {config} is not mounted into the container"
    flags = {k: v for k, v in flags.items() if k != "config"}
    return merge(flags, typing.get_type_hints(start), str(ROOT / mounts[config]), environ=env).values


def test_every_service_parses_with_the_shared_settings_and_the_swarm_is_connected():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    named = {n: settings(s) for n, s in services.items() if n != "worker"}
    worker = settings(services["worker"])
    assert len(named) >= 3
    for name, params in named.items():
        assert parse_address(params["advertise"], allow_wildcard=False)[0] == name, "a node advertises its service name"
        assert params["checkpoint_dir"], f"{name} keeps checkpoints"
        volume = next(v for v in services[name]["volumes"] if v.endswith(":" + params["checkpoint_dir"]))
        assert volume.split(":")[0] in compose["volumes"], f"{name}'s checkpoints live on a named volume"
    assert "advertise" not in worker and "checkpoint_dir" not in worker, "replicas of a scaled service cannot share these"
    for name, params in {**named, "worker": worker}.items():
        parse_address(params["listen"])
        parse_address(params["metrics"])
        for target in params.get("join", []):
            assert parse_address(target)[0] in named, f"{name} joins unknown {target}"
    assert [n for n, p in named.items() if not p.get("join")] == ["peer0"], "exactly one node starts the swarm"
    assert len({p["seed"] for p in (*named.values(), worker)}) == 1, "one run seed for the swarm"
    shards = sorted(p["shard"] for p in named.values())
    assert shards == [f"{i}/{len(named)}" for i in range(len(named))]


def test_the_image_is_cpu_torch_on_a_local_base_and_checks_its_health():
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG BASE=p2p-base:bookworm" in text and "FROM ${BASE}" in text
    assert "ARG TORCH=torch==2.13.0+cpu" in text, "no CUDA packages unless asked"
    assert "/healthz" in text and 'ENTRYPOINT ["p2p"]' in text
    setup = (ROOT / "bench" / "docker_setup.sh").read_text()
    assert "p2p-base:bookworm" in setup and "docker import" in setup
