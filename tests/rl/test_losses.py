"""Policy / value losses (docs/methods.md §4) and GAE against numpy loop references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mr_rl.rl import gae as gae_lib
from mr_rl.rl import losses


def _np_policy_loss(logp, old, A, mask, agg, eps_low, eps_high, norm_len=None, beta=0.0,
                    ref=None, est='k3'):
  N, T = logp.shape
  seq_losses, all_losses = [], []
  for b in range(N):
    ls = []
    for t in range(T):
      if not mask[b, t]:
        continue
      a = A[b] if A.ndim == 1 else A[b, t]
      rho = np.exp(np.clip(logp[b, t] - old[b, t], -20, 20))
      l = max(-a * rho, -a * min(max(rho, 1 - eps_low), 1 + eps_high))
      if beta:
        x = ref[b, t] - logp[b, t]
        l += beta * {'k1': -x, 'k2': 0.5 * x * x, 'k3': np.exp(np.clip(x, -20, 20)) - 1
                     - np.clip(x, -20, 20)}[est]
      ls.append(l)
    all_losses += ls
    if ls:
      seq_losses.append(np.mean(ls))
  if agg == 'token-mean':
    return np.sum(all_losses) / len(all_losses)
  if agg == 'seq-mean-token-mean':
    return np.mean(seq_losses)
  return np.sum(all_losses) / (N * (norm_len or T))


_jit_policy_loss = jax.jit(losses.policy_loss, static_argnums=4)


def _batch(seed=0, N=6, T=9):
  rng = np.random.default_rng(seed)
  logp = -rng.uniform(0.1, 3.0, size=(N, T))
  old = logp + rng.normal(scale=0.4, size=(N, T))  # ratios both inside and outside the clip
  ref = logp + rng.normal(scale=0.3, size=(N, T))
  mask = np.zeros((N, T), np.int32)
  for b in range(N):
    start = rng.integers(1, 4)
    mask[b, start:start + rng.integers(1, T - start + 1)] = 1
  mask[-1] = 0  # an empty response row
  A = rng.normal(size=N)
  return logp, old, ref, mask, A


@pytest.mark.parametrize('agg', losses.LOSS_AGG_MODES)
@pytest.mark.parametrize('est,beta', [('k3', 0.0), ('k1', 0.05), ('k2', 0.1), ('k3', 0.1)])
def test_policy_loss_matches_numpy(agg, est, beta):
  logp, old, ref, mask, A = _batch()
  cfg = losses.PolicyLossConfig(loss_agg=agg, kl_coef=beta, kl_estimator=est, norm_len=12)
  loss, metrics = _jit_policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32),
                                   jnp.asarray(A, jnp.float32), jnp.asarray(mask), cfg,
                                   ref_logp_NT=jnp.asarray(ref, jnp.float32))
  want = _np_policy_loss(logp, old, A, mask, agg, 0.2, 0.28, 12, beta, ref, est)
  np.testing.assert_allclose(float(loss), want, rtol=2e-5, atol=1e-6)
  m = mask.astype(bool)
  rho = np.exp(logp - old)
  Ab = np.broadcast_to(A[:, None], logp.shape)
  clipped = -Ab * np.clip(rho, 0.8, 1.28) > -Ab * rho
  np.testing.assert_allclose(float(metrics['clip_frac']), clipped[m].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(metrics['approx_kl']),
                             (rho - 1 - np.log(rho))[m].mean(), rtol=1e-4)
  assert 0 < float(metrics['clip_frac']) < 1


def test_per_token_advantages_and_clip_higher():
  logp, old, _, mask, A = _batch(1)
  A_NT = np.random.default_rng(2).normal(size=logp.shape)
  cfg = losses.PolicyLossConfig(eps_low=0.1, eps_high=0.5)
  loss, _ = _jit_policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(A_NT),
                             jnp.asarray(mask), cfg)
  want = _np_policy_loss(logp, old, A_NT, mask, 'token-mean', 0.1, 0.5)
  np.testing.assert_allclose(float(loss), want, rtol=2e-5)


def test_gradient_zero_when_clipped():
  # rho = e^1 > 1 + eps_high with A > 0: clipped branch is constant, gradient 0.
  g = jax.grad(lambda lp: losses.policy_loss(lp, jnp.zeros((1, 2)), jnp.ones(1),
                                             jnp.array([[0, 1]]), losses.PolicyLossConfig())[0])
  np.testing.assert_allclose(g(jnp.array([[0.0, 1.0]])), 0.0)
  # inside the clip range the gradient of -A rho w.r.t. logp is -A rho.
  np.testing.assert_allclose(g(jnp.array([[0.0, 0.1]]))[0, 1], -np.exp(0.1), rtol=1e-6)


def _np_tis_loss_and_grad(logp, sampler, A, mask, cap, beta, ref, eps=(0.2, 0.28)):
  """Token-mean loss and dL/dlogp with pi_old recomputed (= logp, so rho = 1) and truncated
  importance sampling: each token's clipped term times min(exp(logp - sampler), cap) (TRL
  `token_truncate`, verl `tis_imp_ratio_cap`); the KL term is not reweighted."""
  m = mask > 0
  n = m.sum()
  loss, grad = 0.0, np.zeros_like(logp)
  for b, t in zip(*np.nonzero(m)):
    w_is = min(np.exp(logp[b, t] - sampler[b, t]), cap)
    x = ref[b, t] - logp[b, t]
    loss += (-A[b] * w_is + beta * (np.exp(x) - 1 - x)) / n
    # d/dlogp of -A * rho * w_is at rho = 1 (inside the clip range) is -A * w_is; the
    # weight and pi_old are constants (stop-gradient).
    grad[b, t] = (-A[b] * w_is + beta * (1 - np.exp(x))) / n
  return loss, grad


@pytest.mark.parametrize('cap', [1.2, 3.0])
def test_recomputed_old_logp_and_truncated_importance_sampling_match_numpy(cap):
  logp, sampler, ref, mask, A = _batch(3)  # sampler log-probs 0.4 nats off: many ratios > cap
  cfg = losses.PolicyLossConfig(kl_coef=0.05, recompute_old_logp=True, tis_cap=cap)
  fn = lambda lp: losses.policy_loss(lp, jnp.asarray(sampler, jnp.float32), jnp.asarray(A),
                                     jnp.asarray(mask), cfg, ref_logp_NT=jnp.asarray(ref))
  (loss, metrics), grad = jax.jit(jax.value_and_grad(fn, has_aux=True))(
      jnp.asarray(logp, jnp.float32))
  want_loss, want_grad = _np_tis_loss_and_grad(logp, sampler, A, mask, cap, 0.05, ref)
  np.testing.assert_allclose(float(loss), want_loss, rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=2e-5, atol=1e-7)
  m = mask > 0
  ratio = np.exp(logp - sampler)[m]
  x = (logp - sampler)[m]
  for k, v in (('mismatch_abs', np.abs(x).mean()), ('mismatch_k3', (np.exp(x) - 1 - x).mean()),
               ('tis_weight_mean', np.minimum(ratio, cap).mean()),
               ('tis_clip_frac', (ratio > cap).mean()), ('ratio_mean', 1.0),
               ('clip_frac', 0.0), ('approx_kl', 0.0)):
    np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-5, atol=1e-7, err_msg=k)
  if cap == 1.2:  # the cap binds on some tokens, not all
    assert 0 < float(metrics['tis_clip_frac']) < 1


def _np_decoupled_ppo(theta, prox, behav, A, mask, cap, eps=(0.2, 0.28)):
  """AReaL's decoupled PPO objective (docs/methods.md §4, "Lag correction"), token-mean, in
  float64: ``-w min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` with ``r = pi_theta / pi_prox``
  (the trust region around the proximal policy, the learner's params before this update) and
  the behaviour weight ``w = min(pi_prox / pi_behav, cap)`` (pi_behav: the possibly stale
  sampler). AReaL masks tokens whose weight exceeds the cap; this reference truncates."""
  m = mask > 0
  r = np.exp(theta - prox)
  w = np.minimum(np.exp(prox - behav), cap)
  a = A[:, None]
  per = -w * np.minimum(r * a, np.clip(r, 1 - eps[0], 1 + eps[1]) * a)
  return per[m].sum() / m.sum()


@pytest.mark.parametrize('cap', [1.5, 4.0])
def test_truncated_importance_sampling_is_the_decoupled_objective_for_stale_rollouts(cap):
  # Rollouts sampled by a policy two updates old: behaviour log-probs 0.6 nats off the learner.
  logp, _, _, mask, A = _batch(5)
  behav = logp + np.random.default_rng(7).normal(scale=0.6, size=logp.shape)
  cfg = losses.PolicyLossConfig(recompute_old_logp=True, tis_cap=cap)
  fn = lambda lp: losses.policy_loss(lp, jnp.asarray(behav, jnp.float32), jnp.asarray(A),
                                     jnp.asarray(mask), cfg)[0]
  loss, grad = jax.jit(jax.value_and_grad(fn))(jnp.asarray(logp, jnp.float32))
  # The learner makes one optimizer step per batch, so the proximal policy is the forward's
  # own params: evaluate the reference at theta = prox, its gradient by central differences.
  np.testing.assert_allclose(float(loss), _np_decoupled_ppo(logp, logp, behav, A, mask, cap),
                             rtol=2e-5, atol=1e-6)
  h, want = 1e-5, np.zeros_like(logp)
  for b, t in zip(*np.nonzero(mask)):
    up, down = logp.copy(), logp.copy()
    up[b, t] += h
    down[b, t] -= h
    want[b, t] = (_np_decoupled_ppo(up, logp, behav, A, mask, cap)
                  - _np_decoupled_ppo(down, logp, behav, A, mask, cap)) / (2 * h)
  np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-4, atol=1e-7)
  # Centring the clip on the stale sampler instead (plain PPO with pi_old = pi_behav) is a
  # different objective: it clips tokens the learner never moved.
  plain = jax.grad(lambda lp: losses.policy_loss(
      lp, jnp.asarray(behav, jnp.float32), jnp.asarray(A), jnp.asarray(mask),
      losses.PolicyLossConfig())[0])(jnp.asarray(logp, jnp.float32))
  assert np.abs(np.asarray(plain) - want).max() > 1e-3


def test_mismatch_logged_without_recompute_and_recompute_is_exact_when_equal():
  logp, sampler, _, mask, A = _batch(4)
  plain = losses.PolicyLossConfig()
  loss, metrics = _jit_policy_loss(jnp.asarray(logp, jnp.float32),
                                   jnp.asarray(sampler, jnp.float32), jnp.asarray(A),
                                   jnp.asarray(mask), plain)
  x = (logp - sampler)[mask > 0]
  np.testing.assert_allclose(float(metrics['mismatch_abs']), np.abs(x).mean(), rtol=1e-5)
  np.testing.assert_allclose(float(metrics['mismatch_k3']), (np.exp(x) - 1 - x).mean(),
                             rtol=1e-5)
  assert 'tis_weight_mean' not in metrics
  np.testing.assert_allclose(float(loss), _np_policy_loss(logp, sampler, A, mask, 'token-mean',
                                                          0.2, 0.28), rtol=2e-5)
  # When the sampler computed exactly what the trainer computes, recomputing changes nothing.
  same = jnp.asarray(logp, jnp.float32)
  g = lambda cfg: jax.jit(jax.value_and_grad(lambda lp: losses.policy_loss(
      lp, same, jnp.asarray(A), jnp.asarray(mask), cfg)[0]))(same)
  (l0, g0), (l1, g1) = g(plain), g(losses.PolicyLossConfig(recompute_old_logp=True))
  assert float(l0) == float(l1)
  np.testing.assert_array_equal(np.asarray(g0), np.asarray(g1))


def test_loss_aggregation_registry_names_and_aliases():
  reg = losses.LOSS_AGGREGATIONS
  assert reg.names() == ('seq_mean_token_mean', 'seq_mean_token_sum_norm', 'token_mean')
  assert losses.LOSS_AGG_MODES == ('token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm')
  assert reg.aliases() == {m: m.replace('-', '_') for m in losses.LOSS_AGG_MODES}
  mask = np.array([[0, 1, 1, 1], [0, 0, 1, 0], [0, 0, 0, 0]])
  for mode in losses.LOSS_AGG_MODES:  # the alias, the name and the function agree
    name = reg.canonical(mode)
    fn = getattr(losses, name)
    assert reg.get(mode) is fn and fn.__name__ == name
    np.testing.assert_array_equal(losses.token_weights(mask, mode, 8),
                                  losses.token_weights(mask, name, 8))
    np.testing.assert_array_equal(losses.token_weights(mask, mode, 8),
                                  fn(jnp.asarray(mask, jnp.float32), 8))


def test_token_weights_and_logprobs():
  mask = np.array([[0, 1, 1, 1], [0, 0, 1, 0], [0, 0, 0, 0]])
  w = np.asarray(losses.token_weights(mask, 'seq-mean-token-mean'))
  np.testing.assert_allclose(w[0], [0, 1 / 6, 1 / 6, 1 / 6])
  np.testing.assert_allclose(w[1], [0, 0, 0.5, 0])
  np.testing.assert_allclose(losses.token_weights(mask, 'seq-mean-token-sum-norm', 8).sum(), 4 / 24)
  np.testing.assert_allclose(losses.token_weights(mask, 'token-mean').sum(), 1.0)
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7))
  tokens = rng.integers(0, 7, size=(2, 5))
  logp, ent = map(np.asarray, jax.jit(losses.token_logprobs_and_entropy)(
      jnp.asarray(logits, jnp.float32), tokens))
  z = logits - logits.max(-1, keepdims=True)
  ls = z - np.log(np.exp(z).sum(-1, keepdims=True))
  for b in range(2):
    assert logp[b, 0] == 0
    for t in range(1, 5):
      np.testing.assert_allclose(logp[b, t], ls[b, t - 1, tokens[b, t]], rtol=1e-5)
      np.testing.assert_allclose(ent[b, t], -(np.exp(ls[b, t - 1]) * ls[b, t - 1]).sum(),
                                 rtol=1e-5)
  # Uniform next-token logits: entropy log V.
  _, ent_uniform = losses.token_logprobs_and_entropy(jnp.zeros((1, 2, 7)), jnp.zeros((1, 2), int))
  np.testing.assert_allclose(ent_uniform[0, 1], np.log(7), rtol=1e-6)


def test_config_validation():
  """PolicyLossConfig checks its declared fields (`mr_rl.fields`), naming config.optim.loss.*."""
  with pytest.raises(ValueError, match=r"^config.optim.loss.loss_agg='sum' is not valid; choose "
                                       r"one of \['seq-mean-token-mean', "):
    losses.PolicyLossConfig(loss_agg='sum')
  with pytest.raises(ValueError, match=r"^unknown loss aggregation 'sum'; valid: "):
    losses.token_weights(jnp.ones((1, 2)), 'sum')
  with pytest.raises(ValueError, match=r'response_mask_NT must be \[N, T\]'):
    losses.token_weights(jnp.ones(2), 'token-mean')
  with pytest.raises(ValueError, match=r'config.optim.loss.eps_low must be in \[0, 1\)'):
    losses.PolicyLossConfig(eps_low=1.5)
  with pytest.raises(ValueError, match=r"^config.optim.loss.kl_estimator='k9' is not valid; "
                                       r"choose one of \['k1', 'k2', 'k3'\]$"):
    losses.PolicyLossConfig(kl_estimator='k9')
  with pytest.raises(ValueError, match='ref_logp_NT is required'):
    losses.policy_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones(1), jnp.ones((1, 2)),
                       losses.PolicyLossConfig(kl_coef=0.1))
  with pytest.raises(ValueError, match='advantages'):
    losses.policy_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones(3), jnp.ones((1, 2)),
                       losses.PolicyLossConfig())
  with pytest.raises(ValueError, match='tis_cap needs config.optim.loss.recompute_old_logp'):
    losses.PolicyLossConfig(tis_cap=2.0)
  with pytest.raises(ValueError, match=r'config.optim.loss.tis_cap must be 0 \(off\) or >= 1'):
    losses.PolicyLossConfig(tis_cap=0.5, recompute_old_logp=True)
  assert losses.PolicyLossConfig(tis_cap=0).tis_cap is None  # the config's 0 = off


def test_value_loss_matches_numpy():
  rng = np.random.default_rng(0)
  v, old, ret = (rng.normal(size=(3, 5)) for _ in range(3))
  mask = (rng.uniform(size=(3, 5)) < 0.7).astype(np.int32)
  w = losses.token_weights(mask, 'token-mean')
  vl = jax.jit(losses.value_loss, static_argnums=4)
  loss, metrics = vl(jnp.asarray(v), jnp.asarray(old), jnp.asarray(ret), w, 0.2)
  terms, clipped = [], []
  for b in range(3):
    for t in range(5):
      if mask[b, t]:
        vc = old[b, t] + min(max(v[b, t] - old[b, t], -0.2), 0.2)
        terms.append(0.5 * max((v[b, t] - ret[b, t]) ** 2, (vc - ret[b, t]) ** 2))
        clipped.append((vc - ret[b, t]) ** 2 > (v[b, t] - ret[b, t]) ** 2)
  np.testing.assert_allclose(float(loss), np.mean(terms), rtol=1e-5)
  np.testing.assert_allclose(float(metrics['vf_clip_frac']), np.mean(clipped), rtol=1e-5)
  loss_nc, _ = vl(jnp.asarray(v), jnp.asarray(old), jnp.asarray(ret), w, None)
  np.testing.assert_allclose(float(loss_nc), np.mean(0.5 * (v - ret)[mask > 0] ** 2), rtol=1e-5)


def _np_gae(r, v, mask, gamma, lam):
  N, T = r.shape
  adv = np.zeros((N, T))
  for b in range(N):
    idx = [t for t in range(T) if mask[b, t]]
    last = 0.0
    for j in reversed(range(len(idx))):
      t = idx[j]
      nv = v[b, idx[j + 1]] if j + 1 < len(idx) else 0.0
      delta = r[b, t] + gamma * nv - v[b, t]
      last = delta + gamma * lam * last
      adv[b, t] = last
  return adv, np.where(mask > 0, adv + v, 0.0)


@pytest.mark.parametrize('gamma,lam', [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_numpy_loop(gamma, lam):
  rng = np.random.default_rng(4)
  N, T = 4, 10
  r, v = rng.normal(size=(N, T)), rng.normal(size=(N, T))
  mask = np.zeros((N, T), np.int32)
  mask[0, 3:9] = 1
  mask[1, 1:10] = 1
  mask[2, [2, 3, 5, 6]] = 1  # holes inside the response are skipped
  adv, ret = jax.jit(gae_lib.gae, static_argnums=(3, 4))(r, v, mask, gamma, lam)
  want_adv, want_ret = _np_gae(r, v, mask, gamma, lam)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_outcome_rewards_whiten_and_ppo_advantages():
  mask = np.array([[0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]])
  r = np.asarray(gae_lib.outcome_rewards_to_tokens(np.array([1.0, np.nan, 3.0]), mask))
  np.testing.assert_array_equal(r, [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
  x = np.random.default_rng(0).normal(size=(3, 4)) * 3 + 1
  w = np.asarray(gae_lib.whiten(x, mask))
  sel = x[mask > 0]
  np.testing.assert_allclose(w[mask > 0], (sel - sel.mean()) / sel.std(ddof=1), rtol=1e-5)
  assert np.all(w[mask == 0] == 0)
  v = np.random.default_rng(1).normal(size=(3, 4))
  adv, ret = jax.jit(gae_lib.ppo_advantages, static_argnums=(3, 4))(np.array([1.0, 0.0, 2.0]),
                                                                     v, mask, 1.0, 1.0)
  raw, want_ret = _np_gae(np.asarray(gae_lib.outcome_rewards_to_tokens([1.0, 0.0, 2.0], mask)),
                          v, mask, 1.0, 1.0)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-6)
  sel = raw[mask > 0]
  np.testing.assert_allclose(np.asarray(adv)[mask > 0], (sel - sel.mean()) / sel.std(ddof=1),
                             rtol=1e-4)
  with pytest.raises(ValueError, match='lam'):
    gae_lib.gae(x, x, mask, 1.0, 1.5)
