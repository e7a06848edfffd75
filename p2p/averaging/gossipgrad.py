"""GossipGraD: gradient gossip with a rotating partner.

After Daily, Vishnu, Siegel, Warfel & Amatya, "GossipGraD: Scalable Deep Learning using Gossip
Communication based Asynchronous Gradient Descent", arXiv:1803.05880, 2018, sec. 4: instead of
an all-reduce of gradients, each step a peer exchanges its gradient with ONE partner and both
use the average; the partner rotates over a hypercube-like schedule (natural topology
``hypercube``: partner i XOR 2^(t mod log2 n) over the sorted members), so a gradient reaches
every peer in log2 n steps at O(1) messages per peer per step.

Hooks (step k, gradient round r):
- ``on_gradient(k)``: g_i = ``port.gradient()``; send GradientShare(r, g_i) to this round's
  partner(s) (the topology's neighbours at ``topology_round()``).
- ``gradient_ready(k)``: False until the partner's round-r gradient arrived or
  ``round_timeout_s`` passed; then ``port.set_gradient`` with the Metropolis-Hastings mix
  ((g_i + g_j) / 2 for one partner) or, on timeout with nothing, the own gradient is kept.
  No partner this round (n not a power of two): True at once.
- ``after_step(k)``: every ``gossipgrad_model_every`` gradient rounds, begin a model-averaging
  round with the partner of the next round (D-PSGD's round on parameters, message
  GossipModelShare); ``may_step(k + 1)`` is False until it finished or timed out.

Why model averaging too: gradient averaging alone keeps models equal only if they start equal
and every peer sees the same averaged gradient; with a single partner the averaged gradients
differ, so models drift apart (boundedly for a fixed learning rate), and a late joiner's model
would never be pulled in. The paper relies on identical starts; occasional pairwise model
averaging bounds the drift and admits joiners (``gossipgrad_model_every = 0`` turns it off).

Invariants: the gradient mix on a symmetric pairing preserves the swarm's mean gradient, so the
mean model follows mean-gradient SGD; the model rounds preserve the mean (``rounds.py``).
Rounds are numbered by the peers and aligned as in ``rounds.py``. Waits for the partner each
step (as the paper's synchronous variant): a straggler slows its partners, up to the timeout.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from p2p.averaging.base import AveragingConfig, ModelPort, check_params
from p2p.averaging.rounds import NeighbourRounds
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
class GossipModelShare:
    round: int  # the sender's model-averaging round
    step: int
    degree: int
    model_key: str
    params: np.ndarray


class GossipGraD:
    """Rotating-partner gradient gossip (module docstring)."""

    name = "gossipgrad"
    natural_topology = "hypercube"
    MESSAGES = (GradientShare, GossipModelShare)
    wants_gradient = True

    def __init__(self, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float) -> None:
        self.config = config
        self.port = port
        self.stats: dict[str, int] = {}
        self._grads = NeighbourRounds(config.round_timeout_s, self.stats)
        self._models = NeighbourRounds(config.round_timeout_s, self.stats, prefix="model_")

    def topology_round(self) -> int:
        return self._grads.next_round()

    def busy(self) -> bool:
        return self._grads.waiting or self._models.waiting

    def next_deadline(self) -> float:
        return min(self._grads.deadline, self._models.deadline)

    def _tau(self):
        return self.config.staleness_tau if self.config.staleness_aware else None

    def _poll(self, now: float) -> None:
        if self._grads.ready(now):
            mixed = self._grads.finish(self.port.step, self._tau())
            if mixed.received:
                self.port.set_gradient(mixed.payload[0])
        if self._models.ready(now):
            mixed = self._models.finish(self.port.step, self._tau())
            if mixed.received:
                self.port.add_delta(mixed.deltas[0])

    # -- step hooks ---------------------------------------------------------------------------
    def may_step(self, step: int, now: float) -> bool:
        self._poll(now)
        return not self._models.waiting

    def on_gradient(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        if self._grads.waiting:
            raise LocalProtocolError("on_gradient() before gradient_ready() turned True")
        grad = self.port.gradient()
        r = self._grads.begin(now, neighbours, (grad,))
        msg = GradientShare(r, self.port.step, len(neighbours), self.port.model_key, grad)
        self._poll(now)
        return [Send(j, msg) for j in neighbours]

    def gradient_ready(self, step: int, now: float) -> bool:
        self._poll(now)
        return not self._grads.waiting

    def after_step(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        every = self.config.gossipgrad_model_every
        done = self._grads.round  # gradient rounds finished so far (the next one's number)
        if not every or done % every or self._models.waiting:
            return []
        self._models.advance_to(done // every)  # both partners derive it from the shared round
        snapshot = self.port.snapshot()
        r = self._models.begin(now, neighbours, (snapshot,))
        msg = GossipModelShare(r, self.port.step, len(neighbours), self.port.model_key, snapshot)
        self._poll(now)
        return [Send(j, msg) for j in neighbours]

    # -- network ------------------------------------------------------------------------------
    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]:
        if isinstance(msg, GradientShare):
            check_params(msg.grad, msg.model_key, self.port)
            self._grads.offer(src, msg.round, msg.degree, msg.step, (msg.grad,))
        elif isinstance(msg, GossipModelShare):
            check_params(msg.params, msg.model_key, self.port)
            self._models.offer(src, msg.round, msg.degree, msg.step, (msg.params,))
        else:
            raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not a GossipGraD message")
        self._poll(now)
        return []

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        self._poll(now)
        return []
