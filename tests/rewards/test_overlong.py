"""DAPO's soft overlong punishment channel (mr_rl/rewards/overlong.py, DAPO Eq. 13)."""

import numpy as np
import pytest

from mr_rl.rewards import overlong
from mr_rl.rewards.runner import RewardRunner, available_rewards, get_reward


def _verl_rule(L, max_len, cache_len):
  """verl's DAPO reward manager arithmetic (penalty factor 1): the buffer starts at
  max_len - cache_len and the penalty is min(-exceed / cache_len, 0); beyond max_len, -1."""
  if L > max_len:
    return -1.0
  exceed = L - (max_len - cache_len)
  return min(-exceed / cache_len, 0.0)


def test_matches_dapo_rule_on_every_length():
  for max_len, cache_len in ((20, 5), (48, 12), (30, 30)):
    for L in range(0, max_len + 5):
      got = overlong.soft_overlong_penalty(L, max_len, cache_len)
      assert got == pytest.approx(_verl_rule(L, max_len, cache_len), abs=1e-12), (L, max_len)
  assert overlong.soft_overlong_penalty(15, 20, 5) == 0.0   # last length without penalty
  assert overlong.soft_overlong_penalty(20, 20, 5) == -1.0  # at L_max: the ramp reaches -1
  assert overlong.soft_overlong_penalty(18, 20, 5) == pytest.approx(-0.6)


def test_matches_trl_when_installed():
  rewards = pytest.importorskip("trl.rewards")
  fn = rewards.get_soft_overlong_punishment(max_completion_len=40, soft_punish_cache=10)
  lengths = list(range(0, 46))
  want = fn([[1] * n for n in lengths])
  got = [overlong.soft_overlong_penalty(n, 40, 10) for n in lengths]
  np.testing.assert_allclose(got, want, atol=1e-12)


def test_channel_through_the_runner_reads_length_only():
  """Attack: the channel cannot be moved by content (same length, any text, any example)."""
  assert "overlong" in available_rewards()
  ch = get_reward("overlong", max_len=16, cache_len=4)
  runner = RewardRunner([ch], timeout_s=5.0)
  texts = [["short", "<answer>42</answer>" * 9, "x", "y"]]
  lengths = np.array([[3, 16, 13, 14]])
  r, _ = runner(texts, [{}], lengths)
  np.testing.assert_allclose(r[0, :, 0], [0.0, -1.0, -0.25, -0.5])
  r2, _ = runner([["0" * 1000, "", "<answer>1</answer>", "ok"]], [{"reference": "1"}], lengths)
  np.testing.assert_array_equal(r, r2)


def test_bad_parameters_fail_with_the_field_name():
  with pytest.raises(ValueError, match="rewards.params.overlong.max_len"):
    get_reward("overlong")
  with pytest.raises(ValueError, match="rewards.params.overlong.cache_len"):
    get_reward("overlong", max_len=10)
  with pytest.raises(ValueError, match="cache_len=12 must be <= max_len=10"):
    get_reward("overlong", max_len=10, cache_len=12)
  with pytest.raises(ValueError, match="max_len must be a positive int"):
    get_reward("overlong", max_len=0, cache_len=1)
  with pytest.raises(ValueError, match="num_tokens must be an int >= 0"):
    overlong.soft_overlong_penalty(-1, 10, 2)
