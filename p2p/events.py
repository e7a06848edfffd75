"""Events a node reports as they happen: members joining, leaving, suspected, declared dead;
state sync; checkpoints; rejected input. They go to the ``p2p.events`` logger, each record
carrying ``event`` (its name) and its fields as attributes, so a log handler can write them as
they are (``p2p start --log-format json``: one JSON object per line) or as text.

The library configures no handler: a program that wants them adds one, the daemon does.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("p2p.events")


def event(name: str, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Report event ``name`` (``message`` for people, ``fields`` for machines)."""
    if log.isEnabledFor(level):
        log.log(level, message, extra={"event": name, "fields": fields})
