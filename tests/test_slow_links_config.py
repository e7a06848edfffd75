"""examples/slow-links.toml and slow-links-int4.toml, the configurations the README recommends on
slow links: each file is read as it stands, real peers running the first (overlap, warm-up,
sparseloco) end with one model, and a node started with the second trains."""

import json
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from p2p.cli.sources import merge
from p2p.cli.start import start
from p2p.harness.local_swarm import consensus_distance
from p2p.net.ports import free_ports
from tests.conftest import train_to_lingering

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "slow-links.toml"
INT4_CONFIG = CONFIG.with_name("slow-links-int4.toml")


def test_the_slow_links_file_holds_the_settings_the_readme_names():
    values = merge({}, typing.get_type_hints(start), str(CONFIG), {}).values  # H as text: it takes "auto" too
    assert values == {"algorithm": "diloco", "topology": "full", "compression": "sparseloco",
                      "diloco_inner_steps": "25", "diloco_outer_lr": 1.0, "diloco_outer_momentum": 0.0,
                      "diloco_overlap": True, "diloco_warmup_steps": 300, "diloco_warmup_inner_steps": 10}


def test_the_int4_file_holds_the_settings_the_readme_names_and_a_node_trains_with_it():
    values = merge({}, typing.get_type_hints(start), str(INT4_CONFIG), {}).values
    assert values == {"algorithm": "diloco", "topology": "full", "compression": "int4",
                      "diloco_inner_steps": "25", "diloco_outer_lr": 0.5, "diloco_outer_momentum": 0.8}
    port = free_ports(1)[0]
    done = subprocess.run([sys.executable, "-m", "p2p", "start", "--config", str(INT4_CONFIG), "--task", "synthetic",
                           "--listen", f"127.0.0.1:{port}", "--steps", "30", "--linger", "0", "--log-format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["step"] == 30 and last["codec"] == "int4" and last["inner_steps"] == 25, last
    assert last["exchanges_completed"] == 1, last  # its one outer step, at step 25


# the file as it is, and with the README's override for peers that share a machine's cores:
# blocking rounds, the warm-up's at 10% density
SHARED_CORES = ["--no-diloco-overlap", "--diloco-warmup-topk-fraction", "0.1"]


@pytest.mark.integration
@pytest.mark.parametrize("override", [[], SHARED_CORES], ids=["file", "shared-cores"])
def test_peers_started_with_the_slow_links_file_average_on_the_warm_up_steps_and_end_with_one_model(tmp_path, override):
    # 40 warm-up steps at H 10, then H 25: boundaries 10, 20, 30, 40, 65, 90, 115 (the last step, so
    # the final models are the outer parameters: with overlap the last round lands before exit)
    steps = 115
    args = ["--config", str(CONFIG), *override, "--diloco-warmup-steps", "40", "--task", "synthetic", "--membership", "local",
            "--steps", str(steps), "--linger", "-1", "--log-every", "0", "--eval-every", "1", "--round-timeout", "15",
            "--join-timeout", "60", "--min-members", "3"]
    final, params, codes = train_to_lingering(tmp_path, args, 3, what="slow-links peers to finish")
    assert codes == [0, 0, 0]
    for s in final:
        avg = s["averaging"]
        assert s["step"] == steps and sum(s["rejected"].values()) == 0, s["rejected"]
        assert s["bandwidth"]["codec"] == "sparseloco" and avg["inner_steps"] == 25 and avg["warmup_until"] == 0, avg
        # every boundary's round, on every peer: a peer that went on past a late round (a gate
        # passed, its boundary skipped) answered it after its last step (diloco.py, "Overlap")
        assert avg["outer_steps"] == 7 and avg["boundaries_skipped"] <= avg["gates_passed"], avg
        if override:  # blocking rounds: the trainer never goes on without one
            assert avg["gates_passed"] == 0 and avg["boundaries_skipped"] == 0, avg
        # the warm-up's four rounds at 10% (loopback carries them; outer_warm.py judges only once
        # six waits are measured), none without the override
        assert avg["warmup_dense_rounds"] == (4 if override else 0), avg
    # every peer took the same outer steps: after the last one the models are theta_start, one copy
    scale = float(np.linalg.norm(np.mean(params, axis=0)))
    assert consensus_distance(params) < 1e-5 * scale
