"""Tests for the stateless aggregators, PG-OT and the registry (mr_rl/aggregators).

References are numpy (np.nanmean / nanmin, a direct numpy Sinkhorn, brute-force
Pareto dominance) and closed forms (TAG truth table, LSC limits, dropout keep rate).
"""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mr_rl import aggregators as A

K = 3


def _rewards(seed=0, shape=(4, 5, K), nan_frac=0.15):
  rng = np.random.default_rng(seed)
  r = rng.uniform(0, 1, shape).astype(np.float32)
  r[rng.uniform(size=shape) < nan_frac] = np.nan
  r[0, 0, :] = np.nan  # one all-NaN row
  return r


R = _rewards()
KEY = jax.random.key(3)

STATELESS = {
    "additive": lambda r: A.additive(r),
    "weighted": lambda r: A.weighted_sum(r, jnp.array([0.9, 0.05, 0.05])),
    "min": lambda r: A.min_and(r),
    "rp_only": lambda r: A.rp_only(r, 1),
    "lsc": lambda r: A.lsc_soft_and(r, 0.1),
    "tag": lambda r: A.tag(r, 0, jnp.array([0.0, 0.5, 2.0])),
    "rubric_dropout": lambda r: A.rubric_dropout(r, KEY, 0.5),
    "pg_ot": lambda r: A.pg_ot(r),
}


def _expected_nan(name):
  """Where each rule documents a NaN result for the rewards R."""
  nan = np.isnan(R)
  if name == "rp_only":
    return nan[..., 1]  # the primary channel is NaN
  if name == "tag":
    return nan[..., 0]  # the anchor is NaN
  if name == "rubric_dropout":
    return nan[..., np.asarray(A.rubric_dropout_mask(KEY, K, 0.5))].all(-1)  # kept all NaN
  return nan.all(-1)  # every other rule: only all-NaN rows


@pytest.mark.parametrize("name", sorted(STATELESS))
def test_jit_equals_eager_and_nan_pattern(name):
  fn = STATELESS[name]
  eager = np.asarray(fn(R))
  jitted = np.asarray(jax.jit(fn)(R))
  assert eager.shape == R.shape[:-1]
  np.testing.assert_allclose(jitted, eager, rtol=1e-5, atol=1e-6, equal_nan=True)
  assert np.isnan(eager[0, 0])  # all-NaN row -> NaN scalar (advantage 0 downstream)
  np.testing.assert_array_equal(np.isnan(eager), _expected_nan(name))


def test_simple_rules_match_numpy():
  r = R.astype(np.float64)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on the all-NaN row
    np.testing.assert_allclose(A.additive(R), np.nanmean(r, -1), rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(A.min_and(R), np.nanmin(r, -1), rtol=1e-6, equal_nan=True)
  w = np.array([0.9, 0.05, 0.05])
  ref = np.where(np.isnan(r).all(-1), np.nan, np.nansum(r * w, -1))
  np.testing.assert_allclose(A.weighted_sum(R, w), ref, rtol=1e-6, equal_nan=True)
  np.testing.assert_allclose(A.rp_only(R, 2), r[..., 2], equal_nan=True)
  # Scalar w broadcasts.
  np.testing.assert_allclose(A.weighted_sum(R, 2.0), np.where(np.isnan(r).all(-1), np.nan,
                                                              2 * np.nansum(r, -1)), rtol=1e-6)


def test_tag_truth_table():
  lam = np.array([7.0, 0.5, 2.0])  # anchor entry ignored
  for prof in itertools.product([0.0, 1.0], repeat=3):
    f = float(A.tag(jnp.array(prof), 0, lam))
    if prof[0] == 0:
      expect = 0.0  # total failure and auxiliary-only success
    else:
      expect = (1 + 0.5 * prof[1] + 2.0 * prof[2]) / (1 + 2.5)
    assert f == pytest.approx(expect, abs=1e-6), prof
  assert float(A.tag(jnp.array([1.0, 1.0, 1.0]), 0, lam)) == pytest.approx(1.0)
  assert float(A.tag(jnp.array([1.0, 0.0, 0.0]), 0, lam)) == pytest.approx(1 / 3.5)
  # Scalar lam, anchor in the middle: primary-only = 1/(1 + 2 lam).
  assert float(A.tag(jnp.array([0.0, 1.0, 0.0]), 1, 0.25)) == pytest.approx(1 / 1.5)
  assert float(A.tag(jnp.array([1.0, 0.0, 1.0]), 1, 0.25)) == 0.0
  # NaN auxiliary is dropped from both sums; NaN anchor gives NaN.
  assert float(A.tag(jnp.array([1.0, np.nan, 0.0]), 0, lam)) == pytest.approx(1 / 3.0)
  assert np.isnan(float(A.tag(jnp.array([np.nan, 1.0, 1.0]), 0, lam)))


def test_lsc_limits_and_formula():
  r = np.nan_to_num(R[1:], nan=0.3)
  np.testing.assert_allclose(A.lsc_soft_and(r, 1e-5), r.min(-1), atol=1e-4)
  np.testing.assert_allclose(A.lsc_soft_and(r, 1e7), r.mean(-1), atol=1e-6)
  rd = r.astype(np.float64)
  for tau in (0.05, 0.3, 2.0):
    ref = -tau * np.log(np.mean(np.exp(-rd / tau), -1))
    np.testing.assert_allclose(A.lsc_soft_and(r, tau), ref, rtol=2e-6, atol=1e-6)
  # NaN channels are skipped (mean over the applicable ones).
  x = np.array([0.2, np.nan, 0.8])
  ref = -0.5 * np.log(np.mean(np.exp(-np.array([0.2, 0.8]) / 0.5)))
  assert float(A.lsc_soft_and(x, 0.5)) == pytest.approx(ref, rel=1e-6)


def _central_diff(f, x, h=1e-6):
  return (f(x + h) - f(x - h)) / (2 * h)


def test_grad_tag_lam_and_lsc_tau_float64():
  with jax.enable_x64(True):
    r = jnp.asarray(np.nan_to_num(R[1:], nan=0.4), jnp.float64)
    f_tag = jax.jit(lambda lam: jnp.sum(A.tag(r, 0, lam) ** 2))
    lam = jnp.array([0.0, 0.7, 1.3], jnp.float64)
    g = jax.jit(jax.grad(f_tag))(lam)
    assert np.isfinite(g).all() and g[0] == 0.0  # anchor entry has no effect
    for i in (1, 2):
      e = jnp.zeros(3).at[i].set(1.0)
      num = _central_diff(lambda t: f_tag(lam + t * e), 0.0)
      assert float(g[i]) == pytest.approx(float(num), rel=1e-6)
    f_lsc = jax.jit(lambda tau: jnp.sum(A.lsc_soft_and(r, tau)))
    g_lsc = jax.jit(jax.grad(f_lsc))
    for tau in (0.05, 0.5, 5.0):
      g = g_lsc(jnp.float64(tau))
      assert float(g) == pytest.approx(float(_central_diff(f_lsc, tau, 1e-7)), rel=1e-5)


def test_vmap_over_hyperparameters_equals_loop():
  r = jnp.asarray(R)
  lams = jnp.array([0.0, 0.5, 3.0])
  got = jax.vmap(lambda l: A.tag(r, 2, l))(lams)
  for i, l in enumerate(lams):
    np.testing.assert_allclose(got[i], A.tag(r, 2, l), rtol=1e-6, equal_nan=True)
  anchors = jnp.arange(K)
  got = jax.vmap(lambda a: A.tag(r, a, 1.0))(anchors)
  for a in range(K):
    np.testing.assert_allclose(got[a], A.tag(r, a, 1.0), rtol=1e-6, equal_nan=True)
  taus = jnp.array([0.01, 0.1, 10.0])
  got = jax.vmap(lambda t: A.lsc_soft_and(r, t))(taus)
  for i, t in enumerate(taus):
    np.testing.assert_allclose(got[i], A.lsc_soft_and(r, t), rtol=1e-6, equal_nan=True)
  ws = jnp.eye(K)
  got = jax.vmap(lambda w: A.weighted_sum(r, w))(ws)
  for i in range(K):
    np.testing.assert_allclose(got[i], A.weighted_sum(r, ws[i]), rtol=1e-6, equal_nan=True)
  ps = jnp.array([0.0, 0.3, 0.9])
  got = jax.vmap(lambda p: A.rubric_dropout(r, KEY, p))(ps)
  for i, p in enumerate(ps):
    np.testing.assert_allclose(got[i], A.rubric_dropout(r, KEY, p), rtol=1e-6, equal_nan=True)
  got = jax.vmap(lambda pr: A.rp_only(r, pr))(anchors)
  np.testing.assert_allclose(got, np.moveaxis(R, -1, 0), equal_nan=True)


def test_rubric_dropout_keep_rate_and_mean():
  p, n = 0.6, 20000
  keys = jax.random.split(jax.random.key(11), n)
  masks = np.asarray(jax.vmap(lambda k: A.rubric_dropout_mask(k, K, p))(keys))
  assert masks.any(-1).all()  # at least one channel kept
  expect = (1 - p) + p ** K / K  # independent drops, plus the at-least-one fallback
  tol = 4 * np.sqrt(expect * (1 - expect) / n)
  np.testing.assert_allclose(masks.mean(0), expect, atol=tol)
  assert (masks.sum(-1) == 1).mean() == pytest.approx(K * (1 - p) * p ** (K - 1) + p ** K,
                                                     abs=4 * np.sqrt(0.25 / n))
  # R is the mean over kept channels, with the same mask for the whole call.
  mask = np.asarray(A.rubric_dropout_mask(KEY, K, 0.5))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    ref = np.nanmean(np.where(mask, R, np.nan), -1)
  np.testing.assert_allclose(A.rubric_dropout(R, KEY, 0.5), ref, rtol=1e-6, equal_nan=True)
  assert np.asarray(A.rubric_dropout_mask(KEY, K, 0.0)).all()  # p = 0 keeps everything


def _np_front(r):
  g = len(r)
  dom = np.zeros(g, bool)
  for i in range(g):
    for j in range(g):
      if np.all(r[j] >= r[i]) and np.any(r[j] > r[i]):
        dom[i] = True
  return ~dom


def _np_sinkhorn_scores(r, eps=0.05, iters=50):
  """Direct (non-log) Sinkhorn in float64, independent of the implementation."""
  front = _np_front(r)
  src, dst = r[~front], r[front]
  cost = ((src[:, None, :] - dst[None, :, :]) ** 2).sum(-1)
  kern = np.exp(-cost / eps)
  a = np.full(len(src), 1 / len(src))
  b = np.full(len(dst), 1 / len(dst))
  v = np.ones(len(dst))
  for _ in range(iters):
    u = a / (kern @ v)
    v = b / (kern.T @ u)
  plan = u[:, None] * kern * v[None, :]
  c = (plan * cost).sum(1) / plan.sum(1)
  out = np.ones(len(r))
  out[~front] = 1 - c / c.max()
  return out


def test_pg_ot_hand_cases_and_frontier():
  # Single frontier point: the plan is forced, c = squared distance to (1, 1).
  r = np.array([[1.0, 1.0], [0.5, 0.5], [0.0, 0.0], [0.2, 0.1]], np.float32)
  np.testing.assert_allclose(A.pg_ot(r[None])[0], [1.0, 0.75, 0.0, 1 - 1.45 / 2], atol=1e-6)
  # Two frontier points, dominated points at distance 1 from both.
  r = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]], np.float32)
  np.testing.assert_allclose(A.pg_ot(r[None])[0], [1.0, 1.0, 0.0, 0.0], atol=1e-6)
  # Random groups: frontier matches brute force and scores 1; the rest match numpy Sinkhorn.
  rng = np.random.default_rng(5)
  r = rng.integers(0, 4, (6, 8, 3)).astype(np.float32) / 3
  out = np.asarray(A.pg_ot(r))
  for b in range(6):
    front = _np_front(r[b].astype(np.float64))
    assert (out[b][front] == 1).all()
    assert (out[b][~front] < 1).all() and (out[b] >= 0).all()
    np.testing.assert_allclose(out[b], _np_sinkhorn_scores(r[b].astype(np.float64)), atol=2e-4)
  # Vmappable over groups: the batched call equals a loop over single groups.
  for b in range(6):
    np.testing.assert_allclose(out[b], A.pg_ot_group(r[b])[0], atol=1e-6)
  # eps is a traced hyperparameter (vmap sweep equals loop).
  eps = jnp.array([0.05, 0.5])
  got = jax.vmap(lambda e: A.pg_ot(r, e))(eps)
  for i in range(2):
    np.testing.assert_allclose(got[i], A.pg_ot(r, eps[i]), atol=1e-6)


def test_pg_ot_nan():
  r = np.array([[1.0, np.nan], [0.5, 0.2], [np.nan, np.nan], [0.2, 0.9]], np.float32)
  out = np.asarray(A.pg_ot(r[None])[0])
  # NaN channels are ignored pairwise: sample 0 is compared on channel 0 only, where it
  # beats both 1 and 3, so it is the whole frontier; the costs use channel 0 only:
  # c_1 = 0.5**2, c_3 = 0.8**2.
  np.testing.assert_allclose(out[[0, 1, 3]], [1.0, 1 - 0.25 / 0.64, 0.0], atol=1e-6)
  assert np.isnan(out[2])  # all-NaN sample
  # No dominated sample: everything scores 1.
  r = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.2, 0.8]], np.float32)
  np.testing.assert_array_equal(A.pg_ot(r[None]), np.ones((1, 4)))


def test_errors_name_the_argument():
  r = jnp.asarray(R)
  cases = [
      (lambda: A.weighted_sum(r, [1.0, 2.0]), "`w`"),
      (lambda: A.tag(r, 3, 1.0), "`anchor`"),
      (lambda: A.tag(r, -1, 1.0), "`anchor`"),
      (lambda: A.tag(r, 0, -0.1), "`lam`"),
      (lambda: A.tag(r, 0, [1.0, 1.0]), "`lam`"),
      (lambda: A.rubric_dropout(r, KEY, 1.0), "`p`"),
      (lambda: A.rubric_dropout(r, KEY, -0.1), "`p`"),
      (lambda: A.rubric_dropout(r, None, 0.5), "`key`"),
      (lambda: A.lsc_soft_and(r, 0.0), "`tau`"),
      (lambda: A.rp_only(r, 5), "`primary`"),
      (lambda: A.pg_ot(r[0, 0]), "`r_BGK`"),
      (lambda: A.pg_ot(r, eps=0.0), "`eps`"),
      (lambda: A.pg_ot(r, num_iters=0), "`num_iters`"),
      (lambda: A.get("tag", gamma=1.0), "gamma"),
      (lambda: A.get("weighted"), "`w`"),
      (lambda: A.get("weighted", w=[1.0, 1.0]).init(K), "`w`"),
      (lambda: A.get("tag", anchor=4).init(K), "`anchor`"),
      (lambda: A.get("tag", lam=-1.0), "`lam`"),
      (lambda: A.get("rubric_dropout", p=1.5), "`p`"),
      (lambda: A.get("lsc", tau=-1.0), "`tau`"),
      (lambda: A.get("amrp", prior=[1.0, 1.0]).init(K), "`prior`"),
      (lambda: A.get("amrp").apply(A.get("amrp").init(2), r), "`r_BGK`"),
      (lambda: A.get("tag").apply(A.get("tag").init(2), r), "`r_BGK`"),
      (lambda: A.get("additive").init(0), "`num_channels`"),
  ]
  for fn, needle in cases:
    with pytest.raises(ValueError, match=needle.replace("`", "`?")):
      fn()
  with pytest.raises(ValueError, match=r"^unknown aggregator 'nope'; valid: additive, amrp, "
                                       r"drbo_delta, drbo_inverse, lagrangian, lsc_soft_and, "
                                       r"min_and, pg_ot, rp_only, rubric_dropout, tag, "
                                       r"weighted_sum$"):
    A.get("nope")
  with pytest.raises(ValueError, match=r"^Aggregator 'weighted_sum' needs the hyperparameter"
                                       r"\(s\) `w`\.$"):
    A.get("weighted", w=None)


def test_static_weights_must_be_finite_nonnegative_and_not_all_zero():
  r = jnp.asarray(R)
  for w in ([1.0, -0.5, 1.0], [0.0, 0.0, 0.0], 0.0, -1.0, [1.0, np.nan, 1.0], [np.inf, 1, 1]):
    msg = r"`w` must be finite, non-negative and not all zero"
    with pytest.raises(ValueError, match=msg):
      A.weighted_sum(r, w)
    with pytest.raises(ValueError, match=msg):
      A.get("weighted", w=w).init(K)
  A.get("weighted", w=[0.0, 1.0, 0.0]).init(K)  # zero weights on some channels are fine


def test_traced_hyperparameters_skip_checks():
  # Checks run on concrete values only; traced ones pass through jit.
  r = jnp.asarray(R)
  out = jax.jit(lambda a, l: A.tag(r, a, l))(jnp.int32(1), jnp.float32(0.5))
  np.testing.assert_allclose(out, A.tag(r, 1, 0.5), rtol=1e-6, equal_nan=True)


REGISTRY_HP = {"weighted_sum": {"w": [0.5, 1.0, 1.5]}, "tag": {"anchor": 1, "lam": 0.5},
               "amrp": {"prior": [1.5, 0.75, 0.75]}, "drbo_inverse": {"interval": 1},
               "drbo_delta": {"interval": 1}, "lagrangian": {"thresholds": 0.6}}


@pytest.mark.parametrize("name", A.AGGREGATORS.names())
def test_registry_uniform_interface(name):
  agg = A.get(name, **REGISTRY_HP.get(name, {}))
  assert agg.name == name
  state = agg.init(K)
  r = jnp.asarray(R)
  apply = jax.jit(agg.apply)
  # Two steps, jit against eager, state carried as a pytree through jit.
  s_eager, s_jit = state, state
  for t in range(2):
    key = jax.random.fold_in(KEY, t)
    r_e, s_eager, m_e = agg.apply(s_eager, r, key)
    r_j, s_jit, m_j = apply(s_jit, r, key)
    np.testing.assert_allclose(r_j, r_e, rtol=1e-5, atol=1e-6, equal_nan=True)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), s_jit,
                 s_eager)
    assert r_e.shape == R.shape[:-1]
    assert ("weights" in m_e) == agg.linear
    if agg.linear:
      # metrics['weights'] are the coefficients of R on fully applicable rows.
      full = ~np.isnan(R).any(-1)
      np.testing.assert_allclose(np.asarray(r_e)[full], (R[full] * np.asarray(m_e["weights"])).sum(-1),
                                 rtol=1e-5, atol=1e-6)
  assert float(m_e["frac_nan_R"]) > 0  # the all-NaN row


def test_registry_vmap_over_init_sweeps_hyperparameters():
  r = jnp.asarray(R)
  lams = jnp.array([0.1, 1.0, 4.0])
  states = jax.vmap(lambda l: A.get("tag", anchor=0, lam=l).init(K))(lams)
  agg = A.get("tag", anchor=0)
  out, _, _ = jax.vmap(agg.apply, in_axes=(0, None))(states, r)
  for i, l in enumerate(lams):
    np.testing.assert_allclose(out[i], A.tag(r, 0, l), rtol=1e-6, equal_nan=True)
