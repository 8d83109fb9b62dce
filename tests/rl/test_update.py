"""Learner steps (update.py) against hand-written numpy gradients and the real Transformer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mr_rl.rl import advantages, losses, update
from mr_rl.rl.batch import LearnerBatch

V = 8  # vocabulary of the linear-softmax policy


def linear_logits(W, tokens_NT, mask_NT):
  """A bigram policy: logits at t are the row of W for token t (no other parameters)."""
  del mask_NT
  return W[tokens_NT]


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _rollout(seed=0, B=2, G=4, T=10, vocab=V):
  """Left-padded prompts of 2-4 tokens, responses of 1..rest tokens, right padding."""
  rng = np.random.default_rng(seed)
  N = B * G
  tokens = rng.integers(1, vocab, size=(N, T)).astype(np.int32)
  mask = np.zeros((N, T), np.int32)
  rmask = np.zeros((N, T), np.int32)
  P = 4
  for i in range(N):
    plen = rng.integers(2, P + 1)
    rlen = rng.integers(1, T - P + 1)
    mask[i, P - plen:P + rlen] = 1
    rmask[i, P:P + rlen] = 1
  tokens = np.where(mask > 0, tokens, 0).astype(np.int32)
  R = rng.binomial(1, 0.5, size=(B, G)).astype(np.float32) + rng.uniform(size=(B, G)) * 0.1
  return tokens, mask, rmask, R


def _np_linear_loss_and_grad(W, tokens, rmask, old_logp, A_N, agg, beta, ref_logp, eps=(0.2, 0.28)):
  """Loss and dL/dW of the clipped objective for the bigram policy, by hand."""
  N, T = tokens.shape
  ls = _np_log_softmax(W.astype(np.float64))
  p = np.exp(ls)
  w = np.asarray(losses.token_weights(rmask, agg), np.float64)
  loss, grad = 0.0, np.zeros_like(ls)
  for b in range(N):
    for t in range(1, T):
      if not rmask[b, t]:
        continue
      prev, tok = tokens[b, t - 1], tokens[b, t]
      logp = ls[prev, tok]
      rho = np.exp(logp - old_logp[b, t])
      a = A_N[b]
      unclipped, clipped = -a * rho, -a * np.clip(rho, 1 - eps[0], 1 + eps[1])
      l = max(unclipped, clipped)
      dl = -a * rho if unclipped >= clipped else 0.0  # d l / d logp
      x = ref_logp[b, t] - logp
      l += beta * (np.exp(x) - 1 - x)
      dl += beta * (1 - np.exp(x))
      loss += w[b, t] * l
      onehot = np.zeros(W.shape[1])
      onehot[tok] = 1
      grad[prev] += w[b, t] * dl * (onehot - p[prev])
  return loss, grad


def _linear_batch(seed=0, **kw):
  tokens, mask, rmask, R = _rollout(seed, **kw)
  rng = np.random.default_rng(seed + 100)
  W = rng.normal(size=(V, V)).astype(np.float32)
  true_logp = np.zeros(tokens.shape)
  ls = _np_log_softmax(W.astype(np.float64))
  true_logp[:, 1:] = ls[tokens[:, :-1], tokens[:, 1:]]
  old = np.where(rmask > 0, true_logp + rng.normal(scale=0.3, size=tokens.shape), 0.0)
  ref = np.where(rmask > 0, true_logp + rng.normal(scale=0.3, size=tokens.shape), 0.0)
  A_BG = np.asarray(advantages.grpo(R))
  batch = LearnerBatch(tokens=tokens, mask=mask, response_mask=rmask,
                       old_logp=old.astype(np.float32), advantages=A_BG.reshape(-1),
                       ref_logp=ref.astype(np.float32))
  return W, jax.tree.map(jnp.asarray, batch).check(), (old, ref, A_BG.reshape(-1))


def test_linear_policy_adamw_step_matches_hand_gradient():
  """One AdamW step: loss, grad norm and the parameter update all follow the numpy gradient."""
  W, batch, (old, ref, A_N) = _linear_batch(0)
  agg, beta = 'seq-mean-token-mean', 0.05
  cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(loss_agg=agg, kl_coef=beta),
                            lr=1e-2, weight_decay=0.1, max_grad_norm=0.02)
  tx = update.make_optimizer(cfg)
  state = update.init_train_state(jnp.asarray(W), tx)
  step = update.make_policy_step(linear_logits, cfg, tx)
  new, metrics = step(state, batch, jax.random.PRNGKey(0))
  want_loss, g = _np_linear_loss_and_grad(W, np.asarray(batch.tokens),
                                          np.asarray(batch.response_mask), old, A_N, agg,
                                          beta, ref)
  np.testing.assert_allclose(float(metrics['policy_loss']), want_loss, rtol=1e-4, atol=1e-6)
  gnorm = np.linalg.norm(g)
  np.testing.assert_allclose(float(metrics['grad_norm']), gnorm, rtol=1e-4)
  assert gnorm > 0.02  # so that clipping is active
  gc = g * 0.02 / gnorm
  # First AdamW step: m_hat = g, v_hat = g^2 -> update = -lr (g / (|g| + eps) + wd W).
  want_W = W - 1e-2 * (gc / (np.abs(gc) + 1e-8) + 0.1 * W)
  np.testing.assert_allclose(np.asarray(new.params), want_W, rtol=1e-5, atol=1e-6)
  assert int(new.step) == 1
  assert float(metrics['kl']) > 0
  new2, _ = step(new, batch, jax.random.PRNGKey(1))  # same shapes: no retrace
  assert int(new2.step) == 2 and step._cache_size() == 1


@pytest.mark.parametrize('agg', losses.LOSS_AGG_MODES)
def test_micro_batched_gradient_equals_full_batch_hand_gradient(agg):
  """Three strided micro-batches reproduce the full-batch loss and gradient (numpy, by hand)."""
  W, batch, (old, ref, A_N) = _linear_batch(1, B=2, G=6)
  beta = 0.02
  cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(loss_agg=agg, kl_coef=beta),
                            num_micro_batches=3)
  state = update.init_train_state(jnp.asarray(W), optax.sgd(1.0))
  new, metrics = update.make_policy_step(linear_logits, cfg, optax.sgd(1.0))(
      state, batch, jax.random.PRNGKey(0))
  want_loss, g = _np_linear_loss_and_grad(W, np.asarray(batch.tokens),
                                          np.asarray(batch.response_mask), old, A_N, agg,
                                          beta, ref)
  np.testing.assert_allclose(float(metrics['policy_loss']), want_loss, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(metrics['grad_norm']), np.linalg.norm(g), rtol=1e-4)
  np.testing.assert_allclose(W - np.asarray(new.params), g, rtol=1e-4, atol=1e-6)  # sgd(1): -g
  assert np.abs(g).max() > 1e-3
  m = np.asarray(batch.response_mask) > 0
  assert float(metrics['response_tokens']) == m.sum()


def test_bad_batch_and_config_raise():
  W, batch, _ = _linear_batch(0)
  cfg = update.UpdateConfig(num_micro_batches=3)
  step = update.make_policy_step(linear_logits, cfg)
  state = update.init_train_state(jnp.asarray(W), update.make_optimizer(cfg))
  with pytest.raises(ValueError, match='num_micro_batches'):
    step(state, batch, jax.random.PRNGKey(0))
  with pytest.raises(TypeError, match='old_logp'):
    LearnerBatch(tokens=batch.tokens, mask=batch.mask, response_mask=batch.response_mask,
                 advantages=batch.advantages)
  with pytest.raises(ValueError, match='LearnerBatch.old_logp has shape'):
    batch.replace(old_logp=batch.old_logp[:, 1:]).check()
  with pytest.raises(ValueError, match='num_micro_batches'):
    update.UpdateConfig(num_micro_batches=0)
  with pytest.raises(ValueError, match='lr'):
    update.UpdateConfig(lr=0.0)
