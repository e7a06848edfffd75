"""The H that ``--diloco-inner-steps auto`` chooses per link rate, in the averaging simulator.

Why: a quick, repeatable look at p2p/averaging/outer_schedule.py before any real-link run. The
simulator drives the real ``p2p.peer.Peer`` and DiLoCo objects over a simulated network whose
uplinks serialise each message at the given rate (p2p/sim/network.py). 4 peers on ``full``,
50 ms steps (+-10%), a 300-parameter model: a share is ~2.5 kB, so a round puts ~7.5 kB on each
uplink, ~1.2 s (24 steps) at 0.05 Mbit/s and ~0.03 s at 2 Mbit/s.

    python bench/diloco_auto_sim.py [--rates 0.05,0.1,0.2,2] [--steps 512] [--overlap]

Prints one row per rate: H at the end (every peer's), H over the run at each boundary of peer
0, whether every peer put its boundaries on the same steps after the first 64, simulated time
against compute only, and the optimality gap (final / initial).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import _common  # noqa: F401  (puts the repository on sys.path)

from p2p.averaging import outer_schedule
from p2p.sim.avg_config import AvgSimConfig, sim_algorithm_options, sim_averaging_config
from p2p.sim.avg_sim import AvgSimulation

COMPUTE_S = 0.05


def run(mbit: float, steps: int, overlap: bool) -> dict:
    seen = defaultdict(list)
    original = outer_schedule.InnerSchedule.at_boundary

    def at_boundary(schedule, step, now):
        original(schedule, step, now)
        seen[id(schedule)].append((step, schedule.h))

    outer_schedule.InnerSchedule.at_boundary = at_boundary
    try:
        options = sim_algorithm_options("diloco", inner_steps="auto", overlap=overlap)
        cfg = AvgSimConfig("diloco", "full", 4, steps, 1, bandwidth_bps=mbit * 1e6, dim=300, compute_s=COMPUTE_S,
                           options=options, lr_decay_steps=100,
                           config=sim_averaging_config(COMPUTE_S, "diloco", options, round_timeout_s=30.0))
        r = AvgSimulation(cfg).run()
    finally:
        outer_schedule.InnerSchedule.at_boundary = original
    traces = list(seen.values())
    late = [[s for s, _ in t if s > 64] for t in traces]
    return {"mbit": mbit, "h_end": sorted({t[-1][1] for t in traces}), "h_trace": [h for _, h in traces[0]],
            "same_boundaries": all(b == late[0] for b in late), "time_s": r.end_time, "compute_s": steps * COMPUTE_S,
            "gap": r.final_gap / r.initial_gap, "outer_steps": r.stats["outer_steps"] // 4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="0.05,0.1,0.2,2", help="uplink rates in Mbit/s, comma separated")
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--overlap", action="store_true", help="--diloco-overlap")
    args = ap.parse_args()
    for mbit in (float(x) for x in args.rates.split(",")):
        row = run(mbit, args.steps, args.overlap)
        trace = row["h_trace"]
        shown = trace if len(trace) <= 12 else trace[:6] + ["..."] + trace[-3:]
        print(f"{mbit:5g} Mbit/s: H {row['h_end']} at the end (trace {shown}), {row['outer_steps']} outer steps, "
              f"same boundaries after step 64: {row['same_boundaries']}, {row['time_s']:.1f} s "
              f"(compute only {row['compute_s']:.1f} s), gap x{row['gap']:.3g}", flush=True)


if __name__ == "__main__":
    main()
