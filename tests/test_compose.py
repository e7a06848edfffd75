"""docker-compose.yml cannot run here (no Docker engine), so check it statically against the CLI:
every service's command must parse as a `p2p` command line, and the swarm must be wired up."""

from pathlib import Path

import typer
import yaml

from p2p.net.addresses import parse_address
from p2p.cli import app

ROOT = Path(__file__).resolve().parent.parent


def parse(argv):
    """Parse argv with the real CLI (types, unknown flags, required options) without running it."""
    group = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="p2p")
    name, *rest = argv
    command = group.get_command(ctx, name)
    assert command is not None, f"no such command {name!r}"
    return name, command.make_context(name, rest, parent=ctx).params


def test_every_service_command_parses_and_the_swarm_is_connected():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert len(services) >= 3
    advertised = {}
    for name, service in services.items():
        command, params = parse(service["command"])
        assert command == "start"
        host, port = parse_address(params["advertise"], allow_wildcard=False)
        assert host == name, "each node advertises its own service name"
        parse_address(params["listen"])
        advertised[name] = params
    for name, params in advertised.items():
        for target in params["join"]:
            assert parse_address(target)[0] in services, f"{name} joins unknown {target}"
    first = [n for n, p in advertised.items() if not p["join"]]
    assert len(first) == 1, "exactly one node starts the swarm"
    assert len({p["seed"] for p in advertised.values()}) == 1, "one run seed for the swarm"
    shards = sorted(p["shard"] for p in advertised.values())
    assert shards == [f"{i}/{len(services)}" for i in range(len(services))]


def test_dockerfile_installs_with_the_install_script():
    text = (ROOT / "Dockerfile").read_text()
    assert "./install.sh" in text and 'ENTRYPOINT ["p2p"]' in text
