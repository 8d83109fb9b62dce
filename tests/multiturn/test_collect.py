"""A multi-turn draw end to end (mr_rl/multiturn/collect.py): the demo's base policy calls the
calculator in the plain format, trajectory-level channels go through AMRP and TAG unchanged
into trajectory-level GRPO advantages and a learner batch whose loss skips observations."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mr_rl import models
from mr_rl.demo import task
from mr_rl.multiturn import builtin_tools, collect, tools, trajectories
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
  return render, collect.draw(engine, params, examples, make_env, render, group_size=G,
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
  # Every channel scores every trajectory (never NaN: no response takes itself out of a
  # channel); a trajectory that called no tool scores the channel's floor on tool_format.
  assert np.isfinite(d.r_BGK).all()
  called = np.array([t.info.get("tool_calls", 0) > 0 for t in d.trajectories]).reshape(4, G)
  assert (d.r_BGK[..., 0][~called] == 0.0).all()
  # acc reads what the policy wrote: the calculator's '=6;' is not the policy's answer.
  for n, t in enumerate(d.trajectories):
    text, count = trajectories.policy_text(turn_draw[0], t)
    assert count == int(t.policy_mask.sum()) and "=;" not in text


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



def _traj(row, turn_ends, turn_rewards, length):
  t = mt.Trajectory(row=row, tokens=np.arange(length, dtype=np.int32),
                    logprobs=np.zeros(length, np.float32),
                    policy_mask=np.ones(length, np.int32))
  t.turn_ends, t.turn_rewards = list(turn_ends), [dict(r) for r in turn_rewards]
  return t


def test_per_turn_credit_is_the_reward_to_go_of_turn_advantages():
  from mr_rl.multiturn import credit
  # One prompt, G = 2: turn 0 rewards 1 vs 0, turn 1 only in the first trajectory.
  trajs = [_traj(0, [2, 6], [{"ok": 1.0}, {"ok": 1.0}], 7), _traj(1, [3], [{"ok": 0.0}], 4)]
  A = credit.per_turn_advantages(trajs, np.array([[0.5, -0.5]]), {"ok": 1.0}, group_size=2,
                                 max_new_tokens=8)
  z = 1.0 / (0.5 + 1e-6) * 0.5  # (1 - 0.5) / std, std 0.5
  # Turn 1 has one trajectory only: no per-turn term; turn 0's term on every turn-0 token.
  np.testing.assert_allclose(A[0, 0], [0.5 + z] * 3 + [0.5] * 4 + [0.5], atol=1e-5)
  np.testing.assert_allclose(A[0, 1], [-0.5 - z] * 4 + [-0.5] * 4, atol=1e-5)


def test_per_token_advantages_enter_the_learner_batch(turn_draw):
  from mr_rl.multiturn import credit
  _, d = turn_draw
  w = {tools.SUCCESS_CHANNEL: 1.0, tools.FORMAT_CHANNEL: 0.5}
  A = credit.per_turn_advantages(d.trajectories, np.ones((4, G), np.float32), w, group_size=G,
                                 max_new_tokens=40)
  b = batch_lib.make_batch(d.rollout, A, trim=False, policy_mask_BGS=d.policy_mask_BGS)
  P = d.rollout.prompt_tokens.shape[1]
  assert b.advantages.shape == b.tokens.shape
  assert not b.advantages[:, :P].any()
  np.testing.assert_array_equal(b.advantages[:, P:], A.reshape(4 * G, 40))
