"""``p2p export``: the trained model as a file, from a checkpoint or from a live member."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from p2p.cli.errors import CliError, check_address, positive, read_identity_file, read_key_file

FORMATS = ("torch", "safetensors")


def export(
    source: Optional[str] = typer.Option(None, "--from", help="A checkpoint directory (its newest readable checkpoint) or file."),
    peer: Optional[str] = typer.Option(None, help="HOST:PORT of a live member: take its current model."),
    out: str = typer.Option(..., help="File to write the model's state_dict to."),
    fmt: str = typer.Option("torch", "--format", help="torch (torch.save of the state_dict) or safetensors."),
    timeout: float = typer.Option(60.0, help="With --peer: seconds to wait for the model."),
    swarm_key: Optional[str] = typer.Option(None, "--swarm-key", envvar="P2P_SWARM_KEY",
                                            help="With --peer: the swarm's key file, if it has one."),
    identity: Optional[str] = typer.Option(None, "--identity", envvar="P2P_IDENTITY",
                                           help="With --peer: an identity file on the node's allow file, if it has identities on."),
) -> None:
    """Write a model's state_dict: load it with ``model.load_state_dict(torch.load(OUT))``
    (or ``safetensors.torch.load_file(OUT)``)."""
    if (source is None) == (peer is None):
        raise CliError("give exactly one of --from DIR|FILE and --peer HOST:PORT")
    if fmt not in FORMATS:
        raise CliError(f"--format: unknown value {fmt!r} (choose from {', '.join(FORMATS)})")
    positive("--timeout", timeout)
    import torch

    from p2p.training.state import StateError, from_bytes_unchecked

    if peer is not None:
        from p2p.net.client import QueryError, model

        check_address("--peer", peer, allow_wildcard=False)
        try:
            keyring = read_key_file(swarm_key)
            reply = model(peer, timeout, keyring, read_identity_file(identity, keyring))
            state = from_bytes_unchecked(bytes(reply.data))
        except (QueryError, StateError) as exc:
            raise CliError(f"--peer {peer}: {exc}", code=1) from None
    else:
        state = _from_checkpoint(Path(source))
    weights, step = state.model, state.step
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in weights.items()}, str(target),
                  metadata={"step": str(step), "model_key": state.model_key})
    else:
        torch.save(weights, target)
    print(f"wrote {target}: {len(weights)} tensors of model {state.model_key}, step {step}")


def _from_checkpoint(path: Path):
    from p2p.training.checkpoints import CheckpointStore, load
    from p2p.training.state import StateError

    try:
        if path.is_dir():
            store = CheckpointStore(path)
            for candidate in store.paths():
                state = load(candidate, store.skipped)
                if state is not None:
                    return state
            raise CliError(f"--from {path}: no readable checkpoint there", code=1)
        if not path.is_file():
            raise CliError(f"--from {path}: no such file or directory", code=1)
        state = load(path)
    except StateError as exc:
        raise CliError(str(exc), code=1) from None
    if state is None:
        raise CliError(f"--from {path}: not a readable checkpoint", code=1)
    return state
