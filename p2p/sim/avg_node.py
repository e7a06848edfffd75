"""One peer of the averaging simulator: the composed ``Peer``, its model, and a simulated trainer.

Theory of operation
-------------------
``peer`` is the very object the daemon drives (``p2p.peer.Peer``: membership, topology and
averager); ``port`` an ``ArrayPort`` with the FlatParams semantics (deltas queue and land at the
next step boundary). The trainer runs the loop of the real one (p2p/training/trainer.py with
p2p/training/step_hooks.py and ``Swarm.finish``) as a state machine:

    JOINING    -- peer.joined (a member answered our join) ---------------------> READY
    READY      -- may_step(k+1)? -- apply queued deltas, compute grad f_i(x) ----> COMPUTING
    COMPUTING  -- after compute_s: wants_gradient? on_gradient(k+1) ------------> GRAD_WAIT
    GRAD_WAIT  -- gradient_ready(k+1)? optimizer step x -= lr_k g; after_step(k+1) -> READY
    (as StepHooks does, may_step is asked only where gate_wanted and after_step only where
    after_step_wanted: the simulator runs what the real trainer runs)
    READY, k = steps -- may_step(steps+1)? (the round in flight finished) ----------> IDLE,
               calling the averager's optional ``training_done(k, now)`` on the way
    IDLE       no more steps; queued deltas keep landing (the real trainer's linger phase)
               and the averager keeps serving its neighbours' rounds from tick/receive
    any        -- crash or leave (the simulator) ---------------------------------> DOWN

``advance(now)`` moves the trainer as far as the hooks allow at ``now`` and returns the sends
the hooks produced and, when a step's computation began, the time it ends (the simulator then
calls ``compute_done``). The simulator re-polls ``advance`` after every event that touches the
peer, so a waiting trainer resumes at the simulated instant its averager lets it. Every hook
gets ``peer.neighbours()``: the topology over this peer's OWN membership view, for the round
the averager is at.

Invariants: ``port.step`` only grows, by one per optimizer step, and never past ``steps``;
``training_done`` is called at most once, on entering IDLE.
"""

from __future__ import annotations

import random
from typing import Optional

import numpy as np

from p2p.peer import Peer
from p2p.protocol import Send
from p2p.sim.avg_config import AvgSimConfig
from p2p.sim.avg_port import ArrayPort
from p2p.sim.avg_problems import Quadratics

JOINING, READY, COMPUTING, GRAD_WAIT, IDLE, DOWN = range(6)
PHASE_NAMES = ("joining", "ready", "computing", "grad_wait", "idle", "down")
INF = float("inf")


class SimNode:
    def __init__(self, index: int, peer: Peer, port: ArrayPort, cfg: AvgSimConfig, problem: Quadratics,
                 compute_s: float) -> None:
        self.index = index
        self.peer = peer
        self.port = port
        self.problem = problem
        self.target = cfg.steps  # steps to train
        self.compute_s = compute_s
        self.compute_jitter = cfg.compute_jitter
        self.lr, self.lr_decay_steps, self.noise = cfg.lr, cfg.lr_decay_steps, cfg.noise
        self.rng = random.Random(f"{cfg.seed}:compute:{index}")  # step-time jitter
        self.noise_rng = np.random.default_rng([cfg.seed, 7, index])  # gradient noise
        self.phase = JOINING
        self.grad: Optional[np.ndarray] = None  # this step's gradient while COMPUTING
        self.finished_at = INF
        self.leaving = False  # announced a graceful leave (the invariant checker allows LEFT)

    @property
    def averager(self):
        return self.peer.averager

    def advance(self, now: float) -> tuple[list[Send], Optional[float]]:
        """Run the trainer as far as the hooks allow (module docstring)."""
        sends: list[Send] = []
        port, avg = self.port, self.peer.averager
        while True:
            phase = self.phase
            if phase == JOINING:
                if not self.peer.joined:
                    return sends, None
                self.phase = READY
            elif phase == READY:
                k = port.step
                # as the real trainer: the gate is asked only on steps the algorithm says it may close
                if avg.gate_wanted(k + 1) and not avg.may_step(k + 1, now):
                    return sends, None
                if k >= self.target and not getattr(avg, "may_finish", lambda _now: True)(now):
                    return sends, None  # as Swarm.settle: the last outer step lands first
                port.apply_pending()
                if k >= self.target:
                    self.phase, self.finished_at = IDLE, now
                    done = getattr(avg, "training_done", None)
                    if done is not None:
                        done(k, now)
                    return sends, None
                g = self.problem.grad(self.index, port.x.astype(np.float64))
                if self.noise:
                    g = g + self.noise * self.noise_rng.normal(size=g.shape)
                self.grad = g.astype(np.float32)
                self.phase = COMPUTING
                spread = 1.0 + self.compute_jitter * (2 * self.rng.random() - 1)
                return sends, now + self.compute_s * spread
            elif phase == GRAD_WAIT:
                if not avg.gradient_ready(port.step + 1, now):
                    return sends, None
                sends += self._optimizer_step(port.grad, now)
            else:
                if phase == IDLE:
                    port.apply_pending()
                return sends, None

    def compute_done(self, now: float) -> list[Send]:
        """The step's forward and backward pass ended."""
        if self.phase != COMPUTING:
            return []  # crashed meanwhile
        avg = self.peer.averager
        if avg.wants_gradient:
            self.port.grad = self.grad
            self.phase = GRAD_WAIT
            return avg.on_gradient(self.port.step + 1, now, self.peer.neighbours())
        return self._optimizer_step(self.grad, now)

    def _optimizer_step(self, grad: np.ndarray, now: float) -> list[Send]:
        port = self.port
        port.x -= np.float32(self.lr / (1.0 + port.step / self.lr_decay_steps)) * grad
        port.step += 1
        port.grad = None
        self.grad = None
        self.phase = READY
        avg = self.peer.averager
        if not avg.after_step_wanted(port.step):  # as the real trainer: skipped steps cost nothing
            return []
        return avg.after_step(port.step, now, self.peer.neighbours())
