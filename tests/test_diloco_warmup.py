"""DiLoCo's warm-up (``--diloco-warmup-steps``, diloco.py "Warm-up"): the first steps average
every ``warmup_inner_steps``, then every H, on the same steps on every peer, joiners included."""

import pytest

from p2p.averaging.diloco import DiLoCoConfig
from p2p.averaging.outer_schedule import InnerSchedule
from p2p.cli.status_view import inner_steps_summary
from p2p.sim.avg_config import AvgSimConfig, sim_algorithm_options, sim_averaging_config
from p2p.sim.avg_sim import AvgSimulation
from p2p.sim.churn import Churn
from tests.test_diloco_auto import COMPUTE_S, PATIENT, Boundaries


def boundaries(schedule: InnerSchedule, last: int, first: int = 1) -> list[int]:
    out = []
    for step in range(first, last + 1):
        if schedule.is_boundary(step):
            schedule.at_boundary(step, float(step))
            out.append(step)
    return out


def test_the_warm_up_boundaries_come_every_warm_up_h_then_every_h_from_its_end():
    s = InnerSchedule(25, overlap=False, warmup_steps=95, warmup_h=10)
    assert s.warm_end == 100  # rounded up to the warm-up's next boundary
    assert s.warming_up and boundaries(s, 90) == list(range(10, 91, 10)) and s.warming_up and s.h == 10
    assert boundaries(s, 200, first=91) == [100, 125, 150, 175, 200] and not s.warming_up
    assert s.h == 25 and s.first_boundary == 10
    # a peer that took a step count past the warm-up (a joiner, a resume) without reaching a
    # boundary yet finds the same ones
    late = InnerSchedule(25, overlap=False, warmup_steps=95, warmup_h=10)
    assert [step for step in range(101, 201) if late.is_boundary(step)] == [125, 150, 175, 200]
    late.resume_at(110)  # and it shows the period it is in
    assert late.h == 25 and not late.warming_up
    late.resume_at(95)
    assert late.h == 10 and late.warming_up
    # no warm-up: the plain multiples of H
    assert boundaries(InnerSchedule(25, overlap=False), 100) == [25, 50, 75, 100]


def test_status_names_the_warm_up_while_it_lasts():
    assert inner_steps_summary({"inner_steps": 10, "inner_steps_auto": 0, "warmup_until": 300}) == \
        "H 10 (warm-up to step 300)"
    assert inner_steps_summary({"inner_steps": 25, "inner_steps_auto": 0, "warmup_until": 0}) == "H 25"


def test_a_warm_up_is_refused_with_auto_h_and_with_bad_values():
    with pytest.raises(ValueError, match="warmup_steps needs a fixed inner_steps"):
        DiLoCoConfig(inner_steps="auto", warmup_steps=100)
    with pytest.raises(ValueError, match="warmup_inner_steps must be an integer >= 1"):
        DiLoCoConfig(warmup_steps=100, warmup_inner_steps=0)
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0"):
        DiLoCoConfig(warmup_steps=-1)


def simulate(steps, overlap=False, churn=None, seed=1):
    options = sim_algorithm_options("diloco", inner_steps=16, warmup_steps=64, warmup_inner_steps=4, overlap=overlap)
    cfg = AvgSimConfig("diloco", "full", 4, steps, seed, bandwidth_bps=2e6, dim=300, compute_s=COMPUTE_S,
                       options=options, lr_decay_steps=100, membership=PATIENT, churn=churn or Churn(),
                       config=sim_averaging_config(COMPUTE_S, "diloco", options, round_timeout_s=30.0))
    return AvgSimulation(cfg).run()


@pytest.mark.parametrize("overlap", [False, True])
def test_every_peer_averages_on_the_warm_up_steps_then_on_hs_and_the_copies_agree(monkeypatch, overlap):
    seen = Boundaries(monkeypatch)
    r = simulate(192, overlap=overlap)
    assert set(r.steps.values()) == {192} and not r.rejected and not r.false_positives
    want = list(range(4, 65, 4)) + list(range(80, 193, 16))
    assert seen.steps() == [want] * 4
    # every boundary began a round that every peer took: 16 warm-up rounds and 8 after
    assert r.stats["outer_steps"] == 4 * len(want) and not r.stats["boundaries_skipped"]
    assert r.final_consensus / r.initial_consensus <= 0.01  # one theta_start at the end


def test_joiners_after_the_warm_up_fall_on_the_swarms_boundaries(monkeypatch):
    seen = Boundaries(monkeypatch)
    r = simulate(300, churn=Churn(joins=2, window=(0.5, 0.8)))  # joined at ~150-240 steps
    assert r.live[-1] == 6 and min(r.steps.values()) == 300
    assert len(seen.seen) == 6
    late = seen.steps(after=100)  # joiners too: every 16 steps from the warm-up's end at 64
    swarm = list(range(112, 301, 16))
    assert all(s and s == swarm[-len(s):] for s in late), late
