"""Topologies: which live members a peer talks to. Pure functions of the membership view."""

from __future__ import annotations

from typing import Sequence


def full(me: str, alive: Sequence[str]) -> list[str]:
    """Fully connected: every live member is a neighbour."""
    return [m for m in alive if m != me]
