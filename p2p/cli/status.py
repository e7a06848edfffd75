"""``p2p status``: ask any running node for its member table and training progress."""

from __future__ import annotations

import json

import typer

from p2p.cli.errors import CliError, check_address, positive


def status(
    peer: str = typer.Option(..., help="HOST:PORT of any running node."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    timeout: float = typer.Option(3.0, help="Seconds to wait for the answer."),
) -> None:
    """Show a running node's member table and training progress."""
    from p2p.cli.status_view import render_status
    from p2p.net.client import QueryError
    from p2p.net.client import status as query_status

    check_address("--peer", peer, allow_wildcard=False)
    positive("--timeout", timeout)
    try:
        info = query_status(peer, timeout)
    except QueryError as exc:
        raise CliError(str(exc), code=1) from None
    if as_json:
        print(json.dumps(info, sort_keys=True))
    else:
        render_status(info)
