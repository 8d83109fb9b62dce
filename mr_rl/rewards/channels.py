"""Reward channels and their registry (METHODS.md section 7).

A channel is a named host-side reward function ``fn(response, example, num_tokens) -> float``
plus how it runs (``kind``). ``REWARDS`` is the project's one registry style
(``mr_rl.registry.Registry``): each entry is a factory ``f(**params) -> RewardChannel``
registered with ``@REWARDS.register`` where it is defined, under the factory's own name.
Channel modules are the registry's plugins, imported on the first lookup:

* ``mr_rl.rewards.math_channels``: accuracy, format, length, brief, negative;
* ``mr_rl.rewards.code_channels``: code_correct, code_fast, code_noop;
* ``mr_rl.rewards.alce``: alce_correctness, alce_citation;
* ``mr_rl.rewards.reward_model``: armorm_helpfulness / _correctness / _coherence,
  reward_model.

``get_reward(name, **params)`` builds one; ``register_reward(name, factory)`` is the
function form of the decorator.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from mr_rl.registry import Registry

__all__ = ["KINDS", "REWARDS", "RewardChannel", "available_rewards", "get_reward",
           "register_reward"]

KINDS = ("thread", "process")
RewardFn = Callable[[str, Mapping[str, Any], int], float]


@dataclasses.dataclass(frozen=True)
class RewardChannel:
  """One named reward channel.

  Attributes:
    name: channel name (a column k of r[B, G, K]).
    fn: ``fn(response, example, num_tokens) -> float``.
    kind: "thread" (light rule) or "process" (heavy / untrusted; picklable fn).
  """
  name: str
  fn: RewardFn
  kind: str = "thread"

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"name must be a non-empty str, got {self.name!r}")
    if not callable(self.fn):
      raise TypeError(f"fn of channel {self.name!r} must be callable, got {type(self.fn)}")
    if self.kind not in KINDS:
      raise ValueError(f"kind of channel {self.name!r} must be one of {KINDS}, got {self.kind!r}")


REWARDS: Registry[Callable[..., RewardChannel]] = Registry(
    "reward channel", plugins=("mr_rl.rewards.math_channels", "mr_rl.rewards.code_channels",
                               "mr_rl.rewards.alce", "mr_rl.rewards.reward_model"))


def register_reward(name: str, factory: Callable[..., RewardChannel]) -> None:
  """Registers ``factory(**params) -> RewardChannel`` under ``name`` (``REWARDS.add``)."""
  REWARDS.add(name, factory)


def available_rewards() -> list[str]:
  """Registered channel names, sorted."""
  return list(REWARDS.names())


def get_reward(name: str, **params: Any) -> RewardChannel:
  """Builds the registered channel ``name`` with ``params``.

  Raises:
    mr_rl.registry.UnknownNameError (a ValueError): unknown name (the message lists the
      valid ones).
  """
  return REWARDS.get(name)(**params)
