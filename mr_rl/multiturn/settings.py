"""The multi-turn settings section (`config.multiturn`, `RunSettings.multiturn`), declared like
every section (`mr_rl.fields`), and what it builds: the environment factory, the renderer and
the rollout's limits, all checked when the section is built (start-up). With neither `env`
nor `tools` the run is single-turn.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

from mr_rl import fields as F
from mr_rl.multiturn import env as env_lib
from mr_rl.multiturn import tools as tools_lib
from mr_rl.multiturn import workers as workers_lib
from mr_rl.multiturn.rollout import TurnLimits


def _import_path_or_empty(path, value):
  value = F.string(path, value)
  if value and ":" not in value:
    raise ValueError(f"config.{path} must be an import path 'package.module:name' or '', "
                     f"got {value!r}")
  return value


@dataclasses.dataclass(frozen=True)
class MultiTurnSettings:
  """Environment, tools and limits of multi-turn rollouts."""
  SECTION: ClassVar[str] = "multiturn"
  env: str = F.setting("", "environment factory 'pkg.mod:make' ('' with tools: the built-in "
                       "tool environment)", _import_path_or_empty)
  env_params: Mapping[str, Any] = F.setting(help="keyword arguments of the environment factory",
                                            check=F.mapping, factory=dict, free=True)
  tools: tuple[str, ...] = F.setting((), "tools of the built-in tool environment: import "
                                     "paths 'pkg.mod:fn' (comma-separated)", F.Csv(), config="")
  tool_format: str = F.setting("hermes", "tool-call format: 'hermes' (Qwen3 <tool_call> JSON) "
                               "or 'plain' (plain_open ... plain_close)",
                               F.Choice(tuple(tools_lib.FORMATS)))
  plain_open: str = F.setting("<r>", "'plain' format: the text that opens a call", F.string)
  plain_close: str = F.setting("</r>", "'plain' format: the text that closes a call", F.string)
  max_turns: int = F.setting(4, "policy turns per trajectory at most", F.Int(lo=1))
  max_observation_tokens: int = F.setting(
      256, "an observation longer than this is truncated with a marker", F.Int(lo=1))
  step_timeout_s: float = F.setting(
      30.0, "an environment step running longer fails its trajectory",
      F.Float(lo=0.0, lo_open=True))
  workers: int = F.setting(8, "host threads running environment steps (and, with "
                           "workers_kind 'process', worker processes)", F.Int(lo=1))
  workers_kind: str = F.setting(
      "thread", "where environment steps run: 'thread' (host threads; a step past the timeout "
      "is abandoned) or 'process' (each step in a fresh worker process, killed at the timeout; "
      "environments must pickle)", F.Choice(workers_lib.KINDS))
  per_turn_credit: bool = F.setting(
      False, "add per-turn advantages: each step's rewards (turn_weights) on its turn's last "
      "token, normalised per turn index in the group, reward-to-go per token "
      "(mr_rl.multiturn.credit; biased, docs/multiturn.md); off: trajectory-level GRPO",
      F.boolean)
  turn_weights: Mapping[str, float] = F.setting(
      help="per_turn_credit: weight of each environment channel in a turn's reward (default: "
      "1 for each environment channel of the run)", check=F.mapping, factory=dict, free=True)
  renderer: str = F.setting("", "renderer factory 'pkg.mod:make' (make(tokenizer) -> renderer; "
                            "'': the tokenizer's chat template, mr_rl.multiturn.render."
                            "ChatRenderer, given the tools' schemas)", _import_path_or_empty)

  @property
  def enabled(self) -> bool:
    return bool(self.env or self.tools)

  def __post_init__(self):
    F.validate(self)
    if not self.enabled:
      return
    if self.env and self.tools:
      raise ValueError("config.multiturn: give env or tools, not both (an environment with "
                       "tools builds its own ToolEnv)")
    try:
      make = self.environment_factory()  # imports, schemas and one build now: start-up errors
    except env_lib.EnvConfigError as e:
      raise ValueError(f"config.multiturn: {e}") from e
    if self.workers_kind == "process":
      try:
        workers_lib.check_picklable([make()])
      except ValueError as e:
        raise ValueError(f"config.multiturn: {e}") from e

  def tool_format_object(self):
    if self.tool_format == "plain":
      return tools_lib.PlainFormat(self.plain_open, self.plain_close)
    return tools_lib.HermesFormat()

  def environment_factory(self) -> Callable[[], env_lib.Environment]:
    """A factory of one environment per trajectory."""
    if self.env:
      return env_lib.environment_factory(self.env, self.env_params)
    tools, fmt = tools_lib.load_tools(self.tools), self.tool_format_object()
    return lambda: tools_lib.ToolEnv(list(tools.values()), format=fmt, **dict(self.env_params))

  def make_renderer(self, tokenizer):
    """The renderer of observations for `tokenizer`."""
    from mr_rl.multiturn import render as render_lib
    if not self.renderer:  # the built-in tool environment's schemas go to the template (tools=)
      tools = tools_lib.load_tools(self.tools) if self.tools else {}
      return render_lib.ChatRenderer(tokenizer, tools=[tools_lib.schema(f) for f in
                                                       tools.values()] or None)
    return env_lib.resolve(self.renderer, "renderer")(tokenizer)

  def limits(self) -> TurnLimits:
    return TurnLimits(max_turns=self.max_turns,
                      max_observation_tokens=self.max_observation_tokens,
                      step_timeout_s=self.step_timeout_s)

  def rollout_options(self) -> dict:
    """`TurnRollout`'s keyword arguments from this section (limits and workers)."""
    return {"limits": self.limits(), "workers": self.workers, "workers_kind": self.workers_kind}


def default_config():
  """The section's config (a ConfigDict of the declared defaults)."""
  import ml_collections
  c = ml_collections.ConfigDict()
  for f in dataclasses.fields(MultiTurnSettings):
    d = F.config_default(f)
    c[F.key(f)] = ml_collections.ConfigDict(d) if isinstance(d, dict) else d
  return c


def from_config(config) -> MultiTurnSettings:
  """The section from `config.multiturn` (a ConfigDict or mapping); unknown keys refused."""
  values = dict(config)
  names = {F.key(f): f.name for f in dataclasses.fields(MultiTurnSettings)}
  unknown = sorted(set(values) - set(names))
  if unknown:
    raise ValueError(f"config.multiturn has unknown field(s) {unknown}; valid: {sorted(names)}")
  return MultiTurnSettings(**{names[k]: (dict(v) if hasattr(v, "items") else v)
                              for k, v in values.items()})
