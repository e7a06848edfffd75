"""``p2p keygen``: a new random swarm key (p2p/net/keyring.py), as a key file line."""

from __future__ import annotations

import os
from typing import Optional

import typer

from p2p.cli.errors import CliError


def keygen(
    out: Optional[str] = typer.Option(None, "--out", help="Write the key to this new file (mode 600) instead of stdout."),
) -> None:
    """Print a new swarm key: `p2p keygen > swarm.key && chmod 600 swarm.key`, then give every
    member `--swarm-key swarm.key`."""
    from p2p.net.keyring import new_key_line

    line = new_key_line() + "\n"
    if out is None:
        print(line, end="")
        return
    try:  # created with mode 600 at once: the key is never readable by others, not even briefly
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CliError(f"--out: {out} exists (a key file is never overwritten; add a key to it by hand to rotate)") from None
    except OSError as exc:
        raise CliError(f"--out: cannot create {out}: {exc.strerror}", code=1) from None
    with os.fdopen(fd, "w") as f:
        f.write(line)
    print(f"wrote a new swarm key to {out} (mode 600); give every member --swarm-key {out}")
