"""A model's parameters as one flat, contiguous buffer.

Every parameter tensor is re-pointed to a view into a single 1-D buffer, so averaging, sending
and checksumming the model are one vectorised operation each, never a Python loop over
parameters (the same trick as apex's flat master weights and DDP's gradient buckets).

Thread discipline (why there is a lock and a mailbox):
- only the training thread writes the buffer: optimizer steps, and at step boundaries the
  averaging deltas that other threads queued with ``add_delta``;
- other threads read it only through ``snapshot`` (a copy taken under the lock), so a peer
  never receives a half-updated model;
- the model's logical value is buffer + pending deltas, and ``snapshot`` returns exactly that.
  Otherwise two exchanges answered between two steps would both mix against the same stale
  value and the peer's own weight could go negative (x + (a-x)/2 + (b-x)/2 = (a+b)/2).
"""

from __future__ import annotations

import threading
from typing import Optional

import numpy as np
import torch


class FlatParams:
    """Owns the flat parameter buffer of ``model`` and the queue of pending averaging deltas."""

    def __init__(self, model: torch.nn.Module) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model has no trainable parameters")
        dtypes = {p.dtype for p in params}
        devices = {p.device for p in params}
        if dtypes != {torch.float32} or len(devices) != 1:
            raise ValueError(f"need float32 parameters on one device, got {dtypes} on {devices}")
        self.device = params[0].device
        self.buffer = torch.cat([p.detach().reshape(-1) for p in params])
        # Gradients live in one flat buffer too (backward accumulates into the views in place),
        # so gradient-exchanging algorithms read and replace them in one operation.
        self.grad = torch.zeros_like(self.buffer)
        offset = 0
        for p in params:
            n = p.numel()
            p.data = self.buffer[offset:offset + n].view_as(p)
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n
        self.numel = offset
        self.lock = threading.Lock()  # guards buffer writes and the pending sum
        self._pending: Optional[np.ndarray] = None  # sum of queued deltas (host float32)
        self._pending_count = 0

    def snapshot(self) -> np.ndarray:
        """A consistent float32 host copy of the parameters, queued deltas included."""
        with self.lock:
            values = self.buffer.detach().to("cpu", copy=True).numpy()
            if self._pending is not None:
                values += self._pending
        return values

    def add_delta(self, delta: np.ndarray) -> None:
        """Queue ``x += delta``; the training thread applies it at its next step boundary."""
        if delta.shape != (self.numel,):
            raise ValueError(f"delta of shape {delta.shape}, model has {self.numel} parameters")
        with self.lock:
            if self._pending is None:
                self._pending = np.array(delta, dtype=np.float32)
            else:
                self._pending += delta
            self._pending_count += 1

    def apply_pending(self) -> int:
        """Apply the queued deltas (training thread only). Returns how many there were."""
        with self.lock:
            pending, count = self._pending, self._pending_count
            if pending is None:
                return 0
            self.buffer.add_(torch.from_numpy(pending).to(self.device))
            self._pending, self._pending_count = None, 0
        return count

    def zero_grad(self) -> None:
        """Zero the flat gradient in place (optimizer.zero_grad(set_to_none=True) would
        detach the parameters' gradients from it)."""
        self.grad.zero_()

    def gradient(self) -> np.ndarray:
        """A float32 host copy of the current flat gradient."""
        return self.grad.detach().to("cpu", copy=True).numpy()

    def set_gradient(self, grad: np.ndarray) -> None:
        """Replace the flat gradient (while the trainer waits between backward and step)."""
        if grad.shape != (self.numel,):
            raise ValueError(f"gradient of shape {grad.shape}, model has {self.numel} parameters")
        self.grad.copy_(torch.from_numpy(np.ascontiguousarray(grad, dtype=np.float32)))

    def load(self, values: np.ndarray) -> None:
        """Overwrite the parameters (training thread only, e.g. from a checkpoint)."""
        with self.lock:
            self.buffer.copy_(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)))
