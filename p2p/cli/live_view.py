"""The demo's live view and summary, drawn with rich on stderr (stdout stays for --json).

rich is already a dependency of typer; it gives a flicker-free live table for free, which we
would otherwise hand-roll with ANSI codes. On a non-terminal stderr the view prints a plain
progress line every few seconds instead.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional, Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


class LiveView:
    def __init__(self, enabled: bool, peers: int) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.peers = peers
        self._live: Optional[Live] = None
        self._last_line = 0.0
        if enabled and self.console.is_terminal:
            self._live = Live(self._table([None] * peers, math.nan), console=self.console,
                              refresh_per_second=4, transient=False)
            self._live.start()

    def _table(self, statuses: Sequence[Optional[dict]], distance: float) -> Table:
        table = Table(title=f"p2p swarm: {self.peers} peers   consensus distance {_fmt(distance, '.5f')}")
        columns = ("peer", "phase", "step", "loss", "accuracy", "neighbours", "sent MB", "recv MB",
                   "exchanges", "codec", "pause s", "link Mbit/s")
        for column in columns:
            table.add_column(column, justify="right")
        for i, s in enumerate(statuses):
            if s is None:
                table.add_row(str(i), "starting", *["-"] * (len(columns) - 2))
                continue
            avg, bw = s.get("averaging", {}), s.get("bandwidth", {})
            rates = [l["throughput_mbit_s"] for l in bw.get("links", {}).values() if l.get("throughput_mbit_s")]
            table.add_row(s["addr"], s["phase"], str(s["step"]), _fmt(s["loss"], ".4f"),
                          _fmt(s["accuracy"], ".4f"), str(len(s["neighbours"])),
                          f"{s['bytes_sent'] / 1e6:.2f}", f"{s['bytes_received'] / 1e6:.2f}",
                          f"{avg.get('exchanges_completed', 0)}/{avg.get('exchanges_started', 0)}",
                          str(bw.get("codec", "-")), _fmt(bw.get("interval_s"), ".2f"),
                          _fmt(min(rates) if rates else None, ".0f"))
        return table

    def update(self, statuses: Sequence[Optional[dict]], distance: float) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.update(self._table(statuses, distance))
        elif time.monotonic() - self._last_line > 5.0:
            self._last_line = time.monotonic()
            steps = " ".join(str(s["step"]) if s else "-" for s in statuses)
            self.console.print(f"steps [{steps}]  consensus distance {_fmt(distance, '.5f')}",
                               highlight=False)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def summary(self, summary: dict) -> None:
        if not self.enabled:
            return
        table = Table(title=f"{summary['task']} / {summary['algorithm']} / {summary['topology']}: "
                            f"reference accuracy {summary['reference_accuracy']:.4f}, consensus distance "
                            f"{summary['consensus_distance']:.2e}, {summary['wall_s']:.1f}s")
        for column in ("peer", "steps", "loss", "accuracy", "vs reference", "sent MB", "recv MB"):
            table.add_column(column, justify="right")
        for p in summary["peers"]:
            table.add_row(p["id"], str(p["steps"]), f"{p['loss']:.4f}", f"{p['accuracy']:.4f}",
                          f"{100 * (p['accuracy'] - summary['reference_accuracy']):+.2f} pt",
                          f"{p['bytes_sent'] / 1e6:.2f}", f"{p['bytes_received'] / 1e6:.2f}")
        self.console.print(table)
