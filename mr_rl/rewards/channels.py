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

Return values (TRL's ``reward_funcs`` convention): a real number, or ``None`` / NaN when the
channel does not apply to this sample on purpose. A *failure* (the scorer raised, timed out
or its worker died on this response) is never "does not apply": it scores the channel's
``on_failure`` value (0.0 by default). A ``RewardConfigError`` says the scorer cannot run
here at all (see ``mr_rl.rewards.runner`` for where the line is drawn).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import pickle
from typing import Any, Callable, Mapping

from mr_rl.registry import Registry

__all__ = ["KINDS", "REWARDS", "MissingFieldError", "RewardChannel", "RewardConfigError",
           "available_rewards", "get_reward", "register_reward"]

KINDS = ("thread", "process")
RewardFn = Callable[[str, Mapping[str, Any], int], float]


class RewardConfigError(ValueError):
  """The scorer cannot run here: an error that is not about the response.

  Raise it from a reward function for bad inputs that no response could fix (a missing or
  malformed example field, an unusable parameter, a reference the verifier cannot read).
  The runner stops the run at the first batch with it, naming the channel and the keys the
  example has. Anything else a reward function raises is a failure on that response.
  """


class MissingFieldError(RewardConfigError, KeyError):
  """A field the channel needs is not in the example (a ``KeyError`` too)."""

  __str__ = BaseException.__str__  # KeyError's would quote the message


class ExampleFields(dict):
  """The example a channel sees in the runner: a dict whose missing keys raise
  ``MissingFieldError`` (naming the key and the keys present) instead of a plain KeyError,
  so a channel reading a field the data set does not have stops the run."""

  def __missing__(self, key: Any):
    raise MissingFieldError(f"example has no field {key!r} (keys: {sorted(map(str, self))})")


def _check_importable(name: str, fn: Any) -> None:
  from mr_rl.rewards.pool import dumps_importable  # pylint: disable=import-outside-toplevel
  try:
    dumps_importable(fn)
  except pickle.PicklingError as e:
    raise TypeError(f"fn of process channel {name!r} must be importable by name in a worker "
                    f"process (a module-level function or a functools.partial of one; use "
                    f"kind='thread' otherwise): {e}") from e


@dataclasses.dataclass(frozen=True)
class RewardChannel:
  """One named reward channel.

  Attributes:
    name: channel name (a column k of r[B, G, K]).
    fn: ``fn(response, example, num_tokens) -> float | None`` or, when ``batched``,
      ``fn(responses, examples, num_tokens) -> list[float | None]`` over the flattened
      batch (B*G entries, each example repeated G times; TRL's convention).
    kind: "thread" (light rule) or "process" (heavy / untrusted; fn importable by name).
    on_failure: the score of a failed call (raised, timed out, worker died): finite.
    batched: fn takes the whole batch at once.
  """
  name: str
  fn: RewardFn
  kind: str = "thread"
  on_failure: float = 0.0
  batched: bool = False

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"name must be a non-empty str, got {self.name!r}")
    if not callable(self.fn):
      raise TypeError(f"fn of channel {self.name!r} must be callable, got {type(self.fn)}")
    if self.kind not in KINDS:
      raise ValueError(f"kind of channel {self.name!r} must be one of {KINDS}, got {self.kind!r}")
    value = self.on_failure
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
      raise ValueError(f"on_failure of channel {self.name!r} must be a finite number (a failure "
                       f"is never 'does not apply'), got {value!r}")
    object.__setattr__(self, "on_failure", float(value))
    if not isinstance(self.batched, bool):
      raise TypeError(f"batched of channel {self.name!r} must be a bool, got {self.batched!r}")
    if self.kind == "process":
      _check_importable(self.name, self.fn)


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
