"""The GRPO recipe features in the trainer: DAPO dynamic sampling (both deciding
signals, refill and shrink), overlong masking and penalty, the sampler/trainer mismatch
(recomputed old log-probs, truncated importance sampling), and bit-exact resume with them on.

They run the real trainer on the demo's arithmetic task with a tiny warm-started policy
(tests/test_train.py's fixture and config)."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from mr_rl import metrics as metrics_lib
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl import train_step
from mr_rl.rl import dynamic_sampling as ds
from mr_rl.rl import signal as signal_lib

from mr_rl.testing.runs import arith_config as _config
from mr_rl.testing.runs import assert_same_metrics as _assert_same_metrics


# --------------------------------------------------------------------------- signals
def test_which_signal_decides():
  """Two channels that trade off exactly: the 0.5/0.5 scalar is constant in group 0, the
  channels are not. `scalar` drops the group (GRPO's advantage is 0 there), `channels` keeps
  it (GDPO normalises each channel in its group)."""
  nan = np.nan
  r = np.array([[[1, 0], [0, 1], [1, 0], [0, 1]],          # scalar constant, channels vary
                [[1, 1], [1, 1], [1, 1], [1, 1]],          # nothing varies
                [[1, nan], [0, nan], [1, nan], [1, nan]],  # one channel varies
                [[nan, 0], [nan, nan], [nan, nan], [1, nan]]], float)  # one valid value each
  R = np.array([[0.5] * 4, [1.0] * 4, [1.0, 0.0, 1.0, 1.0], [0.0, nan, nan, 1.0]])  # mean of valid
  np.testing.assert_array_equal(ds.scalar_signal(R), [False, False, True, True])
  np.testing.assert_array_equal(ds.channel_signal(r), [True, False, True, False])
  R[3] = [nan, nan, nan, 0.5]  # fewer than two valid scalars: no signal
  assert not ds.scalar_signal(R)[3]
  assert ds.resolve_signal("auto", True) == "channels"
  assert ds.resolve_signal("auto", False) == "scalar"
  assert ds.resolve_signal("scalar", True) == "scalar"
  picks, n = ds.fill([(0, 2), (1, 0), (1, 3)], [(0, 0), (0, 1)], 2)
  assert picks == [(0, 2), (1, 0)] and n == 2
  picks, n = ds.fill([(0, 2)], [(0, 0), (0, 1), (0, 3)], 3)
  assert picks == [(0, 2), (0, 0), (0, 1)] and n == 1


@pytest.mark.parametrize("signal_name,advantage,mode", [("scalar", "grpo", "refill"),
                                                   ("channels", "gdpo", "shrink")])
def test_trainer_keeps_only_groups_with_signal(base_policy, signal_name, advantage, mode):
  c = _config(base_policy, 1, aggregator="weighted")
  c.aggregator.hp.w = [0.5, 0.25, 0.25]
  c.advantage.name = advantage
  c.dynamic.mode = mode
  c.dynamic.signal = "auto"
  s = settings_lib.from_config(c)
  assert s.dynamic.signal == signal_name
  comp = train_lib.build(s)
  agg, signal = signal_lib.signal_fn(s.aggregator.name, s.aggregator.hp, s.advantage,
                                     s.advantage_hp)
  state = agg.init(s.num_channels)
  from mr_rl import data
  it = data.ResumableIterator(list(comp.train_examples), s.data.batch_prompts, seed=s.seed)
  key = jax.random.PRNGKey(3)
  draw = train_step.draw_groups(comp, comp.base_params, state, it, signal, key, key)
  ro, r, n_kept, m = draw.rollout, draw.r_BGK, draw.n_kept, draw.metrics
  B = s.data.batch_prompts
  assert r.shape[0] == B == ro.tokens.shape[0]
  # The first round had groups without signal, so dropping (and, for refill, refilling) ran.
  assert m["dynamic/dropped_frac"] > 0
  has = (ds.scalar_signal(np.asarray(signal(state, r, key).R_BG)) if signal_name == "scalar"
         else ds.channel_signal(r))
  assert has[:n_kept].all() and not has[n_kept:].any()
  if mode == "shrink":
    assert m["dynamic/rounds"] == 1
    assert m["dynamic/kept_frac"] == n_kept / B == 1 - m["dynamic/dropped_frac"]
  else:  # refill draws rounds until B groups are kept, at most 1 + max_rounds
    assert m["dynamic/rounds"] >= 2
    if m["dynamic/rounds"] < 1 + s.dynamic.max_rounds:
      assert m["dynamic/kept_frac"] == 1.0
    if m["dynamic/kept_frac"] < 1.0:
      assert m["dynamic/rounds"] == 1 + s.dynamic.max_rounds
  # The data iterator moved once per round.
  assert it.state() != data.ResumableIterator(list(comp.train_examples), B, seed=s.seed).state()


# ----------------------------------------------------------------- trainer, resume
def _recipe_config(base_policy, total_steps):
  c = _config(base_policy, total_steps)          # AMRP: a stateful aggregator
  c.dynamic.mode = "refill"
  c.dynamic.max_rounds = 2
  c.batch.mask_truncated = True
  c.optim.pack = True
  c.optim.loss.tis_cap = 2.0                         # 'auto' recomputation turns on
  c.checkpoint_every = 2
  return c


def test_resume_with_the_recipe_features_is_bit_exact(base_policy, tmp_path):
  s2 = settings_lib.from_config(_recipe_config(base_policy, 2))
  s4 = settings_lib.from_config(_recipe_config(base_policy, 4))
  assert s4.update.loss.recompute_old_logp and s4.update.pack
  comp = train_lib.build(s4)
  resumed, straight = str(tmp_path / "resumed"), str(tmp_path / "straight")
  train_lib.train(s2, resumed, comp=comp, log=None)
  res = train_lib.train(s4, resumed, comp=comp, log=None)
  assert [h["step"] for h in res.history] == [2, 3]
  train_lib.train(s4, straight, comp=comp, log=None)
  a = metrics_lib.read_jsonl(os.path.join(resumed, "metrics.jsonl"))
  b = metrics_lib.read_jsonl(os.path.join(straight, "metrics.jsonl"))
  _assert_same_metrics(a, b)
  assert max(h["dynamic/rounds"] for h in a) > 1  # some step refilled
  for h in a:
    for k in ("dynamic/dropped_frac", "dynamic/rounds", "dynamic/kept_frac", "batch/packed_rows",
              "mismatch/abs_logp_diff", "mismatch/k3", "mismatch/tis_weight_mean"):
      assert k in h and np.isfinite(h[k]), (h["step"], k)
    assert h["update/clip_frac"] == 0.0  # pi_old recomputed: the ratio is exactly 1


def test_bf16_sampler_turns_recomputation_on_and_logs_the_mismatch(base_policy):
  c = _config(base_policy, 1, aggregator="additive")
  c.rewards.channels = "arith_acc,overlong"  # DAPO: the penalty added to the rule reward
  c.rewards.params.overlong = dict(max_len=24, cache_len=8)
  assert settings_lib.from_config(c).update.loss.recompute_old_logp is False
  c.rollout.cache_dtype = "bfloat16"
  assert settings_lib.from_config(c).update.loss.recompute_old_logp is True
  c.rollout.cache_dtype = ""
  c.rollout.dtype = "bfloat16"
  s = settings_lib.from_config(c)
  assert s.update.loss.recompute_old_logp is True and s.rollout.dtype == "bfloat16"
  h = train_lib.train(dataclasses.replace(s, checkpoint_every=0), None, log=None).history[-1]
  assert h["mismatch/abs_logp_diff"] > 1e-4  # bf16 sampling computes differently
  assert h["mismatch/k3"] > 0 and h["update/clip_frac"] == 0.0
  assert -1.0 <= h["reward/overlong/mean"] <= 0.0 and "reward/overlong/mean" in h
  c.optim.loss.recompute_old_logp = "off"
  assert settings_lib.from_config(c).update.loss.recompute_old_logp is False


@pytest.mark.parametrize("fields,needle", [
    ({"optim.loss.tis_cap": 0.5}, "config.optim.loss.tis_cap must be 0 \\(off\\) or >= 1"),
    ({"optim.loss.recompute_old_logp": "maybe"},
     "optim.loss.recompute_old_logp='maybe' is not valid"),
    ({"rollout.dtype": "float16"}, "rollout.dtype='float16' is not valid"),
    ({"dynamic.mode": "always"}, "dynamic.mode='always' is not valid"),
    ({"dynamic.signal": "any"}, "dynamic.signal='any' is not valid"),
    ({"dynamic.max_rounds": -1}, "dynamic.max_rounds must be >= 0"),
    # settings that contradict each other
    ({"optim.loss.tis_cap": 2.0, "optim.loss.recompute_old_logp": "off"},
     "tis_cap needs config.optim.loss.recompute_old_logp"),
    ({"advantage.name": "ppo", "dynamic.mode": "refill"},
     "dynamic needs a group-relative advantage"),
    ({"advantage.name": "ppo", "dynamic.mode": "off", "optim.pack": True},
     "optim.pack is for the GRPO family"),
])
def test_bad_recipe_settings_fail_at_start_up(base_policy, fields, needle):
  c = _config(base_policy, 1)
  for field, value in fields.items():
    *sections, name = field.split(".")
    node = c
    for section in sections:
      node = node[section]
    node[name] = value
  with pytest.raises(ValueError, match=needle):
    settings_lib.from_config(c)
