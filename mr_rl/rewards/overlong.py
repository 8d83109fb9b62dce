"""DAPO's soft overlong punishment as a reward channel (Yu et al. 2025, arXiv:2503.14476,
Sec. 3.4 "Overlong Reward Shaping", Eq. 13):

    R_length(y) = 0                                 if |y| <= L_max - L_cache
                  ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                  -1                                if |y| > L_max

|y| is the response's generated tokens (EOS included: the `num_tokens` every channel gets;
a response truncated at `rollout.max_new_tokens` has exactly that many). With L_max the
sampler's cap, a truncated response scores -1 and the penalty ramps in over the last L_cache
tokens before it. Values lie in [-1, 0]: DAPO adds the channel to the rule reward, so use an
additive or weighted aggregator; rules that assume channels in [0, 1] (min, TAG, AMRP) would
read it as always failing. It depends on the length alone, so it cannot be gamed by content;
the only way to raise it is to answer within L_max - L_cache tokens (tests/rewards/test_overlong.py).

Channel `overlong(max_len, cache_len)`; set `rewards.params.overlong.max_len` (L_max, usually
`rollout.max_new_tokens`) and `cache_len` (L_cache; DAPO: 4096 of 20480).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from mr_rl.rewards.channels import REWARDS, RewardChannel


def soft_overlong_penalty(num_tokens: int, max_len: int, cache_len: int) -> float:
  """DAPO Eq. 13 (module docstring) for a response of `num_tokens` tokens."""
  if isinstance(num_tokens, bool) or not hasattr(num_tokens, "__index__") or num_tokens < 0:
    raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
  start = max_len - cache_len
  L = int(num_tokens)
  if L <= start:
    return 0.0
  if L <= max_len:
    return (start - L) / cache_len
  return -1.0


def _overlong_channel(response: str, example: Mapping[str, Any], num_tokens: int, *,
                      max_len: int, cache_len: int) -> float:
  del response, example
  return soft_overlong_penalty(num_tokens, max_len, cache_len)


@REWARDS.register
def overlong(max_len: int | None = None, cache_len: int | None = None) -> RewardChannel:
  for name, v in (("max_len", max_len), ("cache_len", cache_len)):
    if v is None:
      raise ValueError(f"reward 'overlong' needs config.rewards.params.overlong.{name} "
                       "(DAPO's L_max = the response budget, L_cache = the ramp before it)")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ValueError(f"reward 'overlong': {name} must be a positive int, got {v!r}")
  if cache_len > max_len:
    raise ValueError(f"reward 'overlong': cache_len={cache_len} must be <= max_len={max_len}")
  return RewardChannel("overlong", functools.partial(_overlong_channel, max_len=max_len,
                                                     cache_len=cache_len),
                       value_range=(-1.0, 0.0))

