"""The ``p2p`` command line: flags -> frozen config objects -> library calls.

This is the only place that reads flags (and, for the demo's cache directory, the
environment). Every user error ends in one line on stderr that names the problem and a
non-zero exit: 2 for a bad flag or value, 1 for a runtime failure (port in use, no peer
answered). Each command lives in its own module beside this one.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer
from typer.exceptions import TyperException

from p2p.cli.demo import demo
from p2p.cli.errors import CliError
from p2p.cli.export import export
from p2p.cli.keygen import keygen
from p2p.cli.lab import lab_app
from p2p.cli.plot import plot
from p2p.cli.simulate import simulate
from p2p.cli.start import start
from p2p.cli.status import status

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Decentralized peer-to-peer training of PyTorch models over ZeroMQ.",
)
app.command()(start)
app.command()(status)
app.command()(demo)
app.command()(export)
app.command()(keygen)
app.command()(plot)
app.command("simulate", help="Run membership (or, with --algorithm, averaging) in the deterministic simulator.")(simulate)
app.add_typer(lab_app, name="lab", help="A shaped-network lab: one network namespace per peer (needs root).")


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
