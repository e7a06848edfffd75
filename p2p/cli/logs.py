"""The daemon's logs: text for people, or JSON lines for log shippers (``--log-format json``).

In JSON mode every log record is one object on stderr: ``{"time", "level", "logger",
"message"}`` plus, for the node's events (p2p/events.py), ``"event"`` and its fields. Events are
always written in JSON mode (a shipper wants them whatever ``--log-level`` says); in text mode
they follow ``--log-level`` like everything else.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
                               "level": record.levelname.lower(), "logger": record.name,
                               "message": record.getMessage()}
        if getattr(record, "event", None):
            out["event"] = record.event
            out.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, fmt: str) -> None:
    """The daemon's root handler (the library never configures logging itself)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLines())
        logging.getLogger("p2p.events").setLevel(logging.INFO)
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
