"""``p2p status``: ask any running node for its member table and training progress, or with
``--swarm`` every member it knows (p2p/cli/swarm_view.py)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from p2p.cli.errors import CliError, check_address, positive, read_identity_file, read_key_file


def status(
    peer: str = typer.Option(..., help="HOST:PORT of any running node."),
    swarm: bool = typer.Option(False, "--swarm", help="Ask every member this node knows; one table."),
    watch: bool = typer.Option(False, "--watch", help="With --swarm: redraw the table until Ctrl-C."),
    every: float = typer.Option(2.0, help="With --watch: seconds between redraws."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (with --swarm: a list)."),
    timeout: float = typer.Option(3.0, help="Seconds to wait for each answer."),
    swarm_key: Optional[str] = typer.Option(None, "--swarm-key", envvar="P2P_SWARM_KEY",
                                            help="The swarm's key file: a node with a key answers only requests sealed with it."),
    identity: Optional[str] = typer.Option(None, "--identity", envvar="P2P_IDENTITY",
                                           help="An identity file whose public key is on the nodes' allow file "
                                                "(a node with identities answers only requests signed by one)."),
) -> None:
    """Show a running node's member table and training progress (or the whole swarm's)."""
    from p2p.cli.status_view import render_status
    from p2p.net.client import QueryError
    from p2p.net.client import status as query_status

    check_address("--peer", peer, allow_wildcard=False)
    positive("--timeout", timeout)
    positive("--every", every)
    if watch and (not swarm or as_json):
        raise CliError("--watch goes with --swarm, and not with --json")
    keyring = read_key_file(swarm_key)
    signer = read_identity_file(identity, keyring)
    try:
        if swarm:
            from p2p.cli import swarm_view

            if watch:
                try:
                    swarm_view.watch(peer, timeout, every, keyring=keyring, identity=signer)
                except KeyboardInterrupt:
                    return
            rows = swarm_view.swarm_rows(peer, timeout, keyring, signer)
            if as_json:
                print(json.dumps(swarm_view.json_rows(rows), sort_keys=True, default=str))
            else:
                from rich.console import Console

                Console().print(swarm_view.table(rows, peer))
            return
        info = query_status(peer, timeout, keyring, signer)
    except QueryError as exc:
        raise CliError(str(exc), code=1) from None
    if as_json:
        print(json.dumps(info, sort_keys=True))
    else:
        render_status(info)
