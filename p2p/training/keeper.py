"""``StateKeeper``: what a ``Swarm`` keeps of its training run, and how it gets it back.

It captures a ``TrainingState`` (p2p/training/state.py) of the model, the wrapped optimizer,
the objects registered with ``Swarm.register_state`` (an LR scheduler, a GradScaler) and the
algorithm's state; applies one (from this member's checkpoint, or from a donor during state
sync); and schedules checkpoints. The optimizer and the registered objects may come after the
state they should receive (``wrap()`` after ``start()``): their part waits until they do.

Threads: ``capture_for_peer`` runs on the network thread (a donor serving a joiner) and takes
the parameter lock, under which the optimizer also steps, so model and optimizer state belong
to the same step. Everything else runs on the training thread, between steps.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import numpy as np
import torch

from p2p.events import event
from p2p.training.checkpoints import CheckpointStore
from p2p.training.flat import FlatParams
from p2p.training.state import StateError, TrainingState, check_model, check_optimizer, cpu_copy, finite

log = logging.getLogger("p2p.swarm")


class StateKeeper:
    def __init__(self, model: torch.nn.Module, flat: FlatParams, model_key: str,
                 store: Optional[CheckpointStore], every_s: float) -> None:
        self.model, self.flat, self.model_key = model, flat, model_key
        self.store, self.every_s = store, every_s
        self.optimizer: Optional[torch.optim.Optimizer] = None  # the user's (inner) optimizer
        self.registered: dict[str, Any] = {}
        self._pending_optimizer: Optional[dict] = None
        self._pending_extra: dict[str, Any] = {}
        self.next_checkpoint = time.monotonic() + every_s
        self.restored_from: Optional[str] = None
        self.last_checkpoint_step: Optional[int] = None

    # -- what to keep ---------------------------------------------------------------------------
    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        if self._pending_optimizer is not None:
            self._load_optimizer(self._pending_optimizer)
            self._pending_optimizer = None

    def register(self, name: str, obj: Any) -> None:
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"register_state({name!r}): needs an object with state_dict() and load_state_dict()")
        self.registered[name] = obj
        if name in self._pending_extra:
            obj.load_state_dict(self._pending_extra.pop(name))

    # -- capture --------------------------------------------------------------------------------
    def capture(self, step: int, algorithm: str, algorithm_state: dict, info: dict) -> TrainingState:
        """A checkpoint's state (training thread, between steps: no deltas are queued that
        matter, and nothing steps meanwhile)."""
        return TrainingState(step, self.model_key, algorithm, cpu_copy(self.model.state_dict()),
                             cpu_copy(self.optimizer.state_dict()) if self.optimizer is not None else None,
                             algorithm_state, {k: cpu_copy(o.state_dict()) for k, o in self.registered.items()}, info)

    def capture_for_peer(self, step_of: Callable[[], int], algorithm: str, algorithm_state: dict,
                         with_optimizer: bool, model_values: Optional[np.ndarray] = None) -> TrainingState:
        """A joiner's state (network thread): parameters with the deltas queued for the next
        step included (or ``model_values``, what the algorithm says a joiner should take), the
        optimizer and the registered objects, and the step count, all as of one step (the
        optimizer steps and the count moves under the same lock)."""
        with self.flat.lock:  # re-entrant: snapshot() takes it too
            step = step_of()
            values = self.flat.snapshot() if model_values is None else model_values
            model = cpu_copy(self.model.state_dict())
            optimizer = cpu_copy(self.optimizer.state_dict()) if with_optimizer and self.optimizer is not None else None
            extra = {k: cpu_copy(o.state_dict()) for k, o in self.registered.items()}
        model.update(self.flat.named_values(values, self.model))
        return TrainingState(step, self.model_key, algorithm, model, optimizer, algorithm_state, extra)

    # -- apply ----------------------------------------------------------------------------------
    def apply(self, state: TrainingState) -> None:
        """Load model (now), optimizer and registered objects (now, or when they come).
        StateError when the model or optimizer part does not fit, or the model is not finite;
        nothing is loaded then."""
        check_model(state.model, self.model.state_dict())
        if not finite(state):
            raise StateError("the model carries NaN or Inf")
        if state.optimizer is not None and self.optimizer is not None:
            check_optimizer(state.optimizer, self.optimizer)
        with self.flat.lock:
            with torch.no_grad():
                self.model.load_state_dict(state.model)  # parameters are views: this writes the flat buffers
            self.flat.drop_pending()  # queued deltas were relative to the old values
        if state.optimizer is not None:
            if self.optimizer is not None:
                self._load_optimizer(state.optimizer)
            else:
                self._pending_optimizer = state.optimizer
        for name, value in state.extra.items():
            if name in self.registered:
                self.registered[name].load_state_dict(value)
            else:
                self._pending_extra[name] = value

    def _load_optimizer(self, state: dict) -> None:
        try:
            check_optimizer(state, self.optimizer)
            self.optimizer.load_state_dict(state)
        except (StateError, ValueError, KeyError, RuntimeError) as exc:  # another optimizer or other groups
            log.warning("optimizer state not restored (%s): the optimizer starts afresh", exc)

    # -- checkpoints ----------------------------------------------------------------------------
    def restore(self, task: Optional[str]) -> Optional[TrainingState]:
        """Apply the newest readable checkpoint of this model, if any (StateError: one of
        another model or format, which is refused rather than skipped)."""
        if self.store is None:
            return None
        found = self.store.latest(self.model_key, task)
        if found is None:
            return None
        state, path = found
        self.apply(state)
        self.restored_from = str(path)
        self.last_checkpoint_step = state.step
        event("resumed", f"resumed from {path} (step {state.step})", logging.WARNING, path=str(path), step=state.step)
        return state

    def due(self, now: float) -> bool:
        return self.store is not None and now >= self.next_checkpoint

    def save(self, state: TrainingState, wait: bool) -> None:
        """Write ``state`` (in the background unless ``wait``); a model with NaN or Inf is not
        written (it would push a good checkpoint out)."""
        if self.store is None:
            return
        if not finite(state):
            self.store.last_error = f"checkpoint at step {state.step} not written: the model carries NaN or Inf"
            log.error("%s", self.store.last_error)
            return
        self.next_checkpoint = time.monotonic() + self.every_s
        if wait:
            self.store.wait()
            self.store.save(state)
        elif not self.store.save_in_background(state):
            return  # the previous write is still going: this one is skipped
        self.last_checkpoint_step = state.step
        event("checkpoint", f"checkpoint at step {state.step} in {self.store.directory}", step=state.step,
              directory=str(self.store.directory))

    def status(self) -> dict:
        if self.store is None:
            return {}
        return {"dir": str(self.store.directory), "last_step": self.last_checkpoint_step,
                "written": self.store.written, "write_s": self.store.write_s, "restored_from": self.restored_from,
                "skipped": list(self.store.skipped), "error": self.store.last_error}
