"""The training loop's settings sections (`config.<section>` each): anchor, eval, logging,
export, compile, resume, batch, dynamic. Each field is declared once (`mr_rl.fields.setting`:
default, help, check) and checked in `__post_init__`."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from mr_rl import fields as F


def _modes():
  from mr_rl.rl import dynamic_sampling
  return dynamic_sampling.MODES


def _signals():
  from mr_rl.rl import dynamic_sampling
  return dynamic_sampling.SIGNALS


@dataclasses.dataclass(frozen=True)
class AnchorSettings:
  SECTION: ClassVar[str] = "anchor"
  probe_steps: int = F.setting(300, "single-channel GRPO steps per probe (the TAG paper's T)",
                               F.Int(lo=1))
  probe_batch_prompts: int = F.setting(4, "prompts per probe step (TAG: rollout batch 32 = 4 x "
                                       "G 8)", F.Int(lo=1))
  held_out_prompts: int = F.setting(256, "prompts on which drift is measured (TAG: 256)",
                                    F.Int(lo=1))
  samples_per_prompt: int = F.setting(1, "probe responses per held-out prompt", F.Int(lo=1))
  lam: float = F.setting(1.0, "TAG gate lambda of the joint run after election",
                         F.Float(lo=0.0))

  def __post_init__(self):
    F.validate(self)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  SECTION: ClassVar[str] = "eval"
  every: int = F.setting(0, "evaluate every N steps (0 = only at the end, by a pipeline)",
                         F.Int(lo=0))
  num_prompts: int = F.setting(256, "held-out prompts (per eval set)", F.Int(lo=1))
  samples_per_prompt: int = F.setting(4, "n samples per prompt (pass@k)", F.Int(lo=1))
  temperature: float = F.setting(1.0, "0 = greedy (one response per prompt)", F.Float(lo=0.0))

  def __post_init__(self):
    F.validate(self)


@dataclasses.dataclass(frozen=True)
class LoggingSettings:
  """Where the per-step metrics go besides WORKDIR/metrics.jsonl and TensorBoard."""
  SECTION: ClassVar[str] = "logging"
  wandb_project: str = F.setting("", "Weights & Biases project ('' = off; pip install -e "
                                 ".[wandb])", F.string)
  wandb_entity: str = F.setting("", "W&B team or user ('' = the account's default)", F.string)
  wandb_name: str = F.setting("", "W&B run name ('' = the workdir's base name)", F.string)
  wandb_mode: str = F.setting("", "online | offline | disabled ('' = WANDB_MODE, else online)",
                              F.Choice(("", "online", "offline", "disabled")))

  def __post_init__(self):
    F.validate(self)
    if self.wandb_project:
      import importlib.util
      if importlib.util.find_spec("wandb") is None:
        raise ValueError(f"config.logging.wandb_project={self.wandb_project!r} needs the wandb "
                         "package: pip install -e '.[wandb]' (or unset the field)")


@dataclasses.dataclass(frozen=True)
class ExportSettings:
  SECTION: ClassVar[str] = "export"
  hf_at_end: bool = F.setting(False, "write WORKDIR/hf/ (a transformers / vLLM checkpoint) "
                              "after training", F.boolean)

  def __post_init__(self):
    F.validate(self)


def _cache_dir(path, value):
  if not isinstance(value, str):
    raise ValueError(f"config.{path} must be a directory, '' or 'off', got {value!r}")
  return value


@dataclasses.dataclass(frozen=True)
class CompileSettings:
  SECTION: ClassVar[str] = "compile"
  cache_dir: str = F.setting(
      "", "jax's persistent compilation cache: '' = $MR_RL_CACHE/xla (~/.cache/mr_rl/xla), a "
      "directory, or 'off'; a restarted or resumed run loads its programs", _cache_dir)
  warmup: bool = F.setting(False, "compile every program the settings predict (learner widths, "
                           "prompt buckets) before step 0 (mr_rl.program_plan)", F.boolean)

  def __post_init__(self):
    F.validate(self)

  @property
  def cache(self) -> str:
    """The cache directory to use, or '' when off."""
    from mr_rl import compilation
    if self.cache_dir == "off":
      return ""
    return self.cache_dir or compilation.default_cache_dir()


@dataclasses.dataclass(frozen=True)
class ResumeSettings:
  SECTION: ClassVar[str] = "resume"
  allow_data_change: bool = F.setting(
      False, "resume although the training rows differ from the checkpoint's (their "
      "fingerprint, mr_rl.data.fingerprint; logged): else refused", F.boolean)

  def __post_init__(self):
    F.validate(self)


@dataclasses.dataclass(frozen=True)
class BatchSettings:
  """The learner's batch layout (`mr_rl.rl.batch.make_batch`)."""
  SECTION: ClassVar[str] = "batch"
  trim_columns: bool = F.setting(True, "update / reference / critic over the columns in use "
                                 "(bucketed)", F.boolean)
  mask_truncated: bool = F.setting(False, "DAPO overlong filtering: truncated responses enter "
                                   "no loss", F.boolean)
  column_buckets: int = F.setting(
      0, "with trim_columns: 0 = the fine width grid (least padding, O(log^2) shapes); n = the "
      "whole prompt and n response widths (n compiled learner programs)", F.Int(lo=0))

  def __post_init__(self):
    F.validate(self)


@dataclasses.dataclass(frozen=True)
class DynamicSamplingSettings:
  """DAPO dynamic sampling (`mr_rl.rl.dynamic_sampling`)."""
  SECTION: ClassVar[str] = "dynamic"
  mode: str = F.setting("off", "off | refill (over-sample to B groups) | shrink",
                        F.Choice(_modes))
  signal: str = F.setting("scalar", "what keeps a group: auto (channels when the advantage "
                          "uses them) | scalar (R) | channels (any r_k)",
                          F.Choice(_signals), config="auto")
  max_rounds: int = F.setting(4, "refill: at most this many extra sampling rounds per step",
                              F.Int(lo=0))

  def __post_init__(self):
    F.validate(self)
