"""Tests for the continuous engine (mr_rl/sampling/engine.py, slots.py, memory.py): greedy
tokens equal the static sampler and transformers `generate`; sampled draws equal the static
sampler's per-row key schedule whatever the slot count; shared prefills equal separate ones;
a rollout larger than the pool; the finished-row stream (completion order, every row once);
bounded compiles; the tail compaction; the memory formula against the engine's arrays."""

from __future__ import annotations

import collections

import chex
import jax
import numpy as np
import pytest

from mr_rl.sampling import Engine, Sampler, generate_continuous, memory

# Left-padded prompts of lengths 7, 3, 12, 1 and 5 (the fourth row's prefill is all padding).
PROMPT_LENS = (7, 3, 12, 1, 5)
N_NEW = 16
# EOS ids common enough under the tiny random models that rows stop at varied lengths.
EOS = (3, 7, 11, 19, 23, 42)


@pytest.fixture(scope="module")
def prompts(left_padded_prompts):
  return left_padded_prompts(PROMPT_LENS, vocab=128, seed=0)


def _np(out):
  return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_greedy_matches_static_sampler_and_transformers(family, tiny_hf_pair, hf_greedy,
                                                        prompts):
  hf, model, params = tiny_hf_pair(family)
  tokens, mask = prompts
  group = 2
  rep = np.repeat(tokens, group, 0), np.repeat(mask, group, 0)
  ref = hf_greedy(hf, *rep, N_NEW)
  static = _np(Sampler(model, max_new_tokens=N_NEW, temperature=0.0)(params, *rep,
                                                                      key=jax.random.PRNGKey(0)))
  # 10 rows through 3 slots: rows stream through the pool, G = 2 rows share each prefill.
  out = generate_continuous(model, params, tokens, mask, group_size=group, slots=3,
                            key=jax.random.PRNGKey(0), max_new_tokens=N_NEW, temperature=0.0)
  assert out.tokens.shape == (len(PROMPT_LENS), group, N_NEW)
  out = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]) if a.ndim >= 2 else a, out)
  np.testing.assert_array_equal(out.tokens, ref)
  np.testing.assert_array_equal(out.tokens, static.tokens)
  np.testing.assert_allclose(out.logprobs, static.logprobs, atol=1e-5)
  assert out.lengths.tolist() == [N_NEW] * 10 and out.truncated.all()
  assert len(np.unique(ref)) > 8  # not a degenerate repetition


def test_sampled_draws_do_not_depend_on_slots(tiny_hf_pair, prompts):
  """Row n at step s draws from fold_in(fold_in(key, n), s): slot counts 3, 5 and 16 give the
  static sampler's tokens under that key schedule, EOS rows included."""
  _, model, params = tiny_hf_pair("qwen3")
  tokens, mask = prompts
  group, key = 3, jax.random.PRNGKey(7)
  kw = dict(max_new_tokens=N_NEW, temperature=0.9, top_k=40, top_p=0.95, eos_id=EOS, pad_id=0)
  rep = np.repeat(tokens, group, 0), np.repeat(mask, group, 0)
  ref = _np(Sampler(model, key_schedule="row", **kw)(params, *rep, key=key))
  assert 0 < ref.truncated.mean() < 1 and len(set(ref.lengths.tolist())) > 3
  for slots in (3, 5, 16):  # fixed pools (the tail compaction is tested below)
    out = Engine(model, slots=slots, steps_per_call=3, shrink_tail=False, **kw)(
        params, tokens, mask, key=key, group_size=group)
    np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=f"slots={slots}")
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.truncated, ref.truncated)
    np.testing.assert_array_equal(out.mask, ref.mask)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
  other = _np(Sampler(model, key_schedule="row", **kw)(params, *rep, key=jax.random.PRNGKey(8)))
  assert (other.tokens != ref.tokens).mean() > 0.3  # the key matters


def test_shared_prefill_equals_separate_prefills(tiny_hf_pair, prompts):
  """G rows sharing one prefill of their prompt decode as the same rows prefilled one by one
  (the prompts repeated, G = 1): rows b * G + g match (sampled, Llama; the greedy test above
  shares prefills too)."""
  _, model, params = tiny_hf_pair("llama")
  tokens, mask = prompts
  group = 3
  engine = Engine(model, slots=4, max_new_tokens=N_NEW, eos_id=EOS, shrink_tail=False)
  shared = engine(params, tokens, mask, key=jax.random.PRNGKey(1), group_size=group)
  shared_prefills = engine.last_stats.prefills
  separate = engine(params, np.repeat(tokens, group, 0), np.repeat(mask, group, 0),
                    key=jax.random.PRNGKey(1))
  for name in ("tokens", "lengths", "truncated"):
    np.testing.assert_array_equal(getattr(shared, name), getattr(separate, name))
  np.testing.assert_allclose(shared.logprobs, separate.logprobs, atol=1e-5)
  assert 0 < shared.truncated.mean() < 1
  assert shared_prefills == 3 < engine.last_stats.prefills == 4  # M = 2 vs 4 prompts a call


def _simulated_completion_order(lengths, slots):
  """The engine's schedule with one step per call and refill at the first free slot: free
  slots take queued rows in order; rows finishing at the same step come out by slot."""
  queue = collections.deque(range(len(lengths)))
  free = collections.deque(range(slots))
  row_of, left, order = {}, {}, []
  while queue or row_of:
    while free and queue:
      n = free.popleft()
      row_of[n] = queue.popleft()
      left[n] = lengths[row_of[n]]
    for n in sorted(row_of):
      left[n] -= 1
    for n in sorted(n for n in row_of if left[n] == 0):
      order.append(row_of.pop(n))
      free.append(n)
  return order


def test_stream_yields_each_row_once_in_completion_order(tiny_hf_pair, prompts):
  """A rollout of 15 rows through 4 slots: `stream` hands out every row exactly once, in the
  order the slot schedule finishes them, each equal to its row of the assembled result."""
  _, model, params = tiny_hf_pair("qwen3")
  tokens, mask = prompts
  kw = dict(max_new_tokens=N_NEW, temperature=1.0, eos_id=EOS)
  engine = Engine(model, slots=4, steps_per_call=1, refill_at=1, shrink_tail=False, **kw)
  key = jax.random.PRNGKey(11)
  rows = list(engine.stream(params, tokens, mask, key=key, group_size=3))
  full = engine(params, tokens, mask, key=key, group_size=3)
  assert sorted(r.row for r in rows) == list(range(15))
  assert [r.row for r in rows] == _simulated_completion_order(full.lengths.tolist(), 4)
  assert [r.row for r in rows] != sorted(r.row for r in rows)  # not simply in row order
  for r in rows:
    assert r.length == full.lengths[r.row] and r.truncated == full.truncated[r.row]
    np.testing.assert_array_equal(r.tokens, full.tokens[r.row, :r.length])
    np.testing.assert_array_equal(r.logprobs, full.logprobs[r.row, :r.length])
    assert r.truncated or r.tokens[-1] in EOS
  stats = engine.last_stats
  assert stats.busy_slot_steps == full.lengths.sum() and stats.slot_steps == 4 * stats.decode_steps
  # Finished rows after EOS are padded in the assembled result.
  assert (full.tokens[~full.mask.astype(bool)] == 0).all()
  assert (full.logprobs[~full.mask.astype(bool)] == 0).all()


def test_tail_compaction_keeps_tokens_and_raises_utilization(tiny_hf_pair, prompts):
  _, model, params = tiny_hf_pair("qwen3")
  tokens, mask = prompts
  kw = dict(max_new_tokens=N_NEW, temperature=1.0, eos_id=EOS)
  key = jax.random.PRNGKey(5)
  fixed = Engine(model, slots=6, shrink_tail=False, **kw)
  shrinking = Engine(model, slots=6, **kw)
  assert shrinking.pool_sizes() == (6, 3, 2, 1) and fixed.pool_sizes() == (6,)
  a = fixed(params, tokens, mask, key=key, group_size=2)
  b = shrinking(params, tokens, mask, key=key, group_size=2)
  for name in ("tokens", "lengths", "truncated"):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  assert shrinking.last_stats.slot_utilization > fixed.last_stats.slot_utilization


def test_bounded_compiles(tiny_hf_pair, prompts):
  """Rollouts of different sizes, prompt widths (one bucket) and EOS patterns reuse the
  compiled programs: each traces at most once per pool size."""
  _, model, params = tiny_hf_pair("qwen3")
  tokens, mask = prompts
  chex.clear_trace_counter()
  engine = Engine(model, slots=4, max_new_tokens=N_NEW, temperature=1.0, eos_id=EOS,
                  max_traces=3)
  assert len(engine.pool_sizes()) == 3
  lengths = set()
  for i, (b, group) in enumerate(((5, 2), (3, 2), (4, 2), (5, 2))):  # row 2 (12 tokens): P=16
    pad = ((0, 0), (i, 0))  # wider left padding, same bucket (16)
    out = engine(params, np.pad(tokens[:b], pad), np.pad(mask[:b], pad),
                 key=jax.random.PRNGKey(i), group_size=group)
    lengths.add(tuple(out.lengths.tolist()))
  assert len(lengths) == 4
  with pytest.raises(AssertionError, match="traced"):  # a new prompt bucket (32) compiles again
    engine(params, np.full((2, 17), 3), np.ones((2, 17)), key=jax.random.PRNGKey(0),
           group_size=2)
  chex.clear_trace_counter()


def test_memory_formula_matches_engine_arrays(tiny_hf_pair):
  """The resident bytes per slot of `memory.slot_budget` (cache, store share, buffers) are
  those of the engine's slot state and prompt store."""
  _, model, _ = tiny_hf_pair("qwen3")
  slots, group, bucket, n_new = 8, 2, 16, N_NEW
  engine = Engine(model, slots=slots, max_new_tokens=n_new)
  state, store = engine.programs(slots, engine.prefill_size(group)).init(jax.random.PRNGKey(0),
                                                                        bucket)
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  resident = (nbytes(state) - state.key.nbytes + nbytes(store)) / slots
  b = memory.slot_budget(model.config, hbm_bytes=1e9, prompt_len=bucket, max_new_tokens=n_new,
                         group_size=group, params_count=1000)
  assert b.cache_bytes_per_slot == nbytes(state.cache) / slots
  assert b.cache_bytes_per_slot + b.store_bytes_per_slot + b.buffer_bytes_per_slot == resident
  assert b.slots == int((b.budget_bytes - 4000) // b.bytes_per_slot) > 0
  # The tail shrink's transient: the half-size pool and its gather temporary.
  assert b.shrink_bytes_per_slot == 0.75 * (b.cache_bytes_per_slot + b.buffer_bytes_per_slot)
  assert memory.slot_budget(model.config, hbm_bytes=1e9, prompt_len=bucket, max_new_tokens=n_new,
                            group_size=group, params_count=1000,
                            shrink_tail=False).slots > b.slots
  # Tensor parallelism splits each slot's cache over the KV heads; data parallelism multiplies.
  sharded = memory.slot_budget(model.config, hbm_bytes=1e9, prompt_len=bucket,
                               max_new_tokens=n_new, group_size=group, params_count=1000,
                               mesh_shape=dict(data=2, tensor=2))
  assert sharded.cache_bytes_per_slot == b.cache_bytes_per_slot / 2
  assert sharded.slots % 2 == 0 and sharded.slots > 2 * b.slots
  assert memory.slots_that_fit(model.config, hbm_bytes=1e3, prompt_len=bucket,
                               max_new_tokens=n_new, group_size=group) == 0


def test_invalid_settings_raise(tiny_hf_pair, prompts):
  _, model, params = tiny_hf_pair("qwen3")
  tokens, mask = prompts
  with pytest.raises(ValueError, match="slots"):
    Engine(model, slots=0, max_new_tokens=4)
  with pytest.raises(ValueError, match="steps_per_call"):
    Engine(model, slots=2, max_new_tokens=4, steps_per_call=0)
  engine = Engine(model, slots=4, max_new_tokens=4, prefill_prompts=1)
  with pytest.raises(ValueError, match="prefill_prompts"):
    engine(params, tokens, mask, key=jax.random.PRNGKey(0), group_size=2)
  with pytest.raises(ValueError, match="group_size"):
    engine(params, tokens, mask, key=jax.random.PRNGKey(0), group_size=0)
  with pytest.raises(ValueError, match="left-padded"):
    engine(params, tokens, mask[:, ::-1], key=jax.random.PRNGKey(0), group_size=4)


def test_rollout_dispatches_to_the_continuous_engine(tmp_path):
  """`rollout` with `engine="continuous"` returns the static engine's Rollout (greedy), and
  an unknown engine name is an error."""
  from mr_rl import models
  from mr_rl.rollout import Policy, SamplingSettings, rollout
  from mr_rl.tiny_assets.checkpoints import numpy_init, tiny_model_config
  from mr_rl.tiny_assets.tokenizer import make_tokenizer
  tok = make_tokenizer(str(tmp_path), vocab_size=300)
  model = models.Transformer(tiny_model_config("qwen3", len(tok), d_model=32))
  params = numpy_init(model, std=0.3)
  policy = Policy(model=model, tokenizer=tok, render=lambda ex: ex, max_prompt_len=16,
                  add_bos=False)
  examples = ["1 + 2 =", "Question: 7 * 6", "x"]
  base = dict(group_size=2, max_new_tokens=6, temperature=0.0, top_k=0, top_p=1.0)
  static = rollout(policy, params, examples, jax.random.PRNGKey(0), SamplingSettings(**base))
  cont = rollout(policy, params, examples, jax.random.PRNGKey(0),
                 SamplingSettings(**base, engine="continuous", engine_options={"slots": 4}))
  for name in ("prompt_tokens", "prompt_mask", "tokens", "mask", "lengths", "truncated"):
    np.testing.assert_array_equal(getattr(cont, name), getattr(static, name), err_msg=name)
  np.testing.assert_allclose(cont.logprobs, static.logprobs, atol=1e-5)
  assert cont.texts == static.texts
  with pytest.raises(ValueError, match=r"config.rollout.engine='paged' is not valid; choose one "
                                       r"of \['continuous', 'static'\]"):  # (the registry's)
    SamplingSettings(**base, engine="paged")
