"""Checkpoint files: atomic writes, the last K kept, the newest readable one found again.

A checkpoint is ``DIR/ckpt-<step>.pt``: a ``torch.save`` dictionary (p2p/training/state.py,
``to_checkpoint``), loadable with ``torch.load(path, weights_only=True)``. Writes go to a
temporary file in the same directory, are flushed and fsynced, then renamed over the final
name and the directory fsynced: a crash mid-write leaves the previous checkpoints intact.

Reading (``latest``): newest step first. A file that cannot be read (truncated, corrupt) is
skipped loudly, in favour of the one before it. A readable checkpoint of another model or an
unknown format version is refused outright (``StateError``): resuming from it would be wrong,
and falling back past it would silently take an older run.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import torch

from p2p.training.state import StateError, TrainingState, finite, from_checkpoint, to_checkpoint

log = logging.getLogger("p2p.checkpoints")
NAME = re.compile(r"^ckpt-(\d+)\.pt$")


class CheckpointStore:
    def __init__(self, directory: str | os.PathLike, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.skipped: list[str] = []  # unreadable files passed over by latest(), with the reason
        self._writer: Optional[threading.Thread] = None
        self.last_error: Optional[str] = None  # the last background write that failed
        self.written = 0
        self.write_s: Optional[float] = None  # how long the last write took
        for stale in self.directory.glob(".ckpt-*.tmp") if self.directory.is_dir() else ():
            stale.unlink(missing_ok=True)  # a write a crash interrupted: never renamed, never read

    def paths(self) -> list[Path]:
        """Checkpoint files, newest step first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := NAME.match(p.name))]
        return [p for _, p in sorted(found, reverse=True)]

    # -- writing ------------------------------------------------------------------------------
    def save(self, state: TrainingState) -> Path:
        """Write ``state`` atomically and prune to the last ``keep``; returns the path."""
        started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"ckpt-{state.step:012d}.pt"
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(to_checkpoint(state), fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.directory)
        for old in self.paths()[self.keep:]:
            old.unlink(missing_ok=True)
        self.write_s = time.monotonic() - started
        self.written += 1
        return final

    def save_in_background(self, state: TrainingState) -> bool:
        """Start writing ``state`` on a thread; False (nothing done) if a write is still going."""
        if self._writer is not None and self._writer.is_alive():
            return False
        self._writer = threading.Thread(target=self._write, args=(state,), name="p2p-checkpoint", daemon=True)
        self._writer.start()
        return True

    def _write(self, state: TrainingState) -> None:
        try:
            self.save(state)
        except Exception as exc:  # a full disk (or any failure) must not kill training: say so, go on
            self.last_error = f"checkpoint at step {state.step} not written: {type(exc).__name__}: {exc}"
            log.exception("%s", self.last_error)

    def wait(self) -> None:
        if self._writer is not None:
            self._writer.join()

    # -- reading ------------------------------------------------------------------------------
    def latest(self, model_key: str, task: Optional[str] = None) -> Optional[tuple[TrainingState, Path]]:
        """The newest readable checkpoint, checked against ``model_key`` (and ``task`` when the
        checkpoint names one); None when there is none. StateError for one of another model."""
        for path in self.paths():
            state = load(path, self.skipped)
            if state is None:
                continue
            check(state, path, model_key, task)
            return state, path
        return None


def load(path: Path, skipped: Optional[list[str]] = None) -> Optional[TrainingState]:
    """The checkpoint at ``path``; None (logged, noted in ``skipped``) when it cannot be read.
    StateError when it is readable but of an unknown format."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated or corrupt: torch raises several unrelated types
        why = f"{path.name}: unreadable ({type(exc).__name__}: {str(exc)[:120]}), falling back to an older one"
        log.error("checkpoint %s", why)
        if skipped is not None:
            skipped.append(why)
        return None
    try:
        state = from_checkpoint(data)
    except StateError as exc:
        raise StateError(f"checkpoint {path}: {exc}") from None
    if not finite(state):
        why = f"{path.name}: the model carries NaN or Inf, falling back to an older one"
        log.error("checkpoint %s", why)
        if skipped is not None:
            skipped.append(why)
        return None
    return state


def check(state: TrainingState, path: Path, model_key: str, task: Optional[str]) -> None:
    if state.model_key != model_key:
        raise StateError(f"checkpoint {path} is of model {state.model_key!r}, this one is {model_key!r}")
    theirs = state.info.get("task")
    if task is not None and theirs is not None and theirs != task:
        raise StateError(f"checkpoint {path} is of task {theirs!r}, this node runs {task!r}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
