"""Validated, frozen run settings built from an ml_collections ConfigDict (docs/style.md §3).

The config file is the user's surface; everything downstream reads these dataclasses. Each
field carries its paper symbol where it has one. Bad values fail here, at start-up, with a
message naming the field and, for names, listing the valid choices.

Defaults live in one place: `default_config()` (every config file starts from it). The
dataclasses below have no defaults of their own; the loss and optimiser defaults are those of
`mr_rl.rl.losses.PolicyLossConfig` and `mr_rl.rl.update.UpdateConfig`, which
`default_config()` copies. Names are checked against their registries (aggregators, advantage
estimators, reward channels, data sets, pipelines) after the run's `config.plugins` modules
are imported, so a plugin's names validate like the built-in ones.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from typing import Any, Mapping

from mr_rl import aggregators, rollout_engines
from mr_rl.errors import ConfigError
from mr_rl.registry import PIPELINES, import_plugins, setup_hooks
from mr_rl.rl import advantages as adv_lib
from mr_rl.rl import dynamic_sampling
from mr_rl.rl.losses import PolicyLossConfig
from mr_rl.rl.update import UpdateConfig
from mr_rl.async_rl import AsyncSettings
from mr_rl.rollout import SamplingSettings



def _registered(registry) -> tuple[str, ...]:
  """A registry's names and aliases, read now (after the run's plugins registered theirs)."""
  return registry.names() + tuple(registry.aliases())


def _choice(field: str, value: str, valid) -> str:
  if value not in valid:
    raise ValueError(f"config.{field}={value!r} is not valid; choose one of {sorted(valid)}")
  return value


def _positive(field: str, value, allow_zero: bool = False):
  ok = value >= 0 if allow_zero else value > 0
  if not ok:
    raise ValueError(f"config.{field} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
  return value


def _at_least(field: str, value, lo):
  if value < lo:
    raise ValueError(f"config.{field} must be >= {lo}, got {value!r}")
  return value


def _int(field: str, value) -> int:
  if isinstance(value, bool) or not isinstance(value, int):
    raise ValueError(f"config.{field} must be an int, got {value!r}")
  return value


def _float(field: str, value) -> float:
  """A finite number (ints accepted) as a float."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    raise ValueError(f"config.{field} must be a finite number, got {value!r}")
  return float(value)


def _count(field: str, value, allow_zero: bool = False) -> int:
  """An int > 0 (>= 0 with `allow_zero`)."""
  return _positive(field, _int(field, value), allow_zero)


def _in(field: str, value: float, lo: float, hi: float, lo_open: bool = False,
        hi_open: bool = False) -> float:
  """A finite number in [lo, hi] (open ends where asked)."""
  value = _float(field, value)
  if (value < lo or (lo_open and value == lo)) or (value > hi or (hi_open and value == hi)):
    raise ValueError(f"config.{field} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}"
                     f"{')' if hi_open else ']'}, got {value!r}")
  return value


def _lora(lc, preset: str, advantage: str):
  """`config.model.lora` as a `mr_rl.models.lora.LoraConfig`, or None with rank 0 (every field
  checked either way)."""
  from mr_rl.models import lora as lora_lib
  rank = _count("model.lora.rank", lc.rank, True)
  alpha = _positive("model.lora.alpha", _float("model.lora.alpha", lc.alpha))
  dropout = _in("model.lora.dropout", lc.dropout, 0.0, 1.0, hi_open=True)
  for name in ("targets", "init_from"):
    if not isinstance(lc[name], str):
      raise ValueError(f"config.model.lora.{name} must be a str, got {lc[name]!r}")
  targets = tuple(t.strip() for t in lc.targets.split(",") if t.strip())
  if not targets:
    raise ValueError("config.model.lora.targets names no kernel")
  if lc.init_from and not os.path.isfile(os.path.join(lc.init_from, "adapter_config.json")):
    raise ValueError(f"config.model.lora.init_from={lc.init_from!r} is not a PEFT adapter "
                     "directory (no adapter_config.json)")
  if rank == 0:
    return None
  cfg = lora_lib.LoraConfig(rank=rank, alpha=alpha, targets=targets, init_from=lc.init_from,
                            dropout=dropout)
  if preset in _presets():
    try:
      lora_lib.target_paths(_presets()[preset], cfg)
    except ValueError as e:
      raise ValueError(f"config.model.lora.targets: {e}") from e
  return cfg


def _presets():
  from mr_rl import models
  return models.PRESETS


def _optional_positive(field: str, value) -> float | None:
  return None if value is None else _positive(field, _float(field, value))


# Sections whose keys are free-form (loader options, per-channel parameters, aggregator and
# estimator hyperparameters): checked by what consumes them, not against `default_config()`.
FREE_FORM = ("data.options", "data.eval_set_options", "rewards.params", "aggregator.hp",
             "advantage")


def _is_section(x) -> bool:
  return hasattr(x, "items") and not isinstance(x, str)


def check_field_path(config, path: str) -> None:
  """Raises ValueError when the dotted `path` (e.g. 'loss.cliprange') is not a field of
  `config`, naming the missing part and the valid fields of its section."""
  node, done, free = config, [], None
  for part in path.split("."):
    free = free or next((f for f in FREE_FORM if ".".join(done) == f), None)
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


def _check_strings(c) -> None:
  for field in ("plugins", "setup", "model.path", "model.preset", "data.name", "data.path", "data.split",
                "data.eval_split", "data.template", "data.eval_sets", "logging.wandb_project",
                "logging.wandb_entity", "logging.wandb_name", "logging.wandb_mode"):
    node = c
    for part in field.split("."):
      node = node[part]
    if not isinstance(node, str):
      raise ValueError(f"config.{field} must be a str, got {node!r}")


def _check_known_fields(c) -> None:
  """Every field of `c` must be a field of `default_config()` (free-form sections aside); a
  plugin may add top-level sections of its own (the demo's `config.demo`)."""
  ref = default_config()

  def walk(node, ref_node, prefix):
    for key in node.keys():
      path = f"{prefix}{key}"
      if path in FREE_FORM:
        continue
      if key not in ref_node:
        if not prefix and _is_section(node[key]):
          continue  # a plugin's own section
        where = f"config.{prefix[:-1]}" if prefix else "config"
        raise ValueError(f"config.{path} is not a field: {where} has the fields "
                         f"{sorted(ref_node.keys())}")
      if _is_section(ref_node[key]):
        if not _is_section(node[key]):
          raise ValueError(f"config.{path} must be a section with the fields "
                           f"{sorted(ref_node[key].keys())}, got {node[key]!r}")
        walk(node[key], ref_node[key], path + ".")

  walk(c, ref, "")


def _mesh(m) -> dict[str, int]:
  mesh = {k: _int(f"mesh.{k}", m[k]) for k in ("data", "fsdp", "tensor", "expert")}
  if any(v == 0 or v < -1 for v in mesh.values()) or list(mesh.values()).count(-1) > 1:
    raise ValueError(f"config.mesh sizes must be positive ints, one of them may be -1 (fills "
                     f"the remaining devices), got {mesh}")
  return mesh


def _eval_sets(d) -> tuple[tuple[str, ...], dict]:
  """config.data.eval_sets (comma-separated registry names) and their per-set loader options."""
  from mr_rl import data as data_lib
  names = tuple(n.strip() for n in str(d.eval_sets).split(",") if n.strip())
  for n in names:
    _choice("data.eval_sets", n, _registered(data_lib.DATASETS))
  if len(set(names)) != len(names):
    raise ValueError(f"config.data.eval_sets has duplicates: {names}")
  opts = _as_dict(d.get("eval_set_options"))
  for n, o in opts.items():
    if n not in names:
      raise ValueError(f"config.data.eval_set_options names {n!r}, which is not among "
                       f"config.data.eval_sets {names}")
    if not isinstance(o, dict):
      raise ValueError(f"config.data.eval_set_options.{n} must be a mapping of loader options, "
                       f"got {o!r}")
    bad = sorted(set(o) - {"path", "split"} - set(data_lib.options(n)))
    if bad:
      raise ValueError(f"config.data.eval_set_options.{n} has unknown option(s) {bad}; valid: "
                       f"{['path', 'split', *data_lib.options(n)]}")
  return names, opts


def _logging(c) -> LoggingSettings:
  """config.logging; a W&B project needs the `wandb` package (the `wandb` extra)."""
  out = LoggingSettings(wandb_project=str(c.wandb_project), wandb_entity=str(c.wandb_entity),
                        wandb_name=str(c.wandb_name), wandb_mode=str(c.wandb_mode))
  _choice("logging.wandb_mode", out.wandb_mode, ("", "online", "offline", "disabled"))
  if out.wandb_project:
    import importlib.util
    if importlib.util.find_spec("wandb") is None:
      raise ValueError(f"config.logging.wandb_project={out.wandb_project!r} needs the wandb "
                       "package: pip install -e '.[wandb]' (or unset the field)")
  return out


def _export(c) -> ExportSettings:
  if not isinstance(c.hf_at_end, bool):
    raise ValueError(f"config.export.hf_at_end must be True or False, got {c.hf_at_end!r}")
  return ExportSettings(hf_at_end=c.hf_at_end)


def _as_dict(x) -> dict:
  if x is None:
    return {}
  return {k: _as_dict(v) if hasattr(v, "to_dict") or isinstance(v, Mapping) else v
          for k, v in (x.to_dict() if hasattr(x, "to_dict") else dict(x)).items()}


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  path: str                # HF checkpoint directory or hub id (loaded with load_pretrained)
  preset: str              # or a named preset with random init (tests, dry runs)
  dtype: str               # parameter (and optimizer master weight) dtype
  lora: Any = None         # a mr_rl.models.lora.LoraConfig (adapters on the frozen base) or None
  moe_impl: str = "ragged"  # MoE dispatch, ModelConfig.moe_impl: 'ragged' | 'dense' | 'ep'
  remat: bool = False      # recompute each decoder block in the backward (ModelConfig.remat)
  compute_dtype: str = ""  # matmul / activation dtype ('' = dtype); norms, softmax, logits and
                           # losses stay float32 (ModelConfig.dtype)
  attention_impl: str = "auto"  # ModelConfig.attention_impl (mr_rl.models.attention)

  @property
  def compute(self) -> str:
    """The learner's compute dtype (`compute_dtype`, or `dtype` when empty)."""
    return self.compute_dtype or self.dtype


@dataclasses.dataclass(frozen=True)
class DataSettings:
  name: str                # a mr_rl.data registry name (plugins add their own)
  path: str                # local copy of the data set ('' = hub id)
  split: str
  eval_split: str
  batch_prompts: int       # B, prompts per step (rollout batch = B * G)
  max_prompt_len: int
  template: str            # prompt template task ('' = the data set's own prompt)
  options: Mapping[str, Any]
  # Benchmark sets evaluated instead of `eval_split` (AMRP Table 1: math500, amc, aime), each
  # loaded with mr_rl.data.load_dataset at its default split; per-set loader options
  # (`path` for a local copy, `split`, loader options) in eval_set_options[name].
  eval_sets: tuple[str, ...]
  eval_set_options: Mapping[str, Mapping[str, Any]]
  skip_long_prompts: bool  # drop prompts over max_prompt_len at load (False: error)


@dataclasses.dataclass(frozen=True)
class RewardSettings:
  channels: tuple[str, ...]                # K channel names, primary first by convention
  specs: tuple[str, ...]                   # what builds each: a registered name or an import
                                           # path 'pkg.mod:fn' (its channel name is 'fn')
  primary: int                             # index of the task channel (alarm, reports)
  params: Mapping[str, Mapping[str, Any]]  # per-channel parameters, keyed by channel name
  timeout_s: float                         # per-call wall-clock budget
  max_failure_share: float                 # the failure-rate guard: a channel failing on more
  failure_patience: int                    # than this share of a batch this many runner calls
                                           # in a row stops the run
  not_applicable_patience: int             # a channel that scores no response this many
                                           # runner calls in a row stops the run
  worker_max_calls: int                    # a reward worker process is replaced after this
                                           # many calls
  worker_memory_bytes: int                 # data-size cap of each reward worker (a call past
                                           # it fails; above half of it a worker is replaced)


@dataclasses.dataclass(frozen=True)
class AggregatorSettings:
  name: str
  hp: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class AnchorSettings:
  probe_steps: int              # single-channel GRPO steps per probe (the TAG paper's T)
  probe_batch_prompts: int      # prompts per probe step
  held_out_prompts: int         # prompts on which drift is measured
  samples_per_prompt: int
  lam: float                    # TAG gate lambda of the joint run after election


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  every: int                    # evaluate every N steps (0 = only at the end, by a pipeline)
  num_prompts: int
  samples_per_prompt: int
  temperature: float            # 0 = greedy


@dataclasses.dataclass(frozen=True)
class LoggingSettings:
  """Where the per-step metrics go besides WORKDIR/metrics.jsonl and TensorBoard."""
  wandb_project: str            # Weights & Biases project ('' = W&B off)
  wandb_entity: str             # W&B team or user ('' = the account's default)
  wandb_name: str               # W&B run name ('' = the workdir's base name)
  wandb_mode: str               # 'online' | 'offline' | 'disabled' ('' = WANDB_MODE or online)


@dataclasses.dataclass(frozen=True)
class ExportSettings:
  hf_at_end: bool               # write WORKDIR/hf/ (a transformers checkpoint) after training


def _compile(c) -> "CompileSettings":
  if not isinstance(c.cache_dir, str):
    raise ValueError(f"config.compile.cache_dir must be a directory, '' or 'off', got "
                     f"{c.cache_dir!r}")
  if not isinstance(c.warmup, bool):
    raise ValueError(f"config.compile.warmup must be True or False, got {c.warmup!r}")
  return CompileSettings(cache_dir=c.cache_dir, warmup=c.warmup)


@dataclasses.dataclass(frozen=True)
class CompileSettings:
  cache_dir: str                # jax's persistent compilation cache ('' = the default, 'off')
  warmup: bool                  # compile every predicted learner / rollout program before step 0

  @property
  def cache(self) -> str:
    """The cache directory to use, or '' when off."""
    from mr_rl import compilation
    if self.cache_dir == "off":
      return ""
    return self.cache_dir or compilation.default_cache_dir()


@dataclasses.dataclass(frozen=True)
class ResumeSettings:
  allow_data_change: bool = False  # resume over training rows whose fingerprint differs from
                                   # the checkpoint's (mr_rl.data.fingerprint; logged)


@dataclasses.dataclass(frozen=True)
class BatchSettings:
  trim_columns: bool            # update batch cut to the columns in use (rollout.update_batch)
  mask_truncated: bool          # DAPO overlong filtering: truncated responses enter no loss
  column_buckets: int = 0       # 0: the fine width grid; n: n response widths, whole prompt
                                # (mr_rl.rl.batch.make_batch; n programs per learner program)


@dataclasses.dataclass(frozen=True)
class DynamicSamplingSettings:
  mode: str                     # 'off' | 'refill' | 'shrink' (mr_rl.rl.dynamic_sampling)
  signal: str                   # 'scalar' | 'channels' (resolved from 'auto')
  max_rounds: int               # refill: extra sampling rounds per step at most


@dataclasses.dataclass(frozen=True)
class RunSettings:
  seed: int
  pipeline: str
  total_steps: int
  checkpoint_every: int
  log_every: int
  alarm_window: int
  kl_ref_every: int  # kl_ref/* metrics every N steps (0 = never unless kl_coef > 0)
  model: ModelSettings
  mesh: Mapping[str, int]
  data: DataSettings
  rollout: SamplingSettings
  rewards: RewardSettings
  aggregator: AggregatorSettings
  advantage: str
  advantage_hp: Mapping[str, Any]
  update: UpdateConfig
  anchor: AnchorSettings
  eval: EvalSettings
  logging: LoggingSettings
  export: ExportSettings
  batch: BatchSettings
  dynamic: DynamicSamplingSettings
  asynchrony: AsyncSettings = AsyncSettings()  # rollout.max_staleness / sampler_devices
  compile: CompileSettings = CompileSettings("", False)  # config.compile
  resume: ResumeSettings = ResumeSettings()  # config.resume

  @property
  def num_channels(self) -> int:
    return len(self.rewards.channels)


def default_config():
  """The full field set with defaults; every config file starts from this and overrides.

  The one place for run defaults; the loss and optimiser values are copied from the
  defaults of `PolicyLossConfig` and `UpdateConfig`, the library dataclasses they build.
  """
  import ml_collections
  L, U = PolicyLossConfig(), UpdateConfig()
  c = ml_collections.ConfigDict()
  c.seed = 0                      # root PRNG seed; steps use fold_in(key, step)
  c.plugins = ""                  # comma-separated modules imported first; they register
                                  # data sets, reward channels or pipelines (e.g. mr_rl.demo)
  c.setup = ""                    # comma-separated 'module:function' hooks called with the
                                  # config when a run starts (not by --dry_run): runlocal's
                                  # tiny assets are built there
  c.pipeline = "train"            # 'train' | 'tag' (probe, elect anchor, train TAG) | a plugin's
  c.total_steps = 500             # GRPO steps (papers: 500)
  c.checkpoint_every = 50         # orbax checkpoint interval in steps (0 = never)
  c.log_every = 1                 # console line interval
  c.kl_ref_every = 1              # reference forward for the kl_ref/k1,k3 metrics every N steps
                                  # (0 = never; with loss.kl_coef > 0 it runs every step anyway)
  c.alarm_window = 10             # steps over which the shortcut alarm compares trends
  c.model = ml_collections.ConfigDict(dict(
      path="",                    # HF checkpoint dir or hub id
      preset="",                  # or a preset name with random init
      dtype="float32",            # parameter / optimizer master-weight dtype: 'float32' | 'bfloat16'
      compute_dtype="",           # matmuls and activations ('' = dtype; 'bfloat16' over float32
                                  # params is mixed precision; norms, softmax, log-probs and
                                  # losses stay float32)
      attention_impl="auto",      # self-attention kernel: auto (by backend) | reference |
                                  # blockwise | cudnn | pallas_gpu | pallas_tpu
      moe_impl="ragged",          # MoE models: 'ragged' | 'dense' | 'ep' (expert-parallel
                                  # all_to_all dispatch; mr_rl/models/moe.py)
      remat=False,                # recompute each decoder block in the backward pass: the
                                  # policy step keeps one block's activations, not every layer's
      lora=ml_collections.ConfigDict(dict(  # LoRA RL (mr_rl.models.lora); rank 0 = off
          rank=0,                 # R, adapter rank (0 = full fine-tuning)
          alpha=16.0,             # the update is scaled by alpha / R (PEFT's lora_alpha)
          dropout=0.0,            # PEFT's lora_dropout p, in the learner's forward only
          targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",  # kernel names
                                  # or path patterns ('layers_1/attn/*'); not MoE experts
          init_from=""))))        # a PEFT adapter directory to start from ('' = fresh)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))  # -1 fills
  c.data = ml_collections.ConfigDict(dict(
      name="",                    # a mr_rl.data registry name (required)
      path="",                    # local copy ('' = hub id)
      split="train",              # training split
      eval_split="test",          # held-out split (final eval, TAG's drift prompts)
      batch_prompts=32,           # B prompts per step; rollout batch = B * G (papers: 256)
      max_prompt_len=512,         # prompts are left-padded to this (longer ones are an error)
      template="",                # prompt template task for mr_rl.data.make_template
      options=ml_collections.ConfigDict(),  # loader options (thresholds, subset sizes)
      eval_sets="",               # comma-separated benchmark sets evaluated instead of eval_split
      eval_set_options=ml_collections.ConfigDict(),  # {set: {path=..., split=..., options}}
      skip_long_prompts=False))   # drop (and log) prompts over max_prompt_len instead of failing
  c.rollout = ml_collections.ConfigDict(dict(
      group_size=8,               # G (papers: 8)
      max_new_tokens=3000,        # max response length
      temperature=1.0,            # training rollouts at temperature 1
      top_k=0,                    # 0 = off
      top_p=1.0,                  # 1.0 = off
      dtype="",                   # sampler compute dtype ('' = the learner's, model.compute_dtype
                                  # or model.dtype; e.g. 'bfloat16')
      cache_dtype="",             # sampler KV-cache dtype ('' = the sampler's compute dtype)
      engine=rollout_engines.DEFAULT,  # a mr_rl.rollout_engines name: 'static' (one batch of
                                  # B*G rows) | 'continuous' (slot pool)
      **rollout_engines.config_defaults(),  # the engines' own options (EngineSpec.options):
                                  # continuous: slots, its decode slots (0 = one per row)
      max_staleness=0,            # s: groups sampled up to s updates ago (0 = synchronous)
      sampler_devices=0))         # devices for the sampler, the rest learn (0 = share all)
  c.compile = ml_collections.ConfigDict(dict(
      cache_dir="",               # jax's persistent compilation cache: '' = $MR_RL_CACHE/xla
                                  # (~/.cache/mr_rl/xla), a directory, or 'off'; a restarted or
                                  # resumed run loads its programs instead of compiling them
      warmup=False))              # compile every program the settings predict (learner widths,
                                  # prompt buckets) before step 0 (mr_rl.program_plan)
  c.resume = ml_collections.ConfigDict(dict(
      allow_data_change=False))   # resume although the training rows differ from the
                                  # checkpoint's (their fingerprint; logged): else refused
  c.update_batch = ml_collections.ConfigDict(dict(
      trim_columns=True,          # update / reference / critic over the columns in use (bucketed)
      column_buckets=0,           # with trim_columns: 0 = the fine width grid (least padding,
                                  # O(log^2) shapes); n = the whole prompt and n response widths
                                  # (n compiled learner programs: accelerator runs)
      pack=U.pack,                # several sequences per row (segment ids); GRPO family only
      mask_truncated=False))      # DAPO overlong filtering: truncated responses enter no loss
  c.dynamic_sampling = ml_collections.ConfigDict(dict(
      mode="off",                 # DAPO: off | refill (over-sample to B groups) | shrink
      signal="auto",              # what keeps a group: auto | scalar (R) | channels (any r_k)
      max_rounds=4))              # refill: at most this many extra sampling rounds per step
  c.rewards = ml_collections.ConfigDict(dict(
      channels="accuracy",        # comma-separated reward names or import paths 'pkg.mod:fn'
                                  # (K channels; an import path's channel is named 'fn')
      primary=0,                  # index of the task channel
      params=ml_collections.ConfigDict(),  # per-channel parameters by channel name, e.g.
                                  # {'brief': {'threshold': 200}}; any channel takes
                                  # applies ('pkg.mod:fn', fn(example) -> bool: the prompts
                                  # it scores), import paths also kind ('thread' | 'process'),
                                  # on_failure, batched, value_range
      timeout_s=10.0,             # per-call reward timeout (a timeout scores on_failure)
      max_failure_share=0.5,      # failure-rate guard: a channel failing on more than this
      failure_patience=3,         # share of a batch for this many calls in a row stops the run
      not_applicable_patience=10,  # a channel that scores no response (does not apply, None /
                                  # NaN or failed on each) this many runner calls in a row stops
                                  # the run
      worker_max_calls=1000,      # "process" channels: a worker is replaced after this many calls
      worker_memory_bytes=2 << 30))  # and each worker's data is capped here (a call past it
                                  # fails: on_failure); one above half of it is replaced
  c.aggregator = ml_collections.ConfigDict(dict(
      name="additive",            # a mr_rl.aggregators registry name or alias
      hp=ml_collections.ConfigDict()))  # its hyperparameters (lam, k_s, k_p, ...)
  c.advantage = ml_collections.ConfigDict(dict(
      name="grpo"))               # grpo | dr_grpo | gdpo | mo_grpo | rloo | ppo (ppo also reads
                                  # c.advantage.gamma / lam for GAE; value lr: c.optim.value_lr)
  c.loss = ml_collections.ConfigDict(dict(
      eps_low=L.eps_low,          # clip range [1 - eps_low, 1 + eps_high] (clip-higher)
      eps_high=L.eps_high,
      loss_agg=L.loss_agg,        # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
      kl_coef=L.kl_coef,          # beta of the KL penalty to pi_ref
      kl_estimator=L.kl_estimator,  # k1 | k2 | k3
      entropy_coef=L.entropy_coef,  # entropy bonus weight
      recompute_old_logp="auto",  # pi_old from the training forward: auto (on when the sampler's
                                  # dtype or cache dtype differs from the learner's compute
                                  # dtype) | on | off
      tis_cap=0.0))               # truncated importance sampling cap C of pi_train/pi_sampler
                                  # (0 = off)
  c.optim = ml_collections.ConfigDict(dict(
      lr=U.lr,                    # AdamW learning rate (papers: 1e-6)
      warmup_steps=U.warmup_steps,  # linear warm-up steps (0 = constant)
      weight_decay=U.weight_decay,  # AdamW decoupled weight decay
      b1=U.b1, b2=U.b2,           # Adam betas
      adam_eps=U.adam_eps,        # Adam epsilon
      max_grad_norm=U.max_grad_norm,  # global-norm clip (None = off)
      num_micro_batches=U.num_micro_batches,  # M gradient-accumulation chunks of the B*G rows
      value_lr=U.value_lr,        # PPO critic learning rate
      vf_clip=U.vf_clip))         # PPO value clip range (None = unclipped)
  c.anchor = ml_collections.ConfigDict(dict(
      probe_steps=300,            # single-channel GRPO steps per probe (the TAG paper's T: 300)
      probe_batch_prompts=4,      # prompts per probe step (TAG: rollout batch 32 = 4 x G 8)
      held_out_prompts=256,       # prompts on which drift is measured (TAG: 256)
      samples_per_prompt=1,       # probe responses per held-out prompt
      lam=1.0))                   # TAG gate lambda of the joint run after election
  c.eval = ml_collections.ConfigDict(dict(
      every=0,                    # evaluate every N steps (0 = only at the end of a pipeline)
      num_prompts=256,            # held-out prompts (per eval set)
      samples_per_prompt=4,       # n samples per prompt (pass@k)
      temperature=1.0))           # 0 = greedy (one response per prompt)
  c.logging = ml_collections.ConfigDict(dict(
      wandb_project="",           # Weights & Biases project ('' = off; pip install -e .[wandb])
      wandb_entity="",            # W&B team or user ('' = the account's default)
      wandb_name="",              # W&B run name ('' = the workdir's base name)
      wandb_mode=""))             # online | offline | disabled ('' = WANDB_MODE, else online)
  c.export = ml_collections.ConfigDict(dict(
      hf_at_end=False))           # write WORKDIR/hf/ (transformers / vLLM checkpoint) at the end
  return c


def from_config(cfg) -> RunSettings:
  """Builds and validates RunSettings from a ConfigDict (`default_config()` lists the fields).

  Imports `config.plugins` first, so the names they register are valid. A field that is
  unknown, mistyped or out of range raises `mr_rl.errors.ConfigError` naming it.
  """
  try:
    return _from_config(cfg)
  except ConfigError:
    raise
  except (ValueError, TypeError) as e:  # the checks below name the field in the message
    raise ConfigError(str(e)) from e


def _from_config(cfg) -> RunSettings:
  from mr_rl import data as data_lib
  from mr_rl.rewards import runner as reward_runner

  c = cfg
  _check_known_fields(c)
  _check_strings(c)
  import_plugins(c.get("plugins", ""))
  setup_hooks(c.setup)  # they import and are callable; they run when the run starts
  pipeline = _choice("pipeline", c.pipeline, _registered(PIPELINES))
  specs = tuple(s.strip() for s in str(c.rewards.channels).split(",") if s.strip())
  if not specs:
    raise ValueError("config.rewards.channels is empty; give comma-separated reward names")
  valid_rewards = reward_runner.available_rewards()
  for spec in specs:
    if not reward_runner.is_import_path(spec):
      _choice("rewards.channels", spec, valid_rewards)
  channels = tuple(reward_runner.channel_name(spec) if reward_runner.is_import_path(spec)
                   else spec for spec in specs)
  if len(set(channels)) != len(channels):
    raise ValueError(f"config.rewards.channels has duplicate channel names: {channels}")
  primary = _int("rewards.primary", c.rewards.primary)
  if not 0 <= primary < len(channels):
    raise ValueError(f"config.rewards.primary={primary} is out of range for {len(channels)} "
                     "channels")
  reward_params = _as_dict(c.rewards.get("params"))
  for name in reward_params:
    if name not in channels:
      raise ValueError(f"config.rewards.params names {name!r}, which is not among the channels "
                       f"{channels}")
  for spec, name in zip(specs, channels):
    if reward_runner.is_import_path(spec):  # import, signature and parameters checked now
      reward_runner.get_reward(spec, **reward_params.get(name, {}))
  agg_name = _choice("aggregator.name", c.aggregator.name, _registered(aggregators.AGGREGATORS))
  agg_hp = {k: v for k, v in _as_dict(c.aggregator.get("hp")).items() if v is not None}
  advantage = _choice("advantage.name", c.advantage.name,
                      _registered(adv_lib.ESTIMATORS) + ("ppo",))
  adv_hp = {k: v for k, v in _as_dict(c.advantage).items() if k != "name" and v is not None}
  if advantage == "ppo":
    bad = set(adv_hp) - {"gamma", "lam"}
    if bad:
      raise ValueError(f"config.advantage: PPO takes gamma and lam (GAE), got {sorted(bad)}")
    for k in adv_hp:
      adv_hp[k] = _in(f"advantage.{k}", adv_hp[k], 0.0, 1.0)
  else:
    adv_lib.get_advantage(advantage, **adv_hp)  # unknown hyperparameters fail here

  model_dtype = _choice("model.dtype", c.model.dtype, ("float32", "bfloat16"))
  compute_dtype = _choice("model.compute_dtype", c.model.compute_dtype,
                          ("", "float32", "bfloat16"))
  learner_dtype = compute_dtype or model_dtype
  sample_dtype = _choice("rollout.dtype", c.rollout.dtype, ("", "float32", "bfloat16"))
  cache_dtype = _choice("rollout.cache_dtype", c.rollout.cache_dtype, ("", "float32", "bfloat16"))
  recompute = _choice("loss.recompute_old_logp", c.loss.recompute_old_logp, ("auto", "on", "off"))
  tis_cap = _float("loss.tis_cap", c.loss.tis_cap)
  if tis_cap != 0.0 and tis_cap < 1.0:
    raise ValueError(f"config.loss.tis_cap must be 0 (off) or >= 1, got {tis_cap}")
  if tis_cap and recompute == "off":
    raise ValueError("config.loss.tis_cap needs config.loss.recompute_old_logp 'on' (or 'auto'): "
                     "its weight is pi_train_old / pi_sampler")
  if recompute == "auto":  # on when the sampler computes differently from the training forward
    sampler_dtype = sample_dtype or learner_dtype
    differs = sampler_dtype != learner_dtype or (cache_dtype or sampler_dtype) != learner_dtype
    recompute = "on" if differs or tis_cap else "off"
  from mr_rl.rl import kl as kl_lib, losses as losses_lib
  _choice("loss.loss_agg", c.loss.loss_agg, _registered(losses_lib.LOSS_AGGREGATIONS))
  _choice("loss.kl_estimator", c.loss.kl_estimator, _registered(kl_lib.KL_ESTIMATORS))
  loss = PolicyLossConfig(
      eps_low=_in("loss.eps_low", c.loss.eps_low, 0.0, 1.0, hi_open=True),
      eps_high=_positive("loss.eps_high", _float("loss.eps_high", c.loss.eps_high), True),
      loss_agg=c.loss.loss_agg,
      norm_len=int(c.rollout.max_new_tokens) if c.loss.loss_agg == "seq-mean-token-sum-norm"
      else None,
      kl_coef=_positive("loss.kl_coef", _float("loss.kl_coef", c.loss.kl_coef), True),
      kl_estimator=c.loss.kl_estimator,
      entropy_coef=_positive("loss.entropy_coef", _float("loss.entropy_coef",
                                                         c.loss.entropy_coef), True),
      recompute_old_logp=recompute == "on", tis_cap=tis_cap or None)
  for field in ("update_batch.trim_columns", "update_batch.pack", "update_batch.mask_truncated"):
    section, name = field.split(".")
    if not isinstance(c[section][name], bool):
      raise ValueError(f"config.{field} must be True or False, got {c[section][name]!r}")
  if c.update_batch.pack and advantage == "ppo":
    raise ValueError("config.update_batch.pack is for the GRPO family; PPO's critic and GAE run "
                     "on unpacked rows")
  o = c.optim
  lora = _lora(c.model.lora, c.model.preset, advantage)
  update = UpdateConfig(
      loss=loss, num_micro_batches=_count("optim.num_micro_batches", o.num_micro_batches),
      lr=_positive("optim.lr", _float("optim.lr", o.lr)),
      warmup_steps=_count("optim.warmup_steps", o.warmup_steps, True),
      weight_decay=_positive("optim.weight_decay", _float("optim.weight_decay", o.weight_decay),
                             True),
      b1=_in("optim.b1", o.b1, 0.0, 1.0, hi_open=True),
      b2=_in("optim.b2", o.b2, 0.0, 1.0, hi_open=True),
      adam_eps=_positive("optim.adam_eps", _float("optim.adam_eps", o.adam_eps)),
      value_lr=_positive("optim.value_lr", _float("optim.value_lr", o.value_lr)),
      max_grad_norm=_optional_positive("optim.max_grad_norm", o.max_grad_norm),
      vf_clip=_optional_positive("optim.vf_clip", o.vf_clip), pack=c.update_batch.pack,
      lora=lora)

  from mr_rl.models.attention import IMPLS as ATTENTION_IMPLS
  from mr_rl.models.config import MOE_IMPLS
  if not isinstance(c.model.remat, bool):
    raise ValueError(f"config.model.remat must be True or False, got {c.model.remat!r}")
  model = ModelSettings(path=c.model.path, preset=c.model.preset, dtype=model_dtype,
                        lora=lora, moe_impl=_choice("model.moe_impl", c.model.moe_impl, MOE_IMPLS),
                        remat=c.model.remat, compute_dtype=compute_dtype,
                        attention_impl=_choice("model.attention_impl", c.model.attention_impl,
                                               ATTENTION_IMPLS))
  if bool(model.path) == bool(model.preset):
    raise ValueError("set exactly one of config.model.path (checkpoint) and config.model.preset "
                     f"(random init); got path={model.path!r}, preset={model.preset!r}")
  if model.preset:
    from mr_rl import models
    _choice("model.preset", model.preset, models.PRESETS)

  mesh = _mesh(c.mesh)
  eval_sets, eval_set_options = _eval_sets(c.data)
  if not isinstance(c.resume.allow_data_change, bool):
    raise ValueError("config.resume.allow_data_change must be True or False, got "
                     f"{c.resume.allow_data_change!r}")
  if not isinstance(c.data.skip_long_prompts, bool):
    raise ValueError("config.data.skip_long_prompts must be True or False, got "
                     f"{c.data.skip_long_prompts!r}")
  if c.data.template:
    from mr_rl.data import templates
    _choice("data.template", c.data.template, ("",) + tuple(templates.TASK_INSTRUCTIONS))
    if model.path:  # the style comes from the model (a preset has no tokenizer: build refuses)
      try:
        templates.make_template(c.data.template, model=model.path)
      except ValueError as e:
        raise ValueError(f"config.data.template={c.data.template!r}: {e}") from e
  data = DataSettings(
      name=_choice("data.name", c.data.name, _registered(data_lib.DATASETS)), path=c.data.path,
      split=c.data.split, eval_split=c.data.eval_split,
      batch_prompts=_count("data.batch_prompts", c.data.batch_prompts),
      max_prompt_len=_count("data.max_prompt_len", c.data.max_prompt_len),
      template=c.data.template, options=_as_dict(c.data.get("options")),
      eval_sets=eval_sets, eval_set_options=eval_set_options,
      skip_long_prompts=c.data.skip_long_prompts)
  rollout = SamplingSettings(
      group_size=_count("rollout.group_size", c.rollout.group_size),
      max_new_tokens=_count("rollout.max_new_tokens", c.rollout.max_new_tokens),
      temperature=_positive("rollout.temperature", _float("rollout.temperature",
                                                          c.rollout.temperature), True),
      top_k=_count("rollout.top_k", c.rollout.top_k, True),
      top_p=_in("rollout.top_p", c.rollout.top_p, 0.0, 1.0, lo_open=True), dtype=sample_dtype,
      cache_dtype=cache_dtype,
      engine=_choice("rollout.engine", c.rollout.engine, _registered(rollout_engines.ENGINES)),
      engine_options=rollout_engines.options_from_config(c.rollout))
  asynchrony = AsyncSettings(
      max_staleness=_count("rollout.max_staleness", c.rollout.max_staleness, True),
      sampler_devices=_count("rollout.sampler_devices", c.rollout.sampler_devices, True))
  if asynchrony.max_staleness and not update.loss.tis_cap:
    raise ValueError(f"config.rollout.max_staleness={asynchrony.max_staleness} needs the lag "
                     "correction: set config.loss.tis_cap (C >= 1, e.g. 2.0; AReaL's decoupled "
                     "objective, docs/methods.md §4)")
  rows = data.batch_prompts * rollout.group_size
  if rows % update.num_micro_batches:
    raise ValueError(f"config.optim.num_micro_batches={update.num_micro_batches} must divide "
                     f"the rollout rows data.batch_prompts x rollout.group_size = {rows}")
  if rollout.group_size < 2 and advantage in ("grpo", "dr_grpo", "rloo", "gdpo", "mo_grpo"):
    raise ValueError(f"config.rollout.group_size must be >= 2 for group-relative advantages "
                     f"({advantage}), got {rollout.group_size}")
  dyn = c.dynamic_sampling
  mode = _choice("dynamic_sampling.mode", dyn.mode, dynamic_sampling.MODES)
  signal = _choice("dynamic_sampling.signal", dyn.signal, dynamic_sampling.SIGNALS)
  if mode != "off" and advantage == "ppo":
    raise ValueError("config.dynamic_sampling needs a group-relative advantage; PPO's GAE "
                     "advantages do not vanish on constant groups")
  dynamic = DynamicSamplingSettings(
      mode=mode, signal=dynamic_sampling.resolve_signal(
          signal, advantage != "ppo" and adv_lib.uses_channels(advantage)),
      max_rounds=_positive("dynamic_sampling.max_rounds",
                           _int("dynamic_sampling.max_rounds", dyn.max_rounds), True))
  a, e = c.anchor, c.eval
  anchor = AnchorSettings(
      probe_steps=_count("anchor.probe_steps", a.probe_steps),
      probe_batch_prompts=_count("anchor.probe_batch_prompts", a.probe_batch_prompts),
      held_out_prompts=_count("anchor.held_out_prompts", a.held_out_prompts),
      samples_per_prompt=_count("anchor.samples_per_prompt", a.samples_per_prompt),
      lam=_positive("anchor.lam", _float("anchor.lam", a.lam), True))
  evals = EvalSettings(
      every=_count("eval.every", e.every, True), num_prompts=_count("eval.num_prompts",
                                                                  e.num_prompts),
      samples_per_prompt=_count("eval.samples_per_prompt", e.samples_per_prompt),
      temperature=_positive("eval.temperature", _float("eval.temperature", e.temperature), True))
  settings = RunSettings(
      seed=_int("seed", c.seed), pipeline=pipeline,
      total_steps=_count("total_steps", c.total_steps, True),
      checkpoint_every=_count("checkpoint_every", c.checkpoint_every, True),
      log_every=_count("log_every", c.log_every),
      alarm_window=_count("alarm_window", c.alarm_window),
      kl_ref_every=_count("kl_ref_every", c.kl_ref_every, True),
      model=model, mesh=mesh, data=data, rollout=rollout,
      rewards=RewardSettings(
          channels=channels, specs=specs, primary=primary, params=reward_params,
          timeout_s=_positive("rewards.timeout_s", _float("rewards.timeout_s",
                                                          c.rewards.timeout_s)),
          max_failure_share=_in("rewards.max_failure_share", c.rewards.max_failure_share,
                                0.0, 1.0),
          failure_patience=_count("rewards.failure_patience", c.rewards.failure_patience),
          not_applicable_patience=_count("rewards.not_applicable_patience",
                                         c.rewards.not_applicable_patience),
          worker_max_calls=_count("rewards.worker_max_calls", c.rewards.worker_max_calls),
          worker_memory_bytes=_at_least("rewards.worker_memory_bytes",
                                        _int("rewards.worker_memory_bytes",
                                             c.rewards.worker_memory_bytes), 64 << 20)),
      aggregator=AggregatorSettings(name=agg_name, hp=agg_hp),
      advantage=advantage, advantage_hp=adv_hp, update=update,
      anchor=anchor, eval=evals,
      logging=_logging(c.logging), export=_export(c.export), compile=_compile(c.compile),
      batch=BatchSettings(trim_columns=c.update_batch.trim_columns,
                          mask_truncated=c.update_batch.mask_truncated,
                          column_buckets=_count("update_batch.column_buckets",
                                                c.update_batch.column_buckets, True)),
      dynamic=dynamic, asynchrony=asynchrony,
      resume=ResumeSettings(allow_data_change=c.resume.allow_data_change))
  # Build the aggregator once so unknown hyperparameters fail now, not at step 1.
  aggregators.get(agg_name, **agg_hp).init(len(channels))
  return settings
