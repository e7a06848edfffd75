"""D-PSGD: synchronous decentralized parallel SGD.

After Lian et al., "Can decentralized algorithms outperform centralized algorithms? A case study
for decentralized parallel stochastic gradient descent", NeurIPS 2017, Alg. 1:

    x_i^{k+1} = sum_j W_ij x_j^k - gamma grad f_i(x_i^k)

with W doubly stochastic (Metropolis-Hastings over the topology, ``rounds.py``). Here the local
optimizer step comes first and the mixing follows, which is the same recursion shifted by half a
step: after step k the peer sends its parameters s_i (a snapshot) tagged with round r to every
neighbour, then adds sum_j W_ij (s_j - s_i) before step k + 1.

Hooks (step k):
- ``after_step(k)``: begin round r with s_i; send DpsgdParams(r, degree, s_i) to the neighbours.
- ``may_step(k + 1)``: False while round r waits for its neighbours. It turns True once
  ``len(neighbours)`` round-r vectors arrived (``receive``) or the round deadline passed
  (``tick``: ``round_timeout_s``, longer on a link measured too slow for it,
  p2p/averaging/round_deadline.py); the delta is then queued with ``port.add_delta``. No neighbours: True at once.
- ``on_gradient`` / ``gradient_ready``: not used ([] / True).

THIS ALGORITHM WAITS FOR STRAGGLERS: every peer waits for its neighbours each step, so the whole
connected swarm runs at the pace of its slowest member (up to the round timeout, after which the
straggler is dropped from that round). Use AD-PSGD, SGP or elastic gossip when speeds differ.

Finished peers: after its last step a peer stops calling the hooks but lingers until stopped.
The trainer then calls ``training_done``; from there on the peer answers every round a
neighbour begins (``serve_round``: the oldest buffered round not yet begun) from ``tick``, with
its current parameters, exactly as if it stepped infinitely fast. So the peers still training
never wait a round timeout for it, and it keeps mixing with them (the swarm ends in consensus).
A finished peer ahead of the trainers pulls them forward (``rounds.py``). Finished peers only
answer rounds, so once every peer finished the rounds stop.

Invariants: with symmetric W, no loss and no timeouts the pair terms W_ij (s_j - s_i) and
W_ji (s_i - s_j) cancel, so the swarm mean of the parameters is preserved by mixing. A round
that times out drops the missing pair terms on one side only (the mean drifts by those terms).
Rounds are numbered by the peers (``rounds.py`` aligns late joiners); stale rounds are counted
and dropped, never mixed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from p2p.averaging.base import AsynchronousHooks, AveragingConfig, Disagreement, ModelPort, NoOptions, check_params
from p2p.averaging.robust import RobustMixing
from p2p.averaging.round_deadline import RoundDeadline, RoundReceipt, round_wait_cap
from p2p.averaging.rounds import NeighbourRounds, ServesRounds
from p2p.protocol import LocalProtocolError, RemoteProtocolError, Send
from p2p.wire import message


@message(25)
@dataclass(frozen=True)
class DpsgdParams:
    round: int  # the sender's round number
    step: int  # the sender's local step count
    degree: int  # the sender's neighbour count this round (Metropolis-Hastings weight)
    model_key: str
    params: np.ndarray


class Dpsgd(ServesRounds, AsynchronousHooks):
    """Synchronous D-PSGD (module docstring)."""

    name = "dpsgd"
    natural_topology = "exponential"
    MESSAGES = (DpsgdParams, RoundReceipt)
    Config = NoOptions
    wants_gradient = False

    def __init__(self, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float,
                 options: NoOptions | None = None) -> None:
        self.config = config
        self.options = options or NoOptions()
        self.port = port
        self.stats: dict[str, int] = {}
        self.disagreement = Disagreement()
        self.robust = RobustMixing(config.robust_mixing, self.stats)
        self._rounds = NeighbourRounds(config.round_timeout_s, self.stats, disagreement=self.disagreement,
                                       robust=self.robust, channels=("params",),
                                       link_deadline=RoundDeadline(config.round_timeout_s, round_wait_cap(config),
                                                                   self.stats))
        self.stats.setdefault("rounds_served", 0)

    def _poll(self, now: float) -> None:
        if self._rounds.ready(now):
            tau = self.config.staleness_tau if self.config.staleness_aware else None
            mixed = self._rounds.finish(self.port.step, tau, now)
            if mixed.received:
                self.port.add_delta(mixed.deltas[0])

    # -- step hooks ---------------------------------------------------------------------------
    def may_step(self, step: int, now: float) -> bool:
        self._poll(now)
        return not self._rounds.waiting

    def after_step(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        if self._rounds.waiting:
            raise LocalProtocolError("after_step() before may_step() turned True")
        snapshot = self.port.snapshot()
        r = self._rounds.begin(now, neighbours, (snapshot,))
        msg = DpsgdParams(r, self.port.step, len(neighbours), self.port.model_key, snapshot)
        self._poll(now)  # no neighbours: the round is over already
        return [Send(j, msg) for j in neighbours]

    # -- network ------------------------------------------------------------------------------
    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]:
        if isinstance(msg, RoundReceipt):
            self._rounds.receipt(src, msg.round, now)
            return []
        if not isinstance(msg, DpsgdParams):
            raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not a D-PSGD message")
        check_params(msg.params, msg.model_key, self.port)
        self._rounds.offer(src, msg.round, msg.degree, msg.step, (msg.params,), now)
        self._poll(now)
        return [Send(src, RoundReceipt(msg.round))]  # the sender's deadline learns the link from it

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        self._poll(now)
        served = self._rounds.serve_round()
        if served is None:
            return []
        # ``neighbours`` were computed for topology_round() == served.
        snapshot = self.port.snapshot()
        r = self._rounds.begin(now, neighbours, (snapshot,), round=served)
        self.stats["rounds_served"] += 1
        msg = DpsgdParams(r, self.port.step, len(neighbours), self.port.model_key, snapshot)
        self._poll(now)
        return [Send(j, msg) for j in neighbours]
