"""`RunSettings`: one run's settings, its sections and top-level fields, each declared once
(`mr_rl.fields.setting`); the checks that involve two sections run here, in `__post_init__`
(so a `dataclasses.replace` is checked too). The attribute names and nesting are the
`settings.json` record that a resume compares (`mr_rl.checkpointing.check_resume`): keep them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from mr_rl import fields as F
from mr_rl.registry import PIPELINES
from mr_rl.settings.loop import (AnchorSettings, BatchSettings, CompileSettings,
                                 DynamicSamplingSettings, EvalSettings, ExportSettings,
                                 LoggingSettings, ResumeSettings)
from mr_rl.settings.sections import (AggregatorSettings, DataSettings, ModelSettings,
                                     RewardSettings)


def _sampling():
  from mr_rl.rollout import SamplingSettings
  return SamplingSettings


def _update():
  from mr_rl.rl.update import UpdateConfig
  return UpdateConfig


def _async():
  from mr_rl.draw_queue import AsyncSettings
  return AsyncSettings


def _multiturn():
  from mr_rl.multiturn.settings import MultiTurnSettings
  return MultiTurnSettings


MESH = {"data": -1, "fsdp": 1, "tensor": 1, "expert": 1}


def _mesh(path, value) -> dict[str, int]:
  value = F.mapping(path, value)
  mesh = {k: F.Int()(f"{path}.{k}", value.get(k)) for k in MESH}
  if any(v == 0 or v < -1 for v in mesh.values()) or list(mesh.values()).count(-1) > 1:
    raise ValueError(f"config.{path} sizes must be positive ints, one of them may be -1 "
                     f"(fills the remaining devices), got {mesh}")
  return mesh


def advantage_names() -> tuple[str, ...]:
  """The registered advantage estimators (and aliases), and 'ppo'."""
  from mr_rl.rl import advantages as adv_lib
  return F.registered(adv_lib.ESTIMATORS)() + ("ppo",)


GROUP_RELATIVE = ("grpo", "dr_grpo", "rloo", "gdpo", "mo_grpo")


@dataclasses.dataclass(frozen=True)
class RunSettings:
  SECTION: ClassVar[str] = ""
  seed: int = F.setting(0, "root PRNG seed; steps use fold_in(key, step)", F.Int())
  pipeline: str = F.setting("train", "'train' | 'tag' (probe, elect anchor, train TAG) | a "
                            "plugin's", F.Choice(F.registered(PIPELINES)))
  total_steps: int = F.setting(500, "GRPO steps (papers: 500)", F.Int(lo=0))
  checkpoint_every: int = F.setting(50, "orbax checkpoint interval in steps (0 = never)",
                                    F.Int(lo=0))
  log_every: int = F.setting(1, "console line interval", F.Int(lo=1))
  alarm_window: int = F.setting(10, "steps over which the shortcut alarm compares trends",
                                F.Int(lo=1))
  kl_ref_every: int = F.setting(1, "kl_ref/* metrics every N steps (0 = never unless "
                                "optim.loss.kl_coef > 0)", F.Int(lo=0))
  model: ModelSettings = F.setting(help="the policy", factory=ModelSettings)
  mesh: Mapping[str, int] = F.setting(help="device mesh axis sizes (-1 fills the remaining "
                                      "devices)", check=_mesh, factory=lambda: dict(MESH))
  data: DataSettings = F.setting(help="training and evaluation data", factory=DataSettings)
  rollout: Any = F.setting(help="sampling (mr_rl.rollout.SamplingSettings)",
                           factory=F.Lazy(_sampling))
  rewards: RewardSettings = F.setting(help="reward channels", factory=RewardSettings)
  aggregator: AggregatorSettings = F.setting(help="multi-reward aggregation",
                                             factory=AggregatorSettings)
  # The config's `advantage` section: `name` (this field) and the estimator's
  # hyperparameters (`advantage_hp`; PPO's GAE gamma / lam, value lr: optim.value_lr).
  advantage: str = F.setting("grpo", "grpo | dr_grpo | gdpo | mo_grpo | rloo | ppo",
                             lambda _, v: F.Choice(advantage_names)("advantage.name", v),
                             config={"name": "grpo"}, free=True)
  advantage_hp: Mapping[str, Any] = F.setting(help="the advantage section's other keys",
                                              factory=dict, derived=True)
  update: Any = F.setting(help="the learner step (mr_rl.rl.update.UpdateConfig)",
                          factory=F.Lazy(_update), key="optim")
  anchor: AnchorSettings = F.setting(help="TAG's probes", factory=AnchorSettings)
  eval: EvalSettings = F.setting(help="evaluation", factory=EvalSettings)
  logging: LoggingSettings = F.setting(help="W&B", factory=LoggingSettings)
  export: ExportSettings = F.setting(help="export at the end", factory=ExportSettings)
  batch: BatchSettings = F.setting(help="learner batch layout", factory=BatchSettings)
  dynamic: DynamicSamplingSettings = F.setting(help="DAPO dynamic sampling",
                                               factory=DynamicSamplingSettings)
  asynchrony: Any = F.setting(help="sampler ahead of the learner (mr_rl.draw_queue)",
                              factory=F.Lazy(_async))
  multiturn: Any = F.setting(help="multi-turn rollouts with tools or an environment "
                             "(mr_rl.multiturn.settings)", factory=F.Lazy(_multiturn))
  compile: CompileSettings = F.setting(help="XLA compilation", factory=CompileSettings)
  resume: ResumeSettings = F.setting(help="resume checks", factory=ResumeSettings)

  def __post_init__(self):
    F.validate(self)
    self._check_advantage()
    ppo, update, rows = self.advantage == "ppo", self.update, self.rows
    if update.pack and ppo:
      raise ValueError("config.optim.pack is for the GRPO family; PPO's critic and GAE run "
                       "on unpacked rows")
    if self.dynamic.mode != "off" and ppo:
      raise ValueError("config.dynamic needs a group-relative advantage; PPO's GAE "
                       "advantages do not vanish on constant groups")
    if self.asynchrony.max_staleness and not update.loss.tis_cap:
      raise ValueError(f"config.asynchrony.max_staleness={self.asynchrony.max_staleness} needs "
                       "the lag correction: set config.optim.loss.tis_cap (C >= 1, e.g. 2.0; "
                       "AReaL's decoupled objective, docs/methods.md §4)")
    if rows % update.num_micro_batches:
      raise ValueError(f"config.optim.num_micro_batches={update.num_micro_batches} must "
                       f"divide the rollout rows data.batch_prompts x rollout.group_size = "
                       f"{rows}")
    if self.rollout.group_size < 2 and self.advantage in GROUP_RELATIVE:
      raise ValueError(f"config.rollout.group_size must be >= 2 for group-relative advantages "
                       f"({self.advantage}), got {self.rollout.group_size}")
    r = self.rollout
    if self.advantage in GROUP_RELATIVE and (r.temperature == 0 or r.top_k == 1):
      field = "rollout.temperature=0" if r.temperature == 0 else "rollout.top_k=1"
      raise ValueError(f"config.{field} samples greedily: the {r.group_size} responses of a "
                       f"group are the same, so the group-relative advantage "
                       f"({self.advantage}) is 0 for every row and the run trains on nothing; "
                       "sample (temperature > 0, top_k 0 or > 1), or greedy evaluation: "
                       "config.eval.temperature=0")
    self._check_multiturn()
    # (data.style '' for a model the papers do not list: its tokenizer decides, at build)
    # Build the aggregator so unknown hyperparameters fail now, not at step 1.
    from mr_rl import aggregators
    aggregators.get(self.aggregator.name, **self.aggregator.hp).init(self.num_channels)

  def _check_advantage(self) -> None:
    hp = {k: v for k, v in F.as_dict(self.advantage_hp).items() if v is not None}
    if self.advantage == "ppo":
      bad = set(hp) - {"gamma", "lam"}
      if bad:
        raise ValueError(f"config.advantage: PPO takes gamma and lam (GAE), got {sorted(bad)}")
      hp = {k: F.Float(0.0, 1.0)(f"advantage.{k}", v) for k, v in hp.items()}
    else:
      from mr_rl.rl import advantages as adv_lib
      adv_lib.get_advantage(self.advantage, **hp)  # unknown hyperparameters fail here
    object.__setattr__(self, "advantage_hp", hp)

  def _check_multiturn(self) -> None:
    """Environment channels need config.multiturn; a multi-turn run takes what its rollout
    (mr_rl.multiturn.draw) supports and refuses the rest by name."""
    from mr_rl.multiturn import channels as mt_channels
    env = [name for spec, name in zip(self.rewards.specs, self.rewards.channels)
           if mt_channels.is_environment_spec(spec)]
    if not self.multiturn.enabled:
      if env:
        raise ValueError(f"config.rewards.channels {env} are scored from an environment's step "
                         "rewards: set config.multiturn.env or config.multiturn.tools")
      return
    if len(env) == len(self.rewards.channels):
      raise ValueError("a multi-turn run needs at least one text channel in "
                       "config.rewards.channels (scored on what the policy wrote); all of "
                       f"{env} are environment channels")
    bad = sorted(set(self.multiturn.turn_weights) - set(env))
    if bad:
      raise ValueError(f"config.multiturn.turn_weights names {bad}, which are not environment "
                       f"channels of config.rewards.channels (those are {env})")
    unsupported = [(self.advantage == "ppo", "advantage.name=ppo (GAE over turns is not wired)"),
                   (self.dynamic.mode != "off", "dynamic.mode (DAPO's rounds)"),
                   (bool(self.update.pack), "optim.pack"),
                   (self.asynchrony.active, "asynchrony (a sampler ahead of the learner)"),
                   (self.compile.warmup, "compile.warmup (the turn programs are not warmed up)")]
    names = [what for bad, what in unsupported if bad]
    if names:
      raise ValueError(f"config.multiturn: multi-turn runs do not support {', '.join(names)} "
                       "yet (docs/multiturn.md)")

  @property
  def num_channels(self) -> int:
    return len(self.rewards.channels)

  @property
  def rows(self) -> int:
    """Rollout rows per step, data.batch_prompts x rollout.group_size."""
    return self.data.batch_prompts * self.rollout.group_size
