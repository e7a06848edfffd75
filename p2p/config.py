"""One config object for a swarm member, and the flat settings that build it.

Every setting has one name, used alike by ``p2p.Swarm(model, name=value, ...)``, by
``p2p start --name-with-dashes VALUE`` and by config files: ``swarm_config(**settings)``
checks each value and builds the frozen ``SwarmConfig`` (shared averaging settings in
``AveragingConfig``, the algorithm's own in its ``Config`` class, membership timers from a
preset). A bad value, an unknown name or a setting of another algorithm raises
``SettingError`` naming the setting, so the caller can say which flag or keyword to fix.

``SwarmConfig`` holds what a member of a swarm needs, whoever drives the training loop. The
daemon's own settings (task, shard, steps, ...) live in ``p2p.training.node.NodeConfig``.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from p2p.averaging.base import AveragingConfig
from p2p.averaging.hostile import HOSTILE_MODES
from p2p.averaging.registry import (ALGORITHMS, check_combination, config_class, default_round_timeout_s,
                                    make_averager, natural_topology)
from p2p.compression import COMPRESSORS
from p2p.gossip.config import PRESETS as MEMBERSHIP_PRESETS
from p2p.gossip.config import MembershipConfig
from p2p.net.addresses import bulk_address, parse_address
from p2p.net.identity import load_allow_file, load_identity_file
from p2p.net.keyring import load_key_file
from p2p.net.transport import TransportConfig
from p2p.protocol import LocalProtocolError
from p2p.statesync import SyncConfig
from p2p.topology import TOPOLOGIES

COMPRESSION_NAMES = tuple(COMPRESSORS) + ("auto",)
SHARED_ROUND_TIMEOUT_S = 5.0  # per-step rounds (dpsgd, gossipgrad): a missing neighbour costs this per step


class SettingError(ValueError):
    """A setting that cannot be used. ``setting`` is its name (a flag with dashes)."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


@dataclass(frozen=True)
class SwarmConfig:
    """What one member of a swarm runs with (see the module docstring for how to build one)."""

    listen: str = "127.0.0.1:0"  # HOST:PORT to bind; port 0 takes a free pair of adjacent ports
    advertise: Optional[str] = None  # HOST:PORT peers dial (None: the bound address; on a wildcard, the local address that routes to the first join peer)
    join: tuple[str, ...] = ()  # any known members; empty: first member of a new swarm
    node_id: Optional[str] = None  # defaults to the advertised address
    seed: int = 0  # run seed: this member's protocol randomness comes from (seed, node id)
    join_timeout_s: float = 30.0  # keep retrying the join addresses (and waiting for min_members) this long
    min_members: int = 1  # start training once this many members (this one included) are alive
    linger_s: Optional[float] = 0.0  # keep averaging this long after training ends (None: until stopped)
    algorithm: str = "adpsgd"  # averaging algorithm (p2p.averaging.registry)
    topology: Optional[str] = None  # None: the algorithm's natural topology
    averaging: AveragingConfig = AveragingConfig()  # settings the algorithms share
    options: Any = None  # the algorithm's own settings, an instance of its Config (None: defaults)
    membership: MembershipConfig = field(default_factory=MembershipConfig.lan)
    transport: TransportConfig = TransportConfig()
    state_sync: bool = True  # a joiner downloads the swarm's state from a live member before its first step
    sync_optimizer: bool = True  # ... and asks for the donor's optimizer state too (Adam's moments: a smooth start)
    sync: SyncConfig = SyncConfig()  # how state sync moves the bytes (timeouts, pacing)
    metrics: Optional[str] = None  # HOST:PORT to serve /metrics (Prometheus), / (a status page) and /healthz on
    checkpoint_dir: Optional[str] = None  # write checkpoints here, and resume from the newest one
    checkpoint_every_s: float = 60.0  # seconds between checkpoints (and one at a clean stop)
    keep_checkpoints: int = 2  # checkpoint files kept
    hostile: Optional[str] = None  # test-only: corrupt what this member sends (p2p/averaging/hostile.py)
    swarm_key: Optional[str] = None  # key file (p2p/net/keyring.py): seal every message with it; None: an open swarm
    identity: Optional[str] = None  # this node's identity file (p2p/net/identity.py): sign every message with it
    allow: Optional[str] = None  # allow file: accept only messages signed by the public keys it lists

    def __post_init__(self) -> None:
        if (self.identity is None) != (self.allow is None):
            raise ValueError("identities need both identity (this node's key) and allow (the keys it accepts)")
        if self.identity is not None and self.swarm_key is None:
            raise ValueError("identities sign inside the swarm key's seal: give swarm_key too (p2p keygen)")
        if self.sync.window > self.transport.bulk.max_pending_per_peer:
            raise ValueError(f"sync.window {self.sync.window} exceeds the {self.transport.bulk.max_pending_per_peer} "
                             f"large messages the transport queues per peer: chunks would be dropped")

    @property
    def topology_name(self) -> str:
        return self.topology or natural_topology(self.algorithm)

    @property
    def algorithm_options(self) -> Any:
        return self.options if self.options is not None else config_class(self.algorithm)()


# -- the settings ------------------------------------------------------------------------------
def _address(value: Any, *, wildcard: bool) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    bulk_address(value)  # a valid address whose next port exists (large messages use it)
    parse_address(value, allow_wildcard=wildcard)
    return value


def _listen(value: Any) -> str:
    """A listen address; port 0 asks for any free pair of adjacent ports."""
    if isinstance(value, str) and value.rpartition(":")[2] == "0":
        parse_address(value[:-1] + "1")  # the host part, checked with a placeholder port
        return value
    return _address(value, wildcard=True)


def _addresses(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else list(value)
    return tuple(_address(a, wildcard=False) for a in items)


def _number(value: Any, *, low: float = 0.0, low_ok: bool = False, high: float = math.inf,
            high_ok: bool = False, integer: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise ValueError(f"expected {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")
    ok_low = value >= low if low_ok else value > low
    ok_high = value <= high if high_ok else value < high
    if not (ok_low and ok_high):
        lo = f"{'>=' if low_ok else '>'} {low:g}"
        hi = "" if high == math.inf else f" and {'<=' if high_ok else '<'} {high:g}"
        raise ValueError(f"must be {lo}{hi}, got {value:g}")
    return value


def _choice(value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"unknown value {value!r} (choose from {', '.join(choices)})")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _linger(value: Any) -> Optional[float]:
    """Seconds; a negative number (the CLI's -1) means until stopped (None in SwarmConfig)."""
    value = _number(value, low=-math.inf)
    return None if value < 0 else float(value)


def _membership(value: Any) -> MembershipConfig:
    if isinstance(value, MembershipConfig):
        return value
    return MEMBERSHIP_PRESETS[_choice(value, tuple(MEMBERSHIP_PRESETS))]()


def _node_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty name, got {value!r}")
    return value


def _directory(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a directory path, got {value!r}")
    if os.path.exists(value) and not os.path.isdir(value):
        raise ValueError(f"{value!r} exists and is not a directory")
    return value


def _key_file(value: Any) -> str:
    """A usable swarm key file (read now, so that a bad one is refused before anything starts)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a key file path, got {value!r}")
    load_key_file(value)  # KeyFileError is a ValueError, with one line that says how to fix it
    return value


def _inner_steps(value: Any) -> Any:
    """DiLoCo's H: an integer >= 1, or "auto" (p2p/averaging/outer_schedule.py). The CLI passes text."""
    if value == "auto":
        return value
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise ValueError(f"expected an integer >= 1 or auto, got {value!r}")
        value = int(value)
    return _number(value, low=1, low_ok=True, integer=True)


def _identity_file(value: Any) -> str:
    """A usable identity file (read now, like the swarm key)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected an identity file path, got {value!r}")
    load_identity_file(value)
    return value


def _allow_file(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected an allow file path, got {value!r}")
    load_allow_file(value)
    return value


def _seed(value: Any) -> int:
    return int(_number(value, low=-math.inf, integer=True))


@dataclass(frozen=True)
class Setting:
    name: str  # keyword; the flag is --name with dashes
    where: str  # "swarm" (SwarmConfig), "averaging" (AveragingConfig) or an algorithm's name
    field: str  # the field it sets there
    check: Callable[[Any], Any]  # value -> checked value, or ValueError saying why not
    help: str


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("listen", "swarm", "listen", _listen,
            "HOST:PORT to listen on (port 0: any free pair; 0.0.0.0 listens on all interfaces)."),
    Setting("advertise", "swarm", "advertise", lambda v: _address(v, wildcard=False),
            "HOST:PORT peers should dial (default: the listen address, or on 0.0.0.0 the address that routes to --join)."),
    Setting("join", "swarm", "join", _addresses, "HOST:PORT of any member; repeat for several. None: start a new swarm."),
    Setting("node_id", "swarm", "node_id", _node_id, "Node id (default: the advertised address)."),
    Setting("seed", "swarm", "seed", _seed, "Run seed: the same on every peer."),
    Setting("join_timeout", "swarm", "join_timeout_s", lambda v: float(_number(v)),
            "Seconds to keep retrying the join addresses (and waiting for --min-members)."),
    Setting("min_members", "swarm", "min_members", lambda v: _number(v, low=1, low_ok=True, integer=True),
            "Start training once this many members (this one included) are alive."),
    Setting("linger", "swarm", "linger_s", _linger, "Seconds to keep averaging after training ends (-1: until stopped)."),
    Setting("algorithm", "swarm", "algorithm", lambda v: _choice(v, tuple(ALGORITHMS)),
            "Averaging algorithm: " + ", ".join(ALGORITHMS) + "."),
    Setting("topology", "swarm", "topology", lambda v: _choice(v, tuple(TOPOLOGIES)),
            "Topology: " + ", ".join(TOPOLOGIES) + " (default: the algorithm's own)."),
    Setting("membership", "swarm", "membership", _membership,
            "Membership timer preset: lan, wan or local (fast, for one machine)."),
    Setting("avg_interval", "averaging", "interval_s", lambda v: float(_number(v, low_ok=True)),
            "Seconds between averaging exchanges."),
    Setting("exchange_timeout", "averaging", "exchange_timeout_s", lambda v: float(_number(v)),
            "Seconds before an unanswered exchange is dropped."),
    Setting("round_timeout", "averaging", "round_timeout_s", lambda v: float(_number(v)),
            "Synchronous algorithms stop waiting for a missing neighbour after this (default: 5 s; diloco 20 s, its rounds move whole models); "
            "dpsgd and gossipgrad wait longer, up to --max-interval, on a link measured too slow for their rounds' bytes."),
    Setting("staleness_aware", "averaging", "staleness_aware", _flag, "Down-weight partners whose models are many steps behind."),
    Setting("staleness_tau", "averaging", "staleness_tau", lambda v: float(_number(v)),
            "Steps of staleness that halve a partner's weight (with --staleness-aware)."),
    Setting("compression", "averaging", "compression", lambda v: _choice(v, COMPRESSION_NAMES),
            "Tensor compression: " + ", ".join(COMPRESSION_NAMES) + " (auto: adapt to the link)."),
    Setting("compression_block", "averaging", "compression_block", lambda v: _number(v, integer=True),
            "Block size for int8/int4/sign compression (sparseloco: its chunk, at most 16384)."),
    Setting("topk_fraction", "averaging", "compression_topk_fraction", lambda v: float(_number(v, high=1, high_ok=True)),
            "Fraction of entries topk keeps (default 0.01), or sparseloco per chunk (default 0.02)."),
    Setting("bandwidth_aware", "averaging", "bandwidth_aware", _flag,
            "Adapt the averaging interval and partners to measured links."),
    Setting("comm_fraction", "averaging", "comm_fraction", lambda v: float(_number(v, high=1, high_ok=True)),
            "Bandwidth awareness: keep exchanges under this share of wall time."),
    Setting("max_interval", "averaging", "max_interval_s", lambda v: float(_number(v)),
            "Bandwidth awareness: never pause longer than this between exchanges, nor wait longer for a dpsgd or gossipgrad round (default: 30 s)."),
    Setting("diloco_inner_steps", "diloco", "inner_steps", _inner_steps,
            "DiLoCo: local steps between outer synchronisations, or auto: the fewest whose exchange fits in their compute."),
    Setting("diloco_outer_lr", "diloco", "outer_lr", lambda v: float(_number(v)),
            "DiLoCo: outer (Nesterov) learning rate on the averaged pseudo-gradient (default 0.7; 1 with sparseloco)."),
    Setting("diloco_outer_momentum", "diloco", "outer_momentum", lambda v: float(_number(v, low_ok=True, high=1)),
            "DiLoCo: outer Nesterov momentum, in [0, 1) (default 0.9; 0 with sparseloco)."),
    Setting("diloco_gossip_rounds", "diloco", "gossip_rounds", lambda v: _number(v, low=1, low_ok=True, integer=True),
            "DiLoCo: gossip rounds per outer step (1 is exact on the full graph)."),
    Setting("diloco_overlap", "diloco", "overlap", _flag,
            "DiLoCo: run the outer round beside the next inner steps, its update one round late (Streaming DiLoCo; experimental, off by default; one gossip round)."),
    Setting("diloco_overlap_steps", "diloco", "overlap_steps", lambda v: _number(v, low=1, low_ok=True, integer=True),
            "DiLoCo with --diloco-overlap: wait for the round in flight after this many steps past its boundary, not a whole period (Streaming DiLoCo's tau; default: H)."),
    Setting("diloco_dense_rounds", "diloco", "dense_rounds", lambda v: _number(v, low_ok=True, integer=True),
            "DiLoCo with sparseloco: the swarm's first outer rounds send int4 instead, dense, while the link carries them (default 0; 4 pays on links of 100 Mbit/s and more): 2% of the large early Deltas leaves the model behind."),
    Setting("diloco_warmup_steps", "diloco", "warmup_steps", lambda v: _number(v, low_ok=True, integer=True),
            "DiLoCo: for the first this many steps, average every --diloco-warmup-inner-steps instead of every H (post-local SGD's warm-up: local steps cost accuracy early that they do not later; default 0: none; fixed H only)."),
    Setting("diloco_warmup_inner_steps", "diloco", "warmup_inner_steps", lambda v: _number(v, low=1, low_ok=True, integer=True),
            "DiLoCo: inner steps between outer synchronisations during --diloco-warmup-steps (default 10)."),
    Setting("diloco_warmup_topk_fraction", "diloco", "warmup_topk_fraction", lambda v: float(_number(v, high=1, high_ok=True)),
            "DiLoCo with sparseloco: the fraction of each chunk the rounds of --diloco-warmup-steps keep (default: --topk-fraction's): denser rounds while the early Deltas are large and spread, sent while the link carries them (a peer goes back to --topk-fraction's once the median of its waits for them passes half the period's compute)."),
    Setting("diloco_reduce_scatter", "diloco", "reduce_scatter", _flag,
            "DiLoCo: average each outer round by reduce-scatter + all-gather, 2(N-1)/N model-sizes per peer instead of N-1 (dense codecs, one gossip round; every peer must run with it)."),
    Setting("sgp_push_interval", "sgp", "push_interval_s", lambda v: float(_number(v, low_ok=True)),
            "SGP: push a share at most this often (seconds)."),
    Setting("elastic_alpha", "elastic", "alpha", lambda v: float(_number(v, high=1)),
            "Elastic gossip: fraction of the way both ends move to each other, in (0, 1)."),
    Setting("gossipgrad_model_every", "gossipgrad", "model_every", lambda v: _number(v, low_ok=True, integer=True),
            "GossipGraD: average models with the partner every this many steps (0: gradients only)."),
    Setting("state_sync", "swarm", "state_sync", _flag,
            "Download the swarm's current state from a live member before the first step (--no-state-sync: start from this model)."),
    Setting("sync_optimizer", "swarm", "sync_optimizer", _flag,
            "State sync also takes the donor's optimizer state (with Adam: three times the bytes of the model alone)."),
    Setting("sync_timeout", "sync", "timeout_s", lambda v: float(_number(v)),
            "State sync: give up a donor that sends nothing for this many seconds, try the next."),
    Setting("sync_max_mbit", "sync", "max_rate_bps", lambda v: float(_number(v)) * 1e6 / 8,
            "Serve joiners at most this many Mbit/s (default: as fast as the link)."),
    Setting("metrics", "swarm", "metrics", _listen,
            "HOST:PORT to serve Prometheus metrics (/metrics), a status page (/) and /healthz on (port 0: any free one)."),
    Setting("checkpoint_dir", "swarm", "checkpoint_dir", _directory,
            "Write checkpoints to this directory and resume from the newest one found there."),
    Setting("checkpoint_every", "swarm", "checkpoint_every_s", lambda v: float(_number(v)),
            "Seconds between checkpoints (one is also written at a clean stop)."),
    Setting("keep_checkpoints", "swarm", "keep_checkpoints", lambda v: _number(v, low=1, low_ok=True, integer=True),
            "Checkpoint files kept (older ones are deleted)."),
    Setting("choco_gamma", "choco", "gamma", lambda v: float(_number(v, high=1, high_ok=True)),
            "CHOCO consensus step size in (0, 1] (default: suggested for the codec)."),
    Setting("robust_mixing", "averaging", "robust_mixing", _flag,
            "Clip or refuse a neighbour's model/update far from ours and shun repeat offenders (ClippedGossip; default on)."),
    Setting("swarm_key", "swarm", "swarm_key", _key_file,
            "Key file (`p2p keygen`, mode 600): authenticate and encrypt every message with it; members need the same key."),
    Setting("identity", "swarm", "identity", _identity_file,
            "This node's identity file (`p2p keygen --identity`, mode 600): sign every message with it (needs --swarm-key and --allow)."),
    Setting("allow", "swarm", "allow", _allow_file,
            "Allow file: the public keys (`p2p keygen --public FILE`) whose messages are accepted, one a line; re-read when it changes."),
    Setting("hostile", "swarm", "hostile", lambda v: _choice(v, HOSTILE_MODES),
            "Test-only: corrupt every averaging message this member sends: " + ", ".join(HOSTILE_MODES) + "."),
)}


def swarm_config(**settings: Any) -> SwarmConfig:
    """Check ``settings`` (names from ``SETTINGS``; a None value means "not set", so the
    default holds: ``linger=-1`` is how to say "until stopped") and build a
    ``SwarmConfig``. Raises ``SettingError`` naming the first setting that cannot be used."""
    given = {k: v for k, v in settings.items() if v is not None}
    for name in given:
        if name not in SETTINGS:
            raise SettingError(name, f"unknown setting (known: {', '.join(SETTINGS)})")
    checked: dict[str, Any] = {}
    for name, value in given.items():
        try:
            checked[name] = SETTINGS[name].check(value)
        except (ValueError, TypeError) as exc:
            raise SettingError(name, str(exc)) from None
    swarm: dict[str, Any] = {}
    averaging: dict[str, Any] = {}
    sync: dict[str, Any] = {}
    own: dict[str, Any] = {}
    algorithm = checked.get("algorithm", SwarmConfig.algorithm)
    for name, value in checked.items():
        s = SETTINGS[name]
        if s.where == "swarm":
            swarm[s.field] = value
        elif s.where == "averaging":
            averaging[s.field] = value
        elif s.where == "sync":
            sync[s.field] = value
        elif s.where == algorithm:
            own[s.field] = value
        else:
            raise SettingError(name, f"is a setting of algorithm {s.where}, not of {algorithm}")
    averaging.setdefault("round_timeout_s", default_round_timeout_s(algorithm, SHARED_ROUND_TIMEOUT_S))
    averaging.setdefault("max_interval_s", max(AveragingConfig.max_interval_s, averaging.get("interval_s", 0.0)))
    averaging_config = _build("averaging", AveragingConfig, averaging)
    options = _build(algorithm, config_class(algorithm), own) if own else None
    try:
        config = SwarmConfig(averaging=averaging_config, options=options, sync=_build("sync", SyncConfig, sync), **swarm)
    except ValueError as exc:  # identities without their companions
        if not {"identity", "allow"} & checked.keys():
            raise
        raise SettingError("identity" if "identity" in checked else "allow", str(exc)) from None
    check_runnable(config)
    return config


def _build(where: str, cls: type, values: dict[str, Any]) -> Any:
    try:
        return cls(**values)
    except ValueError as exc:  # a rule across fields: name the one its message begins with, else the first given
        names = [s.name for s in SETTINGS.values() if s.where == where and s.field in values]
        named = [n for n in names if str(exc).startswith(SETTINGS[n].field + " ")]
        raise SettingError((named or names or [where])[0], str(exc)) from None


def check_runnable(config: SwarmConfig) -> None:
    """Refuse a combination the algorithm cannot run (topology, codec, its own settings) before
    any socket is opened: build it once against a stand-in model."""
    name = config.algorithm
    for setting, codec in (("topology", "none"), ("compression", config.averaging.compression)):
        try:
            check_combination(name, config.topology_name, codec)
        except ValueError as exc:
            raise SettingError(setting, str(exc)) from None
    if getattr(config.options, "reduce_scatter", False) and config.topology_name != "full":
        raise SettingError("diloco_reduce_scatter", f"needs --topology full (every peer owns a slice of everyone's "
                                                    f"Delta), not {config.topology_name}")
    codec = config.averaging.compression
    if getattr(config.options, "dense_rounds", 0) and codec != "sparseloco":
        raise SettingError("diloco_dense_rounds", f"needs --compression sparseloco (the dense rounds stand in for its "
                                                  f"first sparse ones), not {codec}")
    if getattr(config.options, "warmup_topk_fraction", None) is not None and codec != "sparseloco":
        raise SettingError("diloco_warmup_topk_fraction", f"needs --compression sparseloco (it sets the density of "
                                                          f"its warm-up rounds), not {codec}")
    try:
        make_averager(name, config.averaging, _ProbePort(), random.Random(0), 0.0, options=config.options)
    except (ValueError, LocalProtocolError) as exc:
        raise SettingError("algorithm", f"{name}: {exc}") from None


class _ProbePort:
    """A stand-in model, so that an algorithm can vet its configuration before the real one."""

    numel, model_key, step = 4, "probe/4", 0

    def snapshot(self):
        import numpy as np

        return np.zeros(4, dtype=np.float32)

    def add_delta(self, delta) -> None:
        pass

    def gradient(self):
        return self.snapshot()

    def set_gradient(self, grad) -> None:
        pass


__all__ = ["COMPRESSION_NAMES", "SETTINGS", "Setting", "SettingError", "SwarmConfig", "check_runnable",
           "swarm_config"]
