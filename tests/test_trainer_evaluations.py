"""The training loop's evaluation schedule: moving evaluations to idle moments never adds any."""

import itertools

import torch

from p2p.training import trainer


class FakeClock:
    """Stands in for the trainer module's ``time``: steps and evaluations advance it."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def time(self):
        return 1_000_000.0 + self.now


class TickingTask:
    """A step costs 0.1 s and an evaluation 0.3 s of the fake clock."""

    def __init__(self, clock):
        self.clock, self.evaluated_at = clock, []

    def loss(self, model, batch):
        self.clock.now += 0.1
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def evaluate(self, model, device):
        self.evaluated_at.append(self.clock.now)
        self.clock.now += 0.3
        return {"accuracy": 0.5}


class IdleAtEveryStep(torch.optim.SGD):
    """The optimizer step a swarm gate holds: while held, the swarm runs its idle work."""

    idle_work = None

    def step(self, closure=None):
        if self.idle_work is not None:
            self.idle_work()
        return super().step(closure)


def run_loop(monkeypatch, idle: bool, steps: int = 200):
    clock = FakeClock()
    monkeypatch.setattr(trainer, "time", clock)
    task, model = TickingTask(clock), torch.nn.Linear(2, 1)
    optimizer = IdleAtEveryStep(model.parameters(), lr=0.01)
    batches = itertools.repeat((torch.ones(4, 2), torch.zeros(4, 1)))
    loop = trainer.TrainingLoop(task, model, optimizer, batches, torch.device("cpu"), eval_every_s=2.0)
    if idle:
        optimizer.idle_work = loop.evaluate_if_due_soon
    loop.run(trainer.threading.Event(), steps, None)
    return task.evaluated_at, loop.state


def test_evaluations_run_every_interval_after_the_last_one_ended(monkeypatch):
    at, state = run_loop(monkeypatch, idle=False)
    gaps = [b - a for a, b in zip(at, at[1:-1])]  # the last one is the final evaluation
    assert gaps and all(2.3 - 1e-6 <= gap < 2.3 + 0.1 + 1e-6 for gap in gaps), gaps
    assert state.evaluations == len(at)


def test_evaluating_early_at_a_gate_keeps_the_count_and_runs_them_sooner(monkeypatch):
    regular, _ = run_loop(monkeypatch, idle=False)
    early, state = run_loop(monkeypatch, idle=True)
    # every evaluation but the final one was pulled forward (idle work runs at every step here)
    assert all(e < r for e, r in zip(early[:-1], regular[:-1]))
    # ... by at most half an interval (2 s, from 0), and never more often: each stands in for
    # the one due, so they stay an interval plus an evaluation apart, less the one step by which
    # the gate that pulled each lands (the first, pulled from the first due time, and the final
    # one aside) ...
    assert early[0] >= 2.0 / 2 - 1e-9
    gaps = [b - a for a, b in zip(early[1:], early[2:-1])]
    assert gaps and all(gap >= 2.3 - 0.1 - 1e-6 for gap in gaps), gaps
    # ... so over the same run, at most the one more that starting half an interval sooner fits
    assert len(regular) <= len(early) == state.evaluations <= len(regular) + 1
