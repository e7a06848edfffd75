"""A shaped-network lab: one Linux network namespace per peer, on one bridge, rate-limited links.

Layout for ``Lab(peers=3, rate="20mbit", prefix="p2plab", subnet="10.77.0.0/24")``::

    root namespace:   bridge p2plab-br 10.77.0.1/24  (the test, `p2p status` reach peers here)
                        |            |            |
                      p2plab-h0    p2plab-h1    p2plab-h2     host-side veths, tbf egress (downlink)
                        |            |            |
    namespaces:       p2plab-0     p2plab-1     p2plab-2
                      eth0 .2      eth0 .3      eth0 .4      tbf egress (uplink); lo up

Every name derives from the prefix, so a second process (``p2p lab down``/``cut``/``status``)
finds the lab from the prefix alone: no state file. ``Lab.attach(prefix)`` rebuilds the object
from what the kernel reports (namespaces, the bridge's address, the tbf rate).

Shaping is ``tc tbf`` on both ends of each peer's veth pair, so a peer's uplink and downlink are
each limited to ``rate`` (traffic between two peers crosses the sender's uplink and the
receiver's downlink). ``cut(i)`` takes the host-side veth down (peer i keeps running but
nothing reaches it or leaves it); ``restore(i)`` brings it back. ``partition([[0, 1], [2, 3]])``
splits the peers into groups that reach each other only within a group (each namespace gets a
``prohibit`` route to every peer outside its group; the root namespace still reaches everyone,
so status queries keep working); ``heal()`` removes those routes. Root is required; every
error is a ``LabError`` whose message says what to fix.

``LabSwarm`` is ``p2p.harness.local_swarm.LocalSwarm`` with each peer started inside its namespace
(``ip netns exec``) and listening on its namespace address.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from p2p.harness.local_swarm import LocalSwarm

DEFAULT_PREFIX = "p2plab"
DEFAULT_SUBNET = "10.77.0.0/24"
MAX_PREFIX_LEN = 9  # interface names are at most 15 bytes: PREFIX + "-h" + up to 4 digits

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*$", re.IGNORECASE)
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]*$")
_UNLIMITED = ("", "none", "unlimited", "inf", "0")


class LabError(RuntimeError):
    """The lab cannot be built or used as asked; the message says why and what to do."""


# -- pure helpers -------------------------------------------------------------------------

def parse_rate(rate: Optional[str]) -> Optional[int]:
    """``"100mbit"`` -> 100_000_000 bits/s; ``None``/``"unlimited"`` -> None (no shaping)."""
    if rate is None or str(rate).strip().lower() in _UNLIMITED:
        return None
    match = _RATE_RE.match(str(rate))
    if not match:
        raise LabError(f"rate {rate!r}: expected a number and a unit, e.g. 100mbit, 20mbit, 500kbit, "
                       f"1gbit, or 'unlimited'")
    bps = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if not 8_000 <= bps <= 100 * 10**9:
        raise LabError(f"rate {rate!r}: must be between 8kbit and 100gbit")
    return bps


def format_rate(bps: Optional[int]) -> str:
    if bps is None:
        return "unlimited"
    for unit in ("gbit", "mbit", "kbit"):
        if bps >= _UNITS[unit] and bps % _UNITS[unit] == 0:
            return f"{bps // _UNITS[unit]}{unit}"
    return f"{bps}bit"


def tbf_params(bps: int) -> tuple[int, int]:
    """(burst bytes, queue limit bytes) for a tbf at ``bps``.

    burst: 4 ms worth of tokens, at least 32 KiB (the kernel must be able to send a full-size
    packet plus some; GSO super-packets larger than the burst are segmented by tbf). limit: the
    queue holds ~25 ms at the rate, at least 64 KiB, so TCP on a sub-millisecond RTT fills the
    pipe without building a standing queue of seconds.
    """
    byte_rate = bps / 8
    burst = max(32 * 1024, int(byte_rate * 0.004))
    limit = max(64 * 1024, int(byte_rate * 0.025)) + burst
    return burst, limit


def _run(argv: Sequence[str], check: bool = True, what: str = "") -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LabError(f"{what or 'command'} failed: {' '.join(argv)}: "
                       f"{(proc.stderr or proc.stdout).strip() or 'exit ' + str(proc.returncode)}")
    return proc


def unavailable_reason() -> Optional[str]:
    """Why the lab cannot run on this machine (not root, no ``ip``/``tc``), or None if it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the network lab needs root (it creates network namespaces, veth pairs and tc qdiscs)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the network lab needs the '{tool}' command (package iproute2)"
    return None


def probe() -> Optional[str]:
    """Like ``unavailable_reason`` but also creates and deletes a scratch namespace and veth."""
    reason = unavailable_reason()
    if reason:
        return reason
    name = f"p2pprobe{os.getpid() % 100000}"
    try:
        made = _run(["ip", "netns", "add", name], check=False)
        if made.returncode != 0:
            return f"'ip netns add' does not work here: {made.stderr.strip()}"
        ran = _run(["ip", "netns", "exec", name, "true"], check=False)
        if ran.returncode != 0:
            return f"'ip netns exec' does not work here: {ran.stderr.strip()}"
        veth = _run(["ip", "link", "add", name[:15], "type", "veth", "peer", "name", (name + "p")[-15:],
                     "netns", name], check=False)
        if veth.returncode != 0:
            return f"cannot create veth pairs here: {veth.stderr.strip()}"
        return None
    finally:
        _run(["ip", "link", "del", name[:15]], check=False)
        _run(["ip", "netns", "del", name], check=False)


def _require() -> None:
    reason = unavailable_reason()
    if reason:
        raise LabError(reason)


# -- the lab ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PeerInfo:
    index: int
    namespace: str
    addr: str
    rate: str  # as tc reports it on the namespace side ("unlimited" when no tbf)
    link_up: bool


class Lab:
    """Peers in network namespaces on a bridge, with tbf-shaped links. See the module doc."""

    def __init__(self, peers: int, rate: Optional[str] = None, prefix: str = DEFAULT_PREFIX,
                 subnet: str = DEFAULT_SUBNET) -> None:
        if not isinstance(peers, int) or peers < 1:
            raise LabError(f"peers must be an integer >= 1, got {peers!r}")
        if not _PREFIX_RE.match(prefix or "") or len(prefix) > MAX_PREFIX_LEN:
            raise LabError(f"prefix {prefix!r}: use 1-{MAX_PREFIX_LEN} lowercase letters/digits, "
                           f"starting with a letter (it names interfaces, limited to 15 bytes)")
        try:
            self.network = ipaddress.IPv4Network(subnet, strict=True)
        except ValueError as exc:
            raise LabError(f"subnet {subnet!r}: {exc}") from None
        hosts = self.network.num_addresses - 2
        if peers + 1 > hosts:
            raise LabError(f"subnet {subnet} has room for {hosts - 1} peers (plus the bridge), "
                           f"not {peers}")
        if peers > 9999:
            raise LabError("at most 9999 peers")
        self.peers = peers
        self.rate = rate
        self.rate_bps = parse_rate(rate)
        self.prefix = prefix
        self.subnet = str(self.network)

    # -- names, all derived from the prefix --------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def ns(self, i: int) -> str:
        return f"{self.prefix}-{self._check(i)}"

    def host_if(self, i: int) -> str:
        return f"{self.prefix}-h{self._check(i)}"

    def _tmp_if(self, i: int) -> str:  # the namespace end before it moves and becomes eth0
        return f"{self.prefix}-n{i}"

    ns_if = "eth0"

    @property
    def bridge_addr(self) -> str:
        return str(self.network.network_address + 1)

    def addr(self, i: int) -> str:
        return str(self.network.network_address + 2 + self._check(i))

    def _check(self, i: int) -> int:
        if not isinstance(i, int) or not 0 <= i < self.peers:
            raise LabError(f"peer {i!r}: this lab has peers 0..{self.peers - 1}")
        return i

    # -- lifecycle -----------------------------------------------------------------------
    def up(self) -> "Lab":
        """Build the lab (removing any earlier lab with the same prefix first)."""
        _require()
        self.down()
        self._check_subnet_free()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _check_subnet_free(self) -> None:
        routes = _run(["ip", "-4", "-o", "route", "show"], what="listing routes").stdout
        for line in routes.splitlines():
            dest, dev = line.split()[0], _field(line, "dev")
            if dest == "default":
                continue
            try:
                other = ipaddress.IPv4Network(dest, strict=False)
            except ValueError:
                continue
            if other.overlaps(self.network) and dev != self.bridge:
                raise LabError(f"subnet {self.subnet} overlaps {dest} on {dev} (another lab?): "
                               f"pick another subnet")

    def _build(self) -> None:
        plen = self.network.prefixlen
        ip = lambda *a: _run(["ip", *a], what="building the lab")  # noqa: E731
        ip("link", "add", "name", self.bridge, "type", "bridge", "forward_delay", "0", "stp_state", "0")
        ip("link", "set", self.bridge, "addrgenmode", "none")  # no IPv6 chatter in the counters
        ip("addr", "add", f"{self.bridge_addr}/{plen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i in range(self.peers):
            ns, host, tmp = self.ns(i), self.host_if(i), self._tmp_if(i)
            ip("netns", "add", ns)
            ip("link", "add", host, "type", "veth", "peer", "name", tmp)
            ip("link", "set", tmp, "netns", ns)
            ip("-n", ns, "link", "set", tmp, "name", self.ns_if)
            ip("-n", ns, "link", "set", self.ns_if, "addrgenmode", "none")
            ip("link", "set", host, "addrgenmode", "none")
            ip("-n", ns, "addr", "add", f"{self.addr(i)}/{plen}", "dev", self.ns_if)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", self.ns_if, "up")
            ip("link", "set", host, "master", self.bridge)
            ip("link", "set", host, "up")
            if self.rate_bps is not None:
                self._shape(None, host)
                self._shape(ns, self.ns_if)
        self._allow_forwarding()

    def _forward_rule(self) -> list[str]:
        return ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-m", "comment", "--comment",
                f"p2p lab {self.prefix}", "-j", "ACCEPT"]

    def _allow_forwarding(self) -> None:
        """Traffic between the peers crosses the bridge, which the kernel passes through the
        iptables FORWARD chain once br_netfilter is loaded; a Docker engine loads it and sets
        that chain's policy to DROP, which silently cuts the lab. So the lab allows its own
        bridge (as Docker does for docker0) and removes the rule with the lab."""
        if shutil.which("iptables") is None:
            return  # no iptables here: nothing filters the bridge
        if _run(["iptables", "-C", *self._forward_rule()], check=False).returncode != 0:
            _run(["iptables", "-I", *self._forward_rule()], what="allowing the lab's bridge in iptables")

    def _shape(self, ns: Optional[str], dev: str) -> None:
        burst, limit = tbf_params(self.rate_bps)
        netns = ["-n", ns] if ns else []
        _run(["tc", *netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{self.rate_bps}bit",
              "burst", str(burst), "limit", str(limit)], what="shaping a link")

    def down(self) -> None:
        """Remove every namespace, veth and bridge of this prefix (idempotent); stops the
        processes still running inside its namespaces (SIGTERM, then SIGKILL after 3 s)."""
        _require()
        namespaces = _lab_namespaces(self.prefix)
        pids = [pid for ns in namespaces for pid in _ns_pids(ns)]
        _signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)
        _signal_all(pids, signal.SIGKILL)
        for ns in namespaces:
            _run(["ip", "netns", "del", ns], check=False)
        pattern = re.compile(rf"^{re.escape(self.prefix)}-(br|h\d+|n\d+)$")
        for name in _links():
            if pattern.match(name):
                _run(["ip", "link", "del", name], check=False)
        if shutil.which("iptables") is not None:
            while _run(["iptables", "-D", *self._forward_rule()], check=False).returncode == 0:
                pass  # every copy of our rule (an earlier lab that crashed may have left one)

    def __enter__(self) -> "Lab":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- using it ------------------------------------------------------------------------
    def exec_prefix(self, i: int) -> list[str]:
        """``argv`` prefix that runs a command inside peer i's namespace."""
        return ["ip", "netns", "exec", self.ns(i)]

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside peer i's namespace. ``ip netns exec`` execs the command, so
        the returned process *is* the command (signals reach it directly)."""
        return subprocess.Popen([*self.exec_prefix(i), *argv], **kwargs)

    def run(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run([*self.exec_prefix(i), *argv], **kwargs)

    def cut(self, i: int) -> None:
        """Take peer i's link down: nothing reaches it or leaves it until ``restore(i)``."""
        _require()
        _run(["ip", "link", "set", self.host_if(i), "down"], what=f"cutting peer {i}")

    def restore(self, i: int) -> None:
        _require()
        _run(["ip", "link", "set", self.host_if(i), "up"], what=f"restoring peer {i}")

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Split the peers: each peer reaches only the peers of its own group (and the bridge).

        A /32 ``prohibit`` route in peer i's namespace for each peer of another group: more
        specific than the subnet route, so a send across fails at once on both sides while
        traffic within a group and to the root namespace is untouched. Peers in no group are
        left alone. Undone by ``heal()`` (and by ``down()``, which deletes the namespaces)."""
        _require()
        flat = [self._check(i) for group in groups for i in group]
        if len(flat) != len(set(flat)):
            raise LabError(f"partition {groups!r}: a peer is in more than one group")
        self.heal()
        for group in groups:
            others = [j for j in flat if j not in group]
            for i in group:
                for j in others:
                    _run(["ip", "-n", self.ns(i), "route", "add", "prohibit", f"{self.addr(j)}/32"],
                         what=f"partitioning peer {i} from peer {j}")

    def heal(self) -> None:
        """Remove every partition route (idempotent): all peers reach each other again."""
        _require()
        for i in range(self.peers):
            text = _run(["ip", "-n", self.ns(i), "-4", "-o", "route", "show", "type", "prohibit"],
                        check=False).stdout
            for line in text.splitlines():
                dest = line.split()[1] if line.split()[:1] == ["prohibit"] else None
                if dest:
                    _run(["ip", "-n", self.ns(i), "route", "del", "prohibit", dest], what=f"healing peer {i}")

    def link_up(self, i: int) -> bool:
        text = _run(["ip", "-o", "link", "show", self.host_if(i)], what="reading a link").stdout
        flags = text.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in text else []
        return "UP" in flags

    def tx_bytes(self, i: int) -> int:
        """Bytes peer i has put on its link (= received by the bridge-side veth)."""
        return _read_int(Path("/sys/class/net", self.host_if(i), "statistics", "rx_bytes"))

    def rx_bytes(self, i: int) -> int:
        """Bytes delivered to peer i over its link."""
        return _read_int(Path("/sys/class/net", self.host_if(i), "statistics", "tx_bytes"))

    def info(self) -> list[PeerInfo]:
        return [PeerInfo(i, self.ns(i), self.addr(i), _tbf_rate(self.ns(i), self.ns_if), self.link_up(i))
                for i in range(self.peers)]

    @classmethod
    def attach(cls, prefix: str = DEFAULT_PREFIX) -> "Lab":
        """The lab with this prefix that is up now (built by another process, say)."""
        _require()
        indices = sorted(int(ns.rsplit("-", 1)[1]) for ns in _lab_namespaces(prefix))
        if not indices:
            raise LabError(f"no lab with prefix {prefix!r} is up (start one with `p2p lab up`)")
        if indices != list(range(len(indices))):
            raise LabError(f"lab {prefix!r} is incomplete (namespaces {indices}): run `p2p lab down`")
        text = _run(["ip", "-4", "-o", "addr", "show", "dev", f"{prefix}-br"], check=False).stdout
        match = re.search(r"inet (\S+)", text)
        if not match:
            raise LabError(f"lab {prefix!r} has no bridge address: run `p2p lab down` and up again")
        subnet = str(ipaddress.IPv4Interface(match.group(1)).network)
        rate = _tbf_rate(f"{prefix}-0", cls.ns_if)
        return cls(len(indices), None if rate == "unlimited" else rate, prefix, subnet)


def _field(line: str, key: str) -> Optional[str]:
    parts = line.split()
    return parts[parts.index(key) + 1] if key in parts[:-1] else None


def _lab_namespaces(prefix: str) -> list[str]:
    text = _run(["ip", "netns", "list"], what="listing namespaces").stdout
    pattern = re.compile(rf"^{re.escape(prefix)}-\d+$")
    return [line.split()[0] for line in text.splitlines() if line.strip() and pattern.match(line.split()[0])]


def _ns_pids(ns: str) -> list[int]:
    text = _run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(tok) for tok in text.split() if tok.isdigit() and int(tok) != os.getpid()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _links() -> list[str]:
    text = _run(["ip", "-o", "link", "show"], what="listing links").stdout
    names = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _tbf_rate(ns: str, dev: str) -> str:
    text = _run(["tc", "-n", ns, "qdisc", "show", "dev", dev], check=False).stdout
    match = re.search(r"\btbf\b.*?\brate (\S+)", text)
    return match.group(1).lower() if match else "unlimited"


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except OSError as exc:
        raise LabError(f"cannot read {path}: {exc} (is the lab up?)") from None


# -- a LocalSwarm inside the lab -----------------------------------------------------------

class LabSwarm(LocalSwarm):
    """``LocalSwarm`` whose peer i runs in lab namespace i and listens on ``addr(i):port``.

    ``join="previous"`` (peer i joins i-1, as LocalSwarm does) or ``"first"`` (all join peer 0).
    Status and parameter queries go from the root namespace over the bridge.
    """

    def __init__(self, lab: Lab, log_dir: Path, node_args: Sequence[str] = (), port: int = 7000,
                 per_peer_args: Optional[Sequence[Sequence[str]]] = None, join: str = "previous",
                 swarm_key: Optional[str] = None, identities: bool = False) -> None:
        if join not in ("previous", "first"):
            raise LabError(f"join must be 'previous' or 'first', got {join!r}")
        super().__init__(lab.peers, log_dir, node_args, ports=[port] * lab.peers,
                         per_peer_args=per_peer_args, swarm_key=swarm_key, identities=identities)
        self.lab = lab
        self.join = join
        self.addrs = [f"{lab.addr(i)}:{port}" for i in range(lab.peers)]

    def command(self, i: int, join: Sequence[str]) -> list[str]:
        return [*self.lab.exec_prefix(i), *super().command(i, join)]

    def start(self) -> None:
        for i in range(len(self.addrs)):
            seed = [] if i == 0 else [self.addrs[0] if self.join == "first" else self.addrs[i - 1]]
            self.start_peer(i, seed)

