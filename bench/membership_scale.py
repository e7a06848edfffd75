"""Membership at scale, in the deterministic simulator: prints one line per target.

    python bench/membership_scale.py            # every target (about 10-15 CPU minutes)
    python bench/membership_scale.py --quick    # smaller versions of each (about a minute)
    python bench/membership_scale.py --only join,detect

Targets (LAN preset: 1 s protocol period):
  join       1,000 peers joining through one seed converge within 3*log2(N) periods
  detect     every crash detected by all live members within 3 suspicion timeouts, and the
             detection time, in suspicion timeouts, flat across N = 100, 1,000, 10,000
  loss       0 false positives with 1,000 peers, 5% message loss, 10 simulated minutes
  partition  a 50/50 partition held 60 s merges into one view within 30 s of healing
  scale      10,000 peers for 100 protocol periods in under 3 minutes of wall time

Figures are simulated seconds unless marked wall/cpu. Runs with --warm-start begin with every
member knowing the full table (``Membership.restore``) so that they measure the steady state.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from p2p.sim import Churn, SimConfig, run


def timed(cfg: SimConfig) -> tuple[dict, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run(cfg)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def line(name: str, ok: bool, text: str) -> None:
    print(f"{name:<10} {'PASS' if ok else 'MISS'}  {text}", flush=True)


def bench_join(quick: bool) -> None:
    n = 200 if quick else 1000
    r, wall, cpu = timed(SimConfig(peers=n, seed=1, duration_s=40.0))
    budget = 3 * math.log2(n)
    conv = r["convergence_periods"]
    line("join", conv is not None and conv <= budget,
         f"N={n}: converged in {conv} periods (budget 3*log2 N = {budget:.1f}); "
         f"{r['msgs_per_member_s']} msgs, {r['bytes_per_member_s']:.0f} B per member-s; "
         f"wall {wall:.0f}s cpu {cpu:.0f}s")


def bench_detect(quick: bool) -> None:
    sizes = (100, 1000) if quick else (100, 1000, 10000)
    rows = []
    for n in sizes:
        crash = max(3, min(10, n // 100))
        cfg = SimConfig(peers=n, seed=2, duration_s=80.0, churn=Churn(crashes=crash, window=(0.1, 0.4)),
                        warm_start=True)
        r, wall, cpu = timed(cfg)
        d, t = r["detection_s"], r["suspicion_min_timeout_s"]
        ok = d is not None and r["undetected"] == 0 and d["max"] <= 3 * t and r["false_positives"] == 0
        rows.append((n, d, t, ok))
        line("detect", ok,
             f"N={n}: {d['count'] if d else 0}/{crash} crashes detected by all; mean {d and d['mean']} "
             f"p99 {d and d['p99']} max {d and d['max']} s; suspicion timeout {t} s -> max "
             f"{r['detection_max_in_suspicion_timeouts']} timeouts (budget 3); fp={r['false_positives']}; "
             f"wall {wall:.0f}s cpu {cpu:.0f}s")
    ratios = [d["mean"] / t for n, d, t, ok in rows if d]
    extra = [d["mean"] - t for n, d, t, ok in rows if d]
    if ratios:
        line("detect", max(ratios) <= 1.25 * min(ratios),
             "across N = " + ", ".join(str(n) for n, *_ in rows) + ": mean detection = "
             + ", ".join(f"{x:.2f}" for x in ratios) + " suspicion timeouts; mean detection minus the "
             "timeout (first probe + dissemination) = " + ", ".join(f"{x:.1f}" for x in extra) + " s. "
             "Seconds grow only through the timeout's max(1, log10 N) factor (memberlist's formula).")


def bench_loss(quick: bool) -> None:
    n, dur = (300, 120.0) if quick else (1000, 600.0)
    r, wall, cpu = timed(SimConfig(peers=n, seed=3, duration_s=dur, loss=0.05, warm_start=True))
    c = r["protocol_counters"]
    line("loss", r["false_positives"] == 0,
         f"N={n}, 5% loss, {dur:.0f} s: {r['false_positives']} false positives; "
         f"{c.get('refutes', 0)} false suspicions refuted ({c.get('suspected', 0)} suspect rows adopted, "
         f"summed over members), "
         f"{c.get('declared_dead', 0)} dead declarations; wall {wall:.0f}s cpu {cpu:.0f}s")


def bench_partition(quick: bool) -> None:
    n = 200 if quick else 1000
    cfg = SimConfig(peers=n, seed=4, duration_s=140.0, partition=0.5, partition_s=60.0, partition_at_s=20.0,
                    warm_start=True)
    r, wall, cpu = timed(cfg)
    m = r["partition_merge_s"]
    c = r["protocol_counters"]
    line("partition", m is not None and m <= 30.0,
         f"N={n}, 50/50 for 60 s: one view again {m} s after healing (budget 30); "
         f"{c.get('declared_dead', 0)} dead declarations during the cut, {c.get('reconnects', 0)} reconnect "
         f"push-pulls, {c.get('refutes', 0)} refutations; wall {wall:.0f}s cpu {cpu:.0f}s")


def bench_scale(quick: bool) -> None:
    n = 2000 if quick else 10000
    r, wall, cpu = timed(SimConfig(peers=n, seed=5, duration_s=100.0, warm_start=True))
    line("scale", wall < 180.0,
         f"N={n}, 100 periods: wall {wall:.0f}s cpu {cpu:.0f}s (budget 180 s wall); {r['events']} events, "
         f"{r['msgs_per_member_s']} msgs and {r['bytes_per_member_s']:.0f} B per member-s; "
         f"converged at end: {r['converged_at_end']}")


BENCHES = {"join": bench_join, "detect": bench_detect, "loss": bench_loss, "partition": bench_partition,
           "scale": bench_scale}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller versions of each target")
    ap.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset of: " + ", ".join(BENCHES))
    args = ap.parse_args(argv)
    names = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in names if x not in BENCHES]
    if unknown:
        print(f"error: unknown target(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name in names:
        BENCHES[name](args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
