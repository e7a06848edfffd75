"""Torch glue: the model as flat buffers, the public ``Swarm`` and its optimizer wrapper, the
averager's step hooks across threads, the daemon's training loop and the ``Task`` interface."""
