"""The run's own settings sections (`config.<section>` each; docs/style.md §3): model, data,
rewards, aggregator. Each field is declared once (`mr_rl.fields.setting`: default, help,
check) and checked in `__post_init__`; names are checked against their registries when the
section is built (after the run's plugins registered theirs). The learner, sampler and
asynchrony sections are declared by the modules that use them (`mr_rl.rl.update.UpdateConfig`,
`mr_rl.rl.losses.PolicyLossConfig`, `mr_rl.rollout.SamplingSettings`,
`mr_rl.draw_queue.AsyncSettings`, `mr_rl.models.lora.LoraConfig`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from mr_rl import fields as F


def _attention_impls():
  from mr_rl.models.attention import IMPLS
  return IMPLS


def _moe_impls():
  from mr_rl.models.config import MOE_IMPLS
  return MOE_IMPLS


def _presets():
  from mr_rl import models
  return tuple(models.PRESETS)


def _preset(path, value):
  return F.Choice(("",) + _presets())(path, value) if value else F.string(path, value)


def _lora_config():
  from mr_rl.models.lora import LoraConfig
  return LoraConfig


def _lora(path, value):
  """config.model.lora (a mapping) as a LoraConfig, or None with rank 0 (every field checked
  either way); a LoraConfig or None passes."""
  if value is None or isinstance(value, _lora_config()):
    return value
  value = F.mapping(path, value)
  if F.Int(lo=0)(f"{path}.rank", value.get("rank")) == 0:
    for f in dataclasses.fields(_lora_config()):
      if f.name != "rank":
        f.metadata["check"](f"{path}.{f.name}", value.get(f.name))
    return None
  return _lora_config()(**value)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  SECTION: ClassVar[str] = "model"
  path: str = F.setting("", "HF checkpoint directory or hub id (loaded with load_pretrained)",
                        F.string)
  preset: str = F.setting("", "or a named preset with random init (tests, dry runs)", _preset)
  dtype: str = F.setting("float32", "parameter / optimizer master-weight dtype: 'float32' | "
                         "'bfloat16'", F.Choice(F.DTYPES))
  lora: Any = F.setting(None, "LoRA RL: a mr_rl.models.lora.LoraConfig, or None (config "
                        "rank 0: full fine-tuning)", _lora, config=F.Lazy(_lora_config))
  moe_impl: str = F.setting("ragged", "MoE dispatch: 'ragged' | 'dense' | 'ep' (expert-parallel "
                            "all_to_all; mr_rl/models/moe.py)", F.Choice(_moe_impls))
  remat: bool = F.setting(False, "recompute each decoder block in the backward pass (one "
                          "block's activations kept, not every layer's)", F.boolean)
  compute_dtype: str = F.setting(
      "", "matmul / activation dtype ('' = dtype; 'bfloat16' over float32 params is mixed "
      "precision; norms, softmax, log-probs and losses stay float32)",
      F.Choice(("",) + F.DTYPES))
  attention_impl: str = F.setting(
      "auto", "self-attention kernel: auto (by backend) | reference | blockwise | cudnn | "
      "pallas_gpu | pallas_tpu", F.Choice(_attention_impls))

  def __post_init__(self):
    F.validate(self)
    if bool(self.path) == bool(self.preset):
      raise ValueError("set exactly one of config.model.path (checkpoint) and "
                       "config.model.preset (random init); got "
                       f"path={self.path!r}, preset={self.preset!r}")
    if self.lora is not None and self.preset:
      from mr_rl import models
      from mr_rl.models import lora as lora_lib
      try:
        lora_lib.target_paths(models.PRESETS[self.preset], self.lora)
      except ValueError as e:
        raise ValueError(f"config.model.lora.targets: {e}") from e

  @property
  def compute(self) -> str:
    """The learner's compute dtype (`compute_dtype`, or `dtype` when empty)."""
    return self.compute_dtype or self.dtype


def _datasets():
  from mr_rl import data as data_lib
  return F.registered(data_lib.DATASETS)()


def _templates():
  from mr_rl.data import templates
  return ("",) + tuple(templates.TASK_INSTRUCTIONS)


@dataclasses.dataclass(frozen=True)
class DataSettings:
  SECTION: ClassVar[str] = "data"
  name: str = F.setting("", "a mr_rl.data registry name (required; plugins add their own)",
                        F.Choice(_datasets))
  path: str = F.setting("", "local copy of the data set ('' = hub id)", F.string)
  split: str = F.setting("train", "training split", F.string)
  eval_split: str = F.setting("test", "held-out split (final eval, TAG's drift prompts)",
                              F.string)
  batch_prompts: int = F.setting(32, "B prompts per step; rollout batch = B * G (papers: 256)",
                                 F.Int(lo=1))
  max_prompt_len: int = F.setting(512, "prompts are left-padded to this", F.Int(lo=1))
  template: str = F.setting("", "prompt template task for mr_rl.data.make_template ('' = the "
                            "data set's own prompt)", F.Choice(_templates))
  style: str = F.setting("", "prompt style of data.template: 'chat' (the tokenizer's chat "
                         "template), 'plain' (User:/Assistant: text), '' = a paper model's "
                         "listed style, else chat when the tokenizer has a chat template",
                         F.Choice(("", "chat", "plain")))
  options: Mapping[str, Any] = F.setting(
      help="loader options (thresholds, subset sizes)", check=F.mapping, factory=dict,
      free=True)
  # Benchmark sets evaluated instead of `eval_split` (AMRP Table 1: math500, amc, aime), each
  # loaded with mr_rl.data.load_dataset at its default split.
  eval_sets: tuple[str, ...] = F.setting(
      (), "comma-separated benchmark sets evaluated instead of eval_split",
      F.Csv(F.Choice(_datasets)), config="")
  eval_set_options: Mapping[str, Mapping[str, Any]] = F.setting(
      help="{set: {path=..., split=..., loader options}}", check=F.mapping, factory=dict,
      free=True)
  skip_long_prompts: bool = F.setting(
      False, "drop (and log) prompts over max_prompt_len instead of failing", F.boolean)

  def __post_init__(self):
    F.validate(self)
    from mr_rl import data as data_lib
    names = self.eval_sets
    if len(set(names)) != len(names):
      raise ValueError(f"config.data.eval_sets has duplicates: {names}")
    for n, o in self.eval_set_options.items():
      if n not in names:
        raise ValueError(f"config.data.eval_set_options names {n!r}, which is not among "
                         f"config.data.eval_sets {names}")
      if not isinstance(o, dict):
        raise ValueError(f"config.data.eval_set_options.{n} must be a mapping of loader "
                         f"options, got {o!r}")
      bad = sorted(set(o) - {"path", "split"} - set(data_lib.options(n)))
      if bad:
        raise ValueError(f"config.data.eval_set_options.{n} has unknown option(s) {bad}; "
                         f"valid: {['path', 'split', *data_lib.options(n)]}")


def _reward_specs(path, value):
  """Reward names or import paths 'pkg.mod:fn' (each checked: a name is registered)."""
  from mr_rl.rewards import runner
  specs = F.Csv()(path, value)
  if not specs:
    raise ValueError(f"config.{path} is empty; give comma-separated reward names")
  valid = runner.available_rewards()
  for spec in specs:
    if not runner.is_import_path(spec):
      F.Choice(valid)(path, spec)
  return specs


@dataclasses.dataclass(frozen=True)
class RewardSettings:
  SECTION: ClassVar[str] = "rewards"
  # The config's `channels` holds the specs; the settings' `channels` their names.
  channels: tuple[str, ...] = F.setting(
      ("accuracy",), "K channel names, primary first by convention (config: comma-separated "
      "reward names or import paths 'pkg.mod:fn', whose channel is named 'fn')",
      F.Csv(), config="accuracy")
  specs: tuple[str, ...] = F.setting(
      None, "what builds each channel: a registered name or an import path", derived=True)
  primary: int = F.setting(0, "index of the task channel (alarm, reports)", F.Int())
  params: Mapping[str, Mapping[str, Any]] = F.setting(
      help="per-channel parameters by channel name, e.g. {'brief': {'threshold': 200}}; any "
      "channel takes applies ('pkg.mod:fn': the prompts it scores), import paths also kind "
      "('thread' | 'process'), on_failure, batched, value_range", check=F.mapping,
      factory=dict, free=True)
  timeout_s: float = F.setting(10.0, "per-call reward timeout (a timeout scores on_failure)",
                               F.Float(lo=0.0, lo_open=True))
  max_failure_share: float = F.setting(
      0.5, "failure-rate guard: a channel failing on more than this share of a batch",
      F.Float(0.0, 1.0))
  failure_patience: int = F.setting(3, "for this many runner calls in a row stops the run",
                                    F.Int(lo=1))
  not_applicable_patience: int = F.setting(
      10, "a channel that scores no response this many runner calls in a row stops the run",
      F.Int(lo=1))
  worker_max_calls: int = F.setting(
      1000, "'process' channels: a worker is replaced after this many calls", F.Int(lo=1))
  worker_memory_bytes: int = F.setting(
      2 << 30, "data-size cap of each reward worker (a call past it fails; above half of it "
      "a worker is replaced)", F.Int(lo=64 << 20))

  def __post_init__(self):
    from mr_rl.rewards import runner
    if self.specs is None:  # from the config: `channels` holds the specs
      specs = _reward_specs("rewards.channels", self.channels)
      object.__setattr__(self, "specs", specs)
      object.__setattr__(self, "channels", tuple(
          runner.channel_name(s) if runner.is_import_path(s) else s for s in specs))
    F.validate(self)
    channels = self.channels
    if len(set(channels)) != len(channels):
      raise ValueError(f"config.rewards.channels has duplicate channel names: {channels}")
    if not 0 <= self.primary < len(channels):
      raise ValueError(f"config.rewards.primary={self.primary} is out of range for "
                       f"{len(channels)} channels")
    for name in self.params:
      if name not in channels:
        raise ValueError(f"config.rewards.params names {name!r}, which is not among the "
                         f"channels {channels}")
    for spec, name in zip(self.specs, channels):
      if runner.is_import_path(spec):  # import, signature and parameters checked now
        runner.get_reward(spec, **dict(self.params.get(name) or {}))


def _aggregators():
  from mr_rl import aggregators
  return F.registered(aggregators.AGGREGATORS)()


def _hp(path, value):
  """Hyperparameters: a dict without the unset (None) ones."""
  return {k: v for k, v in F.mapping(path, value).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class AggregatorSettings:
  SECTION: ClassVar[str] = "aggregator"
  name: str = F.setting("additive", "a mr_rl.aggregators registry name or alias",
                        F.Choice(_aggregators))
  hp: Mapping[str, Any] = F.setting(help="its hyperparameters (lam, k_s, k_p, ...)",
                                    check=_hp, factory=dict, free=True)

  def __post_init__(self):
    F.validate(self)
