"""The overlapping trainer's gate (p2p/averaging/outer_gate.py): when it goes on without the round
in flight. Pure: times are given."""

import math

import pytest

from p2p.averaging.outer_gate import MIN_WAIT_S, PASS_EVERY, UNUSUAL, TrainerGate

USUAL = 0.2  # the round's usual length (s)


def test_a_round_slower_than_usual_holds_the_trainer_until_it_has_waited_min_wait_s():
    gate = TrainerGate(overlap=True)
    began, at_gate = 0.0, 0.2  # the round began at the boundary; the trainer reached its gate later
    assert not gate.may_go(at_gate, began, USUAL, outer_steps=10)
    # 1.25x the usual length has passed, but the trainer waited only 50 ms: jitter, not a cut
    assert UNUSUAL * USUAL < at_gate + MIN_WAIT_S
    assert gate.release_at(began, USUAL, 10) == at_gate + MIN_WAIT_S
    assert not gate.may_go(at_gate + MIN_WAIT_S - 0.01, began, USUAL, 10)
    assert gate.may_go(at_gate + MIN_WAIT_S, began, USUAL, 10)
    assert gate.waited == pytest.approx(MIN_WAIT_S)


def test_a_long_usual_round_still_holds_the_trainer_until_unusual_times_it():
    gate = TrainerGate(overlap=True)
    usual = 2.0
    assert not gate.may_go(0.1, 0.0, usual, 10)
    assert gate.release_at(0.0, usual, 10) == UNUSUAL * usual
    assert not gate.may_go(UNUSUAL * usual - 0.01, 0.0, usual, 10)
    assert gate.may_go(UNUSUAL * usual, 0.0, usual, 10)


def test_at_most_once_in_pass_every_outer_steps_and_never_at_the_last_step_or_without_overlap():
    gate = TrainerGate(overlap=True)
    gate.may_go(1.0, 0.0, USUAL, 10)
    assert gate.may_go(1.0 + MIN_WAIT_S, 0.0, USUAL, 10)
    gate.landed(3.0)
    assert not gate.may_go(4.0, 3.5, USUAL, 10 + PASS_EVERY - 1)
    assert gate.release_at(3.5, USUAL, 10 + PASS_EVERY - 1) == math.inf  # waits the round out
    gate.landed(9.0)
    assert not gate.may_go(10.0, 9.5, USUAL, 10 + PASS_EVERY)
    assert gate.may_go(10.0 + MIN_WAIT_S, 9.5, USUAL, 10 + PASS_EVERY)
    gate.landed(12.0)
    gate.finishing = True  # the last step taken: the final model holds the last outer step
    assert not gate.may_go(20.0, 12.0, USUAL, 100) and not gate.may_go(60.0, 12.0, USUAL, 100)
    blocking = TrainerGate(overlap=False)
    assert not blocking.may_go(100.0, 0.0, USUAL, 10) and blocking.release_at(0.0, USUAL, 10) == math.inf
