"""Length-aware update batches: trimmed and packed batches give the padded
batch's losses, metrics and gradients; the compiled widths stay few; masked rows (truncated
responses, dynamic sampling's unfilled slots) enter no loss."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mr_rl import models
from mr_rl import rollout as rollout_lib
from mr_rl.rl import batch as batch_lib
from mr_rl.rl import losses, update

CFG = models.ModelConfig(family='qwen3', vocab_size=64, d_model=32, n_layers=2, n_heads=4,
                         n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=64)
B, G, P, S = 3, 4, 14, 20  # prompts, group size, max_prompt_len, max_new_tokens


def random_params(model, seed=0, scale=0.2):
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, s: (np.ones(s.shape, np.float32) if 'scale' in jax.tree_util.keystr(path)
                       else (scale * rng.normal(size=s.shape)).astype(np.float32)),
      models.abstract_params(model))


def make_rollout(seed=0, max_prompt=6, max_resp=9, truncate=()):
  """A Rollout as `mr_rl.rollout.rollout` returns it: left-padded prompts of width P,
  responses right-padded to S (rows in `truncate` run to S: truncated)."""
  rng = np.random.default_rng(seed)
  p_len = rng.integers(2, max_prompt + 1, size=B)
  p_tok = np.zeros((B, P), np.int32)
  p_mask = np.zeros((B, P), np.int32)
  for b, n in enumerate(p_len):
    p_tok[b, P - n:] = rng.integers(1, CFG.vocab_size, n)
    p_mask[b, P - n:] = 1
  lengths = rng.integers(1, max_resp + 1, size=(B, G))
  for b, g in truncate:
    lengths[b, g] = S
  mask = (np.arange(S)[None, None] < lengths[..., None]).astype(np.int32)
  tokens = np.where(mask > 0, rng.integers(1, CFG.vocab_size, (B, G, S)), 0).astype(np.int32)
  logprobs = np.where(mask > 0, -rng.uniform(0.5, 4.0, (B, G, S)), 0.0).astype(np.float32)
  trunc = np.zeros((B, G), bool)
  for b, g in truncate:
    trunc[b, g] = True
  return rollout_lib.Rollout(p_tok, p_mask, tokens, logprobs, mask, lengths, trunc,
                             [[""] * G for _ in range(B)], np.ones((B, G), bool))


@pytest.fixture(scope='module')
def model_and_params():
  model = models.Transformer(CFG)
  params = random_params(model)
  ref = random_params(model, seed=1, scale=0.21)
  return model, params, ref


def _with_own_logprobs(model, params, ro, noise=0.3, seed=0):
  """The rollout with log-probs near the model's own (so PPO ratios straddle the clip)."""
  batch = batch_lib.make_batch(ro, jnp.zeros((B, G)), trim=False)
  logp = np.asarray(update.make_logprob_fn(update.model_logits_fn(model))(
      params, batch.tokens, batch.mask))[:, P:].reshape(B, G, S)
  rng = np.random.default_rng(seed)
  lp = np.where(ro.mask > 0, logp + rng.normal(scale=noise, size=logp.shape), 0.0)
  return dataclasses.replace(ro, logprobs=lp.astype(np.float32))


def _step(model, cfg, batch, params, ref_params):
  """One sgd(1) step: (metrics, gradient = params - new params) with a KL to `ref_params`."""
  seg = [] if batch.segment_ids is None else [batch.segment_ids]
  batch = batch.replace(ref_logp=update.make_logprob_fn(update.model_logits_fn(model))(
      ref_params, batch.tokens, batch.mask, *seg))
  state = update.init_train_state(jax.tree.map(jnp.array, params), optax.sgd(1.0))
  step = update.make_policy_step(update.model_logits_fn(model), cfg, optax.sgd(1.0))
  new, m = step(state, batch, jax.random.PRNGKey(0))
  grads = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params, new.params)
  return jax.device_get(m), grads


def _assert_same(a, b, rtol=2e-5, atol=1e-6):
  (ma, ga), (mb, gb) = a, b
  assert ma.keys() == mb.keys()
  for k in ma:
    np.testing.assert_allclose(ma[k], mb[k], rtol=rtol, atol=atol, err_msg=k)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    # float32 sums over tokens in another order: errors scale with the leaf's largest entries
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=3e-7 + 3e-6 * np.abs(y).max())


def test_column_buckets():
  assert [batch_lib.size_bucket(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12,
                                                                12, 12, 16]
  assert [batch_lib.column_bucket(n, 3000) for n in (1, 8, 9, 13, 17, 25, 33, 2049, 2900)] == \
      [8, 8, 12, 16, 24, 32, 48, 3000, 3000]
  assert batch_lib.column_bucket(40, 36) == 36  # never past the cap
  widths = sorted({batch_lib.column_bucket(n, 3000) for n in range(1, 3001)})
  assert widths == [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
                    2048, 3000]


def test_packed_row_buckets():
  """Packed row counts take `fine_bucket`: every count up to 32, then 16 sizes per octave,
  so a packed batch holds at most 1/16 more rows than first-fit decreasing needs (the
  width buckets' 1.5x would cost up to a third of the step in padding rows)."""
  got = [batch_lib.fine_bucket(n, 16) for n in (1, 16, 17, 18, 33, 34, 35, 64, 65, 100, 1000)]
  assert got == [1, 16, 17, 18, 34, 34, 36, 64, 68, 100, 1024]
  assert max(batch_lib.fine_bucket(n, 16) / n for n in range(1, 5000)) <= 1 + 1 / 16
  assert len({batch_lib.fine_bucket(n, 16) for n in range(1, 257)}) == 31 + 3 * 16 + 1
  assert [batch_lib.fine_bucket(n, 2) for n in range(1, 14)] == [
      batch_lib.size_bucket(n) for n in range(1, 14)]  # two per octave: the width buckets
  with pytest.raises(ValueError, match='power of two'):
    batch_lib.fine_bucket(5, 3)
  rng = np.random.default_rng(0)
  lengths = rng.integers(8, 61, size=(64,))  # a GRPO batch's sequences, packed at width 64
  ro = make_rollout(0)
  for m in (1, 2):
    rows = len(batch_lib.placement(lengths, 64))
    n = m * batch_lib.fine_bucket(-(-rows // m), batch_lib.PACKED_ROWS_PER_OCTAVE)
    assert rows <= n <= rows * (1 + 1 / 16) + m
  packed = batch_lib.make_batch(ro, jnp.zeros((B, G)),
                                pack=batch_lib.PackSpec('token-mean', None, row_multiple=1))
  assert packed.shape[0] == len(batch_lib.placement(
      (ro.prompt_mask.sum(1)[:, None] + ro.lengths).reshape(-1), packed.shape[1]))


@pytest.mark.parametrize('max_prompt,max_resp', [(6, 9), (P, 9), (3, S), (P, S)])
def test_trim_keeps_every_real_column(max_prompt, max_resp):
  """The trimmed batch is the padded one without all-padding columns (plus the bucket's
  extra padding): the same tokens, masks and log-probs at the same offsets from the
  prompt / response boundary."""
  ro = make_rollout(3, max_prompt=max_prompt, max_resp=max_resp)
  A = jnp.zeros((B, G))
  full = jax.tree.map(np.asarray, batch_lib.make_batch(ro, A, trim=False))
  trim = jax.tree.map(np.asarray, batch_lib.make_batch(ro, A))
  T = trim.shape[1]
  p_used, s_used = int(ro.prompt_mask.sum(1).max()), int(ro.lengths.max())
  assert T == batch_lib.column_bucket(p_used + s_used, P + S) >= p_used + s_used
  p_w = min(P, T - s_used)  # the split: extra columns on the prompt side first
  for k in ('tokens', 'mask', 'response_mask', 'old_logp'):
    np.testing.assert_array_equal(getattr(trim, k), getattr(full, k)[:, P - p_w:P + T - p_w],
                                  err_msg=k)
  assert full.mask[:, :P - p_w].sum() == 0 and full.mask[:, P + T - p_w:].sum() == 0


@pytest.mark.parametrize('agg', losses.LOSS_AGG_MODES)
def test_trimmed_batch_equals_padded_batch(model_and_params, agg):
  model, params, ref = model_and_params
  ro = _with_own_logprobs(model, params, make_rollout(0))
  A = jnp.asarray(np.random.default_rng(5).normal(size=(B, G)), jnp.float32)
  full = batch_lib.make_batch(ro, A, trim=False)
  trim = batch_lib.make_batch(ro, A)
  assert full.shape == (B * G, P + S)
  used = int(ro.prompt_mask.sum(1).max() + ro.lengths.max())  # <= 6 + 9
  assert trim.shape == (B * G, batch_lib.column_bucket(used, P + S)) == (B * G, 16)
  # Dr.GRPO's L stays the configured max_new_tokens, not the trimmed width.
  cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(
      loss_agg=agg, kl_coef=0.05, norm_len=S if agg == 'seq-mean-token-sum-norm' else None),
      num_micro_batches=2)
  got, want = _step(model, cfg, trim, params, ref), _step(model, cfg, full, params, ref)
  _assert_same(got, want)
  assert 0 < want[0]['clip_frac'] < 1 and want[0]['kl'] > 0


@pytest.mark.parametrize('agg', losses.LOSS_AGG_MODES)
def test_packed_batch_equals_unpacked(model_and_params, agg):
  model, params, ref = model_and_params
  ro = _with_own_logprobs(model, params, make_rollout(1, truncate=[(0, 1), (2, 3)]))
  A = jnp.asarray(np.random.default_rng(6).normal(size=(B, G)), jnp.float32)
  loss_rows = ~ro.truncated  # masked rows are left out of the packed rows
  loss_rows[1, :] = False     # ... and a whole group (dynamic sampling's unfilled slot)
  unpacked = batch_lib.make_batch(ro, A, loss_rows_BG=loss_rows)
  norm_len = S if agg == 'seq-mean-token-sum-norm' else None
  packed = batch_lib.make_batch(ro, A, loss_rows_BG=loss_rows,
                                pack=batch_lib.PackSpec(agg, norm_len, row_multiple=2))
  assert batch_lib.packed_sequences(packed) == int(loss_rows.sum()) == 6
  n_packed = packed.shape[0]
  assert n_packed % 2 == 0 and n_packed < B * G
  seg = np.asarray(packed.segment_ids)
  assert (seg.max(1) >= 1).any() and seg.max() >= 2  # some row holds several sequences
  assert ((seg > 0) == (np.asarray(packed.mask) > 0)).all()
  loss = losses.PolicyLossConfig(loss_agg=agg, kl_coef=0.05, norm_len=norm_len)
  cfg = update.UpdateConfig(loss=loss, num_micro_batches=2)
  cfg_p = dataclasses.replace(cfg, pack=True)
  got, want = _step(model, cfg_p, packed, params, ref), _step(model, cfg, unpacked, params, ref)
  _assert_same(got, want)
  # The fields of a packed run's batch (what the learner's jitted step is built for).
  assert set(update.batch_fields(cfg_p, False)) == set(packed.fields()) | {'ref_logp'}


def test_response_start_buckets():
  got = [batch_lib.response_start_bucket(p, P) for p in range(1, P + 1)]
  assert got == [1, 2, 3, 4, 4, 6, 6, 8, 8, 8, 8, 12, 12, 14]  # P = 14 is exact
  assert [batch_lib.response_start_bucket(p, 1024) for p in (1023, 1024, 700)] == [768, 1024, 512]
  for p in range(1, 3000):
    r = batch_lib.response_start_bucket(p, 3000)
    assert 2 * p / 3 <= r <= p
  with pytest.raises(ValueError, match='>= 1'):
    batch_lib.response_start_bucket(0, P)


@pytest.mark.parametrize('agg', losses.LOSS_AGG_MODES)
def test_response_window_head_equals_full_head(model_and_params, agg):
  """The LM head over the response window only (the batch's static `response_start`) gives
  the losses, metrics and gradients of the head over every column, on the same batch."""
  model, params, ref = model_and_params
  ro = _with_own_logprobs(model, params, make_rollout(4, max_prompt=P, max_resp=9))
  A = jnp.asarray(np.random.default_rng(8).normal(size=(B, G)), jnp.float32)
  batch = batch_lib.make_batch(ro, A)
  r0 = batch.response_start
  assert 1 < r0 <= int(np.argmax(np.asarray(batch.response_mask).any(0)))
  assert r0 > batch.shape[1] // 3  # the window skips a real share of the columns
  cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(
      loss_agg=agg, kl_coef=0.05, entropy_coef=0.01,
      norm_len=S if agg == 'seq-mean-token-sum-norm' else None), num_micro_batches=2)
  got = _step(model, cfg, batch, params, ref)
  want = _step(model, cfg, batch.replace(response_start=None), params, ref)
  _assert_same(got, want)
  assert want[0]['entropy'] > 0 and 0 < want[0]['clip_frac'] < 1


def test_response_window_head_in_the_ppo_step(model_and_params):
  """PPO (make_batch's GAE targets; the critic keeps its own full forward): the windowed
  policy head gives the full head's policy and value metrics and both gradients."""
  from mr_rl.rl import critic
  model, params, _ = model_and_params
  ro = _with_own_logprobs(model, params, make_rollout(5, max_prompt=P, max_resp=9))
  value_fn = jax.jit(critic.model_value_fn(model))
  vparams = critic.init_value_params(model, params, jax.random.PRNGKey(1))
  R = np.random.default_rng(9).normal(size=(B, G)).astype(np.float32)
  batch = batch_lib.make_batch(ro, ppo=batch_lib.PPOTargets(
      lambda t, m: value_fn(vparams, t, m), R, gamma=1.0, lam=0.95))
  assert batch.response_start > 1 and np.ndim(batch.advantages) == 2
  cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(), value_lr=1e-3)

  def run(b):
    tx, vtx = optax.sgd(1.0), optax.sgd(1.0)
    state = update.init_train_state(jax.tree.map(jnp.array, params), tx,
                                    jax.tree.map(jnp.array, vparams), vtx)
    new, m = update.make_ppo_step(update.model_logits_fn(model), critic.model_value_fn(model),
                                  cfg, tx, vtx)(state, b, jax.random.PRNGKey(0))
    g = jax.tree.map(lambda a, c: np.asarray(a) - np.asarray(c), (params, vparams),
                     (new.params, new.value_params))
    return jax.device_get(m), g

  _assert_same(run(batch), run(batch.replace(response_start=None)))


def test_response_start_is_checked():
  batch = batch_lib.make_batch(make_rollout(0), jnp.zeros((B, G)))
  first = int(np.argmax(np.asarray(batch.response_mask).any(0)))  # the first response column
  assert batch.response_start <= first
  batch.replace(response_start=first).check()
  with pytest.raises(ValueError, match='loss tokens before response_start'):
    batch.replace(response_start=first + 1).check()
  with pytest.raises(ValueError, match=r'in \[1, T='):
    batch.replace(response_start=0).check()


def test_compiles_stay_bounded_over_many_lengths():
  """40 batches of random prompt / response lengths compile the step once per (width,
  response start) pair met, and the LM head runs from the response start on."""
  V = 16
  traced = []

  def logits_fn(W, tokens, mask, head_start=0):  # a bigram policy; records each trace
    del mask
    traced.append((tokens.shape, head_start))
    return W[tokens[:, head_start:]]

  cfg = update.UpdateConfig()
  # Widths are buckets of P + S = 34: 8, 12, 16, 24, 32, 34; response starts 1, 2, 3, 4, 6,
  # 8, 12, 14, each at most the width's prompt side: 27 reachable pairs.
  possible = set()
  for p_used in range(1, P + 1):
    for s_used in range(1, S + 1):
      T = batch_lib.column_bucket(p_used + s_used, P + S)
      possible.add((T, batch_lib.response_start_bucket(min(P, T - s_used), P)))
  assert len(possible) == 27
  step = update.make_policy_step(chex.assert_max_traces(logits_fn, n=27), cfg, optax.sgd(0.1))
  state = update.init_train_state(jnp.zeros((V, V)), optax.sgd(0.1))
  widths, pairs = set(), set()
  for seed in range(40):
    rng = np.random.default_rng(seed)
    ro = make_rollout(seed, max_prompt=int(rng.integers(2, P + 1)),
                      max_resp=int(rng.integers(1, S + 1)))
    ro = dataclasses.replace(ro, prompt_tokens=ro.prompt_tokens % V, tokens=ro.tokens % V)
    batch = batch_lib.make_batch(ro, jnp.asarray(rng.normal(size=(B, G)), jnp.float32))
    p_w = int(ro.prompt_mask.sum(1).max())
    s_w = int(ro.lengths.max())
    T = batch.shape[1]
    assert T == batch_lib.column_bucket(p_w + s_w, P + S)
    assert batch.response_start == batch_lib.response_start_bucket(min(P, T - s_w), P)
    widths.add(T)
    pairs.add((T, batch.response_start))
    state, m = step(state, batch, jax.random.PRNGKey(0))
    assert np.isfinite(float(m['policy_loss']))
  assert len(traced) == len(set(traced)) == len(pairs) and pairs <= possible
  assert {(shape[1], h + 1) for shape, h in traced} == pairs  # head from response_start - 1
  assert len(widths) > 3  # the lengths did vary


def test_masked_rows_enter_no_loss(model_and_params):
  """mask_truncated / unfilled slots: the loss is that of the batch without those rows."""
  model, params, ref = model_and_params
  ro = _with_own_logprobs(model, params, make_rollout(2, truncate=[(0, 0), (1, 2), (2, 1)]))
  A = jnp.asarray(np.random.default_rng(7).normal(size=(B, G)), jnp.float32)
  keep = ~ro.truncated
  batch = batch_lib.make_batch(ro, A, loss_rows_BG=keep)
  resp = np.asarray(batch.response_mask).reshape(B, G, -1)
  assert (resp[ro.truncated] == 0).all() and (resp[keep].sum(-1) == ro.lengths[keep]).all()
  # Truncated rows (length S) do not set the width: the kept rows' longest response does.
  used = int(ro.prompt_mask.sum(1).max() + ro.lengths[keep].max())
  assert batch.shape[1] == batch_lib.column_bucket(used, P + S) < P + S
  cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(kl_coef=0.05))
  got = _step(model, cfg, batch, params, ref)
  rows = np.flatnonzero(keep.reshape(-1))
  kept_only = jax.tree.map(lambda v: v[rows], batch_lib.make_batch(ro, A))
  want = _step(model, cfg, kept_only, params, ref)
  _assert_same(({k: v for k, v in got[0].items() if k != 'response_tokens'}, got[1]),
               ({k: v for k, v in want[0].items() if k != 'response_tokens'}, want[1]))
  assert got[0]['response_tokens'] == ro.lengths[keep].sum()
