"""``p2p plot``: a run's curves as a PNG: accuracy and loss against time and against steps, per
peer, and bytes sent per peer (matplotlib: the field's plotting library).

It reads ``metrics.jsonl`` (what ``p2p demo --keep-logs DIR`` writes: one sample per peer per
poll) or, in a directory without one, the JSON progress lines of ``p2p start --log-format json``
in its ``*.log`` files (one file per peer).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import typer

from p2p.cli.errors import CliError


def load_samples(source: Path) -> dict[str, list[dict[str, Any]]]:
    """Samples per peer, in time order: each with t (s), step, loss, accuracy, bytes_sent."""
    if source.is_dir():
        metrics = source / "metrics.jsonl"
        files = [metrics] if metrics.exists() else sorted(source.glob("*.log"))
    elif source.is_file():
        files = [source]
    else:
        raise CliError(f"{source}: no such file or directory", code=1)
    peers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in files:
        start = None
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a text line among JSON ones
            if not isinstance(row, dict) or "step" not in row:
                continue
            if "peer" not in row:  # a daemon's progress line: its file names the peer, its time is absolute
                if row.get("event") not in ("progress", "done"):
                    continue
                start = row["time"] if start is None else start
                row = {**row, "peer": path.stem, "t": row["time"] - start}
            peers[str(row["peer"])].append(row)
    if not peers:
        raise CliError(f"{source}: no samples (want metrics.jsonl, or --log-format json progress lines)", code=1)
    t0 = min(r["t"] for rows in peers.values() for r in rows)  # the first sample: seconds from there
    return {peer: sorted(({**r, "t": r["t"] - t0} for r in rows), key=lambda r: r["t"])
            for peer, rows in sorted(peers.items())}


def plot(source: str = typer.Argument(..., help="A run directory (p2p demo --keep-logs DIR) or a metrics.jsonl file."),
         out: str = typer.Option("curves.png", help="The PNG to write.")) -> None:
    """Draw a run's accuracy, loss and bytes per peer, against time and steps."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    peers = load_samples(Path(source))
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = [("t", "accuracy", "held-out accuracy"), ("t", "loss", "training loss"), ("t", "bytes_sent", "MB sent"),
              ("step", "accuracy", "held-out accuracy"), ("step", "loss", "training loss"), ("step", "bytes_sent", "MB sent")]
    for ax, (x, y, label) in zip(axes.flat, panels):
        for peer, rows in peers.items():
            points = [(r[x], r[y] / (1e6 if y == "bytes_sent" else 1)) for r in rows
                      if r.get(y) is not None and r.get(x) is not None]
            if points:
                ax.plot(*zip(*points), label=peer, linewidth=1.2)
        ax.set_xlabel("seconds" if x == "t" else "step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{source}: {len(peers)} peers")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"wrote {out}: {len(peers)} peers, {sum(len(r) for r in peers.values())} samples")
