"""Multi-turn rollouts on the continuous engine (mr_rl/multiturn/rollout.py, turn_slots.py):
token identity between sampler and learner, the learner's log-probs on policy tokens, slot
reuse across turns, limits and failures."""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest

from mr_rl.demo import task
from mr_rl.models import positions_from_mask
from mr_rl.multiturn import channels as mt_channels
from mr_rl.multiturn import env as env_lib
from mr_rl.multiturn import render as render_lib
from mr_rl.multiturn import rollout as mt
from mr_rl.multiturn import trajectories
from mr_rl.rl import batch as batch_lib

PROMPT_LENS = (7, 3, 12, 5)
G = 2
S = 64
# Turn-end ids common under the tiny random model (vocab 128): turns of ~8 tokens.
END_IDS = tuple(range(5, 128, 8))


class Counter:
  """Answers each turn with its index as a tool message; done after `turns` turns. Row
  `fail_row` raises, `hang_row` sleeps past the timeout."""

  def __init__(self, row, turns=3, fail_row=-1, hang_row=-1, long_row=-1):
    self.row, self.turns = row, turns
    self.fail_row, self.hang_row, self.long_row = fail_row, hang_row, long_row

  def reset(self, example):
    return [{"role": "user", "content": "Q:1+2="}]

  def step(self, turn):
    if self.row == self.fail_row:
      raise RuntimeError("the tool broke")
    if self.row == self.hang_row:
      time.sleep(2.0)
    if turn.index + 1 >= self.turns:
      return env_lib.StepResult(rewards={"done_in_time": 1.0}, done=True)
    content = "9" * 40 if self.row == self.long_row else str(turn.index)
    return env_lib.StepResult(messages=[{"role": "tool", "content": content}],
                              rewards={"steps": 1.0}, info={"tool_calls": 1})


@pytest.fixture(scope="module")
def setup(tiny_hf_pair, left_padded_prompts):
  _, model, params = tiny_hf_pair("qwen3")
  tokens, mask = left_padded_prompts(PROMPT_LENS, vocab=128, seed=0)
  render = render_lib.PlainRenderer(task.make_tokenizer(), template="={content};", marker="--")
  return model, params, tokens, mask, render


def _run(setup, slots=3, limits=mt.TurnLimits(max_turns=4, max_observation_tokens=8,
                                              step_timeout_s=5.0), **env_kw):
  model, params, tokens, mask, render = setup
  rows = len(PROMPT_LENS) * G
  envs = [Counter(n, **env_kw) for n in range(rows)]
  ro = mt.TurnRollout(model, slots=slots, max_new_tokens=S, end_of_turn_ids=END_IDS,
                      limits=limits, workers=4)
  trajs = ro.run(params, tokens, mask, envs, key=jax.random.PRNGKey(3), group_size=G,
                 render=render)
  return ro, trajs


def test_learner_ids_and_logprobs_match_the_sampler(setup):
  model, params, tokens, mask, render = setup
  ro, trajs = _run(setup)
  assert ro.last_stats.token_mismatches == 0
  assert ro.last_stats.appends > 0
  assert ro.programs(2).append._cache_size() == 1  # one compile whatever the slot and length
  assert all(t.status in ("done", "budget") for t in trajs)
  assert sum(t.turns > 1 for t in trajs) >= 4  # multi-turn trajectories, observations inside
  rollout, policy = trajectories.to_rollout(trajs, tokens, mask, group_size=G, max_new_tokens=S,
                                            decode=render.turn_text)
  b = batch_lib.make_batch(rollout, np.ones((len(PROMPT_LENS), G)), trim=False,
                           policy_mask_BGS=policy)
  P = tokens.shape[1]
  n_obs = 0
  for n, t in enumerate(trajs):
    L = len(t.tokens)
    # Token identity: the learner's response ids are the slot's ids, observations included
    # exactly as inserted, and the loss mask is 0 on them.
    np.testing.assert_array_equal(b.tokens[n, P:P + L], t.tokens)
    np.testing.assert_array_equal(b.response_mask[n, P:P + L], t.policy_mask)
    for at, ids in t.inserted:
      np.testing.assert_array_equal(t.tokens[at:at + len(ids)], ids)
      assert not t.policy_mask[at:at + len(ids)].any()
      assert not t.logprobs[at:at + len(ids)].any()
      n_obs += len(ids)
  assert n_obs > 0
  # The learner's forward over the whole trajectory gives the sampler's log-probs on every
  # policy token: the observation prefills into the slot computed the same cache.
  pos = positions_from_mask(b.mask)
  logits = model.apply({"params": params}, b.tokens, pos, kv_mask_NC=b.mask.astype(bool))
  if isinstance(logits, tuple):
    logits = logits[0]
  logp = jax.nn.log_softmax(np.asarray(logits, np.float32)[:, :-1], -1)
  logp = np.take_along_axis(np.asarray(logp), b.tokens[:, 1:, None], -1)[..., 0]
  on = b.response_mask[:, 1:] > 0
  np.testing.assert_allclose(logp[on], b.old_logp[:, 1:][on], atol=2e-5)


def test_tokens_do_not_depend_on_the_slot_count(setup):
  _, a = _run(setup, slots=2)
  _, b = _run(setup, slots=8)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x.tokens, y.tokens)
    assert x.turn_ends == y.turn_ends


def test_batched_appends_equal_one_at_a_time(setup):
  """The observations of steps that finish together go in with one `append` call: the same
  tokens and log-probs as one call per observation of the same program (a row's result does
  not depend on the other rows), and the same tokens as the one-row program (`append_rows=1`,
  the per-observation program of before, whose log-probs may differ in the last bits: the
  matmuls' row count differs)."""
  model, params, tokens, mask, render = setup
  limits = mt.TurnLimits(max_turns=4, max_observation_tokens=8, step_timeout_s=5.0)

  def run(append_rows, one_at_a_time=False):
    ro = mt.TurnRollout(model, slots=4, max_new_tokens=S, end_of_turn_ids=END_IDS,
                        limits=limits, workers=4, append_rows=append_rows)
    progs = ro.programs(2)  # ceil(slots / G) prompts per prefill
    batched = progs.append
    if one_at_a_time:
      def one(params, state, slots_R, ids_RA, n_R):
        for r in np.flatnonzero(n_R):
          state = batched(params, state, slots_R, ids_RA, np.where(np.arange(len(n_R)) == r,
                                                                   n_R, 0).astype(np.int32))
        return state
      progs.append = one
    trajs = ro.run(params, tokens, mask, [Counter(n) for n in range(len(PROMPT_LENS) * G)],
                   key=jax.random.PRNGKey(3), group_size=G, render=render)
    assert batched._cache_size() == 1
    return ro.last_stats, trajs

  stats, batched = run(4)
  assert stats.observations > stats.appends > 0  # some calls carried several observations
  assert stats.token_mismatches == 0
  _, single = run(4, one_at_a_time=True)
  _, one_row = run(1)
  for x, y, z in zip(batched, single, one_row):
    np.testing.assert_array_equal(x.tokens, y.tokens)
    np.testing.assert_array_equal(x.logprobs, y.logprobs)
    assert x.inserted == y.inserted == z.inserted and x.status == y.status == z.status
    np.testing.assert_array_equal(x.tokens, z.tokens)
    np.testing.assert_allclose(x.logprobs, z.logprobs, atol=1e-5)


def test_max_turns_and_observation_truncation(setup):
  _, trajs = _run(setup, limits=mt.TurnLimits(max_turns=2, max_observation_tokens=12,
                                              step_timeout_s=5.0), turns=10, long_row=1)
  assert all(t.turns <= 2 for t in trajs)
  assert {t.status for t in trajs} <= {"max_turns", "budget"}
  assert any(t.status == "max_turns" for t in trajs)
  t = trajs[1]
  assert t.observations_truncated >= 1
  at, ids = t.inserted[0]
  assert len(ids) <= 12
  assert setup[4].turn_text(ids).endswith("--;")  # the content cut, the marker appended


def test_a_failing_or_hanging_environment_fails_only_its_trajectory(setup):
  limits = mt.TurnLimits(max_turns=4, max_observation_tokens=8, step_timeout_s=0.5)
  ro, trajs = _run(setup, limits=limits, fail_row=2, hang_row=5)
  assert trajs[2].status == "error" and "the tool broke" in trajs[2].error
  assert trajs[5].status == "timeout"
  assert all(t.status in ("done", "budget") for n, t in enumerate(trajs) if n not in (2, 5))
  r = mt_channels.environment_scores(
      trajs, [mt_channels.EnvironmentChannel(c, reduce="sum", on_failure=-1.0)
              for c in ("done_in_time", "steps")], G)
  assert r.shape == (len(PROMPT_LENS), G, 2)
  assert r[1, 0].tolist() == [-1.0, -1.0] and r[2, 1].tolist() == [-1.0, -1.0]
  m = trajectories.turn_metrics(trajs, ro.last_stats)
  assert m["multiturn/env_errors"] == 1 and m["multiturn/env_timeouts"] == 1
  assert 0 < m["multiturn/observation_token_share"] < 1
  assert m["multiturn/token_mismatches"] == 0


def test_every_trajectory_failing_stops_the_rollout(setup):
  class Broken(Counter):
    def step(self, turn):
      raise ValueError("no such file: /data/tool.db")
  model, params, tokens, mask, render = setup
  ro = mt.TurnRollout(model, slots=4, max_new_tokens=S, end_of_turn_ids=END_IDS)
  with pytest.raises(mt.AllTrajectoriesFailed, match="no such file"):
    ro.run(params, tokens, mask, [Broken(n) for n in range(len(PROMPT_LENS) * G)],
           key=jax.random.PRNGKey(0), group_size=G, render=render)


def test_an_observation_without_ids_fails_its_trajectory(setup):
  model, params, tokens, mask, _ = setup
  empty = render_lib.PlainRenderer(task.make_tokenizer(), template="{content}")

  class Silent(Counter):
    def step(self, turn):
      return env_lib.StepResult(messages=[{"role": "tool", "content": ""}])
  ro = mt.TurnRollout(model, slots=4, max_new_tokens=S, end_of_turn_ids=END_IDS)
  with pytest.raises(mt.AllTrajectoriesFailed, match="no ids"):
    ro.run(params, tokens, mask, [Silent(n) for n in range(len(PROMPT_LENS) * G)],
           key=jax.random.PRNGKey(0), group_size=G, render=empty)


def test_invalid_settings_raise(setup):
  model = setup[0]
  with pytest.raises(ValueError, match="slots"):
    mt.TurnRollout(model, slots=0, max_new_tokens=S, end_of_turn_ids=END_IDS)
  with pytest.raises(ValueError, match="end-of-turn"):
    mt.TurnRollout(model, slots=2, max_new_tokens=S, end_of_turn_ids=())
  with pytest.raises(ValueError, match="workers"):
    mt.TurnRollout(model, slots=2, max_new_tokens=S, end_of_turn_ids=END_IDS, workers=0)
  with pytest.raises(ValueError, match="workers_kind"):
    mt.TurnRollout(model, slots=2, max_new_tokens=S, end_of_turn_ids=END_IDS,
                   workers_kind="fork")
  with pytest.raises(ValueError, match="append_rows"):
    mt.TurnRollout(model, slots=2, max_new_tokens=S, end_of_turn_ids=END_IDS, append_rows=0)
  with pytest.raises(ValueError, match="max_turns"):
    mt.TurnLimits(max_turns=0)
