"""The node's HTTP endpoint (``--metrics HOST:PORT``): ``/metrics`` for Prometheus, ``/`` a small
status page for people, ``/healthz`` for container health checks.

One WSGI app on a threading server in a daemon thread, from the standard library; the
Prometheus exposition comes from ``prometheus_client`` (its own registry per node, so two nodes
in one process do not mix). ``/healthz`` answers 200 while the node's network loop runs and
has turned within the last ``stale_s`` seconds, 503 otherwise (the loop died or hangs).
"""

from __future__ import annotations

import html
import json
import math
import socketserver
import threading
import time
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from p2p.ops.metrics import SwarmCollector


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # no line on stderr per scrape
        pass


class OpsServer:
    def __init__(self, address: str, status: Callable[[], dict], loop_alive: Callable[[], float],
                 stale_s: float = 10.0) -> None:
        """``status``: the node's status dict; ``loop_alive``: the monotonic time the network loop
        last turned (-inf: it ended)."""
        host, _, port = address.rpartition(":")  # checked by the ``metrics`` setting (port 0: any)
        host = host.strip("[]")
        self.status, self.loop_alive, self.stale_s = status, loop_alive, stale_s
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SwarmCollector(status))
        self._metrics = make_wsgi_app(self.registry)
        self._server = make_server("" if host in ("0.0.0.0", "*") else host, int(port), self._app, _Server, _Quiet)
        self.address = f"{host}:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="p2p-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the app --------------------------------------------------------------------------------
    def _app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/healthz":
            healthy, why = self.health()
            start_response("200 OK" if healthy else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [why.encode()]
        if path == "/status.json":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps(self.status(), default=_json_default).encode()]
        if path in ("/", "/index.html"):
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [page(self.status()).encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: /, /metrics, /healthz, /status.json\n"]

    def health(self) -> tuple[bool, str]:
        last = self.loop_alive()
        if last == -math.inf:
            return False, "unhealthy: the network loop has stopped\n"
        age = time.monotonic() - last
        if age > self.stale_s:
            return False, f"unhealthy: the network loop has not turned for {age:.0f} s\n"
        return True, "ok\n"


def _json_default(value: Any) -> Any:
    return None if isinstance(value, float) and value != value else str(value)


def _fmt(value: Any, spec: str = ".4f") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return format(value, spec) if isinstance(value, (int, float)) else html.escape(str(value))


def page(s: dict) -> str:
    """The status page: the node, its members, its links. Refreshes itself every 5 s."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(str(m['id']))}</td><td>{e(str(m['addr']))}</td><td class='{e(str(m['state']))}'>{e(str(m['state']))}</td>"
        f"<td>{m['incarnation']}</td><td>{_fmt(m['last_heard_s'], '.1f')}</td></tr>" for m in s.get("members", []))
    links = "".join(
        f"<tr><td>{e(peer)}</td><td>{_fmt(row.get('throughput_mbit_s'), '.1f')}</td><td>{_fmt(row.get('exchange_ms'), '.0f')}</td></tr>"
        for peer, row in sorted(((s.get("bandwidth") or {}).get("links") or {}).items()))
    sync = s.get("sync") or {}
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>p2p {e(str(s.get('id')))}</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse;margin:.5em 0 1.5em}}
td,th{{border:1px solid #ccc;padding:.25em .6em;text-align:left}} th{{background:#f3f3f3}}
.alive{{color:#070}} .suspect{{color:#a60}} .dead{{color:#b00}} .left{{color:#777}}</style></head><body>
<h1>p2p node {e(str(s.get('id')))}</h1>
<table><tr><th>phase</th><th>step</th><th>steps/s</th><th>loss</th><th>accuracy</th><th>algorithm</th>
<th>codec</th><th>neighbours</th><th>consensus</th><th>sent MB</th><th>received MB</th><th>rejected</th></tr>
<tr><td>{_fmt(s.get('phase'))}</td><td>{s.get('step')}</td><td>{_fmt(s.get('steps_per_s'), '.1f')}</td>
<td>{_fmt(s.get('loss'))}</td><td>{_fmt(s.get('accuracy'))}</td><td>{_fmt(s.get('algorithm'))}/{_fmt(s.get('topology'))}</td>
<td>{_fmt((s.get('bandwidth') or {}).get('codec'))}</td><td>{len(s.get('neighbours') or [])}</td>
<td>{_fmt(s.get('consensus'), '.3g')}</td><td>{s.get('bytes_sent', 0) / 1e6:.1f}</td>
<td>{s.get('bytes_received', 0) / 1e6:.1f}</td><td>{sum((s.get('rejected') or {}).values())}</td></tr></table>
<p>security: {e(str((s.get('security') or {}).get('summary', '-')))}</p>
<h2>Members</h2>
<table><tr><th>id</th><th>address</th><th>state</th><th>incarnation</th><th>last heard (s ago)</th></tr>{rows}</table>
<h2>Links</h2>
<table><tr><th>neighbour</th><th>throughput Mbit/s</th><th>exchange ms</th></tr>{links or '<tr><td colspan=3>none measured</td></tr>'}</table>
<p>state sync: {_fmt(sync.get('phase'))} {('from ' + e(str(sync.get('donor')))) if sync.get('donor') else ''}
&middot; <a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a> &middot; <a href="/status.json">/status.json</a></p>
</body></html>
"""
