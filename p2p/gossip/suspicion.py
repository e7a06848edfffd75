"""SWIM / Lifeguard arithmetic as pure functions, plus two tiny timer records.

After memberlist's ``util.go`` (suspicionTimeout, retransmitLimit, pushPullScale),
``suspicion.go`` (remainingSuspicionTime) and ``awareness.go``; Lifeguard is Dadgar et al.,
"Lifeguard: Local Health Awareness for More Accurate Failure Detection" (2018), sections IV-A
(local health multiplier) and IV-B (dynamic suspicion timeouts).
"""

from __future__ import annotations

import math

PUSH_PULL_SCALE_THRESHOLD = 32  # memberlist: do not scale push-pull below this many members


def suspicion_min_timeout(suspicion_mult: int, n: int, probe_interval: float) -> float:
    """The suspicion timeout once enough members confirmed: mult * max(1, log10(n)) * interval."""
    node_scale = max(1.0, math.log10(max(1, n)))
    return suspicion_mult * node_scale * probe_interval


def suspicion_timeout(confirmations: int, k: int, min_s: float, max_s: float) -> float:
    """Total suspicion timeout (from its start) after ``confirmations`` independent suspectors.

    Starts at ``max_s`` and falls logarithmically to ``min_s`` once ``k`` members confirmed;
    ``k < 1`` means no confirmations are expected and the timeout is ``min_s`` at once.
    Rounded down to the millisecond like memberlist.
    """
    if k < 1:
        return min_s
    frac = math.log(confirmations + 1.0) / math.log(k + 1.0)
    raw = max_s - frac * (max_s - min_s)
    return max(min_s, math.floor(1000.0 * raw) / 1000.0)


def expected_confirmations(suspicion_mult: int, n: int) -> int:
    """k: confirmations we wait for before the minimum timeout (0 when the cluster is tiny)."""
    k = suspicion_mult - 2
    return 0 if n - 2 < k else k


def retransmit_limit(retransmit_mult: int, n: int) -> int:
    """How many times one update is piggybacked: mult * ceil(log10(n + 1))."""
    return retransmit_mult * math.ceil(math.log10(n + 1))


def push_pull_interval(base: float, n: int) -> float:
    """Anti-entropy interval, stretched once the cluster is large so its cost stays bounded."""
    if n <= PUSH_PULL_SCALE_THRESHOLD:
        return base
    return (math.ceil(math.log2(n) - math.log2(PUSH_PULL_SCALE_THRESHOLD)) + 1.0) * base


def awareness_delta(expected_nacks: int, nacks: int) -> int:
    """Local-health change after a failed probe (Lifeguard IV-A, memberlist probeNode).

    With helpers we blame ourselves once per helper that did not even send a Nack (our own
    links are the likely problem); without helpers every failed probe counts once.
    """
    if expected_nacks > 0:
        return max(0, expected_nacks - nacks)
    return 1


class Awareness:
    """Lifeguard's local health multiplier: a score in [0, max - 1]; timeouts scale by score+1."""

    __slots__ = ("score", "max")

    def __init__(self, max_multiplier: int) -> None:
        self.score = 0
        self.max = max_multiplier

    def apply(self, delta: int) -> None:
        self.score = min(self.max - 1, max(0, self.score + delta))

    def scale(self, timeout: float) -> float:
        return timeout * (self.score + 1)


class Suspicion:
    """One suspicion timer: who confirmed it and when it fires (memberlist ``suspicion``)."""

    __slots__ = ("start", "k", "min", "max", "confirmers", "deadline", "incarnation")

    def __init__(self, origin: str, k: int, min_s: float, max_s: float, now: float, incarnation: int) -> None:
        self.start = now
        self.k = k
        self.min = min_s
        self.max = max_s
        self.confirmers = {origin: None}  # the original suspector does not count as a confirmation
        self.incarnation = incarnation
        self.deadline = now + (max_s if k >= 1 else min_s)

    @property
    def confirmations(self) -> int:
        return len(self.confirmers) - 1

    def confirm(self, origin: str) -> bool:
        """Count an independent suspector; True when it was new (the update is worth re-gossiping)."""
        if len(self.confirmers) - 1 >= self.k or origin in self.confirmers:
            return False
        self.confirmers[origin] = None
        self.deadline = self.start + suspicion_timeout(len(self.confirmers) - 1, self.k, self.min, self.max)
        return True
