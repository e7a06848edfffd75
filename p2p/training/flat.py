"""A model's parameters as flat, contiguous buffers: one per dtype, on the model's device.

Every trainable parameter is re-pointed to a view into the buffer of its dtype, so averaging,
sending and checksumming the model are one vectorised operation per buffer, never a Python loop
over parameters (the same trick as apex's flat master weights and DDP's gradient buckets). A
float32 model has one buffer; a bf16 model one bf16 buffer; a model that keeps, say, its norms
in float32 and the rest in bf16 has two. The optimizer keeps working on the same Parameter
objects, so it may be built before or after.

What the averaging algorithms see is one float32 vector (``numel`` entries: the buffers in
order, converted): averaging happens in float32 whatever the model's dtype, and a delta is
added to a bf16/fp16 buffer in float32 before rounding once (``Tensor.add_`` computes in the
wider type). Only what goes on the wire leaves the device: ``snapshot`` copies to host memory,
``apply_pending`` copies the summed deltas back once per step boundary that has any.

Thread discipline (why there is a lock and a mailbox):
- only the training thread writes the buffers: optimizer steps (under ``lock``), and at step
  boundaries the averaging deltas that other threads queued with ``add_delta``;
- other threads read them only through ``snapshot`` (a copy taken under the lock), so a peer
  never receives a half-updated model;
- the model's logical value is buffers + pending deltas, and ``snapshot`` returns exactly that.
  Otherwise two exchanges answered between two steps would both mix against the same stale
  value and the peer's own weight could go negative (x + (a-x)/2 + (b-x)/2 = (a+b)/2).

Gradients stay the user's: ``optimizer.zero_grad(set_to_none=True)`` is fine. The one
algorithm that exchanges gradients (GossipGraD) gathers and scatters them per step
(``gradient``/``set_gradient``); no other path touches them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class _Group:
    """The parameters of one dtype: a buffer, and its slice of the float32 vector."""

    buffer: torch.Tensor
    start: int
    stop: int


class FlatParams:
    """Owns the flat parameter buffers of ``model`` and the queue of pending averaging deltas."""

    def __init__(self, model: torch.nn.Module) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model has no trainable parameters")
        not_float = sorted({str(p.dtype) for p in params if not p.is_floating_point()})
        if not_float:
            raise ValueError(f"can only average floating-point parameters, got {', '.join(not_float)}")
        devices = {p.device for p in params}
        if len(devices) != 1:
            raise ValueError(f"need every parameter on one device, got {sorted(map(str, devices))}")
        self.device = params[0].device
        dtypes = list(dict.fromkeys(p.dtype for p in params))  # first-seen order
        self.params = [p for dtype in dtypes for p in params if p.dtype == dtype]  # vector order
        self.groups: list[_Group] = []
        offset = 0
        for dtype in dtypes:
            members = [p for p in self.params if p.dtype == dtype]
            buffer = torch.cat([p.detach().reshape(-1) for p in members])
            start = offset
            for p in members:
                n = p.numel()
                p.data = buffer[offset - start:offset - start + n].view_as(p)
                offset += n
            self.groups.append(_Group(buffer, start, offset))
        self.numel = offset
        self.dtypes = dtypes
        self.lock = threading.RLock()  # guards buffer writes and the pending sum; re-entrant, so a
        # reader can hold it across a snapshot and the optimizer's state (one consistent step)
        self._pending: Optional[np.ndarray] = None  # sum of queued deltas (host float32): _spare or None
        self._spare: Optional[np.ndarray] = None  # the pending sum's buffer, kept between steps: a fresh
        # model-sized array per exchange costs its page faults (~1 ms per 8 MB) on top of the copy
        self._pending_count = 0
        self.landed = 0  # deltas applied so far: the model's version, for "changed since evaluated?"

    @property
    def buffer(self) -> torch.Tensor:
        """The one buffer of a single-dtype model."""
        if len(self.groups) != 1:
            raise ValueError(f"the model has {len(self.groups)} dtypes, so as many buffers")
        return self.groups[0].buffer

    def _to_host(self) -> np.ndarray:
        if len(self.groups) == 1 and self.dtypes[0] == torch.float32:
            return self.groups[0].buffer.detach().to("cpu", copy=True).numpy()
        values = np.empty(self.numel, dtype=np.float32)
        for g in self.groups:  # one copy (and cast) per dtype
            torch.from_numpy(values[g.start:g.stop]).copy_(g.buffer.detach())
        return values

    def snapshot(self) -> np.ndarray:
        """A consistent float32 host copy of the parameters, queued deltas included."""
        with self.lock:
            values = self._to_host()
            if self._pending is not None:
                values += self._pending
        return values

    def add_delta(self, delta: np.ndarray) -> None:
        """Queue ``x += delta``; the training thread applies it at its next step boundary."""
        if delta.shape != (self.numel,):
            raise ValueError(f"delta of shape {delta.shape}, model has {self.numel} parameters")
        with self.lock:
            if self._pending is None:
                if self._spare is None:
                    self._spare = np.empty(self.numel, dtype=np.float32)
                self._pending = self._spare
                np.copyto(self._pending, delta)
            else:
                self._pending += delta
            self._pending_count += 1

    def apply_pending(self) -> int:
        """Apply the queued deltas (training thread only). Returns how many there were."""
        with self.lock:
            pending, count = self._pending, self._pending_count
            if pending is None:
                return 0
            delta = torch.from_numpy(pending).to(self.device)
            for g in self.groups:
                g.buffer.add_(delta[g.start:g.stop])
            self._pending, self._pending_count = None, 0
            self.landed += count
        return count

    def drop_pending(self) -> None:
        """Forget queued deltas (call it under ``lock``, right after overwriting the parameters:
        they were relative to the old values)."""
        with self.lock:
            self._pending, self._pending_count = None, 0

    def named_values(self, values: np.ndarray, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``values`` (a float32 vector in this object's order) as CPU tensors named as in
        ``model.state_dict()`` and in each parameter's dtype."""
        by_id, offset = {}, 0
        for p in self.params:
            by_id[id(p)] = torch.from_numpy(values[offset:offset + p.numel()]).view(p.shape).to(p.dtype)
            offset += p.numel()
        # remove_duplicate=False: a tied weight has a name per module; every one of them must get
        # the value (load_state_dict writes each name, the last one wins)
        return {name: by_id[id(p)] for name, p in model.named_parameters(remove_duplicate=False) if id(p) in by_id}

    # -- gradients, for the algorithms that exchange them ----------------------------------
    def gradient(self) -> np.ndarray:
        """A float32 host copy of the current gradients, in vector order (zeros where a
        parameter has none)."""
        parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in self.params]
        return torch.cat(parts).to("cpu").numpy()

    def set_gradient(self, grad: np.ndarray) -> None:
        """Replace the gradients (while the trainer waits between backward and step)."""
        if grad.shape != (self.numel,):
            raise ValueError(f"gradient of shape {grad.shape}, model has {self.numel} parameters")
        values = torch.from_numpy(np.ascontiguousarray(grad, dtype=np.float32)).to(self.device)
        parts = [part.view_as(p) for p, part in zip(self.params, values.split([p.numel() for p in self.params]))]
        if all(p.grad is not None for p in self.params):
            torch._foreach_copy_([p.grad for p in self.params], parts)  # one call, not one per parameter
            return
        for p, part in zip(self.params, parts):  # a parameter without a gradient gets a fresh one
            if p.grad is None:
                p.grad = part.to(p.dtype).clone()
            else:
                p.grad.copy_(part)
