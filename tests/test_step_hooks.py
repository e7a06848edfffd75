"""StepHooks: the trainer waits on the averager's gates, served by another thread."""

import os
import threading

from p2p.averaging.base import AsynchronousHooks
from p2p.protocol import Send


class GatedAverager(AsynchronousHooks):
    wants_gradient = True

    def __init__(self):
        self.open_step = 0
        self.calls = []

    def may_step(self, step, now):
        self.calls.append(("may_step", step))
        return step <= self.open_step

    def on_gradient(self, step, now, neighbours):
        self.calls.append(("on_gradient", step))
        return [Send("peer:1", ("grad", step))]

    def gradient_ready(self, step, now):
        return True

    def after_step(self, step, now, neighbours):
        self.calls.append(("after_step", step))
        return [Send("peer:1", ("step", step))]


def serve_once(hooks, averager, sent):
    """What the network thread does when woken: wait for a post, then service it."""
    assert hooks.wake_socket.poll(5000), "the trainer's post never woke the network side"
    sent += hooks.service(0.0, lambda: ["peer:1"])


def test_trainer_waits_for_the_gate_and_hooks_run_on_the_serving_side():
    from p2p.training.step_hooks import StepHooks

    averager = GatedAverager()
    hooks = StepHooks(averager, gate_timeout_s=30)
    sent = []
    trainer = threading.Thread(target=lambda: (hooks.before_step(1), hooks.gradient(1), hooks.after_step(1)))
    trainer.start()
    serve_once(hooks, averager, sent)
    assert trainer.is_alive() and averager.calls == [("may_step", 1)]  # gate closed: it waits
    averager.open_step = 1
    sent += hooks.service(0.0, lambda: ["peer:1"])  # e.g. after the round's messages
    serve_once(hooks, averager, sent)  # on_gradient
    serve_once(hooks, averager, sent)  # after_step
    trainer.join(10)
    assert not trainer.is_alive()
    assert [s.msg for s in sent] == [("grad", 1), ("step", 1)]
    assert hooks.gate_timeouts == 0
    # the time it spent blocked is counted (status: gate_wait_s), per wait: the gate and the gradient
    assert hooks.gate_waits == 2 and hooks.gate_wait_s > 0
    hooks.close_trainer_side()
    hooks.close()


def test_idle_work_runs_while_a_gate_holds_and_is_not_counted_as_waiting():
    from p2p.training.step_hooks import StepHooks

    averager = GatedAverager()
    hooks = StepHooks(averager, gate_timeout_s=30)
    working, may_end = threading.Event(), threading.Event()

    def work():  # e.g. the loop's due evaluation (the round is in flight meanwhile), ~0.3 s
        working.set()
        may_end.wait(10)
        threading.Event().wait(0.3)  # the work's own duration, not a synchronisation

    hooks.idle_work = work
    trainer = threading.Thread(target=hooks.before_step, args=(1,))
    trainer.start()
    serve_once(hooks, averager, [])  # the gate holds: the trainer turns to its idle work
    assert working.wait(10) and hooks.gate_waits == 0
    averager.open_step = 1
    hooks.service(0.0, lambda: ["peer:1"])  # the round ends while the work runs
    may_end.set()
    trainer.join(10)
    assert not trainer.is_alive() and averager.calls == [("may_step", 1)] * 2  # held, then open
    assert hooks.gate_waits == 1 and hooks.gate_wait_s < 0.3  # the work's 0.3 s is not waiting
    hooks.close_trainer_side()
    hooks.close()


def test_gate_timeout_is_a_safety_net_not_a_hang():
    from p2p.training.step_hooks import StepHooks

    averager = GatedAverager()  # never opens, and nobody serves
    hooks = StepHooks(averager, gate_timeout_s=0.2)
    hooks.before_step(1)
    assert hooks.gate_timeouts == 1
    hooks.close_trainer_side()
    hooks.close()


def test_asynchronous_averagers_cost_the_trainer_nothing():
    from p2p.training.step_hooks import StepHooks

    class Async(AsynchronousHooks):
        pass

    hooks = StepHooks(Async(), gate_timeout_s=5)
    assert not hooks.gates_steps and not hooks.wants_gradient and not hooks.posts_after_step
    hooks.before_step(1)
    hooks.gradient(1)
    hooks.after_step(1)
    assert hooks.service(0.0, lambda: []) == []
    hooks.close_trainer_side()
    hooks.close()


def test_the_network_loop_leaves_out_the_hooks_of_an_algorithm_that_never_posts():
    """AD-PSGD: no wake socket to poll and no ``service`` call on each turn of the loop."""
    import zmq

    from p2p.averaging.adpsgd import PairwiseGossip
    from p2p.net.driver import NetworkDriver
    from p2p.training.step_hooks import StepHooks

    class FakeTransport:
        def __init__(self):
            self.poller = zmq.Poller()

    for averager, served in ((PairwiseGossip.__new__(PairwiseGossip), False), (GatedAverager(), True)):
        hooks = StepHooks(averager, gate_timeout_s=5)
        assert hooks.posts == served
        transport = FakeTransport()
        driver = NetworkDriver(transport, peer=None, advertise="x:1", status_info=dict, state_reply=None,
                               shutdown_grace_s=1.0, hooks=hooks)
        polled = [s for s, _ in transport.poller.sockets]
        assert (hooks.wake_socket in polled) == served and (driver.hooks is hooks) == served
        os.close(driver._wake_read)  # (never started: nothing else to stop)
        os.close(driver._wake_write)
        hooks.close()
