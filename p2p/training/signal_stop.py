"""SIGINT and SIGTERM end a member's loops without a deadlock.

A Python signal handler runs in the main thread between two bytecodes, possibly while that
thread is inside ``Event.wait`` holding the event's (non-reentrant) condition lock; an
``Event.set`` from the handler then waits on that same lock forever. Seen in CI: a node
lingering in ``stop_event.wait(0.02)`` got SIGTERM, hung in ``set`` and was SIGKILLed. The
handler here only writes a byte to a pipe (no lock); a watcher thread blocked on the pipe's
other end sets the event."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

_STOP, _END = b"s", b"e"


class SignalStop:
    """While open: each of ``signals`` sets ``event`` (from a thread of its own)."""

    def __init__(self, event: threading.Event, signals: tuple = (signal.SIGINT, signal.SIGTERM)) -> None:
        self._read, self._write = os.pipe()
        self._watcher = threading.Thread(target=self._watch, args=(event,), name="p2p-signal-stop", daemon=True)
        self._watcher.start()
        self._previous: dict[int, Any] = {sig: signal.signal(sig, self._on_signal) for sig in signals}

    def _on_signal(self, signum: int, frame: Any) -> None:
        try:
            os.write(self._write, _STOP)
        except OSError:  # closed meanwhile: the member is already shutting down
            pass

    def _watch(self, event: threading.Event) -> None:
        while os.read(self._read, 1) == _STOP:
            event.set()

    def close(self) -> None:
        """Give the signals their previous handlers back and end the watcher. Idempotent."""
        if not self._previous:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        os.write(self._write, _END)
        self._watcher.join(timeout=5.0)
        os.close(self._write)
        os.close(self._read)
