"""A member's training state as one record: model, optimizer, step, the algorithm's state.

``TrainingState`` is what a checkpoint holds and what state sync moves. Two encodings:

- On disk (``to_checkpoint``/``from_checkpoint``): a plain ``torch.save`` dictionary, loadable
  with ``torch.load(path, weights_only=True)``: tensors, numbers, strings, lists and dicts only.
- On the wire (``to_bytes``/``from_bytes``): a safetensors blob (a JSON header and raw tensor
  bytes; never pickle) with the non-tensor parts (step, optimizer hyper-parameters, the
  algorithm's scalars) as JSON in its metadata. ``from_bytes`` is the boundary for bytes from
  another member: it checks the framing, every tensor's name, shape, dtype and finiteness
  against this member's own model, and raises ``StateError`` (never anything else) when they
  do not fit.

Keys of ``to_bytes``: ``model/<state_dict key>``, ``optimizer/<param index>/<name>``,
``algorithm/<key>``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

FORMAT_VERSION = 1
MAX_HEADER_BYTES = 64 << 20


class StateError(ValueError):
    """A state (checkpoint or donor's blob) that cannot be used here; the message says why."""


@dataclass
class TrainingState:
    step: int
    model_key: str
    algorithm: str
    model: dict[str, torch.Tensor]  # model.state_dict(), CPU copies
    optimizer: Optional[dict] = None  # optimizer.state_dict(), CPU copies (None: not captured)
    algorithm_state: dict[str, Any] = field(default_factory=dict)  # numpy arrays and scalars
    extra: dict[str, Any] = field(default_factory=dict)  # registered objects' state_dicts (disk only)
    info: dict[str, Any] = field(default_factory=dict)  # task, seed, node id, incarnation, time


def cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor detached and on the CPU (training goes on meanwhile)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


# -- disk -------------------------------------------------------------------------------------
def to_checkpoint(state: TrainingState) -> dict:
    return {"format": "p2p-checkpoint", "version": FORMAT_VERSION, "step": state.step,
            "model_key": state.model_key, "algorithm": state.algorithm, "model": state.model,
            "optimizer": state.optimizer,
            "algorithm_state": {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                for k, v in state.algorithm_state.items()},
            "extra": state.extra, "info": state.info}


def from_checkpoint(data: Any) -> TrainingState:
    if not isinstance(data, dict) or data.get("format") != "p2p-checkpoint":
        raise StateError("not a p2p checkpoint")
    if data.get("version") != FORMAT_VERSION:
        raise StateError(f"checkpoint format version {data.get('version')!r}, this p2p reads {FORMAT_VERSION}")
    try:
        algorithm_state = {k: v.numpy() if isinstance(v, torch.Tensor) else v
                           for k, v in data["algorithm_state"].items()}
        return TrainingState(int(data["step"]), str(data["model_key"]), str(data["algorithm"]), data["model"],
                             data["optimizer"], algorithm_state, data.get("extra") or {}, data.get("info") or {})
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise StateError(f"checkpoint lacks or garbles {exc}") from None


# -- wire -------------------------------------------------------------------------------------
def to_bytes(state: TrainingState) -> np.ndarray:
    """The state as a safetensors blob (uint8 array)."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {f"model/{k}": v.contiguous() for k, v in state.model.items()}
    meta: dict[str, Any] = {"version": FORMAT_VERSION, "step": state.step, "model_key": state.model_key,
                            "algorithm": state.algorithm, "algorithm_values": {}, "extra_values": {}}
    for k, v in state.algorithm_state.items():
        if isinstance(v, np.ndarray):
            tensors[f"algorithm/{k}"] = torch.from_numpy(np.ascontiguousarray(v))
        else:
            meta["algorithm_values"][k] = v
    for name, values in state.extra.items():  # registered objects: top-level tensors, the rest as JSON
        kept = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
        try:
            json.dumps(kept, default=_scalar)
        except (TypeError, ValueError):
            continue  # not representable without pickle: the joiner's own object keeps its state
        meta["extra_values"][name] = kept
        tensors.update({f"extra/{name}/{k}": v.contiguous() for k, v in values.items() if isinstance(v, torch.Tensor)})
    if state.optimizer is not None:
        meta["optimizer_groups"] = state.optimizer["param_groups"]
        slots: dict[str, dict[str, Any]] = {}
        for index, values in state.optimizer["state"].items():
            for name, value in values.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optimizer/{index}/{name}"] = value.contiguous()
                else:
                    slots.setdefault(str(index), {})[name] = value
        meta["optimizer_values"] = slots
    blob = save(tensors, metadata={"p2p": json.dumps(meta, default=_scalar)})
    return np.frombuffer(blob, dtype=np.uint8)


def _scalar(value: Any) -> Any:
    """JSON for what optimizers keep besides plain numbers (a learning rate held as a tensor)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    raise TypeError(f"cannot put {type(value).__name__} in a state's metadata")


def _header(data: bytes) -> dict:
    if len(data) < 8:
        raise StateError(f"{len(data)} bytes: too short for a safetensors header")
    n = int.from_bytes(data[:8], "little")
    if n > min(MAX_HEADER_BYTES, len(data) - 8):
        raise StateError(f"header of {n} bytes in a blob of {len(data)}")
    try:
        header = json.loads(bytes(data[8:8 + n]))
        meta = json.loads(header["__metadata__"]["p2p"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"unreadable header: {exc}") from None
    if not isinstance(meta, dict):
        raise StateError("the header's metadata is not an object")
    return meta


def from_bytes(data: bytes, model: dict[str, torch.Tensor], model_key: str) -> TrainingState:
    """Parse and check a donor's blob against this member's ``model`` (its state_dict)."""
    meta = _header(data)
    if meta.get("model_key") != model_key:
        raise StateError(f"state of model {meta.get('model_key')!r}, this one is {model_key!r}")
    state = _parse(data, meta)
    check_model(state.model, model)
    return state


def from_bytes_unchecked(data: bytes) -> TrainingState:
    """Parse a blob without a model to check it against (``p2p export --peer``): framing,
    finiteness and structure are still checked."""
    return _parse(data, _header(data))


def _parse(data: bytes, meta: dict) -> TrainingState:
    if meta.get("version") != FORMAT_VERSION:
        raise StateError(f"state format version {meta.get('version')!r}, this p2p reads {FORMAT_VERSION}")
    model_key = meta.get("model_key")
    if not isinstance(model_key, str):
        raise StateError(f"model key {model_key!r}")
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise StateError(f"step {step!r}")
    try:
        from safetensors.torch import load

        tensors = load(bytes(data))
    except Exception as exc:  # the Rust parser's own error types: any of them means bad bytes
        raise StateError(f"unreadable tensors: {exc}") from None
    for name, value in tensors.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise StateError(f"{name} carries NaN or Inf")
    try:
        return TrainingState(step, model_key, str(meta.get("algorithm", "")), _section(tensors, "model/"),
                             _optimizer(meta, tensors), _algorithm(meta, tensors), _extra(meta, tensors))
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise StateError(f"garbled state: {exc}") from None


def _section(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def _json_values(values: Any, what: str) -> dict:
    """A JSON object of plain, finite values (numbers, strings, booleans, None, lists of them)."""
    if not isinstance(values, dict):
        raise ValueError(f"{what} is not an object")
    for key, value in values.items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{what}[{key!r}] is not finite")
            if not isinstance(v, (int, float, str, bool, type(None))):
                raise ValueError(f"{what}[{key!r}] is a {type(v).__name__}")
    return values


def _algorithm(meta: dict, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    state: dict[str, Any] = dict(_json_values(meta.get("algorithm_values") or {}, "algorithm values"))
    state.update({k: v.numpy() for k, v in _section(tensors, "algorithm/").items()})
    return state


def _extra(meta: dict, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    values = meta.get("extra_values") or {}
    if not isinstance(values, dict):
        raise ValueError("extra values are not an object")
    extra = {name: dict(_json_values(kept, f"{name}'s state")) for name, kept in values.items()}
    for key, value in _section(tensors, "extra/").items():
        name, _, field = key.partition("/")
        extra.setdefault(name, {})[field] = value
    return extra


def _optimizer(meta: dict, tensors: dict[str, torch.Tensor]) -> Optional[dict]:
    """An optimizer state_dict from the blob's ``optimizer/<index>/<name>`` tensors and the
    metadata's hyper-parameters and scalars (None when the donor sent none). Shapes are checked
    against the optimizer that takes it (``check_optimizer``)."""
    if "optimizer_groups" not in meta:
        return None
    groups = meta["optimizer_groups"]
    if not isinstance(groups, list):
        raise ValueError("optimizer groups are not a list")
    slots: dict[int, dict[str, Any]] = {}
    for k, v in _section(tensors, "optimizer/").items():
        index, name = k.split("/", 1)
        slots.setdefault(int(index), {})[name] = v
    values = meta.get("optimizer_values") or {}
    if not isinstance(values, dict):
        raise ValueError("optimizer values are not an object")
    for index, kept in values.items():
        slots.setdefault(int(index), {}).update(_json_values(kept, "optimizer values"))
    parsed = []
    for g in groups:
        g = dict(_json_values({k: v for k, v in dict(g).items() if k != "params"}, "optimizer group"),
                 params=[int(i) for i in dict(g)["params"]])
        parsed.append({k: tuple(v) if k == "betas" and isinstance(v, list) else v for k, v in g.items()})
    return {"state": slots, "param_groups": parsed}


def check_optimizer(state: dict, optimizer: torch.optim.Optimizer) -> None:
    """A donor's optimizer state fits ``optimizer``: the same groups, and every tensor in a
    parameter's slot either a scalar (a step count) or of that parameter's shape. StateError."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = state["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        raise StateError("optimizer state of other parameter groups")
    for index, slot in state["state"].items():
        if not 0 <= index < len(params):
            raise StateError(f"optimizer state for parameter {index}, there are {len(params)}")
        for name, value in slot.items():
            if isinstance(value, torch.Tensor) and value.ndim and value.shape != params[index].shape:
                raise StateError(f"optimizer {name} of parameter {index}: {list(value.shape)}, "
                                 f"the parameter is {list(params[index].shape)}")


def check_model(weights: dict[str, torch.Tensor], model: dict[str, torch.Tensor]) -> None:
    """Same names, shapes and dtypes as this member's model state_dict, or StateError."""
    if set(weights) != set(model):
        missing, unknown = sorted(set(model) - set(weights)), sorted(set(weights) - set(model))
        raise StateError(f"model tensors differ: missing {missing[:3]}, unknown {unknown[:3]}")
    for name, mine in model.items():
        theirs = weights[name]
        if theirs.shape != mine.shape or theirs.dtype != mine.dtype:
            raise StateError(f"{name}: {theirs.dtype}{list(theirs.shape)}, this model has {mine.dtype}{list(mine.shape)}")


def finite(state: TrainingState) -> bool:
    """No NaN or Inf in the model's floating-point tensors (a diverged run is not kept)."""
    return all(bool(torch.isfinite(t).all()) for t in state.model.values() if t.is_floating_point())
