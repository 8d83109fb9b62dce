"""Config arguments: `key=value,...` strings, sweep grids, loading config files by path."""

from __future__ import annotations

import importlib.util
import itertools
import os
from typing import Any, Mapping, Sequence


def parse_arg(arg: str | None, choices: Mapping[str, Sequence[str]],
              defaults: Mapping[str, str], where: str) -> dict[str, Any]:
  """Parses `key=value,...` against `choices`; returns defaults + given values + `runlocal`.

  Raises:
    ValueError: unknown key, value not among the choices, missing or repeated value.
  """
  out: dict[str, Any] = dict(defaults)
  out["runlocal"] = False
  seen = set()
  for part in filter(None, (s.strip() for s in (arg or "").split(","))):
    key, sep, value = (s.strip() for s in part.partition("="))
    if key in seen:
      raise ValueError(f"{where}: argument {key!r} given twice in {arg!r}")
    seen.add(key)
    if key == "runlocal":
      if sep and value not in ("1", "true", "True"):
        raise ValueError(f"{where}: runlocal takes no value (or 1/true), got {value!r}")
      out["runlocal"] = True
      continue
    if key not in choices:
      raise ValueError(f"{where}: unknown argument {key!r}; valid: "
                       f"{sorted(list(choices) + ['runlocal'])}")
    if not sep or value not in choices[key]:
      raise ValueError(f"{where}: {key}={value!r} is not valid; choose one of "
                       f"{list(choices[key])}")
    out[key] = value
  return out


def grid(**axes: Sequence[str]) -> list[str]:
  """All `key=value,...` strings of the cartesian product of `axes` (in the given order)."""
  keys = list(axes)
  return [",".join(f"{k}={v}" for k, v in zip(keys, vals))
          for vals in itertools.product(*(axes[k] for k in keys))]


def restrict(points: Sequence[str], arg: str | None, choices: Mapping[str, Sequence[str]],
             where: str) -> list[str]:
  """The sweep points that agree with every `key=value` of `arg` (validated like parse_arg)."""
  fixed = parse_arg(arg, choices, {}, where)
  fixed.pop("runlocal")
  out = []
  for p in points:
    kv = dict(part.split("=", 1) for part in p.split(","))
    if all(kv.get(k) == v for k, v in fixed.items()):
      out.append(p)
  if not out:
    raise ValueError(f"{where}: no sweep point matches {arg!r}")
  return out


def load_config_module(path: str):
  """Imports a config file by path (as ml_collections.config_flags does)."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path} does not exist")
  name = "mr_rl_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_sibling(this_file: str, name: str):
  """Imports config file `name`.py from the folder of `this_file` (a config's `__file__`).

  A table's variants start from the set-up in the table's own file, e.g. `configs/amrp_priors.py`
  calls `load_sibling(__file__, "amrp_math").base_config("qwen3_4b")`.
  """
  folder = os.path.dirname(os.path.abspath(this_file))
  return load_config_module(os.path.join(folder, name + ".py"))
