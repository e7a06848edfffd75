"""examples/slow-links.toml, the configuration the README recommends on slow links: the file
is read as it stands, and real peers running it (overlap, warm-up, sparseloco) end with one model."""

import typing
from pathlib import Path

import numpy as np
import pytest

from p2p.cli.sources import merge
from p2p.cli.start import start
from p2p.harness.local_swarm import LocalSwarm, consensus_distance
from tests.conftest import lingering, wait_until

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "slow-links.toml"


def test_the_slow_links_file_holds_the_settings_the_readme_names():
    values = merge({}, typing.get_type_hints(start), str(CONFIG), {}).values  # H as text: it takes "auto" too
    assert values == {"algorithm": "diloco", "topology": "full", "compression": "sparseloco",
                      "diloco_inner_steps": "25", "diloco_outer_lr": 1.0, "diloco_outer_momentum": 0.0,
                      "diloco_overlap": True, "diloco_warmup_steps": 300, "diloco_warmup_inner_steps": 10}


@pytest.mark.integration
def test_peers_started_with_the_slow_links_file_average_on_the_warm_up_steps_and_end_with_one_model(tmp_path):
    # 40 warm-up steps at H 10, then H 25: boundaries 10, 20, 30, 40, 65, 90, 115 (the last step, so
    # the final models are the outer parameters: with overlap the last round lands before exit)
    steps = 115
    args = ["--config", str(CONFIG), "--diloco-warmup-steps", "40", "--task", "synthetic", "--membership", "local",
            "--steps", str(steps), "--linger", "-1", "--log-every", "0", "--eval-every", "1", "--round-timeout", "15",
            "--join-timeout", "60", "--min-members", "3"]
    with LocalSwarm(3, tmp_path, args, per_peer_args=[["--shard", f"{i}/3"] for i in range(3)]) as swarm:
        swarm.start()
        final = wait_until(lambda: lingering(swarm, range(3)), 180, what="slow-links peers to finish")
        params = [swarm.params(i) for i in range(3)]
        codes = swarm.stop()
    assert codes == [0, 0, 0]
    for s in final:
        avg = s["averaging"]
        assert s["step"] == steps and sum(s["rejected"].values()) == 0, s["rejected"]
        assert s["bandwidth"]["codec"] == "sparseloco" and avg["inner_steps"] == 25 and avg["warmup_until"] == 0, avg
        assert avg["outer_steps"] == 7 and avg["boundaries_skipped"] == 0, avg
    # every peer took the same outer steps: after the last one the models are theta_start, one copy
    scale = float(np.linalg.norm(np.mean(params, axis=0)))
    assert consensus_distance(params) < 1e-5 * scale
