"""The trainer's side of the averager's step hooks (p2p/averaging/base.py, ``Averager``).

The averager lives on the network thread; the trainer must not call it directly. Instead the
trainer posts hook requests here and, for the gating hooks (``may_step``, ``gradient_ready``),
waits on an event the network thread sets once the averager says go. Each post also wakes the
network thread at once through an inproc ZeroMQ socket, so a synchronous round does not wait
for the network loop's poll timeout.

Asynchronous algorithms inherit the no-op hooks of ``AsynchronousHooks``: the trainer then
never posts or waits at all.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Callable, Sequence

import zmq

from p2p.averaging.base import AsynchronousHooks
from p2p.protocol import Send

_ids = itertools.count()
IDLE_AFTER_S = 0.005  # a gate not opened within this is held by a round in flight (idle work runs)


class StepHooks:
    def __init__(self, averager: object, gate_timeout_s: float, context: zmq.Context | None = None) -> None:
        # Hooks an algorithm inherits as no-ops from AsynchronousHooks cost the trainer nothing:
        # no per-step wake-up of the network thread, no waiting.
        self.averager = averager
        kind = type(averager)
        self.gates_steps = getattr(kind, "may_step", None) is not AsynchronousHooks.may_step
        self.wants_gradient = bool(getattr(averager, "wants_gradient", False))
        self.posts_after_step = getattr(kind, "after_step", None) is not AsynchronousHooks.after_step
        self.serves_done = callable(getattr(averager, "training_done", None))
        # Nothing to serve (AD-PSGD, elastic gossip): the trainer never posts, so the network
        # thread neither polls the wake socket nor calls ``service`` on each of its turns (at
        # 100 Mbit/s a model arriving turns the loop a few hundred times a second).
        self.posts = self.gates_steps or self.wants_gradient or self.posts_after_step or self.serves_done
        # Steps the algorithm does not act on cost nothing (base.py, ``gate_wanted``).
        self._gate_wanted = getattr(averager, "gate_wanted", lambda step: True)
        self._after_step_wanted = getattr(averager, "after_step_wanted", lambda step: True)
        self.gate_timeout_s = gate_timeout_s  # safety net: the averager's own timeouts come first
        self.gate_timeouts = 0  # times the trainer went on without the averager's go-ahead
        # Seconds the trainer spent blocked at gates (and how many waits): the round time a
        # synchronous algorithm costs training, as opposed to CPU taken from it (status)
        self.gate_wait_s = 0.0
        self.gate_waits = 0
        # Run on the trainer's thread when a step gate holds (p2p.Swarm.when_waiting): the
        # training loop's evaluation, when one is due soon
        self.idle_work: Callable[[], None] | None = None
        self._context = context or zmq.Context.instance()
        self._endpoint = f"inproc://p2p-step-hooks-{next(_ids)}"
        self.wake_socket = self._context.socket(zmq.PULL)  # polled by the network thread
        self.wake_socket.setsockopt(zmq.LINGER, 0)
        self.wake_socket.bind(self._endpoint)
        self._push: zmq.Socket | None = None  # created on, and used only by, the trainer thread
        self._requests: deque[tuple[str, int]] = deque()
        self._waiting: tuple[str, int] | None = None  # gate the trainer is blocked on
        self._go = threading.Event()

    # -- trainer thread -----------------------------------------------------------------
    def _post(self, kind: str, step: int) -> None:
        self._requests.append((kind, step))
        if self._push is None:
            self._push = self._context.socket(zmq.PUSH)
            self._push.setsockopt(zmq.LINGER, 0)
            self._push.setsockopt(zmq.SNDHWM, 1)  # one pending wake-up is enough
            self._push.connect(self._endpoint)
        try:
            self._push.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass  # a wake-up is already queued

    def _wait(self, kind: str, step: int) -> None:
        started = time.monotonic()
        self._go.clear()
        self._post(kind, step)
        idle_s = 0.0
        if self.idle_work is not None and kind == "may_step" and not self._go.wait(IDLE_AFTER_S):
            # The gate holds (a round in flight): the trainer would sit idle, so the work it has
            # due runs now, beside the round, instead of after it in the next period, where the
            # peers that wait for ours at the next round would wait for it too.
            began = time.monotonic()
            self.idle_work()
            idle_s = time.monotonic() - began
        if not self._go.wait(self.gate_timeout_s):
            self.gate_timeouts += 1
        self.gate_wait_s += time.monotonic() - started - idle_s
        self.gate_waits += 1

    def before_step(self, step: int) -> None:
        if self.gates_steps and self._gate_wanted(step):
            self._wait("may_step", step)

    def gradient(self, step: int) -> None:
        if self.wants_gradient:
            self._wait("on_gradient", step)

    def after_step(self, step: int) -> None:
        if self.posts_after_step and self._after_step_wanted(step):
            self._post("after_step", step)

    def settle(self, step: int) -> None:
        """The trainer took its last step: wait until the averager has no round in flight that
        still moves the model (``may_finish(now)``, optional: DiLoCo with overlap)."""
        if self.gates_steps and callable(getattr(self.averager, "may_finish", None)):
            self._wait("may_finish", step)

    def training_done(self, step: int) -> None:
        """The trainer took its last step (it lingers from now on): tell an averager that
        serves finished peers differently (``training_done(step, now)``, optional)."""
        if self.serves_done:
            self._post("training_done", step)

    def close_trainer_side(self) -> None:
        if self._push is not None:
            self._push.close(linger=0)
            self._push = None

    # -- network thread -----------------------------------------------------------------
    def service(self, now: float, neighbours_of: Callable[[], Sequence[str]]) -> list[Send]:
        """Run posted hooks and re-check the gate the trainer waits on. Returns sends."""
        averager = self.averager
        while True:
            try:
                self.wake_socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        sends: list[Send] = []
        if not self._requests and self._waiting is None:
            return sends
        neighbours = neighbours_of()
        while self._requests:
            kind, step = self._requests.popleft()
            if kind == "after_step":
                sends += averager.after_step(step, now, neighbours)
            elif kind == "training_done":
                averager.training_done(step, now)
            elif kind in ("may_step", "may_finish"):
                self._waiting = (kind, step)
            elif kind == "on_gradient":
                sends += averager.on_gradient(step, now, neighbours)
                self._waiting = ("gradient_ready", step)
        if self._waiting is not None:
            kind, step = self._waiting
            if kind == "may_step":
                ready = averager.may_step(step, now)
            elif kind == "may_finish":
                ready = averager.may_finish(now)
            else:
                ready = averager.gradient_ready(step, now)
            if ready:
                self._waiting = None
                self._go.set()
        return sends

    def release(self) -> None:
        """Shutdown: let a waiting trainer go."""
        self._waiting = None
        self._go.set()

    def close(self) -> None:
        self.wake_socket.close(linger=0)
