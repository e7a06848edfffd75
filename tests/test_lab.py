"""The shaped-network lab (p2p/harness/lab.py, p2p/cli/lab.py): real namespaces, veths, tbf, real peers.

Tests marked ``netns`` need root and working ``ip netns``; they skip (saying why) elsewhere.
Each test run uses its own prefix and subnet, so two runs on one machine do not collide, and
every lab is taken down by a fixture finalizer even when a test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from p2p.harness.lab import Lab, LabError, LabSwarm, format_rate, parse_rate, probe, tbf_params
from p2p.cli.lab import lab_app
from tests.conftest import wait_until

PREFIX = f"p2pt{os.getpid() % 100000}"
SUBNET = f"10.78.{os.getpid() % 250}.0/24"



@pytest.fixture(scope="session")
def netns_ok():
    """Skips the test, saying why, unless this machine can build a lab (root, ip, netns, veth)."""
    reason = probe()
    if reason is not None:
        pytest.skip(f"network lab unavailable: {reason}")

# A TCP sink: accepts connections until killed; for each, counts bytes until EOF and prints
# "<bytes> <seconds from first byte to EOF>".
SINK = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8); print("ready", flush=True)
buf = bytearray(1 << 16)
while True:
    c, _ = s.accept(); n = 0; t0 = None
    while True:
        k = c.recv_into(buf)
        if not k: break
        if t0 is None: t0 = time.perf_counter()
        n += k
    c.close(); print(n, time.perf_counter() - (t0 or time.perf_counter()), flush=True)
"""
SEND = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
data = b"x" * 65536
for _ in range(int(sys.argv[3]) * 16): c.sendall(data)
c.close()
"""


@pytest.fixture
def labs(netns_ok):
    """Makes labs (``labs(peers, rate)``) and processes in them; downs every lab at the end."""
    made: list[Lab] = []
    procs: list[subprocess.Popen] = []

    def make(peers: int, rate=None) -> Lab:
        for old in made:
            old.down()
        lab = Lab(peers, rate, prefix=PREFIX, subnet=SUBNET)
        made.append(lab)
        return lab.up()

    make.procs = procs
    try:
        yield make
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for lab in made:
            lab.down()


def start_sink(labs, lab: Lab | None, i: int | None, host: str, port: int = 9000) -> subprocess.Popen:
    argv = [sys.executable, "-c", SINK, host, str(port)]
    kw = dict(stdout=subprocess.PIPE, text=True)
    proc = lab.popen(i, argv, **kw) if lab is not None else subprocess.Popen(argv, **kw)
    labs.procs.append(proc)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def send(lab: Lab | None, i: int | None, host: str, mib: int, port: int = 9000, timeout: float = 20) -> int:
    argv = [sys.executable, "-c", SEND, host, str(port), str(mib), str(timeout)]
    proc = lab.run(i, argv, capture_output=True, timeout=timeout + 10) if lab is not None else \
        subprocess.run(argv, capture_output=True, timeout=timeout + 10)
    return proc.returncode


def mbit_per_s(sink: subprocess.Popen) -> float:
    nbytes, seconds = sink.stdout.readline().split()
    return int(nbytes) * 8 / float(seconds) / 1e6


def can_connect(lab: Lab | None, i: int | None, host: str, port: int = 9000, timeout: float = 1.0) -> bool:
    code = f"import socket; socket.create_connection(({host!r}, {port}), timeout={timeout}).close()"
    argv = [sys.executable, "-c", code]
    proc = lab.run(i, argv, capture_output=True) if lab is not None else subprocess.run(argv, capture_output=True)
    return proc.returncode == 0


# -- no root needed ---------------------------------------------------------------------

@pytest.mark.parametrize("text, bps", [("100mbit", 10**8), ("20mbit", 2 * 10**7), ("1gbit", 10**9),
                                       ("500kbit", 5 * 10**5), ("1.5mbit", 1_500_000), ("20Mbit", 2 * 10**7),
                                       (None, None), ("unlimited", None), ("none", None)])
def test_rates_parse(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text", ["100", "100mb", "fast", "-5mbit", "1kbit", "200gbit", "100 mbps"])
def test_bad_rates_are_refused_clearly(text):
    with pytest.raises(LabError, match="rate"):
        parse_rate(text)


def test_rates_format_and_tbf_parameters_scale_with_the_rate():
    assert [format_rate(b) for b in (None, 10**9, 2 * 10**7, 5 * 10**5)] == ["unlimited", "1gbit", "20mbit", "500kbit"]
    small, big = tbf_params(2 * 10**7), tbf_params(10**9)
    assert small[0] >= 32 * 1024 and big[0] >= 10**9 / 8 * 0.004  # burst: >= 4 ms of tokens
    assert small[1] > small[0] and big[1] > big[0]  # the queue holds at least one burst


@pytest.mark.parametrize("kwargs, match", [
    (dict(peers=0), "peers"), (dict(peers=3, rate="3 apples"), "rate"),
    (dict(peers=2, prefix="much-too-long-prefix"), "prefix"), (dict(peers=2, prefix="Bad"), "prefix"),
    (dict(peers=5, subnet="10.0.0.0/30"), "room for"), (dict(peers=2, subnet="10.0.0.1/24"), "subnet"),
])
def test_bad_lab_arguments_are_refused_before_touching_the_system(kwargs, match):
    with pytest.raises(LabError, match=match):
        Lab(**kwargs)


def test_names_and_addresses_derive_from_prefix_and_subnet():
    lab = Lab(3, "20mbit", prefix="p2plab", subnet="10.77.0.0/24")
    assert (lab.bridge, lab.bridge_addr) == ("p2plab-br", "10.77.0.1")
    assert [lab.ns(i) for i in range(3)] == ["p2plab-0", "p2plab-1", "p2plab-2"]
    assert [lab.addr(i) for i in range(3)] == ["10.77.0.2", "10.77.0.3", "10.77.0.4"]
    assert all(len(lab.host_if(i)) <= 15 for i in range(3))
    with pytest.raises(LabError, match="peers 0..2"):
        lab.addr(3)


def test_cli_refuses_a_bad_rate_in_one_line():
    result = CliRunner().invoke(lab_app, ["up", "--peers", "2", "--rate", "fast"])
    assert result.exit_code == 2
    assert "rate 'fast'" in result.output and "Traceback" not in result.output


# -- real namespaces --------------------------------------------------------------------

@pytest.mark.netns
def test_peers_get_their_addresses_and_reach_each_other_through_the_bridge(labs):
    lab = labs(3)
    for i in range(3):
        out = subprocess.run(["ip", "-n", lab.ns(i), "-4", "-o", "addr", "show", "dev", "eth0"],
                             capture_output=True, text=True, check=True).stdout
        assert f"inet {lab.addr(i)}/24" in out
    start_sink(labs, lab, 2, lab.addr(2))
    assert can_connect(None, None, lab.addr(2))  # root namespace -> peer 2 via the bridge
    assert can_connect(lab, 0, lab.addr(2))  # peer 0 -> peer 2
    start_sink(labs, lab, 1, "127.0.0.1", 9001)  # lo is up inside the namespace
    assert can_connect(lab, 1, "127.0.0.1", 9001)
    assert not can_connect(lab, 0, "127.0.0.1", 9001)  # ...and it is peer 1's own loopback


@pytest.mark.netns
def test_the_rate_limit_is_enforced_in_both_directions(labs):
    lab = labs(2)  # unshaped first, for comparison
    sink = start_sink(labs, lab, 1, lab.addr(1))
    assert send(lab, 0, lab.addr(1), 16) == 0
    unshaped = mbit_per_s(sink)

    lab = labs(2, "20mbit")
    sink = start_sink(labs, lab, 1, lab.addr(1))
    assert send(lab, 0, lab.addr(1), 4) == 0  # peer 0 uplink -> peer 1 downlink
    peer_to_peer = mbit_per_s(sink)
    root_sink = start_sink(labs, None, None, lab.bridge_addr, 9002)
    assert send(lab, 0, lab.bridge_addr, 3, port=9002) == 0  # peer 0's uplink alone
    uplink = mbit_per_s(root_sink)
    assert send(None, None, lab.addr(1), 3) == 0  # root -> peer 1: peer 1's downlink alone
    downlink = mbit_per_s(sink)
    print(f"unshaped {unshaped:.0f} Mbit/s; at 20mbit: peer-peer {peer_to_peer:.1f}, "
          f"uplink {uplink:.1f}, downlink {downlink:.1f}")
    for measured in (peer_to_peer, uplink, downlink):
        assert 14 <= measured <= 22, (peer_to_peer, uplink, downlink)
    assert unshaped > 5 * peer_to_peer
    assert lab.tx_bytes(0) >= 7 * 2**20  # the interface counters saw it all
    assert lab.rx_bytes(1) >= 7 * 2**20


@pytest.mark.netns
def test_cut_makes_a_peer_unreachable_and_restore_brings_it_back(labs):
    lab = labs(3)
    start_sink(labs, lab, 1, lab.addr(1))
    start_sink(labs, lab, 2, lab.addr(2))
    assert can_connect(lab, 0, lab.addr(1)) and lab.link_up(1)
    lab.cut(1)
    assert not lab.link_up(1)
    assert not can_connect(lab, 0, lab.addr(1))
    assert not can_connect(None, None, lab.addr(1))
    assert can_connect(lab, 0, lab.addr(2))  # the others still reach each other
    lab.restore(1)
    assert lab.link_up(1)
    wait_until(lambda: can_connect(lab, 0, lab.addr(1)), 10, what="peer 1 reachable again")
    assert can_connect(None, None, lab.addr(1))


@pytest.mark.netns
def test_partition_splits_the_peers_into_groups_and_heal_joins_them(labs):
    lab = labs(4)
    for i in range(4):
        start_sink(labs, lab, i, lab.addr(i))
    lab.partition([[0, 1], [2, 3]])
    assert can_connect(lab, 0, lab.addr(1)) and can_connect(lab, 3, lab.addr(2))  # within a group
    assert not can_connect(lab, 0, lab.addr(2)) and not can_connect(lab, 3, lab.addr(1))  # across
    assert not can_connect(lab, 1, lab.addr(3))
    assert can_connect(None, None, lab.addr(2)) and can_connect(None, None, lab.addr(0))  # root: all
    lab.heal()
    assert can_connect(lab, 0, lab.addr(2)) and can_connect(lab, 3, lab.addr(1))
    lab.heal()  # idempotent
    with pytest.raises(LabError, match="more than one group"):
        lab.partition([[0, 1], [1, 2]])


@pytest.mark.netns
def test_down_removes_everything_even_from_another_process_and_stops_what_ran_inside(labs):
    lab = labs(2, "50mbit")
    sink = start_sink(labs, lab, 0, lab.addr(0))
    # a fresh object with the same prefix (as `p2p lab down` in another process would make)
    Lab(1, None, prefix=PREFIX).down()
    assert sink.wait(10) is not None  # what ran inside the lab was stopped
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [line for line in out.splitlines() if line.startswith(PREFIX + "-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert PREFIX + "-" not in links
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    assert SUBNET not in routes
    lab.down()  # idempotent


@pytest.mark.netns
def test_cli_up_status_cut_restore_down(labs):  # `labs`: skip unless possible; cleanup
    app = typer.Typer()
    app.add_typer(lab_app, name="lab")  # as p2p/cli/app.py registers it
    run = lambda *args: CliRunner().invoke(app, ["lab", *args, "--prefix", PREFIX])  # noqa: E731
    try:
        result = run("up", "--peers", "2", "--rate", "20mbit", "--subnet", SUBNET)
        assert result.exit_code == 0, result.output
        result = run("status", "--json")
        assert result.exit_code == 0, result.output
        info = json.loads(result.output)
        assert [p["rate"] for p in info["peers"]] == ["20mbit", "20mbit"]
        assert [p["link_up"] for p in info["peers"]] == [True, True]
        assert run("cut", "1").exit_code == 0
        assert [p["link_up"] for p in json.loads(run("status", "--json").output)["peers"]] == [True, False]
        assert run("restore", "1").exit_code == 0
        bad = run("cut", "7")
        assert bad.exit_code == 1 and "peers 0..1" in bad.output
        assert run("down").exit_code == 0
        gone = run("status")
        assert gone.exit_code == 1 and "no lab" in gone.output
    finally:
        Lab(1, None, prefix=PREFIX).down()


@pytest.mark.netns
@pytest.mark.integration
def test_a_three_peer_swarm_trains_and_averages_across_the_lab(labs, tmp_path):
    lab = labs(3, "50mbit")
    args = ["--task", "synthetic", "--membership", "local", "--steps", "300", "--linger", "-1",
            "--log-every", "0", "--eval-every", "0.5", "--join-timeout", "60", "--exchange-timeout", "2"]
    with LabSwarm(lab, tmp_path, args, per_peer_args=[["--shard", f"{i}/3"] for i in range(3)]) as swarm:
        swarm.start()
        assert swarm.addrs == [f"{lab.addr(i)}:7000" for i in range(3)]

        def finished():
            out = [swarm.status(i) for i in range(3)]
            if not all(out):
                assert all(swarm.alive(i) for i in range(3)), [swarm.log_tail(i) for i in range(3)]
                return None
            # a peer can finish its 300 fast steps before the others have even started, so
            # exchanges are also counted while it lingers (it keeps averaging then)
            # and a membership view can miss a member for a moment (a probe answered late)
            # Accuracy is polled too: a peer's latest evaluation can predate most of its mixing
            # (it evaluates every 0.5 s while it lingers and averages); a swarm that does not
            # average stays below 0.6 and times out here.
            return out if all(s["phase"] == "lingering" and s["accuracy"] > 0.6 and len(s["neighbours"]) == 2
                              and s["averaging"]["exchanges_completed"] > 5 for s in out) else None

        final = wait_until(finished, 90, interval_s=0.5, what="all peers to finish 300 steps in the lab")
        for i, s in enumerate(final):
            assert s["step"] == 300
            assert s["averaging"]["exchanges_completed"] > 5, s["averaging"]
            assert s["bytes_received"] > 0 and s["bytes_sent"] > 0
            assert len(s["neighbours"]) == 2
            assert s["accuracy"] > 0.6, s
            # what the node counts as sent went over its shaped link (plus headers)
            assert lab.tx_bytes(i) >= s["bytes_sent"]
        assert swarm.stop() == [0, 0, 0]
