"""A live node fuzzed on both channels while an honest peer trains with it (issue 12; the long
run is bench/fuzz_node.py): it keeps training and exchanging, counts every rejection, closes
slow senders, and its memory and file descriptors stay bounded. Open and sealed."""

import os

import pytest

from p2p.harness.fuzz_live import Budget, fuzz_node
from p2p.harness.local_swarm import LocalSwarm
from p2p.net.keyring import load_key_file, new_key_line
from tests.conftest import wait_until
from tests.test_gossip_wire import SAMPLES as GOSSIP_SAMPLES
from tests.wire_samples import SAMPLES

pytestmark = pytest.mark.integration

ARGS = ["--task", "synthetic", "--membership", "local", "--algorithm", "adpsgd", "--log-every", "0",
        "--eval-every", "1", "--exchange-timeout", "1", "--linger", "-1", "--steps", "10000000",
        "--join-timeout", "60"]
# Small, to run in well under a minute on 2 cores; the slow senders need the node's 10 s grace.
BUDGET = Budget(control=3000, bulk=300, slow=4, slow_control=2, slow_max_s=25.0, flood=100, flood_hold_s=0.5,
                bulk_workers=8, dealers=2, settle_s=2.0)
GRACE_S, HANDSHAKE_S = 10.0, 10.0  # BulkConfig.slow_grace_s, TransportConfig.handshake_ms
SEAL_REASONS = {"unauthenticated", "no_key", "bad_key", "replay"}


def key_file(path):
    path.write_text(new_key_line() + "\n")
    os.chmod(path, 0o600)
    return str(path)


def fuzz_a_training_pair(tmp_path, swarm_key=None):
    swarm = LocalSwarm(2, tmp_path, ARGS, swarm_key=swarm_key, per_peer_args=[["--shard", f"{i}/2"] for i in range(2)])
    with swarm:
        swarm.start()
        wait_until(lambda: (s := swarm.status(0)) and s["step"] > 0 and s["averaging"].get("exchanges_completed", 0)
                   + s["averaging"].get("requests_served", 0) > 3, 60, what="the pair to train and exchange")
        report = fuzz_node(swarm.addrs[0], swarm.procs[0].pid, swarm.addrs[1], SAMPLES + GOSSIP_SAMPLES, BUDGET, seed=1,
                           keyring=swarm.keyring)
        alive = swarm.alive(0)
        honest = swarm.status(1, timeout_s=5.0)
    return report, alive, honest, swarm.addrs


def check_bounds(report, alive, honest, addrs):
    sent, before, after = report.sent, report.before.info, report.after.info
    assert alive and after["step"] > before["step"] + 10  # still training
    assert sum(sent.control.values()) == BUDGET.control and sum(sent.bulk.values()) == BUDGET.bulk, sent
    # The honest peer kept exchanging with it all along (in every 5 s of the run).
    assert min(report.exchanges_by_window(5.0)) > 0, report.exchanges_by_window(5.0)
    assert honest["received_from"].get(addrs[0], 0) > 0
    # Slow senders: every trickling bulk connection cut off after the grace; the ZeroMQ ones
    # dropped by the handshake timeout.
    assert sent.slow_not_closed == 0 and sent.slow_control_not_closed == 0, sent
    assert all(GRACE_S <= t <= GRACE_S + 5 for t in sent.slow_closed_after_s), sent.slow_closed_after_s
    assert all(t <= HANDSHAKE_S + 5 for t in sent.slow_control_closed_after_s), sent.slow_control_closed_after_s
    assert len(sent.slow_closed_after_s) >= BUDGET.slow
    assert report.delta("bulk_slow_closed") == len(sent.slow_closed_after_s)
    # Bounded: memory and file descriptors. During a flood the node holds its connections (at
    # most max_connections, 256, to the bulk port), beside 2 fds per socket to a made-up sender
    # it answered (those close when idle); afterwards it is back where it started but for those.
    assert report.rss_peak_growth < 0.10, (report.before.rss, report.rss_peak, report.before.anon, report.anon_peak)
    opened = report.delta("peer_sockets")
    assert report.max_fds <= report.before.fds + 2 * BUDGET.flood + 2 * opened + 64, (report.before.fds, report.max_fds)
    assert report.after.fds <= report.before.fds + 2 * opened + 8, (report.before.fds, report.after.fds, opened)
    assert report.after.info["peer_sockets"] <= 256  # TransportConfig.max_peer_sockets
    assert report.delta("bulk_connections_refused") == 0


def unopened(report) -> int:
    """Control messages read and dropped unopened: over a connection's budget of messages for one
    turn (p2p/net/control_port.py): met when the network thread turns slowly (a busy machine):
    CI saw 119 of 3,000 missing from the refusals; beside a busy loop here, one run of 4 dropped
    30 unopened, exactly what the refusals were short. Counted, not refused; none is lost
    uncounted, so the port never listened afresh (which drops what libzmq queued uncounted)."""
    assert report.delta("router_rebinds") == 0, report.after.info
    return report.delta("recv_drops")


def test_a_fuzzed_open_node_keeps_training_counts_every_rejection_and_stays_bounded(tmp_path):
    report, alive, honest, addrs = fuzz_a_training_pair(tmp_path)
    check_bounds(report, alive, honest, addrs)
    sent, rejected = report.sent, report.rejected()
    # Every input the decoder refuses was counted (valid ones may be refused too: another
    # model, an unknown member), and each kind of refusal was met.
    must = sent.control_expect["reject"] + sent.bulk_expect["reject"]
    may = sent.control_expect["valid"] + sent.bulk_expect["valid"]
    dropped = unopened(report)
    assert must - dropped <= sum(rejected.values()) <= must + may, (rejected, dropped, sent.control_expect, sent.bulk_expect)
    assert {"malformed", "version", "unknown_type", "oversized", "bad_tensor"} <= set(rejected), rejected
    assert report.delta("transfers_abandoned") >= sent.bulk_expect["abandoned"] > 0
    # Every message was read: it reached the decoder, or was dropped unopened and counted.
    assert report.delta("messages_received") + dropped >= BUDGET.control + sent.bulk_expect["valid"], dropped


def test_a_fuzzed_sealed_node_drops_and_counts_everything_unauthenticated(tmp_path):
    key = key_file(tmp_path / "swarm.key")
    report, alive, honest, addrs = fuzz_a_training_pair(tmp_path / "swarm", swarm_key=key)
    check_bounds(report, alive, honest, addrs)
    sent, rejected = report.sent, report.rejected()
    assert sent.control_expect["valid"] == sent.bulk_expect["valid"] == 0  # nothing forged opens
    assert {"unauthenticated", "no_key", "bad_key"} <= set(rejected), rejected
    # Every control message, and every bulk stream that got as far as its hello, was counted:
    # refused, or dropped unopened over its connection's budget for a turn.
    must, dropped = BUDGET.control + sent.bulk_expect["reject"], unopened(report)
    assert must - dropped <= sum(rejected.values()) <= must, (rejected, dropped)
    assert set(rejected) <= SEAL_REASONS | {"malformed"}, rejected
    assert report.after.info["security"]["key_id"] == load_key_file(key).primary_id.hex()
