"""Deterministic discrete-event simulators on one event loop (``loop``), one network model
(``network``) and one churn schedule (``churn``):

- ``engine``: the real ``p2p.gossip.Membership`` objects at scale; ``run(SimConfig(...))``
  returns the metrics dict;
- ``avg_sim``: the composed ``p2p.peer.Peer`` (membership, topology, averager) on every peer,
  with simulated trainers; ``avg_sim.run(algorithm, ...)`` returns an ``AvgSimResult``.

``p2p.cli.simulate.simulate`` is the CLI command for both.
"""

from p2p.sim.churn import Churn
from p2p.sim.config import SimConfig
from p2p.sim.engine import Simulation, run
from p2p.sim.invariants import InvariantChecker, InvariantViolation

__all__ = ["Churn", "SimConfig", "Simulation", "run", "InvariantChecker", "InvariantViolation"]
