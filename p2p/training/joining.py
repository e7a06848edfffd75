"""Joining a swarm, from the training thread's side: state sync first, then membership.

``sync_state`` runs a ``StateJoiner`` (p2p/statesync/joiner.py) on the network thread and waits
for it. A blob that arrives whole but does not fit this member (``StateError`` from
p2p/training/state.py, or from ``accept`` while it loads the state) counts against its donor
like a broken transfer: the next attempt leaves that donor out. ``wait_joined`` then waits until a join address answered and
``min_members`` are alive.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from p2p.config import SwarmConfig
from p2p.net.driver import DriverBusy, DriverStopped, NetworkDriver
from p2p.peer import Peer
from p2p.statesync import StateJoiner
from p2p.statesync.joiner import FAILED
from p2p.training.state import StateError, TrainingState, from_bytes

log = logging.getLogger("p2p.swarm")
ATTEMPTS = 3  # donors whose blob did not fit this model, before giving up


class SwarmError(RuntimeError):
    """The swarm member cannot go on: no join address answered, a port is taken, state sync
    failed, or the network thread failed. The message says which."""


class JoinError(SwarmError):
    """No join address answered (or too few members came) within ``join_timeout``."""


@dataclass
class Synced:
    state: TrainingState
    donor: str
    crc: int
    nbytes: int
    seconds: float


def sync_state(driver: NetworkDriver, peer: Peer, config: SwarmConfig, model: torch.nn.Module, model_key: str,
               own_step: int, rng: random.Random, stop: threading.Event,
               watch: Callable[[Optional[StateJoiner]], None],
               accept: Callable[[TrainingState], None]) -> Optional[Synced]:
    """Download the freshest state of the swarm and ``accept`` it (load it; StateError: it
    does not fit, try another donor). None when no member has a fresher state than
    ``own_step`` (or ``stop`` was set). ``watch(joiner)`` is told which joiner runs (for
    status). Raises SwarmError when no member could serve a state that fits."""
    started = time.monotonic()
    deadline = started + config.join_timeout_s
    mine = model.state_dict()
    model_bytes = sum(t.numel() * t.element_size() for t in mine.values())
    max_bytes = 8 * model_bytes + (16 << 20)  # model, optimizer slots, algorithm state, with room
    excluded: set[str] = set()
    for _ in range(ATTEMPTS):
        joiner = StateJoiner(config.sync, config.join, own_step, model_key, max_bytes, rng, time.monotonic(),
                             deadline, exclude=excluded, optimizer=config.sync_optimizer)
        watch(joiner)
        driver.act(lambda now: peer.begin_sync(joiner, now))
        while not _call(driver, lambda: joiner.finished, busy=False):
            if stop.wait(0.05):
                return None
        if joiner.phase == FAILED:
            why = joiner.error if not excluded else f"{joiner.error}; refused before: {', '.join(sorted(excluded))}"
            raise SwarmError(f"state sync failed: {why} (--no-state-sync starts from this node's own model)")
        outcome = joiner.outcome
        if outcome.data is None:
            return None
        try:
            state = from_bytes(outcome.data, mine, model_key)
            accept(state)
        except StateError as exc:
            log.warning("state from %s refused: %s; trying another member", outcome.donor, exc)
            excluded.add(outcome.donor)
            continue
        return Synced(state, outcome.donor, outcome.crc, len(outcome.data), time.monotonic() - started)
    raise SwarmError(f"state sync failed: the states of {', '.join(sorted(excluded))} do not fit this model")


def offered_members(alive: list[str], join: Sequence[str]) -> list[str]:
    """The addresses our state offers name (a joiner asks them too): the live members, or, while
    we know none (we are joining ourselves), the addresses we join through. Nodes launched
    together in a chain (each joins the one before, as the lab and LocalSwarm start them) were
    each told "nothing yet, ask again" by a member still syncing, and asked again after 0.25,
    0.5, 1 s...: the last of four began training ~1.8 s after the first at 20 Mbit/s
    (bench/slow_links.py). Pointed at the member we ask, a joiner asks the one with state now."""
    return alive or list(join)


def wait_joined(driver: NetworkDriver, peer: Peer, config: SwarmConfig, stop: threading.Event,
                deadline: Optional[float] = None) -> None:
    """Until a join address answered and ``min_members`` are alive (or ``stop``); JoinError at
    ``deadline`` (default: ``join_timeout`` from now)."""
    if deadline is None:
        deadline = time.monotonic() + config.join_timeout_s
    while True:
        joined, members = _call(driver, lambda: (peer.joined, peer.live_members()), busy=(False, 0))
        if (joined and members >= config.min_members) or stop.is_set():
            return
        if time.monotonic() >= deadline:
            if not joined:
                raise JoinError(f"no join address answered within {config.join_timeout_s:g}s "
                                f"(tried {', '.join(config.join)})")
            raise JoinError(f"{members} of the {config.min_members} members asked for were alive after "
                            f"{config.join_timeout_s:g}s")
        stop.wait(0.05)


def _call(driver: NetworkDriver, fn, busy=None):
    """``driver.call(fn)``; ``busy`` when the network thread is too busy to answer now."""
    try:
        return driver.call(fn)
    except DriverBusy:
        return busy
    except DriverStopped:
        raise SwarmError(f"network loop failed: {driver.error}") from None
