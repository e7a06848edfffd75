"""Per-node identities with real `p2p start` processes over real ZeroMQ: two members on the
allow file form a swarm; a third with the swarm key but an identity not on the file cannot join
and its attempts are counted; then one member's key comes off the allow file and the other
drops it, without a restart."""

import os
import subprocess
import sys

import pytest

from p2p.harness.local_swarm import LocalSwarm
from p2p.net.client import QueryError, status
from p2p.net.identity import Identity, load_identity_file, public_line
from p2p.net.keyring import load_key_file, new_key_line
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

FAST = ["--task", "synthetic", "--membership", "local", "--log-every", "1", "--eval-every", "0.5",
        "--exchange-timeout", "1", "--linger", "-1", "--steps", "1000000"]


def p2p(*args):
    done = subprocess.run([sys.executable, "-m", "p2p", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def write(path, text, mode):  # as an operator would: a new file moved into place
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return str(path)


def test_only_allowed_identities_join_and_a_key_taken_off_the_allow_file_is_cut_off(tmp_path):
    swarm_key = write(tmp_path / "swarm.key", new_key_line() + "\n", 0o600)
    ids = [str(tmp_path / "node0.id")]
    p2p("keygen", "--identity", "--out", ids[0])  # the commands a user runs (the others made here: faster)
    public = [p2p("keygen", "--public", ids[0]).strip()]
    for i in (1, 2):
        identity = Identity.generate()
        ids.append(write(tmp_path / f"node{i}.id", identity.file_text(), 0o600))
        public.append(public_line(identity.public))
    allow = tmp_path / "allow.txt"
    write(allow, f"# the swarm\n{public[0]}  # node 0\n{public[1]}  # node 1\n", 0o644)
    outsider_allow = write(tmp_path / "outsider_allow.txt", "".join(p + "\n" for p in public), 0o644)

    per_peer = [["--identity", ids[0], "--allow", str(allow)], ["--identity", ids[1], "--allow", str(allow)],
                ["--identity", ids[2], "--allow", outsider_allow, "--join-timeout", "6"]]
    nodes = LocalSwarm(3, tmp_path / "logs", FAST + ["--join-timeout", "80"], swarm_key=swarm_key, per_peer_args=per_peer)
    keyring, admin = load_key_file(swarm_key), load_identity_file(ids[0])  # the test queries as node 0

    def ask(i):
        try:
            return status(nodes.addrs[i], 1.0, keyring, admin) if nodes.alive(i) else None
        except QueryError:
            return None

    def alive_members(s):
        return {m["addr"] for m in s["members"] if m["state"] == "alive"}

    with nodes:
        nodes.start_peer(0, [])
        nodes.start_peer(1, [nodes.addrs[0]])
        nodes.start_peer(2, [nodes.addrs[0]])  # the outsider tries to join through node 0
        members = set(nodes.addrs[:2])

        def formed():
            rows = [ask(0), ask(1)]
            if not all(rows):
                return None
            for s in rows:  # the outsider never appears in a member's view, at any poll
                assert nodes.addrs[2] not in {m["addr"] for m in s["members"]}
                assert nodes.addrs[2] not in s["received_from"]
            return all(alive_members(s) == members for s in rows) and rows

        rows = wait_until(formed, 90, what="the two allowed members to see each other")
        ids_info = rows[0]["security"]["identities"]
        assert ids_info["public_key"] == public[0] and ids_info["allowed"] == 2
        assert nodes.procs[2].wait(60) == 1, nodes.log_tail(2, 20)  # the outsider gives up (the others train on)
        assert "no join address answered" in nodes.log_tail(2, 20) or "could not join" in nodes.log_tail(2, 20)
        rejected = ask(0)["rejected"]
        assert rejected.get("not_allowed", 0) > 0, rejected
        assert set(rejected) <= {"not_allowed"}, rejected  # nothing else went wrong
        log0 = (tmp_path / "logs" / "peer0.log").read_text()
        assert log0.count(public[2][:12]) == 1, log0  # logged once for that key, however many tries

        # `p2p status` with an allowed identity shows the mode; without one, a node stays silent.
        shown = subprocess.run([sys.executable, "-m", "p2p", "status", "--peer", nodes.addrs[0], "--swarm-key", swarm_key,
                                "--identity", ids[1], "--timeout", "2"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "identities: signed as" in shown.stdout, shown.stderr
        with pytest.raises(QueryError):
            status(nodes.addrs[0], 1.0, keyring)

        # Node 1's key comes off the allow file: node 0 drops it at its next reload, no restart.
        write(allow, f"{public[0]}  # node 0\n", 0o644)

        def cut_off():
            s = ask(0)
            return (s and s["security"]["identities"]["allowed"] == 1 and s["rejected"].get("not_allowed", 0) > rejected["not_allowed"]
                    and nodes.addrs[1] not in alive_members(s) and s)

        s = wait_until(cut_off, 20, what="node 0 to drop node 1 after its key left the allow file")
        assert s["security"]["identities"]["reloads"] == 1
        assert nodes.alive(0) and nodes.alive(1)  # nobody restarted
