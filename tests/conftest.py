import time

import pytest

from p2p.harness import forked_nodes

# The nodes and example scripts the tests start are forks of one interpreter that imported torch
# once (p2p/harness/forked_nodes.py: ~6 s less CPU a node on this machine); the tests of the
# command line and of start-up still run ``python -m p2p`` in a fresh interpreter.
forked_nodes.use_forks = True


def wait_until(predicate, timeout_s, interval_s=0.2, what="condition"):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` at the deadline.

    Only for tests of real processes, where there is no clock to drive by hand."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def train_to_lingering(tmp_path, args, peers, what, timeout_s=180):
    """Start ``peers`` real nodes (LocalSwarm, chain joins, peer i on shard i/peers) with ``args``,
    wait until all finished training, and stop them: (their last statuses, their parameter
    vectors, their exit codes)."""
    from p2p.harness.local_swarm import LocalSwarm

    with LocalSwarm(peers, tmp_path, args, per_peer_args=[["--shard", f"{i}/{peers}"] for i in range(peers)]) as swarm:
        swarm.start()
        final = wait_until(lambda: lingering(swarm, range(peers)), timeout_s, what=what)
        params = [swarm.params(i) for i in range(peers)]
        return final, params, swarm.stop()


def lingering(swarm, which):
    """The statuses of peers ``which`` of a LocalSwarm once every one of them has finished training
    and lingers (None before): a predicate for ``wait_until``."""
    out = [swarm.status(i) for i in which]
    return out if all(s and s["phase"] == "lingering" for s in out) else None
