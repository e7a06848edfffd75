"""A node's status as Prometheus metrics (``prometheus_client``'s families, never hand-written
text): ``SwarmCollector`` turns one ``Swarm.status()`` into metric families on every scrape, so
nothing is counted twice and a scrape always sees one consistent moment.

Names follow Prometheus conventions: the ``p2p_`` prefix, base units (seconds, bytes), and
``_total`` on counters (the client library appends it to counter families).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

STATES = ("alive", "suspect", "dead", "left")


def _gauge(name: str, doc: str, value: Any) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=math.nan if value is None else float(value))


class SwarmCollector(Collector):
    def __init__(self, status: Callable[[], dict]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        s = self._status()
        yield CounterMetricFamily("p2p_steps", "Optimizer steps taken (skipped AMP steps excluded)", value=s["step"])
        yield _gauge("p2p_steps_per_second", "Steps per second since training started", s.get("steps_per_s"))
        yield _gauge("p2p_loss", "Training loss (moving average, as reported)", s.get("loss"))
        yield _gauge("p2p_accuracy", "Held-out accuracy (last evaluation, as reported)", s.get("accuracy"))
        yield _gauge("p2p_uptime_seconds", "Seconds since the node started", s.get("uptime_s"))
        yield InfoMetricFamily("p2p_node", "What this node runs", value={
            "id": str(s.get("id")), "algorithm": str(s.get("algorithm")), "topology": str(s.get("topology")),
            "codec": str((s.get("bandwidth") or {}).get("codec")), "phase": str(s.get("phase")),
            "device": str(s.get("device"))})
        yield from self._traffic(s)
        yield from self._averaging(s)
        yield from self._membership(s)
        yield from self._keeping(s)

    def _traffic(self, s: dict) -> Iterator[Metric]:
        for direction, per_key, total_key in (("sent", "sent_to", "bytes_sent"), ("received", "received_from", "bytes_received")):
            family = CounterMetricFamily(f"p2p_{direction}_bytes", f"Bytes of messages {direction}, by peer address",
                                         labels=["peer"])
            for peer, nbytes in sorted((s.get(per_key) or {}).items()):
                family.add_metric([peer], nbytes)
            yield family
            yield CounterMetricFamily(f"p2p_transport_{direction}_bytes",
                                      f"Bytes {direction} on every socket (clients and framing included)",
                                      value=s.get(total_key, 0))
        rejected = CounterMetricFamily("p2p_rejected_messages", "Messages from peers dropped, by reason", labels=["reason"])
        for reason, count in sorted((s.get("rejected") or {}).items()):
            rejected.add_metric([reason], count)
        yield rejected
        security = s.get("security") or {}
        yield _gauge("p2p_swarm_encrypted", "1 if every message is sealed with a swarm key, 0 if the swarm is open",
                     security.get("mode") == "encrypted" if security else None)
        yield _gauge("p2p_swarm_keys", "Swarm keys accepted (the first one sends)", security.get("keys", 0))
        yield CounterMetricFamily("p2p_swarm_key_reloads", "Times the swarm key file was re-read after a change",
                                  value=security.get("reloads", 0))
        ids = security.get("identities") or {}  # (its rejections are in p2p_rejected_messages, by reason)
        yield _gauge("p2p_identities_allowed_keys", "Public keys on the allow file (0: identities off)",
                     ids.get("allowed", 0))
        yield CounterMetricFamily("p2p_identities_allow_reloads", "Times the allow file was re-read after a change",
                                  value=ids.get("reloads", 0))
        yield CounterMetricFamily("p2p_send_drops", "Messages not sent (queue full, no route)", value=s.get("send_drops", 0))
        yield CounterMetricFamily("p2p_recv_drops", "Control messages read and dropped (over a connection's "
                                  "budget per turn, or arriving on an outgoing connection)", value=s.get("recv_drops", 0))
        yield CounterMetricFamily("p2p_router_rebinds", "Times the control port was closed and bound afresh (a flood "
                                  "the node could not read fast enough)", value=s.get("router_rebinds", 0))
        yield CounterMetricFamily("p2p_dealers_flooded", "Outgoing control connections closed for the messages the "
                                  "listener sent on them", value=s.get("dealers_flooded", 0))
        yield CounterMetricFamily("p2p_transfers_abandoned", "Large messages abandoned mid-way",
                                  value=s.get("transfers_abandoned", 0))

    def _averaging(self, s: dict) -> Iterator[Metric]:
        avg = s.get("averaging") or {}
        exchanges = CounterMetricFamily("p2p_exchanges", "Averaging exchanges (rounds), by outcome", labels=["outcome"])
        started, completed = avg.get("exchanges_started", 0), avg.get("exchanges_completed", 0)
        exchanges.add_metric(["started"], started)
        exchanges.add_metric(["completed"], completed)
        exchanges.add_metric(["abandoned"], avg.get("exchanges_timed_out", avg.get("rounds_partial", 0)))
        yield exchanges
        yield _gauge("p2p_consensus_estimate", "Relative distance to the partners' models at the last exchanges",
                     s.get("consensus"))
        yield _gauge("p2p_averaging_pause_seconds", "Pause between exchanges (bandwidth awareness)",
                     (s.get("bandwidth") or {}).get("interval_s"))
        yield _gauge("p2p_neighbours", "Neighbours this round", len(s.get("neighbours") or ()))
        yield _gauge("p2p_gate_timeouts", "Steps that went on without the algorithm's go-ahead", s.get("gate_timeouts", 0))
        yield from self._robust(s, avg)
        if "inner_steps" in avg:  # DiLoCo's H now (p2p/averaging/outer_schedule.py: fixed, or chosen by auto)
            yield _gauge("p2p_diloco_inner_steps", "DiLoCo inner steps per outer step (H) in the period under way",
                         avg["inner_steps"])
        if "dense_rounds" in avg:  # DiLoCo's dense first rounds (p2p/averaging/outer_dense.py)
            yield CounterMetricFamily("p2p_diloco_dense_rounds", "DiLoCo outer rounds this node sent as int4 instead of "
                                      "sparseloco (--diloco-dense-rounds)", value=avg["dense_rounds"])
        if "warmup_dense_rounds" in avg:  # DiLoCo's denser warm-up rounds (p2p/averaging/outer_warm.py)
            yield CounterMetricFamily("p2p_diloco_warmup_dense_rounds", "DiLoCo warm-up rounds this node sent at "
                                      "--diloco-warmup-topk-fraction's density", value=avg["warmup_dense_rounds"])
        if "repairs_started" in avg:  # DiLoCo's repairs of copies apart (p2p/averaging/outer_repair.py)
            repairs = CounterMetricFamily("p2p_repairs", "Repairs of theta_start copies apart, by outcome",
                                          labels=["outcome"])
            for outcome in ("started", "completed", "failed"):
                repairs.add_metric([outcome], avg.get(f"repairs_{outcome}", 0))
            yield repairs
            yield CounterMetricFamily("p2p_repair_rounds", "Outer rounds taken while a repair was in flight",
                                      value=avg.get("repair_rounds", 0))
            moved = CounterMetricFamily("p2p_repair_bytes", "Repair payload bytes, by direction", labels=["direction"])
            moved.add_metric(["pulled"], avg.get("repair_bytes", 0))
            moved.add_metric(["served"], avg.get("repair_bytes_served", 0))
            yield moved

    def _robust(self, s: dict, avg: dict) -> Iterator[Metric]:
        """Robust mixing (p2p/averaging/robust.py): what it clipped, refused and shunned."""
        screened = CounterMetricFamily("p2p_robust_mixing", "Neighbours' vectors robust mixing acted on, by action",
                                       labels=["action"])
        for action in ("clipped", "refused", "dropped"):
            screened.add_metric([action], avg.get(f"robust_{action}", 0))
        yield screened
        yield CounterMetricFamily("p2p_robust_exclusions", "Times a repeat offender was excluded from neighbour choice",
                                  value=avg.get("robust_exclusions", 0))
        offenders = (s.get("robust") or {}).get("offenders") or {}
        yield _gauge("p2p_robust_excluded_peers", "Peers excluded from neighbour choice right now",
                     sum(1 for o in offenders.values() if o.get("excluded_for_s", 0) > 0))

    def _membership(self, s: dict) -> Iterator[Metric]:
        members = GaugeMetricFamily("p2p_members", "Members in this node's table, by state", labels=["state"])
        rows = s.get("members") or []
        for state in STATES:
            members.add_metric([state], sum(1 for m in rows if m.get("state") == state))
        yield members
        events = CounterMetricFamily("p2p_membership_events", "Membership events this node saw, by kind", labels=["event"])
        for name, count in sorted((s.get("membership") or {}).items()):
            events.add_metric([name], count)
        yield events

    def _keeping(self, s: dict) -> Iterator[Metric]:
        sync = s.get("sync") or {}
        yield _gauge("p2p_state_sync_seconds", "Seconds the state sync took (NaN: none)", sync.get("seconds"))
        yield _gauge("p2p_state_sync_bytes", "Bytes the state sync took (NaN: none)", sync.get("bytes"))
        ckpt = s.get("checkpoint") or {}
        yield CounterMetricFamily("p2p_checkpoints_written", "Checkpoints written", value=ckpt.get("written", 0))
        yield _gauge("p2p_checkpoint_last_step", "Step of the last checkpoint (NaN: none)", ckpt.get("last_step"))
        yield _gauge("p2p_checkpoint_write_seconds", "Seconds the last checkpoint took to write (NaN: none)",
                     ckpt.get("write_s"))
