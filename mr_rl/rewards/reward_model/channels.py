"""Reward-model channels: ``armorm_helpfulness`` / ``_correctness`` / ``_coherence`` and
``reward_model(objective=...)``, each one objective of a shared scorer, optionally rescaled.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

from mr_rl.rewards.channels import REWARDS, UNIT_RANGE, MissingFieldError, RewardChannel
from mr_rl.rewards.reward_model.loading import ARMORM_HUB
from mr_rl.rewards.reward_model.scorer import get_scorer

HELPSTEER_RANGE = (0.1, 0.9)  # ArmoRM targets (r + 0.5) / 5 for HelpSteer ratings r in 0..4


def _rescale_fn(rescale):
  if rescale is None:
    return None
  if isinstance(rescale, str) and rescale == "helpsteer":
    rescale = HELPSTEER_RANGE
  if (not isinstance(rescale, (tuple, list)) or len(rescale) != 2
      or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in rescale)
      or not rescale[0] < rescale[1]):
    raise ValueError(f"rescale must be None, 'helpsteer' or a finite (lo, hi) with lo < hi, "
                     f"got {rescale!r}")
  lo, hi = float(rescale[0]), float(rescale[1])
  return lambda x: min(max((x - lo) / (hi - lo), 0.0), 1.0)


def conversation_of(example: Mapping[str, Any]):
  """The prompt turns of a runner example: ``messages`` (chat turns) or ``prompt`` (str)."""
  if "messages" in example:
    return example["messages"]
  if "prompt" in example:
    return example["prompt"]
  raise MissingFieldError(f"reward-model channels need example['messages'] or example['prompt'] "
                          f"(keys: {sorted(example)})")


def _rm_channel_fn(response, example, num_tokens, *, scorer, index, rescale):
  del num_tokens
  value = float(scorer.score(conversation_of(example), response)[index])
  return value if rescale is None else rescale(value)


def reward_model_channel(objective: int | str, *, path: str = ARMORM_HUB,
                         name: str | None = None, rescale: Any = None,
                         on_failure: float | None = None, **scorer_kw) -> RewardChannel:
  """A channel returning one objective of the reward model (docs/methods.md §7).

  Args:
    objective: index, full name ('helpsteer-coherence') or HelpSteer short name ('coherence').
    path: checkpoint directory or hub id (default ArmoRM-Llama3-8B-v0.1).
    name: channel name (default ``rm_<objective name>``).
    rescale: None (raw), 'helpsteer' (rating / 4, clipped to [0, 1]) or (lo, hi).
    on_failure: the score of a failed row (a response longer than the model's ``max_len``,
      say). Rescaled channels default to their floor 0; raw scores have no floor, so a raw
      channel must give one below its honest scores (ArmoRM's raw scores are about -3 to 1),
      else a response too long to score would be paid more than an ordinary answer.
    **scorer_kw: ``get_scorer`` options (dtype, head, mesh, max_len, padding_side,
      max_batch, max_wait_ms). Channels with equal options share one model.

  The model is loaded (and cached) when the channel is built; the first forward of each
  padded shape compiles, so give the runner a ``timeout_s`` that covers it.
  """
  rescale_fn = _rescale_fn(rescale)
  if rescale_fn is None and on_failure is None:
    raise ValueError("a raw (rescale=None) reward-model channel must give on_failure, below "
                     "its lowest honest score: raw scores have no floor")
  scorer = get_scorer(path, **scorer_kw)
  index = scorer.model.objective_index(objective)
  fn = functools.partial(_rm_channel_fn, scorer=scorer, index=index, rescale=rescale_fn)
  return RewardChannel(name or f"rm_{scorer.model.objectives[index]}", fn, "thread",
                       on_failure=on_failure,
                       value_range=None if rescale_fn is None else UNIT_RANGE)


# Registered channels (AMRP alignment profile, objectives 0 / 1 / 2 of ArmoRM), each named as
# registered and taking `reward_model_channel`'s keyword arguments (path=ARMORM_HUB,
# rescale=None, dtype='float32', mesh=None, ...).
@REWARDS.register
def armorm_helpfulness(**kw: Any) -> RewardChannel:
  """ArmoRM objective 0 (helpsteer-helpfulness)."""
  return reward_model_channel(0, name="armorm_helpfulness", **kw)


@REWARDS.register
def armorm_correctness(**kw: Any) -> RewardChannel:
  """ArmoRM objective 1 (helpsteer-correctness)."""
  return reward_model_channel(1, name="armorm_correctness", **kw)


@REWARDS.register
def armorm_coherence(**kw: Any) -> RewardChannel:
  """ArmoRM objective 2 (helpsteer-coherence)."""
  return reward_model_channel(2, name="armorm_coherence", **kw)


@REWARDS.register
def reward_model(objective: int | str, **kw: Any) -> RewardChannel:
  """Any one objective of a reward model, channel named ``reward_model``."""
  return reward_model_channel(objective, name="reward_model", **kw)
