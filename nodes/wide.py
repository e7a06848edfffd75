"""A communication-heavy variant of the synthetic task: the same data, a 2.2 M-parameter student.

For bandwidth experiments (bench/diloco_repair.py, the lab test of DiLoCo's repair): a model
whose copy is large on the wire (8.6 MB of fp32) while a step still computes in a few ms, so
the links, not the CPU, are what a run measures. ``p2p start --task nodes.wide:WideTask``.
"""

from __future__ import annotations

from torch import nn

from nodes.synthetic import SyntheticTask


class WideTask(SyntheticTask):
    name = "wide"
    target_accuracy = 0.80

    def __init__(self, hidden: int = 2048, **kwargs) -> None:
        super().__init__(**kwargs)
        self.hidden = hidden

    def make_model(self) -> nn.Module:
        # dim -> hidden -> hidden/2 -> classes: 2,177,546 parameters at the default hidden=2048
        return nn.Sequential(nn.Linear(self.dim, self.hidden), nn.ReLU(),
                             nn.Linear(self.hidden, self.hidden // 2), nn.ReLU(),
                             nn.Linear(self.hidden // 2, self.classes))
