"""Fuzz a live node (issue 12): 100,000 hostile control messages and 10,000 hostile bulk streams,
slow senders and connection floods, against a node training with an honest peer on loopback;
an open node, then a sealed one (``--swarm-key``: everything unauthenticated must be dropped
and counted as a seal rejection).

Per mode, prints what was sent and what the node must make of it (p2p/harness/fuzz.py runs the
node's own readers and decoder on every input), what the node counted (rejections by reason,
abandoned transfers, slow connections cut off, its socket table, heap trims), its RSS, its
open file descriptors (start, most, end), the exchanges it made with the honest peer in each
5 s of the run, and its training steps. The bounded version runs in the test suite
(tests/test_fuzz_live.py).

RSS, how it is measured: the start is the node's RSS after warm-up, not at its launch: once it
has trained and exchanged with the honest peer (torch loaded, the model, optimizer and receive
buffers made) and then run on for a calm stretch (``--calm-s``, whose drift is printed: a node
still growing on its own would show there). The check is the peak over the run (sampled every
0.5 s, and after a settle), not the end: the larger of the total RSS's rise and the anonymous
memory's (RssAnon: the heaps; the kernel may drop the libraries' file pages meanwhile, which
would hide a rise of the total), against the total RSS at the start; < 10% passes.

    python bench/fuzz_node.py [--control 100000] [--bulk 10000] [--slow 20] [--slow-control 5]
                              [--flood 500] [--floods 4] [--modes open,sealed] [--seed 0] [--calm-s 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/fuzz_node.py`: find p2p and the test samples
    sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])  # the nodes too

from _common import wait_for  # noqa: E402  (bench/, the script's folder)
from p2p.harness.fuzz_live import Budget, Monitor, exchanges, fuzz_node  # noqa: E402
from p2p.harness.local_swarm import LocalSwarm  # noqa: E402
from p2p.net.keyring import new_key_line  # noqa: E402
from tests.test_gossip_wire import SAMPLES as GOSSIP_SAMPLES  # noqa: E402
from tests.wire_samples import SAMPLES  # noqa: E402

ARGS = ["--task", "synthetic", "--membership", "local", "--algorithm", "adpsgd", "--log-every", "0",
        "--eval-every", "1", "--exchange-timeout", "1", "--linger", "-1", "--steps", "100000000",
        "--join-timeout", "60"]


def run_mode(mode: str, budget: Budget, seed: int, calm_s: float, work: Path) -> bool:
    key = None
    if mode == "sealed":
        key = work / "swarm.key"
        key.write_text(new_key_line() + "\n")
        os.chmod(key, 0o600)
    swarm = LocalSwarm(2, work / mode, ARGS, swarm_key=str(key) if key else None,
                       per_peer_args=[["--shard", f"{i}/2"] for i in range(2)])
    with swarm:
        swarm.start()
        wait_for(lambda: (s := swarm.status(0, 2.0)) and exchanges(s) > 3, 90, "the pair to train and exchange")
        monitor = Monitor(swarm.procs[0].pid, swarm.addrs[0], swarm.keyring, swarm.addrs[1])
        calm0 = monitor.sample()
        time.sleep(calm_s)  # (a calm stretch: how much the node's RSS drifts on its own)
        calm1 = monitor.sample()
        report = fuzz_node(swarm.addrs[0], swarm.procs[0].pid, swarm.addrs[1], SAMPLES + GOSSIP_SAMPLES, budget, seed,
                           swarm.keyring, log=lambda line: print(f"  [{mode}] {line}", flush=True))
        alive = swarm.alive(0)
    sent, before, after = report.sent, report.before.info, report.after.info
    rejected = report.rejected()
    must = sent.control_expect["reject"] + sent.bulk_expect["reject"]
    may = sent.control_expect["valid"] + sent.bulk_expect["valid"]
    windows = report.exchanges_by_window(5.0)
    print(f"{mode}: sent {sum(sent.control.values())} control messages (unsent {sent.control_unsent}) and "
          f"{sum(sent.bulk.values())} bulk streams (unsent {sent.bulk_unsent}) in {report.seconds:.1f} s")
    print(f"  control kinds: {dict(sent.control)}")
    print(f"  bulk kinds: {dict(sent.bulk)}")
    print(f"  the node must reject: {sent.control_expect['reject']} control + {sent.bulk_expect['reject']} bulk = "
          f"{must}; decode as valid: {sent.control_expect['valid']} control + {sent.bulk_expect['valid']} bulk; "
          f"bulk streams cut mid-message: {sent.bulk_expect['abandoned']}")
    print(f"  rejections counted: {sum(rejected.values())} {dict(rejected.most_common())}")
    print(f"  transfers abandoned +{report.delta('transfers_abandoned')}, slow connections cut off "
          f"+{report.delta('bulk_slow_closed')}, bulk connections refused +{report.delta('bulk_connections_refused')}, "
          f"peer sockets {before['peer_sockets']} -> {after['peer_sockets']} (evicted +{report.delta('peer_sockets_evicted')}), "
          f"send drops +{report.delta('send_drops')}, heap trims +{report.delta('heap_trims')}")
    print(f"  slow senders: {len(sent.slow_closed_after_s)} bulk connections cut off after "
          f"{_span(sent.slow_closed_after_s)} s ({sent.slow_not_closed} not), "
          f"{len(sent.slow_control_closed_after_s)} ZeroMQ ones after {_span(sent.slow_control_closed_after_s)} s "
          f"({sent.slow_control_not_closed} not); flood connections: {sent.flood_opened}")
    print(f"  RSS: {report.before.rss / 1e6:.1f} MB -> {report.after.rss / 1e6:.1f} MB {budget.settle_s:g} s after the "
          f"run ({100 * report.rss_growth:+.1f}%), peak {report.rss_peak / 1e6:.1f} MB "
          f"({100 * (report.rss_peak - report.before.rss) / report.before.rss:+.1f}%); "
          f"calm drift before: {calm0.rss / 1e6:.1f} -> {calm1.rss / 1e6:.1f} MB over {calm_s:g} s "
          f"({100 * (calm1.rss - calm0.rss) / calm0.rss:+.1f}%)")
    print(f"  of which anonymous (the heaps; RssAnon): {report.before.anon / 1e6:.1f} MB -> {report.after.anon / 1e6:.1f} MB, "
          f"peak {report.anon_peak / 1e6:.1f} MB (+{(report.anon_peak - report.before.anon) / 1e6:.1f} MB); calm: "
          f"{calm0.anon / 1e6:.1f} -> {calm1.anon / 1e6:.1f} MB")
    rss = [s.rss for s in [report.before, *report.samples, report.after]]
    print(f"  RSS by fifth of the run (MB): {[round(rss[len(rss) * k // 5] / 1e6, 1) for k in range(5)] + [round(rss[-1] / 1e6, 1)]}")
    print(f"  open fds: start {report.before.fds}, max {report.max_fds}, end {report.after.fds}; "
          f"members in its table: {len(before['members'])} -> {len(after['members'])}")
    honest = [s.honest for s in [report.before, *report.samples, report.after] if s.honest]
    print(f"  honest peer: exchanges {exchanges(honest[0])} -> {exchanges(honest[-1])}, per 5 s {windows} (calm: "
          f"{(exchanges(calm1.honest) - exchanges(calm0.honest)) * 5 / calm_s:.0f} per 5 s); longest wait for a status "
          f"answer {report.status_gap_s():.1f} s; "
          f"node steps {before['step']} -> {after['step']}; alive: {alive}")
    checks = {
        "alive and training": alive and after["step"] > before["step"],
        "every required rejection counted": must <= sum(rejected.values()) <= must + may,
        "sealed: everything counted as a seal rejection": mode != "sealed" or (
            sum(rejected.values()) == sum(sent.control.values()) + sent.bulk_expect["reject"]),
        "abandoned counted": report.delta("transfers_abandoned") >= sent.bulk_expect["abandoned"],
        "slow senders all cut off": sent.slow_not_closed == sent.slow_control_not_closed == 0
        and report.delta("bulk_slow_closed") == len(sent.slow_closed_after_s),
        "RSS growth < 10% (at its peak; total or anonymous, against the RSS at the start)":
            report.rss_peak_growth < 0.10,
        "fds back to the start (+2 per open peer socket)":
            report.after.fds <= report.before.fds + 2 * report.delta("peer_sockets") + 8,
        "honest exchanges in every 5 s": min(windows) > 0,
    }
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    return all(checks.values())


def _span(values) -> str:
    return f"{min(values):.1f}..{max(values):.1f}" if values else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--control", type=int, default=100_000)
    p.add_argument("--bulk", type=int, default=10_000)
    p.add_argument("--slow", type=int, default=20)
    p.add_argument("--slow-control", type=int, default=5)
    p.add_argument("--flood", type=int, default=500)
    p.add_argument("--floods", type=int, default=4)
    p.add_argument("--modes", default="open,sealed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calm-s", type=float, default=20.0)
    a = p.parse_args()
    budget = Budget(control=a.control, bulk=a.bulk, slow=a.slow, slow_control=a.slow_control, flood=a.flood,
                    floods=a.floods, flood_every_s=10.0, settle_s=12.0)
    ok = True
    with tempfile.TemporaryDirectory(prefix="fuzz_node-") as tmp:
        for mode in a.modes.split(","):
            ok = run_mode(mode, budget, a.seed, a.calm_s, Path(tmp)) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
