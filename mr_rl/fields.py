"""Declared settings fields: one `setting(...)` per field carries its default, help, check and
config form; `validate(self)` in a dataclass's `__post_init__` applies the checks.

A settings section is a frozen dataclass with a `SECTION` (its dotted path in the
ml_collections config, 'update.loss'). Each check is a callable `(path, value) -> value` that
raises ValueError naming `config.<path>` and returns the value in its settings form (a csv
string as a tuple, `tis_cap` 0 as None); checks are idempotent, so `dataclasses.replace` on a
validated section validates again. `mr_rl.settings` derives the config from these declarations
(`default_config`) and builds the sections from a config (`from_config`). This module imports
nothing of mr_rl, so the runtime modules that declare their own sections (rl/losses.py,
rl/update.py, rollout.py, draw_queue.py, models/lora.py) may use it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Mapping

SAME = object()  # the config's default is the field's default


def setting(default: Any = dataclasses.MISSING, help: str = "", check: Callable | None = None,
            *, config: Any = SAME, factory: Callable | None = None, derived: bool = False,
            free: bool = False, key: str | None = None):
  """A declared field (see the module docstring).

  Args:
    default: the field's default (settings form).
    help: one line for `--help` readers and the config listing.
    check: `(path, value) -> value`, raising ValueError naming `config.<path>`.
    config: the config file's default where it differs from `default` (e.g. 'auto', which
      `from_config` resolves with other sections); a dict makes a config section.
    factory: default factory (mutable defaults; a nested section's class).
    derived: the field is not in the config; `from_config` computes it.
    free: a free-form section (loader options, hyperparameters): its keys are not declared.
    key: the config's name of the field where it cannot be the field's own (ConfigDict
      reserves its method names: `update` is `config.optim`).
  """
  meta = {"help": help, "check": check, "config": config, "derived": derived, "free": free,
          "key": key}
  if factory is not None:
    return dataclasses.field(default_factory=factory, metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


def validate(obj) -> None:
  """Applies each declared field's check to `obj` (a frozen dataclass), in field order."""
  section = getattr(obj, "SECTION", "")
  for f in dataclasses.fields(obj):
    check = f.metadata.get("check")
    if check is not None:
      path = f"{section}.{f.name}" if section else f.name
      object.__setattr__(obj, f.name, check(path, getattr(obj, f.name)))


def config_default(f: dataclasses.Field):
  """A declared field's default in the config file's form."""
  c = f.metadata.get("config", SAME)
  if c is not SAME:
    return c
  if f.default is not dataclasses.MISSING:
    return f.default
  return f.default_factory()  # type: ignore[misc]


def key(f: dataclasses.Field) -> str:
  """A declared field's name in the config."""
  return f.metadata.get("key") or f.name


def is_section(cls) -> bool:
  return isinstance(cls, type) and dataclasses.is_dataclass(cls)


class Lazy:
  """A section class imported when first needed (`loader()` returns it), so the config layer
  does not import the runtime modules that declare their sections until it builds them."""

  def __init__(self, loader: Callable[[], type]):
    self.loader = loader

  @property
  def cls(self) -> type:
    return self.loader()

  def __call__(self):
    return self.loader()()


def section_class(f: dataclasses.Field):
  """The class whose declarations make `f`'s config section, or None (a leaf field)."""
  for x in (f.metadata.get("config"), f.default_factory):
    if isinstance(x, Lazy):
      return x.cls
    if is_section(x):
      return x
  return None


# ----------------------------------------------------------------------------------- checks
def _fmt(x) -> str:
  return f"{x:g}" if isinstance(x, float) else str(x)


class Int:
  """An int (not a bool), >= lo where given ('> 0' for lo 1)."""

  def __init__(self, lo: int | None = None):
    self.lo = lo

  def __call__(self, path, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise ValueError(f"config.{path} must be an int, got {value!r}")
    value = int(value)
    if self.lo is not None and value < self.lo:
      bound = "> 0" if self.lo == 1 else f">= {self.lo}"
      raise ValueError(f"config.{path} must be {bound}, got {value!r}")
    return value


class Float:
  """A finite number (ints accepted) as a float, in the range given (open ends where asked)."""

  def __init__(self, lo=None, hi=None, lo_open=False, hi_open=False):
    self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open

  def __call__(self, path, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
      raise ValueError(f"config.{path} must be a finite number, got {value!r}")
    value = float(value)
    lo, hi = self.lo, self.hi
    low = lo is not None and (value < lo or (self.lo_open and value == lo))
    high = hi is not None and (value > hi or (self.hi_open and value == hi))
    if low or high:
      if hi is None:
        bound = f"{'>' if self.lo_open else '>='} {_fmt(lo)}"
      else:
        bound = (f"in {'(' if self.lo_open else '['}{_fmt(lo)}, {_fmt(hi)}"
                 f"{')' if self.hi_open else ']'}")
      raise ValueError(f"config.{path} must be {bound}, got {value!r}")
    return value


class Optional:
  """None, or what `check` accepts."""

  def __init__(self, check):
    self.check = check

  def __call__(self, path, value):
    return None if value is None else self.check(path, value)


class Choice:
  """One of `values` (a tuple, or a callable giving them when checked: a registry's names)."""

  def __init__(self, values):
    self.values = values

  def __call__(self, path, value):
    valid = self.values() if callable(self.values) else self.values
    if not isinstance(value, str) or value not in valid:
      raise ValueError(f"config.{path}={value!r} is not valid; choose one of {sorted(valid)}")
    return value


def boolean(path, value):
  if not isinstance(value, bool):
    raise ValueError(f"config.{path} must be True or False, got {value!r}")
  return value


def string(path, value):
  if not isinstance(value, str):
    raise ValueError(f"config.{path} must be a str, got {value!r}")
  return value


class Csv:
  """A comma-separated str as a tuple of its non-empty items (a tuple passes), each checked by
  `item` where given."""

  def __init__(self, item: Callable | None = None):
    self.item = item

  def __call__(self, path, value):
    if isinstance(value, str):
      value = tuple(v.strip() for v in value.split(",") if v.strip())
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
      raise ValueError(f"config.{path} must be a comma-separated str, got {value!r}")
    return tuple(self.item(path, v) if self.item else v for v in value)


def as_dict(x) -> dict:
  """A ConfigDict or mapping (nested) as plain dicts; None as {}."""
  if x is None:
    return {}
  return {k: as_dict(v) if hasattr(v, "to_dict") or isinstance(v, Mapping) else v
          for k, v in (x.to_dict() if hasattr(x, "to_dict") else dict(x)).items()}


def mapping(path, value):
  """A free-form section as a plain dict."""
  if value is not None and not (hasattr(value, "to_dict") or isinstance(value, Mapping)):
    raise ValueError(f"config.{path} must be a mapping, got {value!r}")
  return as_dict(value)


def registered(registry) -> Callable[[], tuple[str, ...]]:
  """A registry's names and aliases, read when checked (after the run's plugins registered)."""
  return lambda: registry.names() + tuple(registry.aliases())


DTYPES = ("float32", "bfloat16")
