"""The tree shows the design: imports only point down the layers (DESIGN.md, "Where things live").

    cli/, harness/            commands and whole local swarms
    training/, config         torch glue, the public Swarm, settings
    net/                      sockets and the driver
    sim/                      the deterministic simulators
    gossip/ topology/ averaging/ compression/ statesync/ wire peer protocol bandwidth   the pure core

Every import counts, also one inside a function; only ``if TYPE_CHECKING:`` blocks are exempt
(type hints cost nothing at run time).
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "p2p"
PURE = ["gossip", "topology", "averaging", "compression", "statesync", "wire.py", "peer.py", "protocol.py",
        "bandwidth.py"]
SIDE_EFFECTS = {"zmq", "torch", "threading", "socket", "time"}  # I/O, clocks, threads, torch
UPPER = {"p2p.net", "p2p.training", "p2p.cli", "p2p.harness", "p2p.sim", "p2p.config"}

RULES = {  # layer -> (modules it may not import, p2p subpackages it may not import)
    "pure": (SIDE_EFFECTS, UPPER),
    "sim": (SIDE_EFFECTS, UPPER - {"p2p.sim"}),
    "net": ({"torch"}, {"p2p.training", "p2p.cli", "p2p.harness", "p2p.sim", "p2p.config"}),
    "training": (set(), {"p2p.cli", "p2p.harness", "p2p.sim"}),
}


def files(*parts):
    for part in parts:
        path = PACKAGE / part
        yield from ([path] if path.suffix == ".py" else sorted(path.rglob("*.py")))


def imports(path):
    """Top-level module names imported by ``path``, outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(), str(path))
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def violations(paths, rule):
    """``(file name, imported module)`` for every import ``rule`` forbids."""
    banned_modules, banned_packages = RULES[rule]
    found = []
    for path in paths:
        for name in imports(path):
            root = name.split(".")[0]
            if root in banned_modules or any(name == p or name.startswith(p + ".") for p in banned_packages):
                found.append((path.name, name))
    return found


@pytest.mark.parametrize("rule, parts", [
    ("pure", PURE), ("sim", ["sim"]), ("net", ["net"]), ("training", ["training"]),
])
def test_imports_point_down_the_layers(rule, parts):
    paths = list(files(*parts))
    assert paths
    assert violations(paths, rule) == []


def test_the_check_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\ndef f():\n    import time\n    from p2p.net.transport import Transport\n"
                   "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n")
    # the function-level imports count; the TYPE_CHECKING one does not
    assert violations([bad], "pure") == [("bad.py", "time"), ("bad.py", "p2p.net.transport")]
