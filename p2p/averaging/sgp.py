"""SGP: Stochastic Gradient Push (push-sum gossip with overlapped communication).

After Assran, Loizou, Ballas & Rabbat, "Stochastic Gradient Push for Distributed Deep
Learning", ICML 2019, Alg. 1 (push-sum: Kempe, Dobra & Gehrke, FOCS 2003). Each peer keeps a
numerator x_i and a weight w_i (w starts at 1) and trains the de-biased model z_i = x_i / w_i.
Per step, over a directed time-varying graph (one out-peer per step; natural topology
``one-peer-exponential``):

    keep  (x_i / 2, w_i / 2);   push (x_i / 2, w_i / 2) to the out-peer j
    on receipt of (x', w'):     x_i += x',  w_i += w'

Representation. The model holds z, not x, so every change is a delta on z. The message carries
the sender's z and its pushed weight w' (the numerator x' = w' z, mathematically the same as
sending x' itself, without the float32 range problems of a tiny w). Keeping half changes
x and w by the same factor, so z does not move; a receipt moves z to the weighted mean

    z_i <- (w_i z_i + w' z_j) / (w_i + w'),  i.e.  add_delta(w' / (w_i + w') (z_j - z_i)).

The trainer's optimizer step updates z directly (z -= lr g), which is x -= lr w g: the paper's
update scaled by w_i. That is a rescaled learning rate, not a bias, only while w_i stays near 1,
i.e. while little weight is in flight and every peer gets back about as much as it pushes. Two
rules keep it so on a real network (the simulator, with a push per step and messages that
arrive within a step, needs neither):

- Pacing. A peer pushes at most once per ``SGPConfig.push_interval_s`` (steps in between keep
  training and are carried by the next push). Pushing on every step when steps are faster than
  the network (a small model: hundreds of steps/s, one model-sized message each) queues shares
  for many steps: most of the mass is then in flight, so w_i shrinks to 2 / (2 + d) for d steps
  of backlog, the gradient steps count w_i times less, and every receipt drags z back towards
  a model d steps old. Measured with the real trainer (synthetic task): 0.78 held-out accuracy
  with prompt delivery, 0.49 with 3.5 steps of delay, 0.29 with 10; the 3-peer daemon ended
  near chance.
- Finished peers. A peer that finished training (``training_done``) takes no more steps, so it
  would keep absorbing the weight its partners push and never give any back: their w then
  halves on every step (to 2^-k), their training stops counting, and the swarm never reaches
  consensus. A finished peer instead answers every share pushed after a new step (the
  sender's step count grew) with a share back to the sender, and pushes on its own timer
  (``interval_s``) to its topology neighbour, so finished peers keep mixing with each other.
  Shares from finished peers repeat their step count and get no answer: no ping-pong.

Hooks: never waits. ``may_step`` / ``gradient_ready`` True, ``after_step(k)`` pushes the share
for round r to the one neighbour of the natural topology (from a longer list: one uniformly at
random; paced as above), ``receive`` mixes.

Invariants. Mass: sum_i w_i + (weight in flight) is exactly conserved with no loss (halving is
exact in binary floating point; the simulator checks it to 1e-9), as is sum_i w_i z_i. Each w_i
stays > 0 (a peer keeps half of its own).

Under loss: a lost message takes its weight w' and its numerator w' z_j together, so the sums
drop but the ratio z of every peer is still a convex combination of the models: nothing is
biased, the swarm simply forgets that share (x and w are lost together). A share the driver
drops unsent (its queue to a slow link is full) is not lost: ``send_dropped`` takes it back. A crashed peer takes
its w with it; a joiner brings w = 1.

Robust mixing (``robust_mixing``, on by default; p2p/averaging/robust.py, after ClippedGossip)
and the mass: a share is never dropped, not even from a peer excluded as a repeat offender,
so the weight mass stays exactly conserved (the invariant above; dropping it would shrink the
swarm's total weight as a lost message does).
A clipped share moves z by the clipped difference, a refused one does not move it at all, as
if the sender's z were nearer ours (or equal): its weight is taken as usual. The numerator sum
sum_i w_i z_i is then not conserved, as no clipped exchange in any algorithm is; that is how
far one share can move us. Rounds are per-peer counters that follow the highest
round heard, so a joiner falls into step with the swarm's graph sequence at its first receipt.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from p2p.averaging.base import AsynchronousHooks, AveragingConfig, Disagreement, ModelPort, check_params, state_int
from p2p.averaging.robust import RobustMixing
from p2p.protocol import RemoteProtocolError, Send
from p2p.wire import message

MAX_WEIGHT = 2.0 ** 20  # a share above this is a lie (weights start at 1 and are only split)
MAX_SENDERS = 4096  # step counts remembered per sender (finished peers' replies)


@message(22)
@dataclass(frozen=True)
class PushSumShare:
    round: int  # the sender's round (selects the time-varying graph)
    step: int  # the sender's local step count
    weight: float  # the pushed push-sum weight w' (half of the sender's weight)
    model_key: str
    params: np.ndarray  # the sender's de-biased model z_j (numerator = weight * params)


@dataclass(frozen=True)
class SGPConfig:
    """SGP's own setting."""

    push_interval_s: float = 0.02  # push at most once per this long (0: every step, as in the paper); bounds the weight in flight when steps outpace the network

    def __post_init__(self) -> None:
        if not 0 <= self.push_interval_s < math.inf:
            raise ValueError("push_interval_s must be a finite number >= 0")


class PushSum(AsynchronousHooks):
    """Stochastic Gradient Push (module docstring)."""

    name = "sgp"
    natural_topology = "one-peer-exponential"
    MESSAGES = (PushSumShare,)
    Config = SGPConfig

    def __init__(self, config: AveragingConfig, port: ModelPort, rng: random.Random, now: float,
                 options: SGPConfig | None = None) -> None:
        self.config = config
        self.options = options or SGPConfig()
        self.port = port
        self.rng = rng
        self.weight = 1.0  # push-sum weight w_i
        self._round = 0
        self._done = False  # the trainer finished: serve pushes from tick and receive
        self._last_push = -math.inf
        self._last_step = 0  # our last step count (the trainer's, as after_step reported it)
        self._seen: dict[str, int] = {}  # highest step count heard per sender (done mode)
        self.stats = {"exchanges_started": 0, "exchanges_completed": 0, "shares_sent": 0,
                      "shares_received": 0, "alone": 0, "replies": 0, "pushes_skipped": 0, "shares_dropped": 0}
        self.disagreement = Disagreement()
        self.robust = RobustMixing(config.robust_mixing, self.stats)
        self.robust.drops_excluded = False  # an excluded sender's share still brings its weight

    def topology_round(self) -> int:
        return self._round

    def busy(self) -> bool:
        return False

    def state_dict(self) -> dict:
        return {"weight": self.weight, "round": self._round}

    def load_state_dict(self, state: dict, source: str) -> None:
        round_ = state_int(state, "round")
        weight = state.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= MAX_WEIGHT:
            raise ValueError(f"state 'weight': want a number in (0, {MAX_WEIGHT}], got {weight!r}")
        self._round = max(self._round, round_)
        if source == "checkpoint":
            self.weight = float(weight)  # a joiner keeps its own unit of weight: the mass stays right

    def next_deadline(self) -> float:
        return self._last_push + self.config.interval_s if self._done else math.inf

    def training_done(self, step: int, now: float) -> None:
        """The trainer took its last step: from now on push on the timer and answer the
        trainers' shares (module docstring, "Finished peers")."""
        self._done = True
        self._last_step = max(self._last_step, step)

    def tick(self, now: float, neighbours: Sequence[str]) -> list[Send]:
        if not self._done or now < self._last_push + self.config.interval_s:
            return []
        self._last_push = now  # also when alone: next try one interval on, never a busy loop
        return self._push(neighbours, self._last_step)

    def after_step(self, step: int, now: float, neighbours: Sequence[str]) -> list[Send]:
        self._last_step = max(self._last_step, step)
        if now < self._last_push + self.options.push_interval_s:
            self.stats["pushes_skipped"] += 1
            return []
        self._last_push = now
        return self._push(neighbours, step)

    def _push(self, neighbours: Sequence[str], step: int) -> list[Send]:
        r = self._round
        self._round += 1
        if not neighbours:
            self.stats["alone"] += 1
            return []
        # One out-peer: the natural topology lists exactly one; from a longer list pick uniformly
        # (Kempe et al.'s push-sum), which keeps in-degrees, hence weights, balanced on average.
        target = neighbours[0] if len(neighbours) == 1 else neighbours[self.rng.randrange(len(neighbours))]
        return [self._share(target, r, step)]

    def _share(self, target: str, r: int, step: int) -> Send:
        share = self.weight * 0.5
        self.weight = share
        self.stats["shares_sent"] += 1
        self.stats["exchanges_started"] += 1
        return Send(target, PushSumShare(r, step, share, self.port.model_key, self.port.snapshot()))

    def send_dropped(self, to: str, msg: object, now: float) -> None:
        """The driver dropped our share unsent (the link to ``to`` still holds two: a slow
        link). Take it back as if it had come straight home: its weight, and its z (ours when
        it was pushed) mixed in with that weight. Else every dropped push would destroy half
        our weight: at 20 Mbit/s on nodes.wide 70 of 73 pushes were dropped, and the swarm's
        weights would shrink by about half a step until they underflow to 0."""
        if not isinstance(msg, PushSumShare):
            return
        z = self.port.snapshot()
        total = self.weight + msg.weight
        self.port.add_delta((msg.params - z) * np.float32(msg.weight / total))
        self.weight = total
        self.stats["shares_dropped"] += 1

    def receive(self, src: str, msg: object, now: float, neighbours: Sequence[str]) -> list[Send]:
        if not isinstance(msg, PushSumShare):
            raise RemoteProtocolError("unexpected", f"{type(msg).__name__} is not an SGP message")
        if not (math.isfinite(msg.weight) and 0.0 < msg.weight <= MAX_WEIGHT) or msg.round < 0:
            raise RemoteProtocolError("bad_value", f"push-sum weight {msg.weight!r}, round {msg.round}")
        check_params(msg.params, msg.model_key, self.port)
        z = self.port.snapshot()
        total = self.weight + msg.weight
        difference = msg.params - z
        distance, own = float(np.linalg.norm(difference)), float(np.linalg.norm(z))
        self.disagreement.observe_norms(distance, own)
        # Refused (0): the weight is kept and z does not move (docstring, "Robust mixing").
        clip = self.robust.screen(src, "params", distance, own, now)
        delta = difference * np.float32(msg.weight / total * clip)
        self.port.add_delta(delta)
        self.weight = total
        self._round = max(self._round, msg.round)
        self.stats["shares_received"] += 1
        self.stats["exchanges_completed"] += 1
        fresh = msg.step > self._seen.get(src, -1)
        if fresh:
            if len(self._seen) >= MAX_SENDERS and src not in self._seen:
                self._seen.clear()  # bounded memory; forgetting costs at most one extra reply each
            self._seen[src] = msg.step
        if not (self._done and fresh):
            return []
        # A finished peer answers every share a trainer pushed after a new step (its step count
        # grew) with a share of its own, so the trainer gets back as much weight as it gives.
        # Shares from finished peers repeat their step count and get no answer: no ping-pong.
        self.stats["replies"] += 1
        return [self._share(src, self._round, self._last_step)]
