"""``p2p keygen``: a new random swarm key (p2p/net/keyring.py), as a key file line; with
``--identity`` a node identity (p2p/net/identity.py); with ``--public FILE`` an identity's public
key, as an allow file line."""

from __future__ import annotations

import os
from typing import Optional

import typer

from p2p.cli.errors import CliError


def keygen(
    out: Optional[str] = typer.Option(None, "--out", help="Write the key to this new file (mode 600) instead of stdout."),
    identity: bool = typer.Option(False, "--identity", help="A node identity (Ed25519 private key) instead of a swarm key."),
    public: Optional[str] = typer.Option(None, "--public", help="Print the public key of this identity file (for --allow files)."),
) -> None:
    """Print a new swarm key: `p2p keygen > swarm.key && chmod 600 swarm.key`, then give every
    member `--swarm-key swarm.key`. `p2p keygen --identity > node.id` makes a node identity;
    `p2p keygen --public node.id >> allow.txt` puts its public key on an allow file."""
    from p2p.net.identity import Identity, load_identity_file, public_line
    from p2p.net.keyring import KeyFileError, new_key_line

    if public is not None:
        if identity or out is not None:
            raise CliError("--public prints a public key: not with --identity or --out")
        try:
            print(public_line(load_identity_file(public).public))
        except KeyFileError as exc:
            raise CliError(f"--public: {exc}") from None
        return
    text = Identity.generate().file_text() if identity else new_key_line() + "\n"
    if out is None:
        print(text, end="")
        return
    try:  # created with mode 600 at once: the key is never readable by others, not even briefly
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CliError(f"--out: {out} exists (a key file is never overwritten; add a key to it by hand to rotate)") from None
    except OSError as exc:
        raise CliError(f"--out: cannot create {out}: {exc.strerror}", code=1) from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if identity:
        print(f"wrote a new node identity to {out} (mode 600); `p2p keygen --public {out}` prints the line "
              f"for the allow file")
    else:
        print(f"wrote a new swarm key to {out} (mode 600); give every member --swarm-key {out}")
