"""``p2p simulate``: run one membership scenario in the deterministic simulator, or with
``--algorithm`` one averaging run (every simulated peer the composed Peer: membership, topology,
averager) on vectorised objectives.

The lead registers it with ``app.command("simulate")(simulate)``. Output carries no wall-clock
values, so the same command prints byte-identical output; the wall time goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Optional

import typer

from p2p.gossip.config import PRESETS
from p2p.sim.churn import Churn
from p2p.sim.config import SimConfig
from p2p.sim.engine import run
from p2p.sim.invariants import InvariantViolation


def _fail(text: str, code: int = 2) -> None:
    typer.echo(f"error: {text}", err=True)
    raise typer.Exit(code)


def simulate(
    peers: int = typer.Option(100, "--peers", help="Members at the start (member 0 is the seed)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the run; the same seed replays the same run."),
    loss: float = typer.Option(0.0, "--loss", help="Message loss probability, in [0, 1)."),
    delay_ms: float = typer.Option(5.0, "--delay-ms", help="One-way base latency in ms (plus up to 2 ms jitter)."),
    crash: int = typer.Option(0, "--crash", help="Members crashed during the fault window (25%-50% of the run)."),
    join: int = typer.Option(0, "--join", help="Members joining later through a random live member."),
    leave: int = typer.Option(0, "--leave", help="Members leaving gracefully during the fault window."),
    partition: Optional[float] = typer.Option(None, "--partition", help="Fraction of members cut off, in (0, 1)."),
    partition_s: float = typer.Option(60.0, "--partition-s", help="How long the partition lasts (s)."),
    duration_s: float = typer.Option(60.0, "--duration-s", help="Simulated seconds."),
    preset: str = typer.Option("lan", "--membership", help="Membership timer preset: lan, wan or local."),
    warm_start: bool = typer.Option(False, "--warm-start", help="Start with every member knowing every other."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object and nothing else on stdout."),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", help="Simulate this averaging algorithm on vectorised objectives instead of membership."),
    topology: Optional[str] = typer.Option(None, "--topology", help="With --algorithm: the topology (default: the algorithm's own)."),
    steps: int = typer.Option(200, "--steps", help="With --algorithm: training steps per peer."),
) -> None:
    """Simulate SWIM/Lifeguard membership (convergence, failure detection, partitions), or with
    --algorithm an averaging algorithm over a topology (consensus distance, optimality gap)."""
    if algorithm is not None:
        membership_only = {"--partition": partition is not None, "--partition-s": partition_s != 60.0,
                           "--delay-ms": delay_ms != 5.0, "--duration-s": duration_s != 60.0,
                           "--membership": preset != "lan", "--warm-start": warm_start}
        given = [flag for flag, set_ in membership_only.items() if set_]
        if given:
            _fail(f"{', '.join(given)}: membership simulation only; with --algorithm the run lasts --steps")
        _simulate_averaging(algorithm, topology, peers, steps, seed, loss, crash, join, leave, as_json)
        return
    if preset not in PRESETS:
        _fail(f"--membership must be one of {', '.join(sorted(PRESETS))}, got {preset!r}")
    try:
        cfg = SimConfig(peers=peers, seed=seed, duration_s=duration_s, loss=loss, delay_ms=delay_ms,
                        churn=Churn(joins=join, crashes=crash, leaves=leave), partition=partition,
                        partition_s=partition_s, warm_start=warm_start, membership=PRESETS[preset]())
    except ValueError as exc:
        _fail(str(exc))
    started = time.perf_counter()
    try:
        result = run(cfg)
    except InvariantViolation as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"simulated {duration_s:g} s in {time.perf_counter() - started:.1f} s wall", err=True)
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    typer.echo(format_table(result))


def _simulate_averaging(algorithm: str, topology: Optional[str], peers: int, steps: int, seed: int,
                        loss: float, crash: int, join: int, leave: int, as_json: bool) -> None:
    from p2p.averaging.registry import ALGORITHMS, check_combination, natural_topology
    from p2p.sim.avg_sim import run as run_averaging
    from p2p.topology import TOPOLOGIES

    if algorithm not in ALGORITHMS:
        _fail(f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    topology = topology or natural_topology(algorithm)
    if topology not in TOPOLOGIES:
        _fail(f"--topology must be one of {', '.join(TOPOLOGIES)}, got {topology!r}")
    if peers < 2 or steps < 1 or not 0 <= loss < 1:
        _fail("--algorithm needs --peers >= 2, --steps >= 1 and --loss in [0, 1)")
    try:
        check_combination(algorithm, topology)
        r = run_averaging(algorithm, topology, peers=peers, steps=steps, seed=seed, loss=loss,
                          churn=Churn(joins=join, crashes=crash, leaves=leave))
    except ValueError as exc:
        _fail(str(exc))
    except InvariantViolation as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    out = {"algorithm": algorithm, "topology": topology, "peers": peers, "steps": steps, "seed": seed,
           "loss": loss, "initial_consensus": r.initial_consensus, "final_consensus": r.final_consensus,
           "initial_gap": r.initial_gap, "final_gap": r.final_gap, "simulated_s": r.end_time,
           "crash": crash, "join": join, "leave": leave, "live_at_end": r.live[-1] if r.live else 0,
           "false_positives": r.false_positives, "messages": r.network["sent"],
           "membership_messages": r.network["membership_sent"]}
    if as_json:
        typer.echo(json.dumps(out, sort_keys=True))
        return
    typer.echo(f"{algorithm} on {topology}, {peers} peers, {steps} steps, seed {seed}, loss {loss:g}\n"
               f"consensus distance {r.initial_consensus:.4g} -> {r.final_consensus:.4g}\n"
               f"optimality gap     {r.initial_gap:.4g} -> {r.final_gap:.4g}")


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, dict):
        return " ".join(f"{k}={_fmt(v[k])}" for k in ("mean", "p99", "max") if k in v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def format_table(r: dict) -> str:
    rows = [
        ("seed / peers", f"{r['seed']} / {r['peers']}"),
        ("convergence", f"{_fmt(r['convergence_s'])} s ({_fmt(r['convergence_periods'])} periods)"),
        ("detection (s)", _fmt(r["detection_s"]) + (f"  undetected={r['undetected']}" if r["undetected"] else "")),
        ("false positives", _fmt(r["false_positives"])),
        ("partition merge", f"{_fmt(r['partition_merge_s'])} s"),
        ("msgs / member / s", _fmt(r["msgs_per_member_s"])),
        ("bytes / member / s", _fmt(r["bytes_per_member_s"])),
        ("live at end", f"{r['live_members_at_end']} (converged: {'yes' if r['converged_at_end'] else 'no'})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> None:  # pragma: no cover - convenience entry point: python -m p2p.cli.simulate
    app = typer.Typer(add_completion=False)
    app.command("simulate")(simulate)
    app(args=["simulate", *sys.argv[1:]])


if __name__ == "__main__":  # pragma: no cover
    main()
