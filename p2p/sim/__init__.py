"""Deterministic discrete-event simulator driving the real ``p2p.gossip.Membership`` objects.

``run(SimConfig(...))`` returns the metrics dict; ``p2p.cli.simulate.simulate`` is the CLI command.
"""

from p2p.sim.churn import Churn
from p2p.sim.config import SimConfig
from p2p.sim.engine import Simulation, run
from p2p.sim.invariants import InvariantChecker, InvariantViolation

__all__ = ["Churn", "SimConfig", "Simulation", "run", "InvariantChecker", "InvariantViolation"]
