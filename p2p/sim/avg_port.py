"""A ``ModelPort`` over a numpy vector, with the same semantics as ``p2p.training.flat.FlatParams``.

``add_delta`` queues; the (simulated) trainer applies the queue at its step boundary with
``apply_pending``; ``snapshot`` is buffer + queue. ``immediate=True`` applies deltas at once
(hand-driven unit tests). The gradient slot serves algorithms with ``wants_gradient``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class ArrayPort:
    def __init__(self, values, model_key: str = "sim/0", immediate: bool = False) -> None:
        self.x = np.array(values, dtype=np.float32).reshape(-1)
        self.numel = self.x.size
        self.model_key = model_key if model_key != "sim/0" else f"sim/{self.numel}"
        self.immediate = immediate
        self.step = 0
        self.grad: Optional[np.ndarray] = None
        self._pending: Optional[np.ndarray] = None
        self.deltas_applied = 0

    def snapshot(self) -> np.ndarray:
        if self._pending is None:
            return self.x.copy()
        return self.x + self._pending

    def add_delta(self, delta: np.ndarray) -> None:
        if delta.shape != (self.numel,):
            raise ValueError(f"delta of shape {delta.shape}, model has {self.numel} parameters")
        if self.immediate:
            self.x += delta
            self.deltas_applied += 1
        elif self._pending is None:
            self._pending = np.array(delta, dtype=np.float32)
        else:
            self._pending += delta

    def apply_pending(self) -> None:
        if self._pending is not None:
            self.x += self._pending
            self._pending = None
            self.deltas_applied += 1

    def gradient(self) -> np.ndarray:
        if self.grad is None:
            raise RuntimeError("no gradient outside on_gradient .. optimizer step")
        return self.grad.copy()

    def set_gradient(self, grad: np.ndarray) -> None:
        if grad.shape != (self.numel,):
            raise ValueError(f"gradient of shape {grad.shape}, model has {self.numel} parameters")
        self.grad = np.array(grad, dtype=np.float32)
