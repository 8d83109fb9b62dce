"""Built-in math reward channels (docs/methods.md §7), registered in ``REWARDS``.

Registry name = factory name:

  accuracy(reference_key="reference")  process  math-verify vs example[reference_key]
  format()                             thread   AMRP <reasoning>/<answer> format
  length(max_full=2800, zero_at=3000)  thread   AMRP soft length rule on num_tokens
  brief(threshold=200)                 thread   TAG: num_tokens < threshold
  negative()                           process  TAG: final answer is a number < 0

The "process" channels run ``math.*_in_process`` inside the reward workers, where the
runner's hard timeout guards them.
"""

from __future__ import annotations

import functools

from mr_rl.rewards import math as math_rewards
from mr_rl.rewards.channels import (REWARDS, UNIT_RANGE, MissingFieldError, RewardChannel,
                                    RewardConfigError)
from mr_rl.rewards.process.pool import shared_pool

# The process channels' functions unpickle from this module: have the zygote load it once.
shared_pool().add_setup(preload=("mr_rl.rewards.math_channels",))

# pylint: disable=redefined-builtin  (the `format` factory is named as its channel)


def _accuracy_channel(response, example, num_tokens, *, reference_key):
  del num_tokens
  if reference_key not in example:
    raise MissingFieldError(f"example has no field {reference_key!r} (keys: "
                            f"{sorted(map(str, example))})")
  reference = example[reference_key]
  if not isinstance(reference, str):
    raise RewardConfigError(f"example[{reference_key!r}] must be a str (LaTeX), got "
                            f"{type(reference).__name__} {reference!r:.80}")
  return math_rewards.accuracy_in_process(response, reference)


def _format_channel(response, example, num_tokens):
  del example, num_tokens
  return math_rewards.format_reward(response)


def _length_channel(response, example, num_tokens, *, max_full, zero_at):
  del response, example
  return math_rewards.length_reward(num_tokens, max_full=max_full, zero_at=zero_at)


def _brief_channel(response, example, num_tokens, *, threshold):
  del response, example
  return math_rewards.brief(num_tokens, threshold)


def _negative_channel(response, example, num_tokens):
  del example, num_tokens
  return math_rewards.negative_in_process(response)


@REWARDS.register
def accuracy(reference_key: str = "reference") -> RewardChannel:
  """Math accuracy: math-verify equivalence of the final answer with example[reference_key]."""
  return RewardChannel(
      "accuracy", functools.partial(_accuracy_channel, reference_key=reference_key), "process",
      value_range=UNIT_RANGE)


@REWARDS.register
def format() -> RewardChannel:
  """AMRP format rule on the response text."""
  return RewardChannel("format", _format_channel, value_range=UNIT_RANGE)


@REWARDS.register
def length(max_full: int = 2800, zero_at: int = 3000) -> RewardChannel:
  """AMRP soft length rule on the generated-token count."""
  math_rewards.length_reward(0, max_full=max_full, zero_at=zero_at)  # validates
  return RewardChannel(
      "length", functools.partial(_length_channel, max_full=max_full, zero_at=zero_at),
      value_range=UNIT_RANGE)


@REWARDS.register
def brief(threshold: int = 200) -> RewardChannel:
  """TAG brief rule: 1 iff fewer than `threshold` generated tokens."""
  math_rewards.brief(0, threshold)  # validates
  return RewardChannel("brief", functools.partial(_brief_channel, threshold=threshold),
                       value_range=UNIT_RANGE)


@REWARDS.register
def negative() -> RewardChannel:
  """TAG negative rule: 1 iff the final answer is a real number < 0."""
  return RewardChannel("negative", _negative_channel, "process", value_range=UNIT_RANGE)
