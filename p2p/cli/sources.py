"""Where ``p2p start``'s settings come from: a config file, the environment, the flags.

Precedence, lowest first: the defaults, then the TOML file of ``--config FILE``, then
``P2P_<NAME>`` environment variables, then flags. Every source uses the same names: a
setting's flag without the dashes (``--diloco-inner-steps`` is ``diloco_inner_steps`` in the
file and ``P2P_DILOCO_INNER_STEPS`` in the environment). Nothing is silent: an unknown key in
the file or an unknown ``P2P_*`` variable is an error that names it, and an error in a value
names where that value came from.

    # swarm.toml
    listen = "0.0.0.0:7000"
    join = ["10.0.0.1:7000"]
    task = "tinylm"
    algorithm = "diloco"
    diloco_inner_steps = 25
    checkpoint_dir = "/data/p2p"
"""

from __future__ import annotations

import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from p2p.cli.errors import CliError

ENV_PREFIX = "P2P_"


@dataclass
class Sources:
    """The merged settings and where each came from (for error messages)."""

    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # name -> "file PATH", "env P2P_X" or "flag --x"

    def where(self, name: str, flag: str) -> str:
        """How to name a setting in an error: its flag, or the file key / variable it came from."""
        origin = self.origin.get(name, "flag")
        if origin.startswith("file "):
            return f"{origin[5:]}: {name}"
        if origin.startswith("env "):
            return origin[4:]
        return flag


def merge(flags: Mapping[str, Any], types: Mapping[str, Any], config: Optional[str],
          environ: Optional[Mapping[str, str]] = None) -> Sources:
    """``flags`` (None: not given) over the environment over the file. ``types`` maps every
    known name to its annotation (``Optional[int]``, ``List[str]`` ...), for the environment's
    strings and the file's checks."""
    environ = os.environ if environ is None else environ
    merged = Sources()
    if config is not None:
        for name, value in _read_file(Path(config), types).items():
            merged.values[name], merged.origin[name] = value, f"file {config}"
    for var, text in environ.items():
        if not var.startswith(ENV_PREFIX) or var == ENV_PREFIX + "CONFIG":
            continue
        name = var[len(ENV_PREFIX):].lower()
        if name not in types:
            raise CliError(f"{var}: no such setting (a P2P_ variable names one: "
                           f"P2P_{'|P2P_'.join(n.upper() for n in list(types)[:4])}|...)")
        merged.values[name], merged.origin[name] = _from_text(var, text, types[name]), f"env {var}"
    for name, value in flags.items():
        if value is not None and value != []:
            merged.values[name], merged.origin[name] = value, f"flag {name}"
    return merged


def _read_file(path: Path, types: Mapping[str, Any]) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise CliError(f"--config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"--config {path}: not TOML: {exc}") from None
    for key, value in data.items():
        if key not in types:
            raise CliError(f"{path}: unknown key {key!r} (keys are the flags of p2p start, with underscores)")
        if _base(types[key]) is str and isinstance(value, int) and not isinstance(value, bool):
            data[key] = value = str(value)  # a number where a word may go too (diloco_inner_steps = 25, or "auto")
        if not _fits(value, types[key]):
            raise CliError(f"{path}: {key} = {value!r}: want {_type_name(types[key])}")
    return data


def _base(annotation: Any) -> Any:
    """``Optional[X]`` -> X; ``List[str]`` stays a list type."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if typing.get_origin(annotation) is typing.Union and len(args) == 1 else annotation


def _fits(value: Any, annotation: Any) -> bool:
    base = _base(annotation)
    if typing.get_origin(base) is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, base)


def _type_name(annotation: Any) -> str:
    base = _base(annotation)
    if typing.get_origin(base) is list:
        return "a list of strings"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(base, str(base))


def _from_text(var: str, text: str, annotation: Any) -> Any:
    base = _base(annotation)
    try:
        if typing.get_origin(base) is list:
            return [part.strip() for part in text.split(",") if part.strip()]
        if base is bool:
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        return base(text)
    except ValueError:
        raise CliError(f"{var}={text!r}: want {_type_name(annotation)}") from None
