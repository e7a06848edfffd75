"""Membership configuration: one frozen dataclass and its presets.

The presets follow HashiCorp memberlist's ``DefaultLANConfig`` / ``DefaultWANConfig`` /
``DefaultLocalConfig``, with two additions borrowed from Serf (reconnecting to recently failed
members, reaping them later) and join retries. All durations are float seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class MembershipConfig:
    probe_interval: float = 1.0  # SWIM protocol period: one member is probed per period
    probe_timeout: float = 0.5  # wait this long for a direct ack before asking others (PingReq)
    indirect_checks: int = 3  # k: members asked to probe on our behalf when the direct ping fails
    suspicion_mult: int = 4  # min suspicion timeout = mult * max(1, log10(N)) * probe_interval
    suspicion_max_timeout_mult: int = 6  # max suspicion timeout = this * min (Lifeguard)
    awareness_max_multiplier: int = 8  # Lifeguard local health: timeouts scale by up to this
    retransmit_mult: int = 4  # each update is piggybacked mult * ceil(log10(N + 1)) times
    gossip_interval: float = 0.2  # send queued updates to gossip_nodes members this often
    gossip_nodes: int = 3  # fan-out of a gossip round
    gossip_to_the_dead: float = 30.0  # dead members keep receiving gossip this long
    packet_budget_bytes: int = 1400  # piggybacked updates per message stay under this many bytes
    push_pull_interval: float = 30.0  # anti-entropy full-state exchange; scaled up above 32 members
    reconnect_interval: float = 10.0  # how often we may push-pull one recently dead member
    reconnect_window: float = 600.0  # dead members are retried this long (partition healing)
    reap_after: float = 900.0  # dead/left members leave the table after this (>= reconnect_window)
    # A brief cut heals within about one fast interval: members dead for less than the fast
    # window are push-pulled every fast interval (at most reconnect_fast_max per interval), each
    # time on a fresh connection (the old one may be in TCP's backoff: membership.py, "Healing").
    reconnect_fast_interval: float = 1.0
    reconnect_fast_window: float = 30.0
    reconnect_fast_max: int = 3
    nudge_interval: float = 1.0  # a member held suspect/dead that is heard from: answered fresh at most this often
    join_retry_initial: float = 1.0  # first join retry after this; doubles on every retry ...
    join_retry_max: float = 30.0  # ... up to this
    max_relays: int = 256  # PingReq requests served at once; further ones are dropped

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise ValueError(f"MembershipConfig.{f.name} must be a number, got {value!r}")
            if value <= 0 and f.name not in ("indirect_checks",):
                raise ValueError(f"MembershipConfig.{f.name} must be > 0, got {value!r}")
        if self.indirect_checks < 0:
            raise ValueError("MembershipConfig.indirect_checks must be >= 0")
        if self.probe_timeout >= self.probe_interval:
            raise ValueError("MembershipConfig.probe_timeout must be shorter than probe_interval")
        if self.join_retry_max < self.join_retry_initial:
            raise ValueError("MembershipConfig.join_retry_max must be >= join_retry_initial")
        if self.reap_after < self.reconnect_window:
            raise ValueError("MembershipConfig.reap_after must be >= reconnect_window")
        if self.packet_budget_bytes < 128:
            raise ValueError("MembershipConfig.packet_budget_bytes must be >= 128")

    @classmethod
    def lan(cls) -> "MembershipConfig":
        """memberlist's LAN defaults: 1 s period, 500 ms probe timeout, 3 indirect probers."""
        return cls()

    @classmethod
    def wan(cls) -> "MembershipConfig":
        """memberlist's WAN defaults: slower probes, longer suspicion, wider gossip."""
        return cls(
            probe_interval=5.0,
            probe_timeout=3.0,
            suspicion_mult=6,
            gossip_interval=0.5,
            gossip_nodes=4,
            gossip_to_the_dead=60.0,
            push_pull_interval=60.0,
            reconnect_interval=30.0,
            reconnect_window=3600.0,
            reap_after=3600.0,
            reconnect_fast_interval=5.0,
            reconnect_fast_window=120.0,
            join_retry_initial=2.0,
            join_retry_max=60.0,
        )

    @classmethod
    def local(cls) -> "MembershipConfig":
        """Fast timers for real processes on loopback (tests, demos)."""
        return cls(
            probe_interval=0.2,
            probe_timeout=0.1,
            indirect_checks=2,
            suspicion_mult=3,
            retransmit_mult=3,
            gossip_interval=0.05,
            gossip_to_the_dead=5.0,
            push_pull_interval=2.0,
            reconnect_interval=1.0,
            reconnect_window=60.0,
            reap_after=120.0,
            reconnect_fast_interval=0.25,
            reconnect_fast_window=10.0,
            nudge_interval=0.5,
            join_retry_initial=0.1,
            join_retry_max=2.0,
        )


PRESETS = {"lan": MembershipConfig.lan, "wan": MembershipConfig.wan, "local": MembershipConfig.local}
