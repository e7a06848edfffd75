"""What a training task is, and how a task spec on the command line becomes one.

A task is a plain Python object a user writes (see ``nodes/`` for ready ones). The protocol does
not own training: the node asks the task for a model, batches from its shard, a loss and an
evaluation, and runs the optimizer itself.

A task spec is either a built-in name (``synthetic``, ``tinylm``) or ``MODULE:ATTR``, where ATTR
is a task object, or a class / zero-argument factory returning one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, runtime_checkable

BUILTIN_TASKS = {
    "synthetic": "nodes.synthetic:SyntheticTask",
    "tinylm": "nodes.tinylm:TinyLMTask",
}
DEFAULT_TASK = "synthetic"


@dataclass(frozen=True)
class Shard:
    """This peer's part of the training data: ``index`` of ``count`` disjoint parts.

    ``count == 1`` means the whole training set (a peer that does not know the swarm size
    samples all of it with its own seed, which is i.i.d. sharding in expectation).
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: need 0 <= index < count")

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """``"I/N"`` -> Shard(I, N)."""
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise ValueError(f"shard {text!r}: expected I/N, e.g. 0/4") from None
        return cls(index, count)


@runtime_checkable
class Task(Protocol):
    """The interface every task implements. Batches are tuples of CPU tensors."""

    name: str
    batch_size: int  # per-peer batch size
    lr: float  # learning rate for ``make_optimizer``
    target_accuracy: float  # held-out accuracy benchmarks time themselves to

    def make_model(self) -> Any:  # torch.nn.Module, same init for the same torch seed
        ...

    def make_optimizer(self, params: Any) -> Any:  # torch.optim.Optimizer
        ...

    def train_batches(self, shard: Shard, seed: int) -> Iterator[tuple]:
        """An endless iterator of training batches from ``shard``, shuffled by ``seed``."""
        ...

    def loss(self, model: Any, batch: tuple) -> Any:  # scalar tensor
        ...

    def evaluate(self, model: Any, device: Any) -> dict[str, float]:
        """Held-out metrics; must include ``accuracy`` (0..1) and ``loss``."""
        ...


class TaskError(ValueError):
    """A task spec that cannot be loaded; the message says what to fix."""


_REQUIRED = ("name", "batch_size", "lr", "target_accuracy", "make_model", "make_optimizer",
             "train_batches", "loss", "evaluate")


def load_task(spec: str) -> Task:
    """Resolve a task spec to a task object, or raise ``TaskError`` saying what is wrong."""
    target = BUILTIN_TASKS.get(spec, spec)
    if ":" not in target:
        raise TaskError(
            f"unknown task {spec!r}: use one of {', '.join(sorted(BUILTIN_TASKS))} or MODULE:ATTR"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is a bad task spec
        raise TaskError(f"task {spec!r}: cannot import module {module_name!r}: {exc}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise TaskError(f"task {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "make_model")):
        try:
            obj = obj()
        except Exception as exc:
            raise TaskError(f"task {spec!r}: constructing {attr} failed: {exc}") from None
    missing = [name for name in _REQUIRED if not hasattr(obj, name)]
    if missing:
        raise TaskError(f"task {spec!r}: object lacks {', '.join(missing)} (see p2p/training/task.py)")
    return obj
