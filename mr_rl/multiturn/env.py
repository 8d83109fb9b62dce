"""The environment protocol of multi-turn rollouts (docs/multiturn.md).

An environment drives one trajectory: `reset(example)` gives the first messages (the chat
turns the prompt is rendered from), then the policy writes a turn and `step(turn)` answers
with the messages to append (a tool's result, a user's reply), per-channel rewards and
`done`. Environments run on host workers (`mr_rl.multiturn.workers`), never inside the
engine's loop; one instance serves one trajectory, so it may keep state (with worker
processes, in attributes that pickle: each step gets the environment as the last one left it).

    class Retry:
      def reset(self, example):
        self.answer = example["answer"]
        return [{"role": "user", "content": example["question"]}]
      def step(self, turn):
        ok = turn.text.strip() == self.answer
        return StepResult(messages=[] if ok else [{"role": "user", "content": "Try again."}],
                          rewards={"correct": float(ok)}, done=ok)

Environments are named in the config by import path, 'package.module:factory', like reward
channels (`resolve`); the factory builds one environment per trajectory (a class is a
factory).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from mr_rl import registry

Message = Mapping[str, str]



class EnvConfigError(ValueError):
  """An environment or tool named in the config that cannot be built."""


@dataclasses.dataclass(frozen=True)
class Turn:
  """One policy turn as the environment sees it.

  Attributes:
    text: the turn's text, decoded from the sampled ids (end-of-turn token excluded).
    token_ids: the sampled ids of the turn (end-of-turn token included when sampled).
    index: 0 for the first policy turn.
  (A turn the budget cut off ends its trajectory without a step.)
  """
  text: str
  token_ids: tuple[int, ...]
  index: int


@dataclasses.dataclass(frozen=True)
class StepResult:
  """What `Environment.step` returns.

  Attributes:
    messages: chat messages appended to the conversation (role 'tool' or 'user'); rendered
      as the observation's token delta. Empty with `done`.
    rewards: per-channel rewards of this step ({channel: value}); a trajectory's value of a
      channel is reduced over its steps (`mr_rl.multiturn.channels`).
    done: the trajectory ends after this step (no observation is inserted).
    info: free-form counters (e.g. {'tool_calls': 1, 'tool_failures': 0}), summed per
      trajectory into the rollout metrics.
  """
  messages: Sequence[Message] = ()
  rewards: Mapping[str, float] = dataclasses.field(default_factory=dict)
  done: bool = False
  info: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for m in self.messages:
      if not isinstance(m, Mapping) or not {"role", "content"} <= set(m):
        raise TypeError(f"StepResult.messages holds {m!r}: each must be a mapping with "
                        "'role' and 'content'")
    if self.done and self.messages:
      raise ValueError("StepResult with done=True carries no messages (nothing is inserted "
                       "after the last turn)")
    for k, v in self.rewards.items():
      if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise TypeError(f"StepResult.rewards[{k!r}] = {v!r} is not a number")


@runtime_checkable
class Environment(Protocol):
  """reset(example) -> first messages; step(turn) -> StepResult (module docstring)."""

  def reset(self, example: Mapping[str, Any]) -> Sequence[Message]:
    ...

  def step(self, turn: Turn) -> StepResult:
    ...


def resolve(spec: str, what: str = "environment") -> Any:
  """The object an import path 'package.module:attr' names (`registry.resolve_import_path`).

  Raises:
    EnvConfigError: a malformed path, a module that does not import, a missing attribute.
  """
  return registry.resolve_import_path(spec, f"{what} {spec!r}", EnvConfigError)


def environment_factory(spec: str, params: Mapping[str, Any] | None = None
                        ) -> Callable[[], Environment]:
  """A zero-argument factory of the environment `spec` names (built once here, so a
  factory that fails or builds no `Environment` stops the run at start-up)."""
  factory = resolve(spec, "environment")
  if not callable(factory):
    raise EnvConfigError(f"environment {spec!r} is a {type(factory).__name__}, not a factory")
  params = dict(params or {})

  def make() -> Environment:
    return factory(**params)

  try:
    probe = make()
  except Exception as e:  # pylint: disable=broad-except
    raise EnvConfigError(f"environment {spec!r} with parameters {params} did not build: "
                         f"{e!r}") from e
  if not isinstance(probe, Environment):
    raise EnvConfigError(f"environment {spec!r} built a {type(probe).__name__}, which has no "
                         "reset(example) and step(turn)")
  return make
