"""What a reward function returned, read as a score (docs/methods.md §7): a finite float32
in the channel's ``value_range``, NaN for None / NaN, a ``RewardValueError`` for a number that
is no score (that row's failure), a ``RewardConfigError`` for something that is no number."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from mr_rl.rewards.channels import RewardChannel, RewardConfigError

_F32_MAX = float(np.finfo(np.float32).max)


class RewardValueError(ValueError):
  """A reward function returned a number that is no score (+-inf, an int too large for a
  float, a value outside the channel's ``value_range``): scored as that row's failure."""


def as_score(value: Any, channel: RewardChannel) -> float:
  """A returned value as a score (NaN: None / NaN).

  Raises:
    RewardValueError: a number that is no score (+-inf, too large for a float, outside the
      channel's value_range): a failure of this row, scored ``on_failure``.
    RewardConfigError: not a number at all (the channel is broken or declared wrongly).
  """
  if value is None:
    return math.nan
  if isinstance(value, (bool, np.bool_)):
    return float(value)
  if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf":
    value = value.item()
  if isinstance(value, numbers.Real):
    try:
      score = float(value)
    except (OverflowError, ValueError, TypeError) as e:  # a 400-digit int, an odd Real
      raise RewardValueError(f"returned {type(value).__name__} that is no float ({e})") from None
    if math.isinf(score) or abs(score) > _F32_MAX:  # r_BGK is float32
      raise RewardValueError(f"returned {score}: a reward is a finite float32")
    lo, hi = channel.value_range
    if not (lo <= score <= hi or math.isnan(score)):
      raise RewardValueError(f"returned {score!r}, outside the channel's value_range "
                             f"[{lo:g}, {hi:g}]")
    return score
  hint = ""
  if isinstance(value, (list, tuple, np.ndarray)) and not channel.batched:
    hint = " (a per-sample function returned a sequence: mark batched functions batched=True)"
  raise RewardConfigError(f"returned {type(value).__name__} {value!r:.80}: a reward is a real "
                          f"number, or None / NaN for 'does not apply'{hint}")


def as_scores(value: Any, channel: RewardChannel, n: int) -> list[float | RewardValueError]:
  """A batched call's values: a score or the ``RewardValueError`` of each row."""
  if not isinstance(value, (list, tuple, np.ndarray)) or np.ndim(value) != 1 or len(value) != n:
    raise RewardConfigError(f"batched function returned {type(value).__name__} "
                            f"{value!r:.80}; expected a list of {n} rewards (one per response, "
                            f"None / NaN where it does not apply)")
  out = []
  for v in value:
    try:
      out.append(as_score(v, channel))
    except RewardValueError as e:
      out.append(e)
  return out
