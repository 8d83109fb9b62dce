"""The ml_collections config, derived from the settings declarations, and back.

`default_config()` is generated from the declared fields of `RunSettings` and its sections
(`mr_rl.fields.setting`): config names are settings names (`config.batch.trim_columns` is
`settings.batch.trim_columns`), with the exceptions the declarations spell out:
`settings.update` is `config.optim` (ConfigDict reserves `update`, a dict method:
`c.update.lr` cannot be written), the `advantage` section holds `advantage` as its `name` and
`advantage_hp` as its other keys, and `plugins` and `setup` are config-only.
`from_config(config)` builds `RunSettings` from a config: the sections' own checks and
`RunSettings.__post_init__` validate; this module only resolves the config forms that need
other sections ('auto' values, `update.loss.norm_len`, `update.lora`).
Old config names (`ALIASES`) are accepted with a one-line deprecation warning.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from mr_rl import fields as F
from mr_rl.errors import ConfigError
from mr_rl.registry import import_plugins, setup_hooks
from mr_rl.settings.run import RunSettings, advantage_names
from mr_rl.settings.sections import ModelSettings

_LOG = logging.getLogger(__name__)

# Fields of the config that are no settings: read before the settings are built.
CONFIG_ONLY = {
    "plugins": ("", "comma-separated modules imported first; they register data sets, reward "
                "channels or pipelines (e.g. mr_rl.demo)"),
    "setup": ("", "comma-separated 'module:function' hooks called with the config when a run "
              "starts (not by --dry_run): runlocal's tiny assets are built there"),
}

# Old config name -> its name now (a section's fields move with it), accepted with a warning.
ALIASES = {
    "loss": "optim.loss",
    "update_batch.pack": "optim.pack",
    "update_batch": "batch",
    "dynamic_sampling": "dynamic",
    "rollout.max_staleness": "asynchrony.max_staleness",
    "rollout.sampler_devices": "asynchrony.sampler_devices",
}
RECOMPUTE = ("auto", "on", "off")


def resolve_alias(path: str) -> str | None:
  """The current name of a deprecated dotted config path, or None when it is not one."""
  for old in sorted(ALIASES, key=len, reverse=True):
    if path == old or path.startswith(old + "."):
      return ALIASES[old] + path[len(old):]
  return None


def deprecation(old: str, new: str) -> str:
  return f"config.{old} is deprecated: it is config.{new} now (same value)"


def _section(cls):
  import ml_collections
  c = ml_collections.ConfigDict()
  for f in dataclasses.fields(cls):
    if f.metadata.get("derived"):
      continue
    sub = F.section_class(f)
    if sub is not None:
      c[F.key(f)] = _section(sub)
    else:
      d = F.config_default(f)
      c[F.key(f)] = ml_collections.ConfigDict(d) if isinstance(d, dict) else d
  return c


def field_help(cls=RunSettings, prefix: str = "") -> dict[str, str]:
  """{dotted config path: its declared help line} of every declared field (`--help`)."""
  out = {name: text for name, (_, text) in CONFIG_ONLY.items()} if not prefix else {}
  for f in dataclasses.fields(cls):
    if f.metadata.get("derived"):
      continue
    sub = F.section_class(f)
    path = f"{prefix}{F.key(f)}"
    if sub is not None and not f.metadata.get("free"):
      out.update(field_help(sub, path + "."))
    elif f.metadata.get("help"):
      out[path] = f.metadata["help"]
  if not prefix:
    from mr_rl import rollout_engines
    out.update({f"rollout.{o.name}": o.doc for o in rollout_engines.options()})
  return out


def default_config():
  """The full field set with defaults, from the declarations; every config file starts from
  this and overrides. Sections named by a deprecated name are there, empty: a config file
  that sets `c.optim.lr` still loads (`from_config` moves the value, with a warning)."""
  import ml_collections
  c = ml_collections.ConfigDict()
  for name, (default, _) in CONFIG_ONLY.items():
    c[name] = default
  for k, v in _section(RunSettings).items():
    c[k] = v
  from mr_rl import rollout_engines  # the engines' own options are fields of config.rollout
  for k, v in rollout_engines.config_defaults().items():
    c.rollout[k] = v
  for old in ALIASES:
    if "." not in old:
      c[old] = ml_collections.ConfigDict()
  return c


def _free_form(cls=RunSettings, prefix="") -> tuple[str, ...]:
  out = []
  for f in dataclasses.fields(cls):
    sub = F.section_class(f)
    if sub is not None:
      out += _free_form(sub, f"{prefix}{F.key(f)}.")
    elif f.metadata.get("free"):
      out.append(prefix + F.key(f))
  return tuple(out)


@functools.cache
def free_form() -> tuple[str, ...]:
  """The sections whose keys are free-form (loader options, per-channel parameters, aggregator
  and estimator hyperparameters): checked by what consumes them, not against
  `default_config()` (`FREE_FORM`, computed when first read: it imports the runtime modules
  that declare sections)."""
  return _free_form()


def __getattr__(name):
  if name == "FREE_FORM":
    return free_form()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_section(x) -> bool:
  return hasattr(x, "items") and not isinstance(x, str)


def check_field_path(config, path: str) -> None:
  """Raises ValueError when the dotted `path` (e.g. 'update.loss.kl_coef', or a deprecated
  name of one) is not a field of `config`, naming the missing part and the valid fields of its
  section."""
  path = resolve_alias(path) or path
  node, done, free = config, [], None
  for part in path.split("."):
    free = free or next((f for f in free_form() if ".".join(done) == f), None)
    if not _is_section(node) or part not in node:
      where = "config." + ".".join(done) if done else "config"
      if not _is_section(node):
        raise ValueError(f"config.{path}: {where} is a value, not a section")
      if free:
        raise ValueError(f"config.{path}: {where} has no key {part!r} (keys: "
                         f"{sorted(node.keys())}); a key the config file lacks cannot be set "
                         f"one dot at a time: give the whole section, "
                         f"--config.{free}=\"{{...}}\"")
      raise ValueError(f"config.{path}: {where} has no field {part!r}; its fields are "
                       f"{sorted(node.keys())}")
    node = node[part]
    done.append(part)


def _get(c, path):
  for part in path.split("."):
    if not _is_section(c) or part not in c:
      return None
    c = c[part]
  return c


def _move_aliases(cfg):
  """A copy of `cfg` with the values set under deprecated names moved to their names now (a
  warning each); a value set under both names, differently, is an error."""
  import ml_collections
  c = ml_collections.ConfigDict(cfg.to_dict(), type_safe=False)
  ref = default_config()
  for old in sorted(ALIASES, key=len, reverse=True):
    parent, _, name = old.rpartition(".")
    node = _get(c, parent) if parent else c
    if not _is_section(node) or name not in node:
      continue
    value = node[name]
    moves = ([(f"{old}.{k}", v) for k, v in value.items()] if _is_section(value)
             else [(old, value)])
    for path, v in moves:
      new = resolve_alias(path)
      *sections, leaf = new.split(".")
      target = _get(c, ".".join(sections)) if sections else c
      if not _is_section(target):
        raise ValueError(f"config.{path} (deprecated) has no field {leaf!r} to move to")
      if leaf in target and target[leaf] != v and target[leaf] != _get(ref, new):
        raise ValueError(f"config.{path} (deprecated) and config.{new} are both set, to "
                         f"{v!r} and {target[leaf]!r}; set config.{new} only")
      _LOG.warning(deprecation(path, new))
      target[leaf] = v
    del node[name]
  return c


def _check_known_fields(c) -> None:
  """Every field of `c` must be a field of `default_config()` (free-form sections aside); a
  plugin may add top-level sections of its own (the demo's `config.demo`)."""
  ref = default_config()

  def walk(node, ref_node, prefix):
    for key in node.keys():
      path = f"{prefix}{key}"
      if path in free_form():
        continue
      if key not in ref_node:
        if not prefix and _is_section(node[key]):
          continue  # a plugin's own section
        where = f"config.{prefix[:-1]}" if prefix else "config"
        raise ValueError(f"config.{path} is not a field: {where} has the fields "
                         f"{sorted(k for k in ref_node.keys() if k not in ALIASES)}")
      if _is_section(ref_node[key]):
        if not _is_section(node[key]):
          raise ValueError(f"config.{path} must be a section with the fields "
                           f"{sorted(ref_node[key].keys())}, got {node[key]!r}")
        walk(node[key], ref_node[key], path + ".")

  walk(c, ref, "")


def _kwargs(cls, node, skip=()) -> dict:
  """The constructor arguments of section `cls` from its config section (sections nested,
  free-form and checked sections as plain dicts; missing fields keep their defaults)."""
  out = {}
  for f in dataclasses.fields(cls):
    if f.metadata.get("derived") or F.key(f) not in node or f.name in skip:
      continue
    sub, value = F.section_class(f), node[F.key(f)]
    if sub is not None and f.metadata.get("check") is None:
      out[f.name] = sub(**_kwargs(sub, value))
    else:
      out[f.name] = F.as_dict(value) if _is_section(value) else value
  return out


def from_config(cfg) -> RunSettings:
  """Builds and validates RunSettings from a ConfigDict (`default_config()` lists the fields).

  Imports `config.plugins` first, so the names they register are valid. A field that is
  unknown, mistyped or out of range raises `mr_rl.errors.ConfigError` naming it.
  """
  try:
    return _from_config(cfg)
  except ConfigError:
    raise
  except (ValueError, TypeError) as e:  # the checks name the field in the message
    raise ConfigError(str(e)) from e


def _from_config(cfg) -> RunSettings:
  c = _move_aliases(cfg)
  _check_known_fields(c)
  for name in CONFIG_ONLY:
    F.string(name, c[name])
  import_plugins(c.plugins)
  setup_hooks(c.setup)  # they import and are callable; they run when the run starts
  kw = _kwargs(RunSettings, c, skip=("model", "rollout", "update", "advantage", "dynamic"))
  model = ModelSettings(**_kwargs(ModelSettings, c.model))
  from mr_rl import rollout_engines
  rollout = F.section_class(_field("rollout"))(**_kwargs(F.section_class(_field("rollout")),
                                                          c.rollout))
  rollout = dataclasses.replace(  # (the engine's name checked before its options)
      rollout, engine_options=rollout_engines.options_from_config(c.rollout))
  update_cls = F.section_class(_field("update"))
  loss_cls = F.section_class(_field("loss", update_cls))
  loss = _kwargs(loss_cls, c.optim.loss)
  recompute = F.Choice(RECOMPUTE)("optim.loss.recompute_old_logp",
                                  loss.get("recompute_old_logp", "auto"))
  if recompute == "auto":  # on when the sampler computes differently from the training forward
    sampler = rollout.dtype or model.compute  # (or with tis_cap, which PolicyLossConfig checks)
    differs = sampler != model.compute or (rollout.cache_dtype or sampler) != model.compute
    recompute = "on" if differs or loss.get("tis_cap") not in (None, 0) else "off"
  loss["recompute_old_logp"] = recompute == "on"
  if loss.get("loss_agg") == "seq-mean-token-sum-norm":
    loss["norm_len"] = rollout.max_new_tokens
  update = _kwargs(update_cls, c.optim, skip=("loss",))
  update.update(loss=loss_cls(**loss), lora=model.lora)
  advantage = F.as_dict(c.advantage)
  name = advantage.pop("name", None)
  dynamic = _kwargs(F.section_class(_field("dynamic")), c.dynamic)
  dynamic.setdefault("signal", "auto")
  if name in advantage_names():  # (else RunSettings names the bad advantage.name)
    from mr_rl.rl import advantages as adv_lib, dynamic_sampling
    dynamic["signal"] = dynamic_sampling.resolve_signal(
        dynamic["signal"], name != "ppo" and adv_lib.uses_channels(name))
  return RunSettings(
      **kw, model=model, rollout=rollout, update=update_cls(**update), advantage=name,
      advantage_hp=advantage, dynamic=F.section_class(_field("dynamic"))(**dynamic))


def _field(name, cls=RunSettings) -> dataclasses.Field:
  return next(f for f in dataclasses.fields(cls) if f.name == name)
