"""The ``p2p`` command line: flags -> frozen config objects -> library calls.

This is the only place that reads flags (and, for the demo's cache directory, the
environment). Every user error ends in one line on stderr that names the problem and a
non-zero exit: 2 for a bad flag or value, 1 for a runtime failure (port in use, no peer
answered). Each command lives in its own module beside this one.

Why commands load lazily: importing every command's module (and through them the config, all
seven averaging algorithms, the lab and the simulator) took ~0.4 s before any command ran, so
``p2p status`` answered in ~0.95 s (0.22 s now). ``main`` reads the command name and imports that
command's module only; the whole app (every command, for ``p2p --help`` or a misspelt name) is
built only when no known command leads the arguments. ``p2p start`` still needs the config, which
holds every algorithm's settings: a node starts no measurably sooner (bench/startup.py).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Optional

import typer
from typer.exceptions import TyperException

from p2p.cli.errors import CliError

HELP = "Decentralized peer-to-peer training of PyTorch models over ZeroMQ."

# command -> (module, attribute, keywords): a function is a command, a typer.Typer (lab) a group
COMMANDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "start": ("p2p.cli.start", "start", {}),
    "status": ("p2p.cli.status", "status", {}),
    "demo": ("p2p.cli.demo", "demo", {}),
    "export": ("p2p.cli.export", "export", {}),
    "keygen": ("p2p.cli.keygen", "keygen", {}),
    "plot": ("p2p.cli.plot", "plot", {}),
    "simulate": ("p2p.cli.simulate", "simulate",
                 {"help": "Run membership (or, with --algorithm, averaging) in the deterministic simulator."}),
    "lab": ("p2p.cli.lab", "lab_app", {"help": "A shaped-network lab: one network namespace per peer (needs root)."}),
}


def build_app(only: Optional[str] = None) -> typer.Typer:
    """The app with every command, or with the command (or group) ``only`` alone. A callback
    keeps a one-command app a group, so ``p2p start ...`` parses (and its usage reads) the same."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      rich_markup_mode=None, help=HELP)
    if only is not None:
        app.callback()(lambda: None)
    for name, (module, attr, kw) in COMMANDS.items():
        if only in (None, name):
            target = getattr(importlib.import_module(module), attr)
            if isinstance(target, typer.Typer):
                app.add_typer(target, name=name, **kw)
            else:
                app.command(name, **kw)(target)
    return app


def __getattr__(name: str) -> Any:
    """``app``: the whole app, built when first asked for (tests, ``typer.testing``)."""
    if name == "app":
        app = globals()["app"] = build_app()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning every user error into one line and an exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    named = args[0] if args and args[0] in COMMANDS else None
    command = typer.main.get_command(build_app(named))
    try:
        code = command.main(args=args, prog_name="p2p", standalone_mode=False)
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
