"""Rollout engines: how `mr_rl.rollout.rollout` decodes a batch, one module per engine, each
registering an `EngineSpec` by name (`config.rollout.engine`).

    from mr_rl import rollout_engines
    spec = rollout_engines.ENGINES.get("continuous")   # the EngineSpec
    rollout_engines.config_defaults()                  # {'slots': 0}: every engine's options

An engine owns its settings: each `EngineOption` is a field of `config.rollout` (the
continuous engine's `slots` is `config.rollout.slots`), defaulted, validated and recorded
(`SamplingSettings.engine_options`) through the registry, so `mr_rl.settings`, the runlocal
configs and launch/check.py name no engine. The built-in engines are the modules of this
package (`static.py`, `continuous.py`), imported on the first lookup; adding an engine is
adding a module here (and a test), nothing else: docs/extending.md. An engine registered
from a `config.plugins` module works the same, but its options are config fields only when
the module is imported before the config is built (`settings.default_config`).
"""

from __future__ import annotations

import dataclasses
import pkgutil
from typing import Any, Callable, Mapping

from mr_rl.registry import Registry

DEFAULT = "static"  # `config.rollout.engine`'s default


@dataclasses.dataclass(frozen=True)
class EngineOption:
  """One setting an engine owns: the field `config.rollout.<name>`.

  Attributes:
    name: the field name (unique over the engines: they share `config.rollout`).
    default: its default (`settings.default_config`).
    check: `(field, value) -> value`: the validated value; raises ValueError naming `field`
      ('rollout.<name>').
    doc: one line for the docs and `--help`-like listings.
  """
  name: str
  default: Any
  check: Callable[[str, Any], Any]
  doc: str = ""


@dataclasses.dataclass(frozen=True)
class EngineSpec:
  """A rollout engine.

  Every callable takes the sampling model and merged params, the prompts `[B, P]` and the
  rollout's `SamplingSettings` `s` (group size, lengths, filters, cache dtype, and
  `s.engine_options`, where this engine finds its own options) and the sampler keywords
  `eos_id`, `pad_id` and `mesh`.

  Attributes:
    name: `config.rollout.engine`.
    doc: what it does, in one line.
    generate: `(model, params, tokens_BP, mask_BP, *, s, key, eos_id, pad_id, mesh,
      on_finished)` -> `mr_rl.sampling.SampleOutput` with leading dims `[B, G]`. An engine
      that finishes rows one at a time calls `on_finished(row)` (a `sampling.FinishedRow`)
      for each; one that never calls it gets every row handed on after it returns.
    warm_up: `(model, params, tokens_BP, mask_BP, *, s, key, eos_id, pad_id, mesh)` ->
      the number of programs compiled for these prompt widths (`mr_rl.program_plan`).
    expected_programs: `(s, prompt_buckets, rollout_rows, eval_rows)` -> {program name:
      most compiles} of a run (`mr_rl.program_plan.expected_programs`; evaluation samples
      with the static sampler, `eval_rows` extra row counts).
    check_programs: the launch/check.py programs that stand for this engine by default.
    options: the settings it owns (`EngineOption`).
    splits_rows: it decodes the B * G rollout rows as one batch split over the mesh's batch
      axes, so they must divide evenly (`mr_rl.startup.check_devices`); an engine of slots
      checks its own sizes.
  """
  name: str
  doc: str
  generate: Callable[..., Any]
  warm_up: Callable[..., int]
  expected_programs: Callable[..., dict]
  check_programs: tuple[str, ...]
  options: tuple[EngineOption, ...] = ()
  splits_rows: bool = True


def _builtin_modules() -> tuple[str, ...]:
  return tuple(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)
               if not m.name.startswith("_"))


ENGINES: Registry[EngineSpec] = Registry("rollout engine", plugins=_builtin_modules())


def register(spec: EngineSpec) -> EngineSpec:
  """Adds `spec` under its name; an option name another engine owns is an error."""
  owners = {o.name: n for n in ENGINES.names() for o in ENGINES.get(n).options}
  for o in spec.options:
    if o.name in owners:
      raise ValueError(f"rollout engine {spec.name!r}: option {o.name!r} is already "
                       f"config.rollout.{o.name} of engine {owners[o.name]!r}")
  return ENGINES.add(spec.name, spec)


def options() -> tuple[EngineOption, ...]:
  """Every registered engine's options."""
  return tuple(o for n in ENGINES.names() for o in ENGINES.get(n).options)


def config_defaults() -> dict[str, Any]:
  """{option name: default} over every engine (the engines' fields of `config.rollout`)."""
  return {o.name: o.default for o in options()}


def options_from_config(rollout: Mapping[str, Any]) -> dict[str, Any]:
  """Every engine's options read from `config.rollout` and validated by their engine (a
  field the config lacks takes its default)."""
  return {o.name: o.check(f"rollout.{o.name}", rollout.get(o.name, o.default))
          for o in options()}


def option(s, name: str):
  """Option `name` of a `SamplingSettings` `s` (its registered default when `s` lacks it)."""
  if name in s.engine_options:
    return s.engine_options[name]
  for o in options():
    if o.name == name:
      return o.default
  raise KeyError(f"no rollout engine has an option {name!r}; options: "
                 f"{sorted(config_defaults())}")
