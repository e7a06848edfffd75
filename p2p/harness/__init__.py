"""Running whole swarms on one machine: local processes, the shaped-network lab, the demo and
its single-process reference."""
