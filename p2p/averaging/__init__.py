"""Averaging algorithms: how peers mix their parameters. One module per algorithm, named in
``registry.ALGORITHMS``; every algorithm is a sans-I/O state machine over a ``ModelPort``."""
