"""GossipGraD: gradient gossip with a rotating partner.

After Daily, Vishnu, Siegel, Warfel & Amatya, "GossipGraD: Scalable Deep Learning using Gossip
Communication based Asynchronous Gradient Descent", arXiv:1803.05880, 2018, sec. 4: instead of
an all-reduce of gradients, each step a peer exchanges its gradient with ONE partner and both
use the average; the partner rotates over a hypercube-like schedule (natural topology
``hypercube``: partner i XOR 2^(t mod log2 n) over the sorted members), so a gradient reaches
every peer in log2 n steps at O(1) messages per peer per step.

Hooks (step k, gradient round r):
- ``on_gradient(k)``: g_i = ``port.gradient()``; send GradientShare(r, g_i) to this round's
  partner(s) (the topology's neighbours at ``topology_round()``). One round in
  ``GossipGraDConfig.model_every`` (``model_round``) the message is a GradientModelShare that
  carries the parameters too (see below).
- ``gradient_ready(k)``: False until the partner's round-r message arrived or the round
  deadline passed (``round_timeout_s``, longer on a link measured too slow for the round's bytes:
  p2p/averaging/round_deadline.py, measured from the partner's ``RoundReceipt``, which it sends
  back for every share it accepts, so a straggling partner is not mistaken for a slow link); then ``port.set_gradient`` with the Metropolis-Hastings mix
  ((g_i + g_j) / 2 for one partner) or, on timeout with nothing, the own gradient is kept.
  On model rounds the parameter mix is queued too (``add_delta``). No partner this round (n
  not a power of two): True at once.
- ``may_step`` True, ``after_step`` [] (all the waiting is in ``gradient_ready``).

Why parameters too: gradient averaging alone keeps models equal only if they start equal and
every peer applies the same averaged gradient; with a single partner the averaged gradients
differ, so models drift apart (boundedly for a decaying learning rate), and a late joiner's
model would never be pulled in. The paper relies on identical starts; averaging the parameters
with the same partner every few rounds bounds the drift and admits joiners at no extra round
trip (``model_every = 0`` turns it off). Both partners agree on which rounds carry
parameters because the round number is shared (``model_round``).

Invariants: the gradient mix on a symmetric pairing preserves the swarm's mean gradient, so the
mean model follows mean-gradient SGD; the parameter mix preserves the mean (``rounds.py``).
Rounds are numbered by the peers and aligned as in ``rounds.py``. Waits for the partner each
step (as the paper's synchronous variant): a straggler slows its partners, up to the timeout.
On a rotating pairing a peer that lags by a few rounds (after churn) meets partners that have
moved on and pays round timeouts until it is caught up (keep ``round_timeout_s`` a few steps).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from p2p.averaging.base import AsynchronousHooks, AveragingConfig, Disagreement, ModelPort, check_params
from p2p.averaging.robust import RobustMixing
from p2p.averaging.round_deadline import RoundDeadline, RoundReceipt, round_wait_cap
from p2p.averaging.rounds import NeighbourRounds, ServesRounds
from p2p.protocol import LocalProtocolError, RemoteProtocolError, Send
from p2p.wire import message


@message(26)
@dataclass(frozen=True)
class GradientShare:
    round: int  # the sender's gradient round
    step: int  # the sender's local step count
    degree: int  # the sender's partner count this round
    model_key: str
    grad: np.ndarray


@message(27)
@dataclass(frozen=True)
class GradientModelShare:
    round: int  # a round that averages parameters too (model_round(round, model_every))
    step: int
    degree: int
    model_key: str
    grad: np.ndarray
    params: np.ndarray  # the parameters the gradient was computed at


def _mix64(r: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of the round number."""
    z = (r + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


_MASK = (1 << 64) - 1


def model_round(r: int, every: int) -> bool:
    """Whether gradient round r also averages parameters: a pseudo-random one round in ``every``,
    picked by a hash of r, so both partners agree without talking and the parameter rounds'
    partners cycle through all hypercube dimensions whatever log2 n is (a plain
    r % every == 0 meets the same partner forever when log2 n divides ``every``)."""
    return every > 0 and _mix64(r) % every == 0


@dataclass(frozen=True)
class GossipGraDConfig:
    """GossipGraD's own setting."""

    model_every: int = 8  # average models with the partner every this many steps (0: gradients only)

    def __post_init__(self) -> None:
        if self.model_every < 0:
            raise ValueError("model_every must be >= 0")


class GossipGraD(ServesRounds, AsynchronousHooks):
    """Rotating-partner gradient gossip (module docstring)."""

    name = "gossipgrad"
    natural_topology = "hypercube"
    MESSAGES = (GradientShare, GradientModelShare, RoundReceipt)
    Config = GossipGraDConfig
    wants_gradient = True

    def __init__(self, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float,
                 options: GossipGraDConfig | None = None) -> None:
        self.config = config
        self.options = options or GossipGraDConfig()
        self.port = port
        self.stats: dict[str, int] = {"model_rounds": 0}
        self.disagreement = Disagreement()  # from the rounds that carry models (payload index 1)
        self.robust = RobustMixing(config.robust_mixing, self.stats)
        self._rounds = NeighbourRounds(config.round_timeout_s, self.stats, disagreement=self.disagreement, model_index=1,
                                       robust=self.robust, channels=("grad", "params"),
                                       link_deadline=RoundDeadline(config.round_timeout_s, round_wait_cap(config),
                                                                   self.stats))
        self._with_model = False

    def _poll(self, now: float) -> None:
        if not self._rounds.ready(now):
            return
        tau = self.config.staleness_tau if self.config.staleness_aware else None
        mixed = self._rounds.finish(self.port.step, tau, now)
        if mixed.received:
            self.port.set_gradient(mixed.payload[0])
            if self._with_model:
                self.port.add_delta(mixed.deltas[1])
                self.stats["model_rounds"] += 1

    # -- step hooks ---------------------------------------------------------------------------
    def on_gradient(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        if self._rounds.waiting:
            raise LocalProtocolError("on_gradient() before gradient_ready() turned True")
        grad = self.port.gradient()
        self._with_model = model_round(self._rounds.next_round(), self.options.model_every)
        key, d = self.port.model_key, len(neighbours)
        if self._with_model:
            params = self.port.snapshot()
            r = self._rounds.begin(now, neighbours, (grad, params))
            msg: object = GradientModelShare(r, self.port.step, d, key, grad, params)
        else:
            r = self._rounds.begin(now, neighbours, (grad,))
            msg = GradientShare(r, self.port.step, d, key, grad)
        self._poll(now)
        return [Send(j, msg) for j in neighbours]

    def gradient_ready(self, step: int, now: float) -> bool:
        self._poll(now)
        return not self._rounds.waiting

    # -- network ------------------------------------------------------------------------------
    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]:
        if isinstance(msg, RoundReceipt):
            self._rounds.receipt(src, msg.round, now)
            return []
        if isinstance(msg, GradientShare):
            check_params(msg.grad, msg.model_key, self.port)
            payload: tuple = (msg.grad,)
        elif isinstance(msg, GradientModelShare):
            check_params(msg.grad, msg.model_key, self.port)
            check_params(msg.params, msg.model_key, self.port)
            payload = (msg.grad, msg.params)
        else:
            raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not a GossipGraD message")
        self._rounds.offer(src, msg.round, msg.degree, msg.step, payload, now)
        self._poll(now)
        return [Send(src, RoundReceipt(msg.round))]  # the sender's deadline learns the link from it

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        self._poll(now)
        served = self._rounds.serve_round()
        if served is None:
            return []
        # A finished peer (training_done) answers with a zero gradient, so a peer still
        # training never waits a round timeout for it; that halves its step for the round, as
        # a partner with nothing to learn from should. ``neighbours`` are for ``served``.
        grad = np.zeros(self.port.numel, dtype=np.float32)
        self._with_model = model_round(served, self.options.model_every)
        key, d = self.port.model_key, len(neighbours)
        if self._with_model:
            params = self.port.snapshot()
            r = self._rounds.begin(now, neighbours, (grad, params), round=served)
            msg: object = GradientModelShare(r, self.port.step, d, key, grad, params)
        else:
            r = self._rounds.begin(now, neighbours, (grad,), round=served)
            msg = GradientShare(r, self.port.step, d, key, grad)
        self.stats["rounds_served"] = self.stats.get("rounds_served", 0) + 1
        self._poll(now)
        return [Send(j, msg) for j in neighbours]
