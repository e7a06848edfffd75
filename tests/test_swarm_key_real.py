"""The swarm key with real processes over real ZeroMQ: members with the key train together; a
node with another key, and one with none, cannot join, and the members count what they drop."""

import os
import subprocess
import sys

import pytest

from p2p.harness.local_swarm import LocalSwarm
from p2p.net.keyring import new_key_line
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

FAST = ["--task", "synthetic", "--membership", "local", "--log-every", "1", "--eval-every", "0.5",
        "--exchange-timeout", "1", "--linger", "-1", "--steps", "1000000"]


def key_file(path):
    path.write_text(new_key_line() + "\n")
    os.chmod(path, 0o600)
    return str(path)


def cli_status(addr, *extra, timeout="2"):
    return subprocess.run([sys.executable, "-m", "p2p", "status", "--peer", addr, "--timeout", timeout, *extra],
                          capture_output=True, text=True, timeout=60)


def test_members_with_the_key_train_and_outsiders_with_another_key_or_none_cannot_join(tmp_path):
    ours, theirs = key_file(tmp_path / "swarm.key"), key_file(tmp_path / "other.key")
    # The members sleep 7/8 of each step (``--slowdown``): the outsiders' start-ups (torch, ~5
    # CPU-s each) would otherwise share two cores with three members training flat out (~45 s).
    members = LocalSwarm(3, tmp_path / "members", FAST + ["--join-timeout", "60", "--slowdown", "8"], swarm_key=ours,
                         per_peer_args=[["--shard", f"{i}/3"] for i in range(3)])
    outsiders = [LocalSwarm(1, tmp_path / name, FAST + ["--join-timeout", "5"], swarm_key=key)
                 for name, key in (("other_key", theirs), ("no_key", None))]
    with members, outsiders[0], outsiders[1]:
        members.start()
        first = wait_until(lambda: (s := members.status(0)) and s["accuracy"] == s["accuracy"] and s, 60,
                           what="the first member's first evaluation")  # (NaN until then)
        for outsider in outsiders:  # both try to join through a member
            outsider.start_peer(0, [members.addrs[1]])
        outsider_addrs = {o.addrs[0] for o in outsiders}

        def trained():
            rows = [members.status(i, timeout_s=2.0) for i in range(3)]
            if not all(rows):
                return None
            for s in rows:  # outsiders never appear in a member's view, at any poll
                assert not outsider_addrs & {m["addr"] for m in s["members"]}
                assert not outsider_addrs & set(s["received_from"])
            mixed = all(s["averaging"].get("exchanges_completed", 0) + s["averaging"].get("requests_served", 0) > 5
                        and len(set(s["received_from"]) & set(members.addrs)) == 2 for s in rows)
            # the synthetic task's chance level is ~0.1; the members pass 0.7 within seconds
            return mixed and all(s["accuracy"] > max(0.7, first["accuracy"]) and s["step"] > first["step"]
                                 for s in rows) and rows

        rows = wait_until(trained, 60, what="the members to train and mix")
        assert all(s["security"]["mode"] == "encrypted" and s["security"]["keys"] == 1 for s in rows)
        assert len({m["addr"] for s in rows for m in s["members"] if m["state"] == "alive"}) == 3
        # The outsiders give up (no member ever answers them) and the members counted their attempts.
        codes = [o.wait(60)[0] for o in outsiders]
        assert codes == [1, 1], [o.log_tail(0) for o in outsiders]
        for o in outsiders:
            assert "no join address answered" in o.log_tail(0, 20) or "could not join" in o.log_tail(0, 20), o.log_tail(0)
        rejected = {}
        for i in range(3):
            for reason, n in members.status(i, timeout_s=2.0)["rejected"].items():
                rejected[reason] = rejected.get(reason, 0) + n
        assert rejected.get("no_key", 0) > 0 and rejected.get("unauthenticated", 0) > 0, rejected
        assert set(rejected) <= {"no_key", "unauthenticated"}, rejected  # nothing else went wrong

        # ``p2p status``: with the key it works; without it, or with another, one clear line.
        good = cli_status(members.addrs[2], "--swarm-key", ours)
        assert good.returncode == 0 and "security: encrypted (AES-256-GCM" in good.stdout, good.stderr
        for extra in ((), ("--swarm-key", theirs)):
            bad = cli_status(members.addrs[2], *extra, timeout="1")
            assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "swarm key" in bad.stderr, bad.stderr


def test_keys_rotate_without_a_restart_and_a_removed_key_is_refused(tmp_path):
    import p2p
    import torch

    from p2p.net.keyring import key_id, load_key_file

    lines = [new_key_line() for _ in range(3)]
    files = [tmp_path / "a.key", tmp_path / "b.key"]

    def write(path, *keys):  # as an operator would: a new file moved into place
        tmp = path.with_suffix(".new")
        tmp.write_text("".join(lines[k] + "\n" for k in keys))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    for f in files:
        write(f, 0)
    fast = dict(membership="local", join_timeout=20, exchange_timeout=1.0)
    a = p2p.Swarm(torch.nn.Linear(4, 2), listen="127.0.0.1:0", swarm_key=str(files[0]), **fast).start()
    b = p2p.Swarm(torch.nn.Linear(4, 2), listen="127.0.0.1:0", join=[a.address], swarm_key=str(files[1]), **fast).start()
    try:
        def sees(me, other):
            rows = {m["addr"]: m for m in me.status()["members"]}
            row = rows.get(other.address)
            return row is not None and row["state"] == "alive" and row["last_heard_s"] is not None and row["last_heard_s"] < 1.0

        def settled(keys):  # both reloaded this file and still hear each other
            want = key_id(load_key_file(str(files[0])).primary).hex()
            return all(s.status()["security"]["keys"] == keys and s.status()["security"]["key_id"] == want
                       for s in (a, b)) and sees(a, b) and sees(b, a)

        wait_until(lambda: sees(a, b) and sees(b, a), 20, what="the two members to see each other")
        for step, keys in (((0, 1), 2), ((1, 0), 2), ((1,), 1)):  # add the new key, make it first, drop the old
            for f in files:
                write(f, *step)
            wait_until(lambda: settled(keys), 20, what=f"both members on keys {step}")
        assert all(s.status()["security"]["reloads"] == 3 for s in (a, b))
        assert not any(s.status()["rejected"] for s in (a, b))  # nothing was lost on the way
        write(files[0], 2)  # a moves to a key b does not hold: each refuses the other from now on
        wait_until(lambda: a.status()["rejected"].get("no_key", 0) > 0 and b.status()["rejected"].get("no_key", 0) > 0,
                   20, what="both to refuse the other's key")
        wait_until(lambda: not sees(a, b) and not sees(b, a), 20, what="the members to stop hearing each other")
    finally:
        b.close(linger_s=0.0, checkpoint=False)
        a.close(linger_s=0.0, checkpoint=False)
