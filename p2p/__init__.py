"""p2p: decentralized, peer-to-peer training of PyTorch models over ZeroMQ.

The package is layered (see README "Architecture"):

- pure, sans-I/O protocol parts: ``p2p.wire`` (codec), ``p2p.gossip`` (membership),
  ``p2p.topology`` (who to talk to), ``p2p.averaging`` (how to mix parameters);
- drivers: ``p2p.net.transport`` + ``p2p.training.node`` (ZeroMQ, OS clock, threads) and ``p2p.sim``
  (deterministic simulator);
- torch glue: ``p2p.training``; tasks live in ``nodes/``.

Importing the package has no side effects.
"""

__version__ = "0.1.0"
