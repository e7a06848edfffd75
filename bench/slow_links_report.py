"""The slow-links benchmark's comparisons and outputs: accuracy at equal steps, the markdown
table and the accuracy-against-time plot (definitions in bench/slow_links.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import _common
from slow_links_runs import Result, Settings


def accuracy_at_step(step_curve: list[tuple[int, float]], step: int) -> Optional[float]:
    """The curve's accuracy at ``step``, interpolated between its points either side (after its
    last: that one; None before its first), as time_to_target reads a crossing: DDP's one
    evaluator and N peers (each already interpolated, _common.mean_accuracy_curve) are read at
    the same step. Before stop 36 the last point at or before ``step``, which lagged DDP's sparse
    points by up to an evaluation interval and the N peers' denser ones by less."""
    if not step_curve or step < step_curve[0][0]:
        return None
    return _common.interpolated(step_curve, step)


EQUAL_STEP_FRACTIONS = (0.2, 0.4, 0.6, 0.8, 1.0)


def compare_at_equal_steps(by_method: dict[str, Result]) -> None:
    """Accuracy of every method at the same number of steps per peer (= the same total samples):
    the fewest any method of this rate completed, so a method cut off by --max-time counts too;
    and at 20%, 40%, ... of that, so an early gap that closes late shows."""
    runs = [r for r in by_method.values() if r.step_curve]
    if not runs:
        return
    equal = min(max(k for k, _ in r.step_curve) for r in runs)
    for r in runs:
        r.equal_steps = equal
        r.accuracy_at_equal_steps = accuracy_at_step(r.step_curve, equal)
        r.accuracy_at_fractions = [(round(f * equal), accuracy_at_step(r.step_curve, round(f * equal)))
                                   for f in EQUAL_STEP_FRACTIONS]


def compare_with_bounds(results: dict[str, dict[str, Result]]) -> None:
    """The ideal bound and the per-step overhead of every method (definitions in bench/slow_links.py).

    Ideal data parallelism = DDP's steps to the target at compute-only's speed per step, after
    compute-only's start-up. DDP's steps to a target do not depend on the link (the same exact
    averaging), so the fewest over this run's rates is used: evaluations land every --eval-every
    seconds, and the slower rate's DDP is evaluated at finer step intervals.

    Per-step overheads and the ideal bound compare with the compute-only run at the same rate:
    the first one, repeated under every rate, or one run in each rate's lab
    (``--compute-only-each-rate``). Why the bound too (before stop 36 it took the first one's
    speed): on this shared machine compute-only's 1200 steps of nodes.wide took 41.7 s in one
    rate's lab and 35.3 s in the next two, which moved every ratio at those rates by ~0.1x of
    ideal while the overheads, from the run beside them, did not move."""
    first = next((by["compute_only"] for by in results.values() if "compute_only" in by), None)
    ddps = [by["ddp"] for by in results.values() if "ddp" in by]
    fewest = [min((k for k in steps if k is not None), default=None)
              for steps in ([d.steps_to_target for d in ddps], [d.steps_to_high for d in ddps])]

    def ideal(co: Optional[Result], steps: Optional[float]) -> Optional[float]:
        if co is None or steps is None or not co.train_time_s or co.start_s is None or not co.steps:
            return None
        return round(steps * (co.train_time_s - co.start_s) / co.steps + co.start_s, 3)

    for by_method in results.values():
        for name, r in by_method.items():
            co = compute_only_for(name, by_method, first)
            r.ideal_s, r.ideal_high_s = ideal(co, fewest[0]), ideal(co, fewest[1])
            if co is not None and co.train_time_s and r.train_time_s:
                r.step_overhead = round(r.train_time_s / co.train_time_s - 1, 4)
            if co is not None and co.train_phase_s and r.train_phase_s:
                r.phase_overhead = round(r.train_phase_s / co.train_phase_s - 1, 4)
                if co.eval_s is not None and r.eval_s is not None and co.train_phase_s > co.eval_s:
                    r.phase_less_eval_overhead = round((r.train_phase_s - r.eval_s) / (co.train_phase_s - co.eval_s) - 1, 4)
            if co is not None and co.cpu_s_per_step and r.cpu_s_per_step:
                r.cpu_overhead = round(r.cpu_s_per_step / co.cpu_s_per_step - 1, 4)


def compute_only_for(name: str, by_method: dict[str, Result], first: Optional[Result]) -> Optional[Result]:
    """The compute-only run a result at one rate is compared with: its own pass's ("METHOD #2"
    with "compute_only #2", bench/slow_links.py ``run_order``'s pairs) where there is one, else
    the rate's first, else the run's first. Why pairs: compute-only's own 1200 steps of
    nodes.wide took 90.7-106.4 s from one rate's lab to the next (stop 43), the size of a 10%
    overhead target, and one compute-only run per rate left every repeat against one draw."""
    _, _, n = name.partition(" #")
    return by_method.get(f"compute_only #{n}" if n else "compute_only") or by_method.get("compute_only", first)


def fmt(x: Optional[float], digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def fmt_mb(x: Optional[float]) -> str:
    return "—" if x is None else f"{x / 1e6:.1f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "—" if a is None or b is None or b <= 0 else f"{a / b:.2f}"


def markdown(results: dict[str, dict[str, Result]], s: Settings, wall_s: float) -> str:
    lines = [f"# Slow links: task `{s.task}`, {s.peers} peers, {s.steps} steps per peer",
             "",
             f"Target held-out accuracy {s.target:g} (mean over peers of each one's evaluations, interpolated); "
             f"times are wall seconds from launch. Ratios are within this run only. "
             f"Benchmark wall time {wall_s / 60:.1f} min.",
             "",
             "| rate | method | time to target (s) | × ideal | × compute-only | × DDP | MB to target / peer "
             "| DDP's ÷ ours | accuracy at equal steps (steps) | vs DDP (pt) | final accuracy | steps "
             "| train time (s) | per-step overhead | MB sent / peer | status |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for rate, by_method in results.items():
        co = by_method.get("compute_only")
        ddp = by_method.get("ddp")
        for name, r in by_method.items():
            equal = "—" if r.accuracy_at_equal_steps is None else f"{r.accuracy_at_equal_steps:.4f} ({r.equal_steps})"
            vs_ddp = ("—" if r.accuracy_at_equal_steps is None or ddp is None or ddp.accuracy_at_equal_steps is None
                      else f"{100 * (r.accuracy_at_equal_steps - ddp.accuracy_at_equal_steps):+.1f}")
            fewer = ("—" if ddp is None or name == "compute_only" or not r.bytes_to_target
                     or ddp.bytes_to_target is None else f"{ddp.bytes_to_target / r.bytes_to_target:.0f}×")
            lines.append(
                f"| {rate} | {name} | {fmt(r.time_to_target_s)} | {_ratio(r.time_to_target_s, r.ideal_s)} "
                f"| {_ratio(r.time_to_target_s, co.time_to_target_s if co else None)} "
                f"| {_ratio(r.time_to_target_s, ddp.time_to_target_s if ddp else None)} "
                f"| {fmt_mb(r.bytes_to_target)} | {fewer} | {equal} | {vs_ddp} "
                f"| {fmt(r.final_accuracy, 4)} | {r.steps} | {fmt(r.train_time_s)} "
                f"| {_percent(r.step_overhead)} | {fmt_mb(r.bytes_per_peer)} | {r.status} |")
    if s.target_high is not None:
        lines += _high_target_table(results, s)
    lines += _equal_steps_table(results)
    lines += _overhead_table(results)
    lines += repeats_table(results, s)
    bounds = []
    for rate, by in results.items():
        r = next(iter(by.values()), None)
        if r is not None:
            bounds.append(f"{rate} {fmt(r.ideal_s)} s to {s.target:g}"
                          + (f", {fmt(r.ideal_high_s)} s to {s.target_high:g}" if s.target_high else ""))
    lines += ["", "Ideal bound (× ideal): DDP's steps to the target at the rate's compute-only seconds per step, "
              "plus its start-up: " + "; ".join(bounds)
              + " (— when this run has no DDP that reached it, or no finished compute-only). "
              "Per-step overhead: train time ÷ compute-only's − 1."]
    lines += ["", "compute_only runs once (it sends nothing, so the rate does not matter) and is "
              "repeated under every rate, or once in each rate's lab with --compute-only-each-rate. "
              "\"MB to target\": mean bytes a peer put on its link until "
              "the time to target (counted at the bridge: payload plus TCP/IP/Ethernet headers). "
              "\"Accuracy at equal steps\": each method's mean accuracy, interpolated, at "
              "the fewest steps per peer any method at that rate completed (equal steps = "
              "equal total samples: the same peers, batch size and data).", ""]
    return "\n".join(lines)


def _spread(values: list[Optional[float]], show) -> str:
    """"median [min–max]" of the known values, and how many runs never got there (None)."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return "never"
    mid = len(known) // 2
    median = known[mid] if len(known) % 2 else (known[mid - 1] + known[mid]) / 2
    missed = len(values) - len(known)
    return (f"{show(median)} [{show(known[0])}–{show(known[-1])}]" + (f", {missed} never" if missed else ""))


def repeats_table(results: dict[str, dict[str, Result]], s: Settings) -> list[str]:
    """With --repeat: each method's median and range over its runs at a rate (single runs of
    this shared machine moved a ratio by 0.3-0.5 between runs minutes apart, stop 34)."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for rate, by_method in results.items():
        for name, r in by_method.items():
            groups.setdefault((rate, name.split(" #")[0]), []).append(r)
    repeated = {k: runs for k, runs in groups.items() if len(runs) > 1}
    if not repeated:
        return []
    x = lambda a, b: None if a is None or b is None or b <= 0 else a / b  # noqa: E731
    lines = ["", "## Repeats: median [range] over each method's runs", "",
             f"| rate | method | runs | time to {s.target:g} (s) | × ideal "
             + (f"| time to {s.target_high:g} (s) | × ideal " if s.target_high is not None else "")
             + "| per-step overhead |",
             "| --- | --- | ---: | ---: | ---: " + ("| ---: | ---: " if s.target_high is not None else "") + "| ---: |"]
    for (rate, name), runs in repeated.items():
        row = (f"| {rate} | {name} | {len(runs)} | {_spread([r.time_to_target_s for r in runs], fmt)} "
               f"| {_spread([x(r.time_to_target_s, r.ideal_s) for r in runs], lambda v: f'{v:.2f}')} ")
        if s.target_high is not None:
            row += (f"| {_spread([r.time_to_high_s for r in runs], fmt)} "
                    f"| {_spread([x(r.time_to_high_s, r.ideal_high_s) for r in runs], lambda v: f'{v:.2f}')} ")
        lines.append(row + f"| {_spread([r.step_overhead for r in runs], _percent)} |")
    return lines


def _percent(x: Optional[float]) -> str:
    return "—" if x is None else f"{100 * x:+.0f}%"


def _overhead_table(results: dict[str, dict[str, Result]]) -> list[str]:
    """What communication costs training, three ways (definitions in bench/slow_links.py)."""
    lines = ["", "## Per-step overhead over compute-only", "",
             "Train time: launch to the last peer's last step (start-up included); training phase: "
             "the last peer's first step to the last peer's last step; CPU: seconds of CPU (all "
             "processes and threads, start-up and evaluations included) per peer-step. The CPU "
             "figure moves least with the machine's load. Less evaluations: the training phase less "
             "a peer's seconds evaluating (evaluations follow the wall clock, so a slower run "
             "evaluates more), over compute-only's the same way.", "",
             "| rate | method | train time (s) | overhead | training phase (s) | overhead | less evaluations "
             "| CPU s / step | overhead |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for rate, by_method in results.items():
        for name, r in by_method.items():
            lines.append(f"| {rate} | {name} | {fmt(r.train_time_s)} | {_percent(r.step_overhead)} "
                         f"| {fmt(r.train_phase_s)} | {_percent(r.phase_overhead)} "
                         f"| {_percent(r.phase_less_eval_overhead)} "
                         f"| {fmt(r.cpu_s_per_step, 4)} | {_percent(r.cpu_overhead)} |")
    return lines


def _equal_steps_table(results: dict[str, dict[str, Result]]) -> list[str]:
    """Accuracy at 20%, 40%, ..., 100% of the equal steps, and the gap to DDP at each."""
    heads = [f"{round(100 * f)}%" for f in EQUAL_STEP_FRACTIONS]
    lines = ["", "## Accuracy at equal steps", "",
             "Mean accuracy of each method's last evaluations at or before each share of the equal steps "
             "(in brackets: points against DDP at the same steps).", "",
             "| rate | method | " + " | ".join(heads) + " |",
             "| --- | --- | " + " | ".join("---:" for _ in heads) + " |"]
    for rate, by_method in results.items():
        ddp = by_method.get("ddp")
        for name, r in by_method.items():
            if not r.accuracy_at_fractions:
                continue
            cells = []
            for k, (steps, acc) in enumerate(r.accuracy_at_fractions):
                ref = ddp.accuracy_at_fractions[k][1] if ddp and len(ddp.accuracy_at_fractions) > k else None
                gap = "" if acc is None or ref is None or name == "ddp" else f" ({100 * (acc - ref):+.1f})"
                cells.append(f"{fmt(acc, 3)} @{steps}{gap}")
            lines.append(f"| {rate} | {name} | " + " | ".join(cells) + " |")
    return lines


def _high_target_table(results: dict[str, dict[str, Result]], s: Settings) -> list[str]:
    """Time and bytes to the higher target, against compute-only, DDP and the better of PyTorch's
    post-local SGD runs (the ``torch-localsgd-hN`` methods) at the same rate."""
    lines = ["", f"## Higher target: {s.target_high:g}", "",
             "A target the unaveraged peers (compute-only) do not reach within the steps, so time to it "
             "measures what averaging buys. \"best torch-localsgd\": the faster of this rate's "
             "`torch-localsgd-hN` runs to this target.", "",
             "| rate | method | time to target (s) | × ideal | × compute-only | × DDP | × best torch-localsgd "
             "| MB to target / peer | status |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for rate, by_method in results.items():
        co, ddp = by_method.get("compute_only"), by_method.get("ddp")
        local = [r.time_to_high_s for name, r in by_method.items()
                 if name.startswith("torch-localsgd-h") and r.time_to_high_s is not None]
        best_local = min(local) if local else None
        for name, r in by_method.items():
            lines.append(f"| {rate} | {name} | {fmt(r.time_to_high_s)} | {_ratio(r.time_to_high_s, r.ideal_high_s)} "
                         f"| {_ratio(r.time_to_high_s, co.time_to_high_s if co else None)} "
                         f"| {_ratio(r.time_to_high_s, ddp.time_to_high_s if ddp else None)} "
                         f"| {_ratio(r.time_to_high_s, best_local)} "
                         f"| {fmt_mb(r.bytes_to_high)} | {r.status} |")
    return lines


def plot(results: dict[str, dict[str, Result]], s: Settings, path: Path) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib, or the project's `bench` extra)"
    fig, ax = plt.subplots(figsize=(10, 6))
    styles = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1))]
    methods = sorted({m for by in results.values() for m in by})
    colors = {m: f"C{k}" for k, m in enumerate(methods)}
    drawn_compute = False
    for k, (rate, by_method) in enumerate(results.items()):
        for name, r in by_method.items():
            if not r.curve or (name == "compute_only" and drawn_compute):
                continue
            label = "compute_only (any rate)" if name == "compute_only" else f"{name} @ {rate}"
            drawn_compute |= name == "compute_only"
            t, a = zip(*r.curve)
            ax.plot(t, a, linestyle=styles[k % len(styles)], color=colors[name], label=label)
    ax.axhline(s.target, color="grey", linewidth=0.8)
    if s.target_high is not None:
        ax.axhline(s.target_high, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("wall time since launch (s)")
    ax.set_ylabel("held-out accuracy (mean over peers)")
    ax.set_title(f"{s.task}: {s.peers} peers, {s.steps} steps, shaped links")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
