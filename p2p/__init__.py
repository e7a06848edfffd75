"""p2p: decentralized, peer-to-peer training of PyTorch models over ZeroMQ.

The public API, for your own training loop::

    import p2p
    with p2p.Swarm(model, listen="0.0.0.0:7000", join=["10.0.0.1:7000"], algorithm="diloco") as swarm:
        opt = swarm.wrap(opt)
        ...

``Swarm`` and ``SwarmOptimizer`` (p2p/training/), ``SwarmConfig`` and ``swarm_config``
(p2p/config.py: every setting by name), ``SwarmError``/``JoinError``, and ``Shard`` for tasks.

The package is layered (see README "Architecture"): the pure, sans-I/O protocol (``wire``,
``peer``, ``gossip/``, ``topology/``, ``averaging/``, ``compression/``), the sockets (``net/``),
the torch glue (``training/``), the simulator (``sim/``), whole local swarms (``harness/``) and
the command line (``cli/``). Importing the package has no side effects and imports no torch:
the names above load on first use.
"""

__version__ = "0.1.0"

_PUBLIC = {
    "Swarm": "p2p.training.swarm",
    "SwarmError": "p2p.training.swarm",
    "JoinError": "p2p.training.swarm",
    "SwarmOptimizer": "p2p.training.optimizer",
    "SwarmConfig": "p2p.config",
    "swarm_config": "p2p.config",
    "Shard": "p2p.training.task",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'p2p' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
