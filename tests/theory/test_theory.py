"""Tests of mr_rl.theory: the conditional-mean GRPO model of docs/methods.md §9.

References used here that the module does not share code with: a brute-force sum over
all 5**G ordered outcome sequences (numpy), a Monte Carlo GRPO estimator (numpy),
closed forms (Dr.GRPO's (1 - 1/G) factor, the G -> inf limits) and central
differences; plus the three facts section 9 requires.
"""

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mr_rl import aggregators
from mr_rl import theory
from mr_rl.theory import __main__ as cli

# Outcome types: (r1, r2, is_P) for P00, P01, P10, P11, S.
TYPES = np.array([[0, 0, 1], [0, 1, 1], [1, 0, 1], [1, 1, 1], [0, 1, 0]], np.float64)

NP_AGGS = {  # numpy transcriptions of docs/methods.md §1 (lam = 1 for TAG).
    "additive": lambda r: r.mean(-1),
    "weighted": lambda r: 0.9 * r[..., 0] + 0.1 * r[..., 1],
    "tag": lambda r: r[..., 0] * (1 + r[..., 1]) / 2,
}
LIB_AGGS = {
    "additive": aggregators.additive,
    "weighted": functools.partial(aggregators.weighted_sum, w=jnp.array([0.9, 0.1])),
    "tag": functools.partial(aggregators.tag, anchor=0, lam=1.0),
}


@functools.lru_cache(maxsize=None)
def _jitted_drift(G, normalize_std=True):
  """One compiled ``(theta, rho, eta, R_V) -> drift`` per (G, normalize_std)."""
  return jax.jit(lambda theta, rho, eta, R_V: theory.expected_drift(
      theta, rho=rho, eta=eta, aggregator=theory.table_aggregator(R_V), group_size=G,
      normalize_std=normalize_std))


def drift(theta, rho, eta, agg, G=8, normalize_std=True):
  """``expected_drift`` of a library aggregator, through the compiled cache."""
  R_V = theory.aggregate_rewards(agg)
  return float(_jitted_drift(G, normalize_std)(theta, rho, eta, R_V))


def test_table_aggregator_is_faithful():
  direct = jax.jit(lambda: [theory.expected_drift(0.7, rho=0.3, eta=0.4, aggregator=agg)
                             for agg in LIB_AGGS.values()])()
  for agg, want in zip(LIB_AGGS.values(), direct):
    R_V = theory.aggregate_rewards(agg)
    np.testing.assert_array_equal(theory.table_aggregator(R_V)(jnp.asarray(theory.REWARD_VECTORS_YK)), R_V)
    assert drift(0.7, 0.3, 0.4, agg) == pytest.approx(float(want), rel=1e-6)


def _type_probs(theta, rho, eta):
  p = 1 / (1 + math.exp(-theta))
  return p, np.array([p * (1 - rho) * (1 - eta), p * (1 - rho) * eta, p * rho * (1 - eta),
                      p * rho * eta, 1 - p])


def _grpo_objective(types_NG, p, np_agg, normalize_std, eps=1e-6):
  """(1/G) sum_i A_i dlogpi(a_i) for each of N groups of outcome-type indices."""
  t = TYPES[types_NG]
  R = np_agg(t[..., :2])
  d = R - R.mean(-1, keepdims=True)
  if normalize_std:
    sd = R.std(-1, ddof=1, keepdims=True)
    zero = np.isclose(R.max(-1, keepdims=True), R.min(-1, keepdims=True), rtol=0, atol=1e-12)
    A = np.where(zero, 0.0, d / (sd + eps))
  else:
    A = d
  score = np.where(t[..., 2] == 1, 1 - p, -p)
  return (A * score).mean(-1)


def _brute_force(theta, rho, eta, np_agg, G, normalize_std=True):
  p, q = _type_probs(theta, rho, eta)
  seqs = np.indices((5,) * G).reshape(G, -1).T
  prob = np.prod(q[seqs], axis=1)
  return float(np.sum(prob * _grpo_objective(seqs, p, np_agg, normalize_std)))


POINTS = [(0.0, 0.05, 0.3), (1.3, 0.4, 0.8), (-2.0, 0.7, 0.0), (0.5, 1.0, 0.5)]


@pytest.mark.parametrize("G", [2, 5])
def test_enumeration_equals_brute_force_over_sequences(G):
  counts, log_coef = theory.compositions(G)
  assert counts.shape == (math.comb(G + 3, 3), 4)
  assert np.allclose(np.exp(log_coef.astype(np.float64)).sum(), 4**G, rtol=1e-5)
  for name, np_agg in NP_AGGS.items():
    for normalize_std in (True, False):
      for theta, rho, eta in POINTS:
        got = drift(theta, rho, eta, LIB_AGGS[name], G, normalize_std)
        want = _brute_force(theta, rho, eta, np_agg, G, normalize_std)
        assert got == pytest.approx(want, rel=2e-5, abs=2e-7), (name, normalize_std, theta)


def test_enumeration_equals_monte_carlo():
  rng = np.random.default_rng(0)
  G, N = 8, 400_000
  for name, (theta, rho, eta) in [("weighted", (0.5, 0.2, 0.6)), ("tag", (-1.0, 0.3, 0.4))]:
    p, q = _type_probs(theta, rho, eta)
    types = rng.choice(5, size=(N, G), p=q)
    obj = _grpo_objective(types, p, NP_AGGS[name], normalize_std=True)
    mc, se = obj.mean(), obj.std() / math.sqrt(N)
    exact = drift(theta, rho, eta, LIB_AGGS[name], G)
    assert abs(exact - mc) < 4 * se, (name, exact, mc, se)
    assert se < 0.05 * abs(exact)  # The check has power.


def test_fact1_additive_infinite_group_sign():
  n = 19
  grid = (np.arange(n) + 0.5) / n
  rho, eta = np.meshgrid(grid, grid)  # [eta, rho]
  off_boundary = np.abs(rho + eta - 1) > 1e-6
  add = aggregators.additive

  @jax.jit
  def both(theta):
    return (theory.phase_diagram(lambda r, e: theory.expected_drift(
        theta, rho=r, eta=e, aggregator=add, group_size=None), grid, grid),
            theory.phase_diagram(lambda r, e: theory.closed_form_drift_inf(
                theta, rho=r, eta=e, aggregator=add), grid, grid))

  for theta in (-3.0, 0.0, 2.5):
    d, closed = (np.asarray(x) for x in both(theta))
    np.testing.assert_array_equal(np.sign(d)[off_boundary],
                                  np.sign(rho + eta - 1)[off_boundary])
    np.testing.assert_allclose(d, closed, rtol=1e-4, atol=1e-7)


def test_fact2_static_downweighting_drifts_to_shortcut_at_finite_G():
  w91 = LIB_AGGS["weighted"]
  for theta in (-2.0, 0.0, 2.0):
    assert drift(theta, 0.05, 0.3, w91, 8) < 0
  # The finite-G normalisation is the cause: at rho = 0.2 the population (G -> inf)
  # drift favours P (0.9 rho + 0.1 eta > 0.1) while G = 8 still favours the shortcut.
  assert drift(0.0, 0.2, 0.3, w91, None) > 0
  assert drift(0.0, 0.2, 0.3, w91, 8) < 0


@pytest.mark.parametrize("G", [2, 8, None])
def test_fact3_tag_drifts_toward_primary(G):
  rho = np.linspace(0.02, 1.0, 12)
  eta = np.linspace(0.0, 0.97, 12)
  thetas = jnp.linspace(-6.0, 6.0, 9)
  lams = jnp.array([0.25, 1.0, 4.0])

  def drift(lam, theta):
    agg = functools.partial(aggregators.tag, anchor=0, lam=lam)
    return theory.phase_diagram(
        lambda r, e: theory.expected_drift(theta, rho=r, eta=e, aggregator=agg, group_size=G),
        rho, eta)

  d = jax.jit(jax.vmap(jax.vmap(drift, (None, 0)), (0, None)))(lams, thetas)
  assert d.shape == (3, 9, 12, 12)
  assert bool(jnp.all(d > 0)), float(d.min())


def test_finite_G_approaches_infinite_limit():
  for name, (theta, rho, eta) in [("weighted", (0.5, 0.3, 0.6)), ("tag", (-0.5, 0.2, 0.7))]:
    agg = LIB_AGGS[name]
    limit = drift(theta, rho, eta, agg, None)
    errs = [abs(drift(theta, rho, eta, agg, G) - limit) for G in (4, 16, 64, 128)]
    assert all(a > b for a, b in zip(errs, errs[1:])), (name, errs)
    assert errs[-1] < 0.02 * abs(limit), (name, errs, limit)


def test_dr_grpo_finite_G_is_one_minus_one_over_G_times_limit():
  # E[(1/G) sum_i (R_i - mean R) s_i] = (1 - 1/G) Cov(R, s) since E[s] = 0.
  for name in ("weighted", "tag"):
    agg = LIB_AGGS[name]
    for theta, rho, eta in POINTS:
      limit = drift(theta, rho, eta, agg, None, normalize_std=False)
      closed = float(theory.closed_form_drift_inf(theta, rho=rho, eta=eta, aggregator=agg,
                                                  normalize_std=False))
      assert limit == pytest.approx(closed, rel=1e-5, abs=1e-8)
      for G in (3, 8):
        got = drift(theta, rho, eta, agg, G, normalize_std=False)
        assert got == pytest.approx((1 - 1 / G) * limit, rel=1e-4, abs=1e-7)


def test_grad_wrt_tag_lambda_matches_central_differences():
  for G in (8, None):
    def f(lam, G=G):
      agg = functools.partial(aggregators.tag, anchor=0, lam=lam)
      return theory.expected_drift(0.3, rho=0.2, eta=0.6, aggregator=agg, group_size=G)

    value_and_grad = jax.jit(jax.value_and_grad(f))
    grad = float(value_and_grad(1.0)[1])
    h = 1e-2
    fd = (float(value_and_grad(1.0 + h)[0]) - float(value_and_grad(1.0 - h)[0])) / (2 * h)
    assert np.isfinite(grad) and abs(grad) > 1e-3
    assert grad == pytest.approx(fd, rel=2e-3)


def _gdpo_brute_force(theta, rho, eta, G, w, eps=1e-4):
  """Per-channel group normalisation, weighted sum; returns (numerator, E[(1/G) sum S^2])."""
  p, q = _type_probs(theta, rho, eta)
  seqs = np.indices((5,) * G).reshape(G, -1).T
  prob = np.prod(q[seqs], axis=1)
  t = TYPES[seqs]
  S = 0.0
  for k in range(2):
    r = t[..., k]
    sd = r.std(-1, ddof=1, keepdims=True)
    S = S + w[k] * np.where(sd > 0, (r - r.mean(-1, keepdims=True)) / (sd + eps), 0.0)
  score = np.where(t[..., 2] == 1, 1 - p, -p)
  return np.sum(prob * (S * score).mean(-1)), np.sum(prob * (S**2).mean(-1))


def test_gdpo_matches_brute_force_and_closed_form():
  w = (1.0, 0.5)
  gdpo = jax.jit(lambda theta, rho, eta: [theory.expected_drift_gdpo(
      theta, rho=rho, eta=eta, weights=w, group_size=4, batch_normalize=b) for b in (False, True)])
  for theta, rho, eta in POINTS[:3]:
    num, m2 = _gdpo_brute_force(theta, rho, eta, 4, w)
    mo, gd = (float(x) for x in gdpo(theta, rho, eta))
    assert mo == pytest.approx(num, rel=1e-4, abs=1e-7)
    assert gd == pytest.approx(num / (math.sqrt(m2) + 1e-4), rel=1e-4, abs=1e-7)
  # G -> inf, equal weights: sign(rho - (1 - eta)) for every theta, since
  # x / sqrt(p x (1 - p x)) increases in x (channel-1 share rho, channel-2 deficit 1-eta).
  grid = (np.arange(15) + 0.5) / 15
  rho, eta = np.meshgrid(grid, grid)
  off = np.abs(rho + eta - 1) > 1e-6
  phase = jax.jit(lambda theta: theory.phase_diagram(
      lambda r, e: theory.expected_drift_gdpo(theta, rho=r, eta=e, group_size=None), grid, grid))
  for theta in (-2.0, 1.0):
    d = np.asarray(phase(theta))
    np.testing.assert_array_equal(np.sign(d)[off], np.sign(rho + eta - 1)[off])


def test_amrp_trajectory_feeds_expected_batch_statistics():
  # At theta = 0, rho = 1/2, eta = 1/4 the expected channel means are 1/4 and 5/8; a real
  # binary batch with exactly those frequencies has the same mean and population variance.
  r_real = jnp.array([[[1, 1], [1, 1], [0, 1], [0, 1], [0, 1], [0, 0], [0, 0], [0, 0]]],
                     jnp.float32)
  synth = theory.expected_batch(0.0, 0.5, 0.25)
  np.testing.assert_allclose(synth.reshape(-1, 2).mean(0), r_real.reshape(-1, 2).mean(0),
                             atol=1e-6)
  np.testing.assert_allclose(synth.reshape(-1, 2).var(0), r_real.reshape(-1, 2).var(0),
                             atol=1e-6)
  theta_T, w_TK = theory.amrp_trajectory(0.0, rho=0.5, eta=0.25, lr=0.5, num_steps=2)
  state = aggregators.amrp.init(2)
  _, state, _ = aggregators.amrp.update(state, r_real)
  np.testing.assert_allclose(w_TK[0], [1.0, 1.0])
  np.testing.assert_allclose(w_TK[1], state.weights, rtol=1e-5)
  assert not np.allclose(state.weights, 1.0)  # The gates act (shortfall of channel 1).
  # Step 0 uses w = (1, 1): GRPO is scale-invariant, so this is the additive drift.
  d0 = drift(0.0, 0.5, 0.25, aggregators.additive)
  assert d0 < -1e-3
  assert float(theta_T[1]) == pytest.approx(0.5 * d0, rel=1e-4)
  d1 = drift(float(theta_T[1]), 0.5, 0.25,
             functools.partial(aggregators.weighted_sum, w=state.weights))
  assert float(theta_T[2]) == pytest.approx(float(theta_T[1]) + 0.5 * d1, rel=1e-5)


def test_integrate_and_phase_diagram_layout():
  fn = theory.method_drift("tag", group_size=8)
  traj = theory.integrate(lambda t: fn(t, 0.3, 0.2), -1.0, lr=2.0, num_steps=4)
  theta, want = -1.0, [-1.0]
  for _ in range(4):
    theta = theta + 2.0 * drift(theta, 0.3, 0.2, LIB_AGGS["tag"])
    want.append(theta)
  np.testing.assert_allclose(traj, want, rtol=1e-5)
  out = theory.phase_diagram(lambda r, e: r + 10 * e, jnp.array([0.1, 0.2, 0.3]),
                             jnp.array([0.5, 0.7]))
  np.testing.assert_allclose(out, [[5.1, 5.2, 5.3], [7.1, 7.2, 7.3]], rtol=1e-6)


def test_bad_inputs_raise():
  add = aggregators.additive
  with pytest.raises(ValueError, match="group_size"):
    theory.expected_drift(0.0, rho=0.5, eta=0.5, aggregator=add, group_size=1)
  with pytest.raises(TypeError, match="group_size"):
    theory.expected_drift(0.0, rho=0.5, eta=0.5, aggregator=add, group_size=2.5)
  with pytest.raises(ValueError, match="rho"):
    theory.expected_drift(0.0, rho=1.5, eta=0.5, aggregator=add)
  with pytest.raises(ValueError, match="eta"):
    theory.expected_drift_gdpo(0.0, rho=0.5, eta=-0.1)
  with pytest.raises(ValueError, match="theta"):
    theory.expected_drift(jnp.zeros(3), rho=0.5, eta=0.5, aggregator=add)
  with pytest.raises(TypeError, match="aggregator"):
    theory.expected_drift(0.0, rho=0.5, eta=0.5, aggregator="additive")
  with pytest.raises(ValueError, match="aggregator"):
    theory.expected_drift(0.0, rho=0.5, eta=0.5, aggregator=lambda r: r)
  with pytest.raises(ValueError, match="num_steps"):
    theory.integrate(lambda t: t, 0.0, lr=1.0, num_steps=0)
  with pytest.raises(ValueError, match="unknown method"):
    theory.method_trajectory("nope", 0.0, rho=0.5, eta=0.5, lr=1.0, num_steps=2)


def test_cli_writes_figures(tmp_path, capsys):
  out = tmp_path / "figs"
  paths = cli.main(["--out", str(out), "--grid", "5", "--steps", "6", "--amrp-steps", "3",
                    "--theta0s", "-1", "1"])
  names = {"phase_G8.png", "phase_Ginf.png", "trajectories.png"}
  assert {os.path.basename(p) for p in paths} == names
  assert set(os.listdir(out)) == names
  printed = capsys.readouterr().out.split()
  assert printed == paths
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  for p in paths:
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(p)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
