"""Environment channels: reward channels whose values an environment's steps report.

A multi-turn run's `config.rewards.channels` mixes two kinds of channel, in any order:
* text channels (every other reward): scored by the reward runner on what the policy wrote in
  the trajectory (its turns joined, observations left out, and its own token count), so an
  environment's or a tool's words never pay the policy;
* environment channels (`EnvironmentChannel`, kind "environment"): a trajectory's value is
  its steps' reports of the channel reduced by `reduce` ('mean', 'sum' or 'last'); a
  trajectory whose steps never reported it scores `missing` (default: the floor), never NaN,
  since whether a channel applies is declared per prompt, not left to what a response does
  (docs/rewards.md); a trajectory whose environment failed scores `on_failure`.

The built-in tool environment reports `tool_format` and `tool_success` per call (registered
here, 'mean' over calls, range [0, 1]); a 'sum' would pay for calling more often. Your own
environment's channel: `register_reward("name", lambda **p: EnvironmentChannel("name",
reduce="sum", value_range=(lo, hi), **p))` in a plugin module (`config.plugins`), the factory
marked with `environment_factory`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from mr_rl.multiturn import tools as tools_lib
from mr_rl.rewards.channels import REWARDS, UNIT_RANGE, RewardChannel

ENVIRONMENT = "environment"
REDUCTIONS = ("mean", "sum", "last")


def _not_called(*_, **__):
  raise RuntimeError("an environment channel is filled from its environment's step rewards; "
                     "the reward runner never calls it")


@dataclasses.dataclass(frozen=True)
class EnvironmentChannel(RewardChannel):
  """A channel an environment reports (module docstring). `missing`: the score of a
  trajectory whose steps never reported it (None: the channel's floor)."""
  fn: object = _not_called
  kind: str = ENVIRONMENT
  reduce: str = "mean"
  missing: float | None = None

  def __post_init__(self):
    super().__post_init__()
    if self.kind != ENVIRONMENT:
      raise ValueError(f"environment channel {self.name!r} has kind {ENVIRONMENT!r}, got "
                       f"{self.kind!r}")
    if self.reduce not in REDUCTIONS:
      raise ValueError(f"reduce of environment channel {self.name!r} must be one of "
                       f"{REDUCTIONS}, got {self.reduce!r}")
    lo, hi = self.value_range
    missing = lo if self.missing is None else self.missing
    if isinstance(missing, bool) or not isinstance(missing, (int, float)) or not (
        math.isfinite(missing) and lo <= missing <= hi):
      raise ValueError(f"missing of environment channel {self.name!r} must be a number in "
                       f"its value_range {self.value_range}, got {self.missing!r}")
    object.__setattr__(self, "missing", float(missing))

  def score(self, reports: Sequence[float], failed: bool) -> float:
    """The trajectory's value from its steps' reports, in order."""
    if failed:
      return self.on_failure
    if not reports:
      return self.missing
    value = {"mean": lambda r: sum(r) / len(r), "sum": sum, "last": lambda r: r[-1]}[
        self.reduce](list(reports))
    lo, hi = self.value_range
    if not (math.isfinite(value) and lo <= value <= hi):
      return self.on_failure  # outside its declared range: scored as a failure, as a reward's
    return float(value)


def is_environment_channel(channel: RewardChannel) -> bool:
  return channel.kind == ENVIRONMENT


def environment_factory(factory):
  """Marks a registered factory as one of environment channels, so a run's settings know
  its kind without building it (a reward model channel is not built to learn that)."""
  factory.environment_channel = True
  return factory


def is_environment_spec(spec: str) -> bool:
  """Whether channel spec `spec` (a registered name; import paths are text channels) names an
  environment channel."""
  return ":" not in spec and getattr(REWARDS.get(spec), "environment_channel", False)


def environment_channels(rewards) -> dict[int, EnvironmentChannel]:
  """{k: channel} of the environment channels of a `RewardSettings`, built with their params."""
  return {k: REWARDS.get(spec)(**dict(rewards.params.get(name) or {}))
          for k, (spec, name) in enumerate(zip(rewards.specs, rewards.channels))
          if is_environment_spec(spec)}


@REWARDS.register
@environment_factory
def tool_format(**params) -> EnvironmentChannel:
  """1 per well-formed tool call, 0 per malformed one (`ToolEnv`), mean over calls."""
  return EnvironmentChannel(tools_lib.FORMAT_CHANNEL, **{"value_range": UNIT_RANGE, **params})


@REWARDS.register
@environment_factory
def tool_success(**params) -> EnvironmentChannel:
  """1 per tool call that returned, 0 per call that raised or was malformed (`ToolEnv`),
  mean over calls."""
  return EnvironmentChannel(tools_lib.SUCCESS_CHANNEL, **{"value_range": UNIT_RANGE, **params})


def environment_scores(trajs, channels: Sequence[EnvironmentChannel], group_size: int
                       ) -> np.ndarray:
  """r[B, G, K_env]: each environment channel's value per trajectory (row order)."""
  r = np.zeros((len(trajs), len(channels)), np.float32)
  for n, t in enumerate(trajs):
    for k, c in enumerate(channels):
      reports = [turn[c.name] for turn in t.turn_rewards if c.name in turn]
      r[n, k] = c.score(reports, t.failed)
  return r.reshape(len(trajs) // group_size, group_size, len(channels))
