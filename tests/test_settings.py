"""mr_rl.settings.from_config range-checks every field (issue 24 item 3), so `--dry_run` catches
a bad value, and an unknown field names the valid fields of its section."""

import math
import os
import subprocess
import sys

import pytest

from mr_rl import settings as settings_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_CONFIG = os.path.join(ROOT, "configs", "demo.py")


def _demo_config():
  """The demo's smoke config, unlocked and not type-safe (a config file may set any value)."""
  import ml_collections
  from ml_collections.config_flags import config_flags as config_file
  c = config_file.ConfigFileFlagParser(name="config").parse(DEMO_CONFIG + ":smoke")
  return ml_collections.ConfigDict(c.to_dict(), type_safe=False)


def _set(c, field, value):
  *sections, name = field.split(".")
  node = c
  for s in sections:
    node = node[s]
  node[name] = value


def test_the_demo_config_resolves():
  s = settings_lib.from_config(_demo_config())
  assert s.rewards.not_applicable_patience == 10
  assert (s.rewards.worker_max_calls, s.rewards.worker_memory_bytes) == (1000, 2 << 30)


@pytest.mark.parametrize("field, value, needle", [
    ("eval.num_prompts", -4, r"config.eval.num_prompts must be > 0, got -4"),
    ("eval.num_prompts", 0, r"config.eval.num_prompts must be > 0"),
    ("eval.samples_per_prompt", 0, r"config.eval.samples_per_prompt must be > 0"),
    ("eval.every", -1, r"config.eval.every must be >= 0"),
    ("eval.temperature", -0.5, r"config.eval.temperature must be >= 0"),
    ("anchor.probe_steps", 0, r"config.anchor.probe_steps must be > 0"),
    ("anchor.probe_steps", -3, r"config.anchor.probe_steps must be > 0"),
    ("anchor.probe_batch_prompts", 0, r"config.anchor.probe_batch_prompts must be > 0"),
    ("anchor.held_out_prompts", -1, r"config.anchor.held_out_prompts must be > 0"),
    ("anchor.samples_per_prompt", 0, r"config.anchor.samples_per_prompt must be > 0"),
    ("anchor.lam", -1.0, r"config.anchor.lam must be >= 0"),
    ("anchor.lam", math.nan, r"config.anchor.lam must be a finite number"),
    ("rollout.top_p", 0.0, r"config.rollout.top_p must be in \(0, 1\]"),
    ("rollout.top_p", 1.5, r"config.rollout.top_p must be in \(0, 1\]"),
    ("rollout.top_k", -1, r"config.rollout.top_k must be >= 0"),
    ("rollout.engine", "paged", r"config.rollout.engine='paged' is not valid"),
    ("rollout.slots", -1, r"config.rollout.slots must be >= 0"),
    ("rollout.temperature", math.inf, r"config.rollout.temperature must be a finite number"),
    ("optim.num_micro_batches", 0, r"config.optim.num_micro_batches must be > 0"),
    ("optim.num_micro_batches", 3, r"config.optim.num_micro_batches=3 must divide the rollout "
                                   r"rows data.batch_prompts x rollout.group_size = \d+"),
    ("optim.lr", -1e-6, r"config.optim.lr must be > 0"),
    ("optim.lr", math.nan, r"config.optim.lr must be a finite number"),
    ("optim.b1", 1.0, r"config.optim.b1 must be in \[0, 1\)"),
    ("optim.b2", -0.1, r"config.optim.b2 must be in \[0, 1\)"),
    ("optim.adam_eps", 0.0, r"config.optim.adam_eps must be > 0"),
    ("optim.warmup_steps", -1, r"config.optim.warmup_steps must be >= 0"),
    ("optim.weight_decay", -0.1, r"config.optim.weight_decay must be >= 0"),
    ("optim.max_grad_norm", 0.0, r"config.optim.max_grad_norm must be > 0"),
    ("optim.vf_clip", -1.0, r"config.optim.vf_clip must be > 0"),
    ("optim.value_lr", 0.0, r"config.optim.value_lr must be > 0"),
    ("optim.loss.kl_coef", math.nan, r"config.optim.loss.kl_coef must be a finite number"),
    ("optim.loss.kl_coef", -1.0, r"config.optim.loss.kl_coef must be >= 0"),
    ("optim.loss.eps_low", 1.0, r"config.optim.loss.eps_low must be in \[0, 1\)"),
    ("optim.loss.eps_high", -0.2, r"config.optim.loss.eps_high must be >= 0"),
    ("optim.loss.entropy_coef", -0.01, r"config.optim.loss.entropy_coef must be >= 0"),
    ("optim.loss.tis_cap", math.nan, r"config.optim.loss.tis_cap must be a finite number"),
    ("rewards.timeout_s", math.inf, r"config.rewards.timeout_s must be a finite number"),
    ("rewards.not_applicable_patience", 0, r"config.rewards.not_applicable_patience must be > 0"),
    ("rewards.not_applicable_patience", 2.5, r"config.rewards.not_applicable_patience must be an "
                                             r"int"),
    ("rewards.primary", 0.5, r"config.rewards.primary must be an int"),
    ("rewards.worker_max_calls", 0, r"config.rewards.worker_max_calls must be > 0"),
    ("rewards.worker_memory_bytes", 1 << 20, r"config.rewards.worker_memory_bytes must be >= "
                                             r"67108864, got 1048576"),
    ("rewards.worker_memory_bytes", 2.5e9, r"config.rewards.worker_memory_bytes must be an int"),
    ("mesh.data", 0, r"config.mesh sizes must be positive ints"),
    ("mesh.fsdp", -1, r"config.mesh sizes must be positive ints, one of them may be -1"),
    ("total_steps", 2.7, r"config.total_steps must be an int"),
    ("seed", "0", r"config.seed must be an int"),
    ("log_every", 0, r"config.log_every must be > 0"),
    ("data.batch_prompts", 0, r"config.data.batch_prompts must be > 0"),
    ("data.template", "amrp_maths", r"config.data.template='amrp_maths' is not valid"),
    ("data.style", "chatty", r"config.data.style='chatty' is not valid"),
    ("model.path", 5, r"config.model.path must be a str"),
    ("model.moe_impl", "sparse", r"config.model.moe_impl='sparse' is not valid"),
])
def test_out_of_range_fields_fail_naming_the_field(field, value, needle):
  c = _demo_config()
  _set(c, field, value)
  with pytest.raises(ValueError, match=needle):
    settings_lib.from_config(c)


def test_advantage_gae_parameters_are_range_checked():
  c = _demo_config()
  c.advantage.name = "ppo"
  c.advantage.gamma = 1.5
  with pytest.raises(ValueError, match=r"config.advantage.gamma must be in \[0, 1\]"):
    settings_lib.from_config(c)


@pytest.mark.parametrize("w", [[1.0, -1.0], [0.0, 0.0]])
def test_negative_or_all_zero_static_weights_fail(w):
  c = _demo_config()
  c.rewards.channels = "arith_acc,arith_brief"
  c.aggregator.name = "weighted"
  c.aggregator.hp = {"w": w}
  with pytest.raises(ValueError, match=r"`w` must be finite, non-negative and not all zero"):
    settings_lib.from_config(c)


def _leaves(node, prefix=""):
  for k, v in node.items():
    if hasattr(v, "items"):
      if f"{prefix}{k}" not in settings_lib.FREE_FORM:
        yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def test_every_field_is_checked():
  """Each field of `default_config()` set to a value of the wrong kind fails naming it: a
  number field NaN (int fields want ints, float fields finite numbers), a str field 5, a bool
  field the string 'yes'."""
  unchecked = []
  for field, default in _leaves(settings_lib.default_config()):
    if isinstance(default, bool):
      bad = "yes"
    elif isinstance(default, str):
      bad = 5
    else:  # numbers, and the optional (None) ones
      bad = math.nan
    c = _demo_config()
    _set(c, field, bad)
    try:
      settings_lib.from_config(c)
    except (ValueError, TypeError) as e:
      if field.rsplit(".", 1)[-1] not in str(e):
        unchecked.append(f"{field}: {e}")
    else:
      unchecked.append(f"{field}={bad!r} accepted")
  assert not unchecked, "\n".join(unchecked)


def test_an_unknown_field_names_the_fields_of_its_section():
  c = _demo_config()
  c.optim.loss.cliprange = 0.2
  with pytest.raises(ValueError, match=r"^config.optim.loss.cliprange is not a field: "
                                       r"config.optim.loss has the fields \['entropy_coef', "
                                       r"'eps_high', 'eps_low', "):
    settings_lib.from_config(c)
  c = _demo_config()
  c.total_step = 5
  with pytest.raises(ValueError, match=r"^config.total_step is not a field: config has the "
                                       r"fields \[.*'total_steps'"):
    settings_lib.from_config(c)
  with pytest.raises(ValueError, match=r"config.rewards.params has no key 'brief' .*give the "
                                       r"whole section"):
    settings_lib.check_field_path(_demo_config(), "rewards.params.brief.threshold")
  settings_lib.check_field_path(_demo_config(), "optim.loss.kl_coef")


def _main(*args):
  return subprocess.run([sys.executable, "-m", "mr_rl.main", f"--config={DEMO_CONFIG}:smoke",
                         "--dry_run", *args], capture_output=True, text=True, cwd=ROOT,
                        timeout=300, env={**os.environ, "PYTHONPATH": ROOT})


def test_dry_run_catches_bad_and_unknown_fields():
  p = _main("--config.optim.loss.cliprange=0.2")
  assert p.returncode == 1, p.stderr
  assert p.stderr.strip().splitlines()[-1] == (
      "FATAL Flags parsing error: --config.optim.loss.cliprange: config.optim.loss has no field "
      "'cliprange'; its fields are ['entropy_coef', 'eps_high', 'eps_low', 'kl_coef', "
      "'kl_estimator', 'loss_agg', 'recompute_old_logp', 'tis_cap']")
  p = _main("--config.eval.num_prompts=-4")  # one line, no stack to read through
  assert p.returncode == 1
  assert p.stderr.strip() == "FATAL ConfigError: config.eval.num_prompts must be > 0, got -4", \
      p.stderr
  p = _main("--config.rollout.top_p=1.5")
  assert p.returncode == 1 and "config.rollout.top_p must be in (0, 1]" in p.stderr
  p = _main("--config.rollout.top_p=1.5", "--verbosity=1")  # the stack, when asked for
  assert p.returncode == 1 and "Traceback" in p.stderr and "ConfigError" in p.stderr


def test_help_lists_the_config_fields_and_exits_0():
  p = _main("--help")
  assert p.returncode == 0, p.stderr
  assert "  --workdir: " in p.stdout and "  --[no]break_lock: " in p.stdout, p.stdout[:3000]
  assert "\n  --config.optim.lr=" in p.stdout and "\n  --config.rollout.group_size=" in p.stdout
  lines = p.stdout.splitlines()  # each declared field with its help line under it
  for field in ("optim.lr", "rollout.group_size", "rollout.slots", "resume.allow_data_change"):
    at = next(i for i, line in enumerate(lines) if line.startswith(f"  --config.{field}="))
    assert lines[at + 1].startswith("      ") and len(lines[at + 1].strip()) > 5, lines[at:at + 2]
  p = subprocess.run([sys.executable, "-m", "mr_rl.main", "--help"], capture_output=True,
                     text=True, cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
  assert p.returncode == 0 and "Give --config=FILE[:ARG] with --help" in p.stdout, p.stderr


# ------------------------------------------------------- declarations, config names, aliases
V1_DEFAULTS = os.path.join(ROOT, "tests", "settings_default_config_v1.json")


def _renamed(old: dict) -> dict:
  """A config dict under the deprecated names (`settings_lib.ALIASES`) with them moved."""
  import copy
  new = copy.deepcopy(old)
  for path in sorted(settings_lib.ALIASES, key=len, reverse=True):
    parent, _, name = path.rpartition(".")
    node = new[parent] if parent else new
    if name not in node:
      continue
    value = node.pop(name)
    for sub, v in (value.items() if isinstance(value, dict) else [("", value)]):
      *sections, leaf = settings_lib.resolve_alias(f"{path}.{sub}" if sub else path).split(".")
      target = new
      for s in sections:
        target = target.setdefault(s, {})
      target[leaf] = v
  return new


def test_the_default_config_is_derived_from_the_declarations_with_the_same_values():
  """`default_config()` (generated from the sections' declared fields) holds the values the
  hand-written one held before (tests/settings_default_config_v1.json), under the settings'
  names; the deprecated sections are there, empty, so old config files still load."""
  import json
  got = settings_lib.default_config().to_dict()
  for old in settings_lib.ALIASES:
    if "." not in old:
      assert got.pop(old) == {}
  # Sections declared after v1; off by default (a run without them is what v1 ran).
  multiturn = got.pop("multiturn")
  assert multiturn["env"] == "" and multiturn["tools"] == ""
  assert got == _renamed(json.load(open(V1_DEFAULTS)))
  assert got["optim"]["pack"] is False and got["optim"]["loss"]["recompute_old_logp"] == "auto"
  assert got["asynchrony"] == {"max_staleness": 0, "sampler_devices": 0}


def test_config_names_are_settings_names():
  """Each declared section and field of the config is the settings attribute of the same
  name, except `optim` (ConfigDict reserves `update`), the `advantage` section and the rollout
  engines' own options (`config.rollout.<option>` -> `rollout.engine_options[<option>]`)."""
  from mr_rl import rollout_engines
  s = settings_lib.from_config(_demo_config())
  c = settings_lib.default_config()
  for section in ("model", "data", "rollout", "rewards", "aggregator", "anchor", "eval",
                  "logging", "export", "batch", "dynamic", "asynchrony", "compile", "resume"):
    own = set(vars(getattr(s, section)))
    if section == "rollout":
      own |= set(s.rollout.engine_options)
      assert set(s.rollout.engine_options) == set(rollout_engines.config_defaults())
    assert set(c[section]) <= own, section
  assert set(c.optim) - {"loss"} <= set(vars(s.update)) and set(c.optim.loss) <= set(
      vars(s.update.loss))


def test_old_config_names_still_work_with_a_warning(caplog):
  """A config file (or copy) that sets fields under their old names resolves to the same
  settings as one using the names now, with a one-line deprecation warning each; the same field
  set under both names, differently, is an error."""
  new, old = _demo_config(), _demo_config()
  for c, names in ((new, ("optim.loss", "optim.pack", "batch", "dynamic", "asynchrony")),
                   (old, ("loss", "update_batch.pack", "update_batch", "dynamic_sampling",
                          "rollout"))):
    for field, value in zip(
        (f"{names[0]}.tis_cap", names[1], f"{names[2]}.mask_truncated", f"{names[3]}.mode",
         f"{names[4]}.max_staleness"), (2.0, True, True, "refill", 1)):
      *sections, name = field.split(".")
      node = c
      for part in sections:
        node = node[part]
      node[name] = value
  with caplog.at_level("WARNING", logger="mr_rl.settings"):
    assert settings_lib.from_config(old) == settings_lib.from_config(new)
  warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
  assert "config.loss.tis_cap is deprecated: it is config.optim.loss.tis_cap now (same value)" \
      in warned and len(warned) == 5, warned
  s = settings_lib.from_config(old)
  assert (s.update.loss.tis_cap, s.update.pack, s.batch.mask_truncated, s.dynamic.mode,
          s.asynchrony.max_staleness) == (2.0, True, True, "refill", 1)
  c = _demo_config()
  c.optim.loss.kl_coef, c.loss.kl_coef = 0.5, 0.1
  with pytest.raises(ValueError, match=r"config.loss.kl_coef \(deprecated\) and "
                                       r"config.optim.loss.kl_coef are both set"):
    settings_lib.from_config(c)


def test_old_config_names_work_on_the_command_line():
  p = _main("--config.loss.kl_coef=0.25", "--config.update_batch.column_buckets=2")
  assert p.returncode == 0, p.stderr
  assert ("WARNING --config.loss.kl_coef is deprecated: it is config.optim.loss.kl_coef now"
          in p.stderr), p.stderr
  assert '"kl_coef": 0.25' in p.stdout and '"column_buckets": 2' in p.stdout
