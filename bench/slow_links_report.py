"""The slow-links benchmark's comparisons and outputs: accuracy at equal steps, the markdown
table and the accuracy-against-time plot (definitions in bench/slow_links.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from slow_links_runs import Result, Settings


def accuracy_at_step(step_curve: list[tuple[int, float]], step: int) -> Optional[float]:
    """The mean accuracy of the last evaluations made at or before ``step``."""
    before = [a for k, a in step_curve if k <= step]
    return before[-1] if before else None


def compare_at_equal_steps(by_method: dict[str, Result]) -> None:
    """Accuracy of every method at the same number of steps per peer (= the same total samples):
    the fewest any method of this rate completed, so a method cut off by --max-time counts too."""
    runs = [r for r in by_method.values() if r.step_curve]
    if not runs:
        return
    equal = min(max(k for k, _ in r.step_curve) for r in runs)
    for r in runs:
        r.equal_steps = equal
        r.accuracy_at_equal_steps = accuracy_at_step(r.step_curve, equal)


def fmt(x: Optional[float], digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def fmt_mb(x: Optional[float]) -> str:
    return "—" if x is None else f"{x / 1e6:.1f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "—" if a is None or b is None or b <= 0 else f"{a / b:.2f}"


def markdown(results: dict[str, dict[str, Result]], s: Settings, wall_s: float) -> str:
    lines = [f"# Slow links: task `{s.task}`, {s.peers} peers, {s.steps} steps per peer",
             "",
             f"Target held-out accuracy {s.target:g} (mean over peers of their latest evaluation); "
             f"times are wall seconds from launch. Ratios are within this run only. "
             f"Benchmark wall time {wall_s / 60:.1f} min.",
             "",
             "| rate | method | time to target (s) | × compute-only | × DDP | MB to target / peer "
             "| DDP's ÷ ours | accuracy at equal steps (steps) | vs DDP (pt) | final accuracy | steps "
             "| train time (s) | MB sent / peer | status |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
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
                f"| {rate} | {name} | {fmt(r.time_to_target_s)} "
                f"| {_ratio(r.time_to_target_s, co.time_to_target_s if co else None)} "
                f"| {_ratio(r.time_to_target_s, ddp.time_to_target_s if ddp else None)} "
                f"| {fmt_mb(r.bytes_to_target)} | {fewer} | {equal} | {vs_ddp} "
                f"| {fmt(r.final_accuracy, 4)} | {r.steps} | {fmt(r.train_time_s)} "
                f"| {fmt_mb(r.bytes_per_peer)} | {r.status} |")
    if s.target_high is not None:
        lines += _high_target_table(results, s)
    lines += ["", "compute_only runs once (it sends nothing, so the rate does not matter) and is "
              "repeated under every rate. \"MB to target\": mean bytes a peer put on its link until "
              "the time to target (counted at the bridge: payload plus TCP/IP/Ethernet headers). "
              "\"Accuracy at equal steps\": each method's mean accuracy from its last evaluations at "
              "or before the fewest steps per peer any method at that rate completed (equal steps = "
              "equal total samples: the same peers, batch size and data).", ""]
    return "\n".join(lines)


def _high_target_table(results: dict[str, dict[str, Result]], s: Settings) -> list[str]:
    """Time and bytes to the higher target, against compute-only, DDP and the better of PyTorch's
    post-local SGD runs (the ``torch-localsgd-hN`` methods) at the same rate."""
    lines = ["", f"## Higher target: {s.target_high:g}", "",
             "A target the unaveraged peers (compute-only) do not reach within the steps, so time to it "
             "measures what averaging buys. \"best torch-localsgd\": the faster of this rate's "
             "`torch-localsgd-hN` runs to this target.", "",
             "| rate | method | time to target (s) | × compute-only | × DDP | × best torch-localsgd "
             "| MB to target / peer | status |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for rate, by_method in results.items():
        co, ddp = by_method.get("compute_only"), by_method.get("ddp")
        local = [r.time_to_high_s for name, r in by_method.items()
                 if name.startswith("torch-localsgd-h") and r.time_to_high_s is not None]
        best_local = min(local) if local else None
        for name, r in by_method.items():
            lines.append(f"| {rate} | {name} | {fmt(r.time_to_high_s)} "
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
