"""DiLoCo's reduce-scatter outer round (p2p/averaging/outer_scatter.py) in the protocol
simulator: it converges as the all-to-all round does, and through joins and crashes (peers
dying mid-round, owners of a slice among them) the copies of theta_start end as one."""

import pytest

from p2p.sim.avg_config import sim_algorithm_options, sim_averaging_config
from p2p.sim.avg_sim import run
from p2p.sim.churn import Churn

PEERS, STEPS = 8, 150


def simulate(seed, reduce_scatter=True, churn=Churn()):
    options = sim_algorithm_options("diloco", reduce_scatter=reduce_scatter)
    config = sim_averaging_config(0.05, "diloco", options, compression="int8")
    return run("diloco", "full", peers=PEERS, steps=STEPS, seed=seed, lr_decay_steps=10, churn=churn,
               options=options, config=config)


@pytest.mark.parametrize("seed", [1, 2])
def test_reduce_scatter_converges_like_the_all_to_all_round(seed):
    r, reference = simulate(seed), simulate(seed, reduce_scatter=False)
    assert set(r.steps.values()) == {STEPS} and not r.rejected
    assert r.stats["scatter_rounds"] == r.stats["outer_steps"] == reference.stats["outer_steps"]
    assert r.final_consensus / r.initial_consensus <= 0.01  # one model at the end
    assert r.final_gap / r.initial_gap <= max(0.08, 1.5 * reference.final_gap / reference.initial_gap)


@pytest.mark.parametrize("seed", [1, 3])
def test_through_joins_and_crashes_mid_round_the_copies_end_as_one(seed):
    r = simulate(seed, churn=Churn(joins=2, crashes=2))
    assert r.live[-1] == PEERS and min(r.steps.values()) == STEPS and not r.rejected
    # crashed owners' slices were skipped (on every peer alike, or mended by a pull)
    assert r.stats["scatter_slices_skipped"] > 0 and r.stats["scatter_contributors_missing"] > 0
    assert r.final_consensus / r.initial_consensus <= 0.01, r.final_consensus / r.initial_consensus
    assert r.final_gap / r.initial_gap <= 0.08
