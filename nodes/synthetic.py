"""The default task: a small, fast classification problem generated on the spot.

Inputs are 32-dim Gaussian vectors; labels are the argmax of a fixed random "teacher" MLP, with
a few percent of labels flipped so the task does not saturate at 100%. A 2-layer MLP student
(~13k parameters) reaches ~83% held-out accuracy after ~50k samples, at well under a
second of CPU per hundred steps, which makes it the demo and test default. Nothing is
downloaded: the data set is a pure function of ``data_seed``.

Copy this file to make your own task; see ``p2p/training/task.py`` for the interface.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from p2p.training.task import Shard


class SyntheticTask:
    name = "synthetic"
    batch_size = 32
    lr = 0.01
    target_accuracy = 0.80
    demo_steps = 800  # per peer in `p2p demo`: 4 peers x 800 x 32 samples ~ 5 epochs

    def __init__(self, dim: int = 32, classes: int = 10, train_size: int = 20_000,
                 test_size: int = 4_000, label_noise: float = 0.03, data_seed: int = 1234) -> None:
        self.dim, self.classes = dim, classes
        gen = torch.Generator().manual_seed(data_seed)
        teacher_w1 = torch.randn(dim, 16, generator=gen) * (0.6 / dim**0.5)
        teacher_w2 = torch.randn(16, classes, generator=gen)
        x = torch.randn(train_size + test_size, dim, generator=gen)
        y = (torch.tanh(x @ teacher_w1) @ teacher_w2).argmax(dim=1)
        flip = torch.rand(len(y), generator=gen) < label_noise
        y[flip] = torch.randint(0, classes, (int(flip.sum()),), generator=gen)
        self.train_x, self.train_y = x[:train_size], y[:train_size]
        self.test_x, self.test_y = x[train_size:], y[train_size:]

    def make_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.dim, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                             nn.Linear(64, self.classes))

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9)

    def train_batches(self, shard: Shard, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        indices = torch.arange(shard.index, len(self.train_y), shard.count)
        gen = torch.Generator().manual_seed(seed)
        while True:  # endless epochs, reshuffled each time
            order = indices[torch.randperm(len(indices), generator=gen)]
            for start in range(0, len(order) - self.batch_size + 1, self.batch_size):
                batch = order[start:start + self.batch_size]
                yield self.train_x[batch], self.train_y[batch]

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device | str = "cpu") -> dict[str, float]:
        logits = model(self.test_x.to(device))
        y = self.test_y.to(device)
        return {"accuracy": (logits.argmax(dim=1) == y).float().mean().item(),
                "loss": nn.functional.cross_entropy(logits, y).item()}
