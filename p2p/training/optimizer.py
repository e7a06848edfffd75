"""``SwarmOptimizer``: the user's optimizer, with the swarm's averaging beside it.

It is a ``torch.optim.Optimizer`` (so LR schedulers, ``GradScaler`` and ``clip_grad_norm_``
accept it) that shares the inner optimizer's ``param_groups`` and ``state``: a scheduler set up
on either changes both, and ``state_dict()`` is the inner one's, loadable into a plain
optimizer. Only ``step()`` differs: the inner step runs under the parameter lock (a snapshot
taken by the network thread never sees a half-applied update), then the ``Swarm`` lands the
averaging deltas and, for synchronous algorithms, waits at the algorithm's gate
(p2p/training/swarm.py, ``_after_optimizer_step``).

Mixed precision: ``GradScaler.step(opt)`` skips ``opt.step()`` when the gradients carry inf or
NaN, so a skipped step is not a swarm step (the algorithm's step count, DiLoCo's H, count
applied updates only). ``_step_supports_amp_scaling`` is False on purpose: with a fused inner
optimizer GradScaler would otherwise call ``step()`` on skipped steps too and let the inner
optimizer skip silently.

Gradient accumulation needs nothing: backward as often as you like, ``step()`` once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

if TYPE_CHECKING:
    from p2p.training.swarm import Swarm


class SwarmOptimizer(torch.optim.Optimizer):
    _step_supports_amp_scaling = False  # module docstring: GradScaler must skip our step() itself

    # The inner optimizer's state is ours: no Optimizer.__init__ (it would start a second one).
    def __init__(self, optimizer: torch.optim.Optimizer, swarm: "Swarm") -> None:  # noqa: D107
        if isinstance(optimizer, SwarmOptimizer):
            raise ValueError("this optimizer is already wrapped by a Swarm")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"Swarm.wrap() takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        averaged = {id(p) for p in swarm.flat.params}
        stepped = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        if any(id(p) not in averaged for p in stepped):
            raise ValueError("the optimizer steps parameters that are not the Swarm's model's: "
                             "build it from the same model's parameters()")
        self.optimizer = optimizer
        self._swarm = swarm
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def swarm(self) -> "Swarm":
        return self._swarm

    def step(self, closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Any:  # type: ignore[override]
        swarm = self._swarm
        swarm._before_optimizer_step(closure is not None)
        with swarm.flat.lock:  # a snapshot never sees half a step, and the count moves with it
            result = self.optimizer.step(closure, **kwargs) if closure is not None else self.optimizer.step(**kwargs)
            swarm._step += 1
        swarm._after_optimizer_step()
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise ValueError("a Swarm averages a fixed set of parameters: add parameter groups before wrap()")

    # Hooks belong to the inner optimizer (they run around its step).
    def register_step_pre_hook(self, hook: Callable) -> Any:
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Callable) -> Any:
        return self.optimizer.register_step_post_hook(hook)

    def register_state_dict_pre_hook(self, hook: Callable, prepend: bool = False) -> Any:
        return self.optimizer.register_state_dict_pre_hook(hook, prepend)

    def register_state_dict_post_hook(self, hook: Callable, prepend: bool = False) -> Any:
        return self.optimizer.register_state_dict_post_hook(hook, prepend)

    def register_load_state_dict_pre_hook(self, hook: Callable, prepend: bool = False) -> Any:
        return self.optimizer.register_load_state_dict_pre_hook(hook, prepend)

    def register_load_state_dict_post_hook(self, hook: Callable, prepend: bool = False) -> Any:
        return self.optimizer.register_load_state_dict_post_hook(hook, prepend)

    def __getattr__(self, name: str) -> Any:  # the inner optimizer's own extras
        if name in ("optimizer", "_swarm"):
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"SwarmOptimizer({self.optimizer!r})"
