"""Human-readable rendering of a node's status (``p2p status``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def render_status(info: dict, console: Console | None = None) -> None:
    console = console or Console()
    console.print(
        f"node {info['id']} at {info['addr']}  task {info['task']}  {info['phase']}  "
        f"step {info['step']}  loss {info['loss']:.4f}  acc {info['accuracy']:.4f}  "
        f"{info['algorithm']}/{info['topology']}  sent {info['bytes_sent'] / 1e6:.1f} MB  "
        f"recv {info['bytes_received'] / 1e6:.1f} MB  rejected {sum(info['rejected'].values())}"
    )
    if security := security_line(info):
        console.print(security)
    consensus = info.get("consensus")
    if consensus is not None:
        console.print(f"consensus estimate {consensus:.3g} (relative distance to partners' models)")
    for line in (flood_line(info), _robust_line(info), _inner_steps_line(info), dense_line(info), warm_line(info),
                 _scatter_line(info), _repair_line(info)):
        if line:
            console.print(line)
    line = _sync_line(info.get("sync") or {})
    if line:
        console.print(line)
    ckpt = info.get("checkpoint") or {}
    if ckpt:
        console.print(f"checkpoints in {ckpt['dir']}: last at step {ckpt.get('last_step')}, {ckpt.get('written', 0)} written"
                      + (f", resumed from {ckpt['restored_from']}" if ckpt.get("restored_from") else "")
                      + (f"; {ckpt['error']}" if ckpt.get("error") else ""))
    table = Table("id", "address", "state", "incarnation", "last heard")
    for row in info["members"]:
        heard = "-" if row["last_heard_s"] is None else f"{row['last_heard_s']:.1f}s ago"
        table.add_row(str(row["id"]), str(row["addr"]), str(row["state"]), str(row["incarnation"]), heard)
    console.print(table)
    bw = info.get("bandwidth") or {}
    if bw.get("links"):
        links = Table("neighbour", "throughput Mbit/s", "exchange ms", "samples",
                      title=f"bandwidth: codec {bw['codec']}, pause {bw['interval_s']:.2f}s between exchanges")
        for peer, row in bw["links"].items():
            links.add_row(peer, str(row["throughput_mbit_s"]), str(row["exchange_ms"]), str(row["samples"]))
        console.print(links)


def flood_line(info: dict) -> str:
    """What the control port dropped to keep its memory bounded (p2p/net/control_port.py), or ""
    when nothing was: an operator should see that someone floods this node."""
    drops, rebinds, dealers = (info.get(k, 0) for k in ("recv_drops", "router_rebinds", "dealers_flooded"))
    if not (drops or rebinds or dealers):
        return ""
    return (f"control flood: {drops} messages dropped over the per-connection budget, listened afresh "
            f"{rebinds} times, {dealers} outgoing connections closed")


def repair_summary(avg: dict) -> str:
    """DiLoCo's repairs of copies apart (p2p/averaging/outer_repair.py), or "" for other algorithms."""
    if "repairs_started" not in avg:
        return ""
    return (f"repairs {avg['repairs_completed']}/{avg['repairs_started']} ({avg.get('repairs_failed', 0)} failed, "
            f"{avg.get('catch_ups_completed', 0)} caught up from the rounds' shares, "
            f"{avg.get('repair_rounds', 0)} rounds, {avg.get('repair_bytes', 0) / 1e6:.1f} MB pulled, "
            f"{avg.get('repair_bytes_served', 0) / 1e6:.1f} MB served)")


def inner_steps_summary(avg: dict) -> str:
    """DiLoCo's H now (p2p/averaging/outer_schedule.py), or "" for other algorithms."""
    if "inner_steps" not in avg:
        return ""
    return (f"H {avg['inner_steps']}" + (" (auto)" if avg.get("inner_steps_auto") else "")
            + (f" (warm-up to step {avg['warmup_until']})" if avg.get("warmup_until") else ""))


def _inner_steps_line(info: dict) -> str:
    line = inner_steps_summary(info.get("averaging") or {})
    return f"diloco {line} inner steps per outer step" if line else ""


def dense_line(info: dict) -> str:
    """DiLoCo's dense first rounds (p2p/averaging/outer_dense.py) this node sent, or "" for none:
    whether the link carried them shows here (they stop after one the trainer waited too long for)."""
    sent = (info.get("averaging") or {}).get("dense_rounds", 0)
    return (f"diloco dense first rounds: {sent} sent as int4 (--diloco-dense-rounds; they stop after one the "
            f"trainer waited for longer than its period's compute)") if sent else ""


def warm_line(info: dict) -> str:
    """DiLoCo's denser warm-up rounds (p2p/averaging/outer_warm.py) this node sent, and whether it
    went back to the codec's density (the link did not carry them), or "" for none."""
    avg = info.get("averaging") or {}
    sent = avg.get("warmup_dense_rounds", 0)
    if not sent:
        return ""
    line = f"diloco warm-up rounds: {sent} sent at --diloco-warmup-topk-fraction's density"
    if avg.get("warmup_wait_pct"):
        line += f", the trainer's wait for them {avg['warmup_wait_pct']}% of the period's compute (median)"
    return line + ("; stopped: over 50%, the link does not carry them" if avg.get("warmup_dense_stopped") else "")


def _scatter_line(info: dict) -> str:
    """DiLoCo's reduce-scatter rounds (p2p/averaging/outer_scatter.py), when on."""
    avg = info.get("averaging") or {}
    if "scatter_rounds" not in avg:
        return ""
    return (f"diloco reduce-scatter: {avg['scatter_rounds']} rounds, {avg['scatter_slices_skipped']} slices skipped "
            f"(owner missing), {avg['scatter_contributors_missing']} contributions missing, "
            f"{avg['scatter_view_mismatch']} from another membership view")


def _repair_line(info: dict) -> str:
    line = repair_summary(info.get("averaging") or {})
    return f"theta_start {line}: copies apart pulled from one donor" if line else ""


def _robust_line(info: dict) -> str:
    """Robust mixing: off, or what it clipped, refused and whom it shuns now."""
    robust = info.get("robust")
    if robust is None:
        return ""
    if not robust.get("enabled"):
        return "robust mixing: off (--no-robust-mixing): every neighbour's vector is mixed as it comes"
    avg = info.get("averaging") or {}
    offenders = robust.get("offenders") or {}
    shunned = [f"{p} ({o['excluded_for_s']:.0f}s left)" for p, o in offenders.items() if o.get("excluded_for_s", 0) > 0]
    return (f"robust mixing: {avg.get('robust_clipped', 0)} clipped, {avg.get('robust_refused', 0)} refused, "
            f"{avg.get('robust_dropped', 0)} dropped from {len(offenders)} offender(s)"
            + (f"; excluded now: {', '.join(shunned)}" if shunned else "")
            + (f"  [this node is HOSTILE: {info['hostile']}]" if info.get("hostile") else ""))


def _sync_line(sync: dict) -> str:
    """State sync, as a line: its progress while it runs, what it brought after."""
    phase = sync.get("phase")
    if phase in ("querying", "transferring"):
        total = sync.get("total", -1)
        done = f"{sync.get('received', 0) / 1e6:.1f}" + (f" of {total / 1e6:.1f} MB" if total >= 0 else " MB")
        return f"state sync: {phase} from {sync.get('donor') or '?'}: {done} (attempt {sync.get('attempts', 0)})"
    if phase == "done":
        return (f"state sync: took step {sync['step']} from {sync['donor']} ({sync['bytes'] / 1e6:.1f} MB in "
                f"{sync['seconds']:.1f} s)")
    return ""


SEAL_REASONS = ("unauthenticated", "no_key", "bad_key", "replay")  # p2p/net/seal.py
IDENTITY_REASONS = ("unsigned", "not_allowed", "bad_signature", "identity_mismatch",  # p2p/net/identity.py
                    "sender_mismatch", "member_mismatch")  # p2p/net/member_ids.py


def security_line(info: dict) -> str:
    """Open, or encrypted with which key, and what the seal turned away."""
    security = info.get("security")
    if not security:
        return ""
    if security["mode"] == "open":
        return "security: open (no --swarm-key: anyone who reaches this node can join and read the models)"
    rejected = info.get("rejected") or {}
    counts = ", ".join(f"{r} {rejected.get(r, 0)}" for r in SEAL_REASONS)
    line = (f"security: {security['summary']}; rejected {counts}"
            + (f"; key file: {security['key_file_error']}" if security.get("key_file_error") else ""))
    ids = security.get("identities")
    if ids:
        counts = ", ".join(f"{r} {rejected.get(r, 0)}" for r in IDENTITY_REASONS)
        line += (f"\nidentities: signed as {ids['public_key']}, {ids['allowed']} keys allowed "
                 f"({ids['allow_file']}), {ids['bound_ids']} addresses and "
                 f"{ids.get('bound_member_ids', 0)} member ids bound; rejected {counts}"
                 + (f"; allow file: {ids['allow_file_error']}" if ids.get("allow_file_error") else ""))
    return line
