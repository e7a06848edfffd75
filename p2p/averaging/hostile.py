"""A hostile peer, for tests and benchmarks only (``p2p start --hostile MODE``, hidden).

It trains and mixes like any peer, but every averaging message it sends has its float32
tensors (parameters, DiLoCo's pseudo-gradient, sketch and momentum, GossipGraD's gradient)
replaced on the way out, by one of the attacks robust mixing is meant to withstand
(p2p/averaging/robust.py):

    scale100   v -> 100 v          (a huge but finite vector; only NaN/Inf was refused before)
    noise      v -> Gaussian noise with the norm of v (a plausible-looking scale, no signal)
    signflip   v -> -v             (the sign-flipping attack: a model or update pointing away)

Its own model is left alone (only what travels is corrupted), so it keeps looking like a
member. Compressed payloads (uint8 codes) travel unchanged: the hostile knob is meant for runs
without compression.
"""

from __future__ import annotations

import dataclasses

import numpy as np

HOSTILE_MODES = ("scale100", "noise", "signflip")


class Hostile:
    def __init__(self, mode: str, message_types: tuple[type, ...], seed: int = 0) -> None:
        if mode not in HOSTILE_MODES:
            raise ValueError(f"unknown hostile mode {mode!r} (choose from {', '.join(HOSTILE_MODES)})")
        self.mode = mode
        self.types = tuple(message_types)
        self.rng = np.random.default_rng(seed)
        self.tampered = 0  # messages corrupted so far

    def corrupt(self, v: np.ndarray) -> np.ndarray:
        if self.mode == "scale100":
            return v * np.float32(100.0)
        if self.mode == "signflip":
            return -v
        noise = self.rng.standard_normal(v.size).astype(np.float32)
        return noise * np.float32(np.linalg.norm(v) / max(float(np.linalg.norm(noise)), 1e-30))

    def tamper(self, msg: object) -> object:
        """The message as this hostile peer sends it (non-averaging messages unchanged)."""
        if not isinstance(msg, self.types) or not dataclasses.is_dataclass(msg):
            return msg
        changes = {f.name: self.corrupt(value) for f in dataclasses.fields(msg)
                   if isinstance(value := getattr(msg, f.name), np.ndarray)
                   and value.dtype == np.float32 and value.size}
        if not changes:
            return msg
        self.tampered += 1
        return dataclasses.replace(msg, **changes)
