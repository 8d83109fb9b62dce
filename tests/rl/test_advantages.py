"""Advantage estimators (docs/methods.md §3) against loop-based numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mr_rl.rl import advantages as _adv


class _Jitted:
  """The module's functions under jax.jit (one compile per shape instead of one per op)."""

  def __getattr__(self, name):
    fn = getattr(_adv, name)
    if name in ('grpo', 'mo_grpo', 'gdpo'):
      return jax.jit(fn, static_argnames='eps')
    if name in ('dr_grpo', 'rloo', 'frac_zero_std', 'frac_zero_std_channels'):
      return jax.jit(fn)
    return fn


adv = _Jitted()


# ----------------------------------------------------------------- numpy references (loops)
def _ref_group(x_BG, eps, kind):
  """Straightforward per-group loop; NaN skipped, zero-std groups -> 0."""
  out = np.zeros_like(x_BG, dtype=np.float64)
  for b in range(x_BG.shape[0]):
    idx = [g for g in range(x_BG.shape[1]) if not np.isnan(x_BG[b, g])]
    vals = [float(x_BG[b, g]) for g in idx]
    if len(vals) < 2 or max(vals) == min(vals):
      continue
    n = len(vals)
    mean = sum(vals) / n
    std = (sum((v - mean) ** 2 for v in vals) / (n - 1)) ** 0.5
    for g in idx:
      if kind == 'grpo':
        out[b, g] = (x_BG[b, g] - mean) / (std + eps)
      elif kind == 'dr_grpo':
        out[b, g] = x_BG[b, g] - mean
      elif kind == 'rloo':
        others = [x_BG[b, h] for h in idx if h != g]
        out[b, g] = x_BG[b, g] - sum(others) / len(others)
  return out


def _ref_channels(r_BGK, w_K, eps, batch_norm):
  B, G, K = r_BGK.shape
  S = np.zeros((B, G))
  for k in range(K):
    S += w_K[k] * _ref_group(r_BGK[:, :, k], eps, 'grpo')
  row_valid = ~np.all(np.isnan(r_BGK), axis=-1)
  all_const = np.ones(B, bool)
  for b in range(B):
    for k in range(K):
      vals = r_BGK[b, :, k][~np.isnan(r_BGK[b, :, k])]
      if len(vals) >= 2 and vals.max() != vals.min():
        all_const[b] = False
  if batch_norm:
    vals = S[row_valid]
    mean = vals.mean() if len(vals) else 0.0
    std = vals.std(ddof=1) if len(vals) > 1 else 0.0
    S = (S - mean) / (std + eps)
  return np.where(row_valid & ~all_const[:, None], S, 0.0)


def _rewards(seed, B=6, G=5, K=3, nan_frac=0.2):
  rng = np.random.default_rng(seed)
  r = rng.binomial(1, 0.5, size=(B, G, K)).astype(np.float64)
  r[:, :, 0] = rng.uniform(size=(B, G))  # one continuous channel
  r[0, :, :] = 1.0  # a group with zero std in every channel
  r[1, :, 1] = np.nan  # a channel not applicable to a whole group
  r[2, 3, :] = np.nan  # a sample with no applicable channel
  r[rng.uniform(size=r.shape) < nan_frac] = np.nan
  return r


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize('kind', ['grpo', 'dr_grpo', 'rloo'])
@pytest.mark.parametrize('seed', [0, 1])
def test_scalar_estimators_match_loop_reference(kind, seed):
  rng = np.random.default_rng(seed)
  R = rng.binomial(1, 0.4, size=(8, 6)).astype(np.float64) + 0.3 * rng.uniform(size=(8, 6))
  R[0] = 0.7  # zero std
  R[1, :5] = np.nan  # one valid sample only
  R[2, :] = np.nan  # no valid sample
  R[3, 1] = np.nan
  R[4] = np.array([1, 1, 0, 0, 1, 1.0])  # binary group
  fn = {'grpo': adv.grpo, 'dr_grpo': adv.dr_grpo, 'rloo': adv.rloo}[kind]
  got = np.asarray(fn(jnp.asarray(R, jnp.float32)))
  want = _ref_group(R, 1e-6, kind)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(got))
  np.testing.assert_array_equal(got[:3], 0.0)  # zero-std / single / empty groups


def test_grpo_eps_and_bessel():
  R = np.array([[0.0, 1.0, 1.0, 0.0]])
  std = np.std(R, ddof=1)
  got = np.asarray(adv.grpo(R, eps=0.5))
  np.testing.assert_allclose(got, (R - 0.5) / (std + 0.5), rtol=1e-6)


def test_constant_group_with_inexact_mean_is_exactly_zero():
  R = np.full((2, 7), 0.1, np.float32)  # mean of 0.1s is not exactly 0.1 in float32
  assert np.all(np.asarray(adv.grpo(R)) == 0.0)
  assert np.all(np.asarray(adv.gdpo(np.stack([R, R], -1))) == 0.0)


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('weighted', [False, True])
def test_gdpo_and_mo_grpo_match_loop_reference(seed, weighted):
  r = _rewards(seed)
  w = np.array([2.0, 0.5, 0.5]) if weighted else np.ones(3)
  wk = w if weighted else None
  got_gdpo = np.asarray(adv.gdpo(jnp.asarray(r, jnp.float32), wk))
  got_mo = np.asarray(adv.mo_grpo(jnp.asarray(r, jnp.float32), wk))
  np.testing.assert_allclose(got_gdpo, _ref_channels(r, w, 1e-4, True), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got_mo, _ref_channels(r, w, 1e-6, False), rtol=1e-4, atol=1e-4)
  for got in (got_gdpo, got_mo):
    assert np.all(np.isfinite(got))
    assert np.all(got[0] == 0.0)  # all channels zero-std
    assert got[2, 3] == 0.0  # sample without applicable channel


def test_gdpo_single_channel_is_batch_normalised_grpo():
  rng = np.random.default_rng(3)
  R = rng.uniform(size=(4, 8))
  A = _ref_group(R, 1e-4, 'grpo')
  want = (A - A.mean()) / (A.std(ddof=1) + 1e-4)
  np.testing.assert_allclose(np.asarray(adv.gdpo(R[..., None])), want, rtol=1e-4, atol=1e-5)


def test_frac_zero_std():
  r = _rewards(0)
  R = np.nansum(r, -1)
  R[np.all(np.isnan(r), -1)] = np.nan
  want = np.mean([np.all(_ref_group(R, 1e-6, 'grpo')[b] == 0) for b in range(R.shape[0])])
  assert float(adv.frac_zero_std(R)) == pytest.approx(want)
  per_k = np.asarray(adv.frac_zero_std_channels(r))
  want_k = [np.mean([np.all(_ref_group(r[:, :, k], 1e-6, 'grpo')[b] == 0)
                     for b in range(r.shape[0])]) for k in range(r.shape[2])]
  np.testing.assert_allclose(per_k, want_k)
  assert per_k.shape == (3,)
  assert float(adv.frac_zero_std(np.ones((3, 4)))) == 1.0


def test_registry_uniform_signature_and_errors():
  r = _rewards(1)
  R = np.nan_to_num(r).mean(-1)
  for name in adv.ADVANTAGE_NAMES:
    fn = jax.jit(adv.get_advantage(name))
    out = fn(R, r, None)
    assert out.shape == R.shape
    assert np.all(np.isfinite(np.asarray(out)))
  np.testing.assert_allclose(jax.jit(adv.get_advantage('grpo', eps=0.1))(R, None),
                             adv.grpo(R, eps=0.1),
                             rtol=1e-6)
  np.testing.assert_allclose(jax.jit(adv.get_advantage('gdpo'))(None, r, np.ones(3)),
                             adv.gdpo(r),
                             rtol=1e-6)
  assert adv.uses_channels('gdpo') and not adv.uses_channels('rloo')
  with pytest.raises(ValueError,
                     match=r"^unknown advantage estimator 'ppo2'; valid: dr_grpo, gdpo, grpo, "
                           r"mo_grpo, rloo$"):
    adv.get_advantage('ppo2')
  with pytest.raises(ValueError, match=r"^unknown advantage estimator 'ppo2'; valid: "):
    adv.uses_channels('ppo2')
  with pytest.raises(ValueError, match='unexpected'):
    adv.get_advantage('rloo', eps=1e-3)
  with pytest.raises(ValueError, match='r_BGK'):
    adv.get_advantage('mo_grpo')(R, None)
  with pytest.raises(ValueError, match='R_BG'):
    adv.get_advantage('grpo')(None, r)
  with pytest.raises(ValueError, match='weights_K'):
    adv.gdpo(r, np.ones(2))
  with pytest.raises(ValueError, match='R_BG'):
    adv.grpo(np.ones(4))
  with pytest.raises(ValueError, match='eps'):
    adv.grpo(R, eps=-1.0)


def test_estimator_registry_names_are_function_names(monkeypatch):
  from mr_rl.registry import Registry
  assert _adv.ESTIMATORS.names() == _adv.ADVANTAGE_NAMES == (
      'dr_grpo', 'gdpo', 'grpo', 'mo_grpo', 'rloo')
  assert not _adv.ESTIMATORS.aliases()
  for name in _adv.ADVANTAGE_NAMES:  # every name resolves, to the function of that name
    fn = _adv.ESTIMATORS.get(name)
    assert getattr(_adv, name) is fn and fn.__name__ == name
    assert _adv.get_advantage(name).__name__ == name
  assert {n for n in _adv.ADVANTAGE_NAMES if _adv.uses_channels(n)} == {'gdpo', 'mo_grpo'}
  # An estimator must say what it reads with its first parameter.
  reg = Registry('advantage estimator')
  reg.add('odd', lambda rewards: rewards)
  monkeypatch.setattr(_adv, 'ESTIMATORS', reg)
  with pytest.raises(ValueError, match="'odd' must take R_BG or r_BGK as its first parameter, "
                                       "got 'rewards'"):
    _adv.get_advantage('odd')


def test_grpo_gradient_is_finite_with_constant_groups():
  """A constant group must not turn gradients w.r.t. the rewards into NaN (guarded sqrt)."""
  import jax
  import jax.numpy as jnp
  from mr_rl import rl
  R = jnp.array([[0., 0, 0, 0], [1, 0, 1, 0]])
  g = jax.grad(lambda s: jnp.sum(rl.grpo(R * s) * jnp.arange(8.).reshape(2, 4)))(1.0)
  assert jnp.isfinite(g)
  # Only the non-constant group contributes; grpo is scale-invariant there, so d/ds ~ 0.
  assert abs(float(g)) < 1e-3
