"""Tests for mr_rl.rollout: rewards scored as rows finish (`StreamingScore`) against scoring
after the rollout (`score`)."""

import threading

import jax
import numpy as np
import pytest

from mr_rl import models
from mr_rl.data.example import Example
from mr_rl.rewards import runner as rr
from mr_rl.rl import batch as batch_lib
from mr_rl.rollout import Policy, SamplingSettings, StreamingScore, rollout, score
from mr_rl.tiny_assets.checkpoints import numpy_init, tiny_model_config
from mr_rl.tiny_assets.tokenizer import make_tokenizer

PROMPTS = ["1 + 2 =", "Question: 7 * 6", "x", "what is 3 - 5?", "y z", "12 / 4 ="]


@pytest.fixture(scope="module")
def policy_params(tmp_path_factory):
  tok = make_tokenizer(str(tmp_path_factory.mktemp("tok")), vocab_size=300)
  model = models.Transformer(tiny_model_config("qwen3", len(tok), d_model=32))
  policy = Policy(model=model, tokenizer=tok, render=lambda ex: ex.prompt, max_prompt_len=16,
                  add_bos=False)
  return policy, numpy_init(model, std=0.3)


def _examples():
  return [Example.single_turn(f"t/{i}", "t", p, reference=str(i),
                              skip=i == 2) for i, p in enumerate(PROMPTS)]


def _chars(response, example, num_tokens):
  """Not applicable to prompt 2 (declared in `_runner`); None (unscorable) on some responses;
  fails on others."""
  assert not example["skip"]
  if len(response) % 5 == 0:
    return None
  if len(response) % 5 == 1:
    raise RuntimeError("a scorer that breaks on this response")
  return float(len(response) % 3 + num_tokens % 2)


@rr.batched_reward
def _batch_rank(responses, examples, num_tokens):
  """Depends on the whole batch and its order."""
  del examples
  keys = [(len(r), n) for r, n in zip(responses, num_tokens)]
  order = sorted(range(len(keys)), key=keys.__getitem__)
  return [float(order.index(i)) for i in range(len(keys))]


def _runner():
  return rr.RewardRunner([rr.RewardChannel("chars", _chars, applies=lambda ex: not ex["skip"],
                                           on_failure=0.0),
                          "accuracy",
                          rr.RewardChannel("rank", _batch_rank, batched=True,
                                           on_failure=0.0)], timeout_s=60)


@pytest.mark.parametrize("engine", ["continuous", "static"])
def test_streaming_scores_equal_scoring_after_the_rollout(policy_params, engine):
  """Same rollout, rewards, metrics (but the seconds) and learner batch, with a thread, a
  process (math-verify) and a batched channel, failures and per-prompt applicability."""
  policy, params = policy_params
  settings = SamplingSettings(group_size=3, max_new_tokens=10, temperature=1.0, top_k=0,
                              top_p=1.0, engine=engine, engine_options={"slots": 4})
  key = jax.random.PRNGKey(3)
  ro_a = rollout(policy, params, _examples(), key, settings)
  r_a, m_a = score(_runner(), ro_a, _examples())
  scoring = StreamingScore(_runner(), policy, _examples(), settings.group_size)
  ro_b = rollout(policy, params, _examples(), key, settings, on_row=scoring)
  r_b, m_b = scoring.finish(ro_b)
  for f in ("prompt_tokens", "prompt_mask", "tokens", "logprobs", "mask", "lengths",
            "truncated", "texts", "owned"):
    np.testing.assert_array_equal(getattr(ro_b, f), getattr(ro_a, f), err_msg=f)
  np.testing.assert_array_equal(r_b, r_a)
  m_a.pop("rewards/seconds"), m_b.pop("rewards/seconds")
  assert m_b == m_a
  # The comparison means something: every outcome occurs.
  assert m_a["rewards/chars/errors"] > 0 and m_a["rewards/chars/unscorable"] > 0
  assert m_a["rewards/chars/not_applicable"] == 3 and np.isnan(r_a[2, :, 0]).all()
  assert len(set(r_a[..., 2].ravel())) == r_a[..., 2].size
  A_BG = np.nan_to_num(r_a[..., 0]) - np.nanmean(np.nan_to_num(r_a[..., 0]), 1, keepdims=True)
  ba, bb = batch_lib.make_batch(ro_a, A_BG), batch_lib.make_batch(ro_b, A_BG)
  for x, y in zip(jax.tree.leaves(ba), jax.tree.leaves(bb)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


EVENTS: list = []
SCORED = threading.Event()


def _record(response, example, num_tokens):
  del response, example, num_tokens
  EVENTS.append("scored")
  SCORED.set()
  return 1.0


def test_continuous_engine_scores_rows_before_the_last_one_finishes(policy_params):
  """With 4 slots for 18 rows, the first finished row's reward starts before the last row
  comes out of the engine. The check is an order of events: the row callback waits (up to a
  minute) for the first reward call to start, which happens only if scoring starts at once."""
  policy, params = policy_params
  EVENTS.clear()
  SCORED.clear()
  settings = SamplingSettings(group_size=3, max_new_tokens=10, temperature=1.0, top_k=0,
                              top_p=1.0, engine="continuous", engine_options={"slots": 4})
  runner = rr.RewardRunner([rr.RewardChannel("record", _record, on_failure=0.0)], timeout_s=60)
  scoring = StreamingScore(runner, policy, _examples(), settings.group_size)
  started_in_time = []

  def on_row(b, g, text, num_tokens):
    EVENTS.append(("finished", b, g))
    scoring(b, g, text, num_tokens)
    if len(started_in_time) == 0:
      started_in_time.append(SCORED.wait(60))

  ro = rollout(policy, params, _examples(), jax.random.PRNGKey(0), settings, on_row=on_row)
  assert started_in_time == [True]
  finished = [i for i, e in enumerate(EVENTS) if e != "scored"]
  first_scored = EVENTS.index("scored")
  assert first_scored < finished[-1]
  assert sum(1 for i in finished if i > first_scored) >= 12  # rows still decoding then
  r_BGK, _ = scoring.finish(ro)
  assert (r_BGK == 1.0).all() and EVENTS.count("scored") == 18


def test_finish_needs_every_row(policy_params):
  policy, params = policy_params
  settings = SamplingSettings(group_size=2, max_new_tokens=4, temperature=0.0, top_k=0,
                              top_p=1.0)
  ro = rollout(policy, params, _examples(), jax.random.PRNGKey(0), settings)
  scoring = StreamingScore(_runner(), policy, _examples(), 2)
  scoring(0, 0, ro.texts[0][0], int(ro.lengths[0, 0]))
  with pytest.raises(ValueError, match="twice"):
    scoring(0, 0, ro.texts[0][0], int(ro.lengths[0, 0]))
  with pytest.raises(RuntimeError, match="1 of 12"):
    scoring.finish(ro)


def _nested_depth(response, example, num_tokens):
  """A "process" channel reading nested metadata (pickled to a worker process)."""
  return float(example["meta"]["depth"] + len(example["meta"]["tags"]))


def test_a_process_channel_reads_nested_metadata(policy_params):
  """Examples reach a "process" channel as plain, picklable dicts, nested metadata included
  (the Example's read-only mappings do not pickle)."""
  policy, params = policy_params
  settings = SamplingSettings(group_size=2, max_new_tokens=4, temperature=0.0, top_k=0,
                              top_p=1.0)
  examples = [Example.single_turn(f"n/{i}", "n", p, reference=str(i),
                                  meta={"depth": i, "tags": ["a", "b"]})
              for i, p in enumerate(PROMPTS[:3])]
  runner = rr.RewardRunner([rr.RewardChannel("depth", _nested_depth, "process", on_failure=0.0)],
                           timeout_s=60)
  ro = rollout(policy, params, examples, jax.random.PRNGKey(0), settings)
  r_BGK, _ = score(runner, ro, examples)
  np.testing.assert_array_equal(r_BGK[..., 0], [[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
  assert runner.error_counts["depth"] == 0
