"""Algorithm x topology matrix in the averaging simulator, at a size the unit tests avoid.

    python bench/averaging_matrix.py --peers 32 --steps 400 [--loss 0.05] [--joins 4 --crashes 4 --leaves 2]

Prints, per pair: final consensus distance and optimality gap relative to the start, simulated
time to finish (synchronous algorithms wait), averaging messages per peer per step (membership
traffic not counted), and wall time. Every simulated peer runs real SWIM membership.
"""

from __future__ import annotations

import argparse
import time

from p2p.averaging.registry import ALGORITHMS
from p2p.sim.avg_config import sim_algorithm_options
from p2p.sim.avg_sim import run
from p2p.sim.churn import Churn
from p2p.topology import TOPOLOGIES
from p2p.topology.graphs import log2_ceil


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--joins", type=int, default=0)
    ap.add_argument("--crashes", type=int, default=0)
    ap.add_argument("--leaves", type=int, default=0)
    ap.add_argument("--stragglers", type=int, default=0)
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--topologies", default=",".join(TOPOLOGIES))
    args = ap.parse_args()
    churn = Churn(joins=args.joins, crashes=args.crashes, leaves=args.leaves)
    print(f"{'algorithm':11s} {'topology':21s} {'consensus':>10s} {'gap':>10s} {'sim s':>7s} {'msg/step':>8s} {'wall s':>7s}")
    for algorithm in args.algorithms.split(","):
        for topology in args.topologies.split(","):
            options = None
            if algorithm == "diloco":  # enough gossip rounds for the graph's mixing time
                rounds = 1 if topology == "full" else 2 * log2_ceil(args.peers)
                options = sim_algorithm_options("diloco", gossip_rounds=rounds)
            t0 = time.perf_counter()
            r = run(algorithm, topology, peers=args.peers, steps=args.steps, seed=args.seed, loss=args.loss,
                    churn=churn, stragglers=args.stragglers, options=options, lr_decay_steps=args.steps / 15)
            wall = time.perf_counter() - t0
            averaging_msgs = r.network["sent"] - r.network["membership_sent"]
            per_step = averaging_msgs / max(1, sum(r.steps.values()))
            print(f"{algorithm:11s} {topology:21s} {r.final_consensus / r.initial_consensus:10.2e} "
                  f"{r.final_gap / r.initial_gap:10.2e} {r.end_time:7.1f} {per_step:8.2f} {wall:7.2f}")


if __name__ == "__main__":
    main()
