"""A multi-turn draw end to end (mr_rl/multiturn/collect.py): the demo's base policy calls the
calculator in the plain format, trajectory-level channels go through AMRP and TAG unchanged
into trajectory-level GRPO advantages and a learner batch whose loss skips observations."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mr_rl import models
from mr_rl.demo import task
from mr_rl.multiturn import builtin_tools, collect, tools
from mr_rl.multiturn import render as render_lib
from mr_rl.multiturn import rollout as mt
from mr_rl.rl import batch as batch_lib
from mr_rl.rl import signal as signal_lib

G = 4


@pytest.fixture(scope="module")
def turn_draw():
  import os
  from transformers import AutoTokenizer
  path = os.path.join(os.path.dirname(task.__file__), "assets", "base_policy")
  model, params = models.load_pretrained(path)[:2]
  tok = AutoTokenizer.from_pretrained(path)
  render = render_lib.PlainRenderer(tok, template="={content};", marker="")
  make_env = lambda: tools.ToolEnv([builtin_tools.calculator],
                                   format=tools.PlainFormat("<r>", "</r>"), error_template="")
  engine = mt.TurnRollout(model, slots=8, max_new_tokens=40,
                          end_of_turn_ids=tok.convert_tokens_to_ids(["<eos>", "</r>"]),
                          limits=mt.TurnLimits(max_turns=3, max_observation_tokens=8,
                                               step_timeout_s=5.0))
  examples = task.examples(4, seed=0)
  acc = lambda text, ex: task.accuracy(text, int(ex.reference))
  return engine, collect.draw(engine, params, examples, make_env, render, group_size=G,
                              key=jax.random.PRNGKey(0),
                              env_channels=(tools.FORMAT_CHANNEL, tools.SUCCESS_CHANNEL),
                              text_rewards={"acc": acc})


def test_the_demo_policy_calls_the_calculator(turn_draw):
  _, d = turn_draw
  assert d.r_BGK.shape == (4, G, 3) and d.channels == ("tool_format", "tool_success", "acc")
  assert d.metrics["multiturn/tool_calls"] >= 8  # the base policy opens with <r>...</r>
  assert d.metrics["multiturn/turns_mean"] > 1.5
  assert d.metrics["multiturn/token_mismatches"] == 0
  assert 0 < d.metrics["multiturn/observation_token_share"] < 0.5
  # tool_format applies (is not NaN) exactly to the trajectories that called the tool; acc
  # is scored on every trajectory's text.
  called = np.array([t.info.get("tool_calls", 0) > 0 for t in d.trajectories]).reshape(4, G)
  np.testing.assert_array_equal(np.isfinite(d.r_BGK[..., 0]), called)
  assert np.isfinite(d.r_BGK[..., 2]).all()


@pytest.mark.parametrize("name,hp", [("amrp", {}), ("tag", {"anchor": 2}), ("additive", {})])
def test_trajectory_channels_through_the_aggregators(turn_draw, name, hp):
  _, d = turn_draw
  r = np.nan_to_num(d.r_BGK, nan=0.0)
  agg, fn = signal_lib.signal_fn(name, hp, "grpo")
  sig = fn(agg.init(r.shape[-1]), r, jax.random.PRNGKey(0))
  assert np.isfinite(np.asarray(sig.A_BG)).all() and sig.A_BG.shape == (4, G)
  b = batch_lib.make_batch(d.rollout, np.asarray(sig.A_BG), policy_mask_BGS=d.policy_mask_BGS)
  # The loss covers exactly the sampled ids: observation ids are attended, not trained on.
  assert int(b.response_mask.sum()) == int(d.policy_mask_BGS.sum())
  assert int(b.mask.sum()) == int(d.rollout.prompt_mask.sum()) * G + int(d.rollout.mask.sum())
