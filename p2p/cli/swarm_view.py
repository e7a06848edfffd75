"""``p2p status --swarm``: one table of every member a node knows, each asked for its own status.

The member list comes from the node given with ``--peer``; every member is then asked at once
(one thread each), each with its own timeout, so an unreachable member shows as such within
that timeout and the whole view never hangs. ``--watch`` redraws it in place (rich's Live).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from rich.console import Console
from rich.live import Live
from rich.table import Table

from p2p.net.client import QueryError, status
from p2p.net.identity import Identity
from p2p.net.keyring import Keyring


def swarm_rows(peer: str, timeout_s: float, keyring: Optional[Keyring] = None,
               identity: Optional[Identity] = None) -> list[dict[str, Any]]:
    """One row per member ``peer`` lists (itself included): its own status, or why not."""
    first = status(peer, timeout_s, keyring, identity)
    members = {m["addr"]: m for m in first.get("members", [])}
    members.setdefault(first["addr"], {"id": first["id"], "addr": first["addr"], "state": "alive", "last_heard_s": 0.0})

    def ask(addr: str) -> dict[str, Any]:
        row = {"addr": addr, "id": members[addr].get("id"), "state": members[addr].get("state"),
               "last_heard_s": members[addr].get("last_heard_s")}
        if addr == first["addr"]:
            return {**row, "reachable": True, "status": first}
        if row["state"] in ("dead", "left"):
            return {**row, "reachable": False, "error": row["state"]}
        try:
            return {**row, "reachable": True, "status": status(addr, timeout_s, keyring, identity)}
        except QueryError as exc:
            return {**row, "reachable": False, "error": str(exc)}

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(members)))) as pool:
        return sorted(pool.map(ask, members), key=lambda r: str(r["id"]))


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def table(rows: list[dict[str, Any]], peer: str) -> Table:
    t = Table("id", "state", "step", "loss", "accuracy", "steps/s", "neighbours", "sent MB", "recv MB", "codec",
              "last heard", title=f"swarm seen from {peer}: {len(rows)} members, "
                                  f"{sum(r['reachable'] for r in rows)} answering")
    for r in rows:
        heard = "-" if r["last_heard_s"] is None else f"{r['last_heard_s']:.1f}s ago"
        if not r["reachable"]:
            t.add_row(str(r["id"]), f"{r['state']} (unreachable)" if r["state"] not in ("dead", "left") else r["state"],
                      "-", "-", "-", "-", "-", "-", "-", "-", heard)
            continue
        s = r["status"]
        t.add_row(str(s["id"]), f"{r['state']}/{s['phase']}", str(s["step"]), _fmt(s.get("loss"), ".4f"),
                  _fmt(s.get("accuracy"), ".4f"), _fmt(s.get("steps_per_s"), ".1f"), str(len(s.get("neighbours", []))),
                  f"{s.get('bytes_sent', 0) / 1e6:.1f}", f"{s.get('bytes_received', 0) / 1e6:.1f}",
                  str((s.get("bandwidth") or {}).get("codec", "-")), heard)
    return t


def json_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows for ``--json``: a few fields per member, its full status under ``status``."""
    return [{"id": r["id"], "addr": r["addr"], "state": r["state"], "reachable": r["reachable"],
             "last_heard_s": r["last_heard_s"], **({"status": r["status"]} if r["reachable"] else {"error": r["error"]})}
            for r in rows]


def watch(peer: str, timeout_s: float, every_s: float, console: Optional[Console] = None,
          keyring: Optional[Keyring] = None, identity: Optional[Identity] = None) -> None:
    """Redraw the table every ``every_s`` until interrupted (Ctrl-C)."""
    console = console or Console()
    with Live(table(swarm_rows(peer, timeout_s, keyring, identity), peer), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(every_s)
            try:
                live.update(table(swarm_rows(peer, timeout_s, keyring, identity), peer))
            except QueryError as exc:
                live.update(Table(title=f"{peer} does not answer: {exc}"))
