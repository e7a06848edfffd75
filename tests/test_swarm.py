"""Real peers: separate processes, real ZeroMQ over loopback, real torch training."""

import signal
import sys

import numpy as np
import pytest
import zmq

from p2p.harness.local_swarm import LocalSwarm, consensus_distance
from p2p.wire import PROTOCOL_VERSION
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

FAST = ["--task", "synthetic", "--membership", "local", "--log-every", "0", "--eval-every", "0.5", "--join-timeout", "30",
        "--exchange-timeout", "1"]


def statuses(swarm, which):
    out = [swarm.status(i) for i in which]
    return out if all(out) else None


def test_three_peers_converge_to_one_accurate_model(tmp_path):
    # --min-members 3: the three train together. Without it a peer still importing torch on a loaded
    # machine started after the others were nearly done (CI: 2 exchanges on one peer).
    args = FAST + ["--steps", "600", "--linger", "-1", "--min-members", "3"]
    with LocalSwarm(3, tmp_path, args, per_peer_args=[["--shard", f"{i}/3"] for i in range(3)]) as swarm:
        swarm.start()
        wait_until(lambda: (s := statuses(swarm, range(3))) and all(x["phase"] == "lingering" for x in s),
                   120, what="all peers to finish training")
        # training over, the peers keep mixing: their models must meet (consensus distance -> 0)
        params = [swarm.params(i) for i in range(3)]
        scale = float(np.linalg.norm(np.mean(params, axis=0)))
        assert consensus_distance(params) < 0.1 * scale  # close already while training
        wait_until(lambda: consensus_distance([swarm.params(i) for i in range(3)]) < 1e-4 * scale,
                   20, what="consensus distance below 1e-4 of the model norm")
        # an evaluation of the agreed model (one made before consensus can still be the latest)
        final = wait_until(lambda: (s := statuses(swarm, range(3))) and all(x["accuracy"] >= 0.78 for x in s) and s,
                           30, what="evaluations of the agreed model at 0.78 or better")
        for s in final:
            assert s["averaging"]["exchanges_completed"] >= 3  # every peer took part (consensus is asserted above)
            assert s["accuracy"] >= 0.78, s  # the task's single-process reference reaches ~0.83
            assert s["bytes_sent"] > 0 and s["bytes_received"] > 0
        # everyone lists both others as neighbours (polled: a peer starved of CPU can be
        # suspected for a moment, and refutes)
        wait_until(lambda: (s := statuses(swarm, range(3))) and all(len(x["neighbours"]) == 2 for x in s),
                   30, what="every peer to have both others as neighbours")
        codes = swarm.stop()
    assert codes == [0, 0, 0]


def test_a_peer_killed_mid_exchange_does_not_stop_the_others(tmp_path):
    # Exchanges back to back, so the victim is almost surely inside one when it dies.
    args = FAST + ["--avg-interval", "0", "--linger", "-1"]
    with LocalSwarm(3, tmp_path, args) as swarm:
        swarm.start()
        wait_until(lambda: (s := statuses(swarm, range(3))) and all(x["averaging"]["exchanges_completed"] > 20 for x in s) and s,
                   90, what="peers exchanging")
        swarm.kill(2, signal.SIGKILL)
        before = statuses(swarm, [0, 1])
        # the survivors keep training and keep averaging with each other
        after = wait_until(
            lambda: (s := statuses(swarm, [0, 1])) and all(
                a["step"] > b["step"] + 200 and a["averaging"]["exchanges_completed"] > b["averaging"]["exchanges_completed"] + 20
                for a, b in zip(s, before)) and s,
            60, what="survivors to make progress")
        assert all(s["phase"] == "training" for s in after)
        codes = swarm.stop()
    assert codes[:2] == [0, 0]


def test_garbage_and_wrong_version_messages_are_rejected_and_counted(tmp_path):
    import msgpack

    with LocalSwarm(1, tmp_path, FAST + ["--linger", "-1"]) as swarm:
        swarm.start()
        wait_until(lambda: swarm.status(0), 60, what="node to answer")
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 5000)  # let the frames go out after close()
        sock.connect(f"tcp://{swarm.addrs[0]}")
        sock.send_multipart([b"\x00garbage"])
        sock.send_multipart([msgpack.packb([PROTOCOL_VERSION + 7, 20, "x:1", [], []])])
        sock.send_multipart([msgpack.packb([PROTOCOL_VERSION, 20, "x:1", [1, 2, "k", None], [["float32", [2]]]]),
                             np.array([np.nan, 1], dtype=np.float32).tobytes()])
        sock.close()
        status = wait_until(lambda: (s := swarm.status(0)) and sum(s["rejected"].values()) >= 3 and s,
                            20, what="rejections to be counted")
        assert status["rejected"] == {"malformed": 1, "version": 1, "non_finite": 1}
        assert status["phase"] == "training"  # still alive and training
        swarm.kill(0, signal.SIGUSR1)  # an operator's "what are you doing": every thread's stack, and go on
        wait_until(lambda: "most recent call first" in swarm.log_tail(0, 400), 20, what="the stacks in the log")
        assert swarm.status(0)["phase"] == "training"
        assert swarm.stop() == [0]


class _Stubborn(LocalSwarm):
    """A "peer" that ignores SIGTERM, as a node stuck in its shutdown would."""

    def command(self, i, join):
        return [sys.executable, "-c", "import faulthandler, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "faulthandler.register(signal.SIGUSR1, all_threads=True); print('ready', flush=True); time.sleep(120)"]


def test_a_peer_late_to_stop_is_killed_and_its_stacks_are_shown(tmp_path, capsys):
    swarm = _Stubborn(1, tmp_path)
    swarm.start()
    wait_until(lambda: "ready" in swarm.log_tail(0), 30, what="the stub to start")
    assert swarm.stop(timeout_s=0.5) == [-signal.SIGKILL]
    err = capsys.readouterr().err
    assert "peer 0 did not stop in time" in err
    assert "most recent call first" in err and '"<string>", line 1' in err
