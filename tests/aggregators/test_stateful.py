"""Tests for the stateful aggregators: AMRP, DRBO (inverse / delta), Lagrangian.

AMRP is checked against an independent numpy implementation of Algorithm 1 /
Eqs. 4-7 written here from the paper; DRBO and the Lagrangian rule against short
sequences computed by hand from docs/methods.md §2.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mr_rl import aggregators as A

K = 3
T_STEPS = 6
RNG = np.random.default_rng(0)
# Bernoulli rewards whose success rates drift differently per channel.
_P = np.stack([np.linspace(0.1, 0.5, T_STEPS), np.linspace(0.7, 0.9, T_STEPS),
               np.linspace(0.6, 0.4, T_STEPS)], -1)
RS = (RNG.uniform(size=(T_STEPS, 2, 4, K)) < _P[:, None, None, :]).astype(np.float32)
RS[:, 0, 0, 2] = 0.37  # one non-binary value

AMRP_UPDATE = jax.jit(A.amrp.update)


def _softplus(x):
  return np.log1p(np.exp(x))


def amrp_reference(rs, rho=0.9, lam=1.0, k_s=5.0, k_p=5.0, n=1, eps=1e-6, prior=None,
                   drop=(), additive=False, persistent=True):
  """Algorithm 1 in float64 numpy, for rewards without NaN. Returns (R_t, w_t) lists."""
  k = rs.shape[-1]
  a = np.ones(k) if prior is None else np.asarray(prior, np.float64)
  w = a.copy()  # w^(0)
  mu = nu = None
  out_r, out_w = [], []
  for t, r in enumerate(rs.astype(np.float64), start=1):
    out_r.append((r * w).sum(-1))  # Eq. 4 with w^(t-1)
    flat = r.reshape(-1, k)
    m, v = flat.mean(0), flat.var(0)
    if t == 1:
      mu, nu, delta = m, v, np.zeros(k)
    else:
      mu_new = rho * mu + (1 - rho) * m
      nu = rho * nu + (1 - rho) * v
      delta = mu_new - mu
      mu = mu_new
    sigma = np.sqrt(nu)
    if t % n == 0:
      s = _softplus(k_s * (mu.mean() - mu))
      vv = 1 + lam * sigma / (mu + eps)
      p = _softplus(-k_p * delta)
      s = np.ones(k) if "S" in drop else s
      vv = np.ones(k) if "V" in drop else vv
      p = np.ones(k) if "P" in drop else p
      u = s + vv + p if additive else s * vv * p
      aa = a if persistent else np.ones(k)
      w = k * aa * u / (aa * u).sum()
    out_w.append(w.copy())
  return out_r, out_w


def _run_amrp(state, rs):
  out_r, out_w, metrics = [], [], []
  for r in rs:
    big_r, state, m = AMRP_UPDATE(state, r)
    out_r.append(np.asarray(big_r))
    out_w.append(np.asarray(state.weights))
    metrics.append(m)
  return out_r, out_w, metrics, state


VARIANTS = {
    "default": ({}, {}),
    "no_S": ({"use_s": False}, {"drop": ("S",)}),
    "no_V": ({"use_v": False}, {"drop": ("V",)}),
    "no_P": ({"use_p": False}, {"drop": ("P",)}),
    "additive": ({"additive": True}, {"additive": True}),
    "prior_persistent": ({"prior": [1.5, 0.75, 0.75]}, {"prior": [1.5, 0.75, 0.75]}),
    "prior_init_only": ({"prior": [1.5, 0.75, 0.75], "persistent_prior": False},
                        {"prior": [1.5, 0.75, 0.75], "persistent": False}),
    "interval_2_hp": ({"interval": 2, "lam": 0.5, "k_s": 2.0, "k_p": 8.0, "rho": 0.7},
                      {"n": 2, "lam": 0.5, "k_s": 2.0, "k_p": 8.0, "rho": 0.7}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_amrp_matches_numpy_reference(variant):
  kw, ref_kw = VARIANTS[variant]
  ref_r, ref_w = amrp_reference(RS, **ref_kw)
  got_r, got_w, metrics, _ = _run_amrp(A.amrp.init(K, **kw), RS)
  for t in range(T_STEPS):
    np.testing.assert_allclose(got_r[t], ref_r[t], rtol=2e-5, atol=1e-6, err_msg=f"R step {t+1}")
    np.testing.assert_allclose(got_w[t], ref_w[t], rtol=2e-5, atol=1e-6, err_msg=f"w step {t+1}")
    assert np.mean(got_w[t]) == pytest.approx(1.0, abs=1e-6)  # mean-one
    np.testing.assert_allclose(metrics[t]["new_weights"], got_w[t])
  # The first step uses the prior (w^(0) = a) and reports it as the weights in use.
  prior = np.asarray(kw.get("prior", np.ones(K)))
  np.testing.assert_allclose(got_r[0], (RS[0] * prior).sum(-1), rtol=1e-6)
  np.testing.assert_allclose(metrics[0]["weights"], prior)
  np.testing.assert_allclose(metrics[0]["Delta"], 0.0)


def test_amrp_metrics_and_hand_step():
  """Two steps of Eqs. 5-7 by hand on a 2-channel batch."""
  r1 = np.array([[[1.0, 1.0], [0.0, 1.0]]], np.float32)  # means (0.5, 1), vars (0.25, 0)
  r2 = np.array([[[1.0, 1.0], [1.0, 0.0]]], np.float32)  # means (1, 0.5), vars (0, 0.25)
  state = A.amrp.init(2)
  _, state, m1 = AMRP_UPDATE(state, r1)
  # Step 1: mu = (0.5, 1), sigma = (0.5, 0), Delta = 0.
  s = [math.log1p(math.exp(5 * 0.25)), math.log1p(math.exp(-5 * 0.25))]
  v = [1 + 0.5 / (0.5 + 1e-6), 1.0]
  p = [math.log(2.0)] * 2
  u = [s[i] * v[i] * p[i] for i in range(2)]
  w1 = [2 * u[0] / sum(u), 2 * u[1] / sum(u)]
  for name, val in (("S", s), ("V", v), ("P", p), ("U", u), ("new_weights", w1)):
    np.testing.assert_allclose(m1[name], val, rtol=1e-5, err_msg=name)
  np.testing.assert_allclose(m1["sigma"], [0.5, 0.0], atol=1e-7)
  big_r, state, m2 = AMRP_UPDATE(state, r2)
  np.testing.assert_allclose(big_r, [[w1[0] + w1[1], w1[0]]], rtol=1e-5)
  mu = [0.9 * 0.5 + 0.1 * 1.0, 0.9 * 1.0 + 0.1 * 0.5]
  nu = [0.9 * 0.25, 0.1 * 0.25]
  np.testing.assert_allclose(m2["mu"], mu, rtol=1e-6)
  np.testing.assert_allclose(m2["sigma"], np.sqrt(nu), rtol=1e-6)
  np.testing.assert_allclose(m2["Delta"], [0.05, -0.05], rtol=1e-5)
  np.testing.assert_allclose(m2["weights"], w1, rtol=1e-6)
  assert int(state.step) == 2


def test_amrp_nan_channel_skipped():
  rs = RS[:3].copy()
  rs[1, ..., 2] = np.nan  # channel 2 not applicable at step 2
  rs[2, 0, 1, :] = np.nan  # one all-NaN sample at step 3
  got_r, got_w, metrics, _ = _run_amrp(A.amrp.init(K), rs)
  # Channel 2 keeps its statistics at step 2 and reports no progress.
  np.testing.assert_allclose(metrics[1]["mu"][2], metrics[0]["mu"][2])
  np.testing.assert_allclose(metrics[1]["sigma"][2], metrics[0]["sigma"][2])
  assert float(metrics[1]["Delta"][2]) == 0.0
  # R sums the applicable channels; the all-NaN sample scores NaN.
  w1 = got_w[0]
  np.testing.assert_allclose(got_r[1], (rs[1, ..., :2] * w1[:2]).sum(-1), rtol=1e-6)
  assert np.isnan(got_r[2][0, 1]) and np.isfinite(np.delete(got_r[2].ravel(), 1)).all()
  # Batch statistics of step 3 skip the NaN sample (population variance, ddof = 0).
  flat = rs[2].reshape(-1, K)
  flat = flat[~np.isnan(flat).all(-1)]
  mu3 = 0.9 * np.asarray(metrics[1]["mu"]) + 0.1 * flat.mean(0)
  np.testing.assert_allclose(metrics[2]["mu"], mu3, rtol=1e-5)


def test_amrp_vmap_over_init_equals_loop():
  lams = jnp.array([0.0, 1.0, 3.0])
  kss = jnp.array([5.0, 1.0, 9.0])
  use_s = jnp.array([True, False, True])
  additive = jnp.array([False, False, True])
  states = jax.vmap(lambda l, s, us, ad: A.amrp.init(K, lam=l, k_s=s, use_s=us, additive=ad))(
      lams, kss, use_s, additive)
  vupdate = jax.jit(jax.vmap(A.amrp.update, in_axes=(0, None)))
  for r in RS[:3]:
    big_r, states, _ = vupdate(states, r)
  for i in range(3):
    _, w, _, _ = _run_amrp(A.amrp.init(K, lam=float(lams[i]), k_s=float(kss[i]),
                                       use_s=bool(use_s[i]), additive=bool(additive[i])), RS[:3])
    np.testing.assert_allclose(states.weights[i], w[-1], rtol=1e-6)


def test_amrp_grad_hyperparameters_float64():
  with jax.enable_x64(True):
    rs = jnp.asarray(RS[:4], jnp.float64)
    c = jnp.array([1.0, -2.0, 0.5], jnp.float64)

    def f(lam, k_s, k_p):
      state = A.amrp.init(K, lam=lam, k_s=k_s, k_p=k_p)
      for r in rs:
        _, state, _ = A.amrp.update(state, r)
      return jnp.sum(c * state.weights)

    f_jit = jax.jit(f)
    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(1.0, 5.0, 5.0)
    x0 = np.array([1.0, 5.0, 5.0])
    for i in range(3):
      e = np.eye(3)[i] * 1e-6
      num = (f_jit(*(x0 + e)) - f_jit(*(x0 - e))) / 2e-6
      assert np.isfinite(grads[i]) and abs(float(grads[i])) > 1e-6
      assert float(grads[i]) == pytest.approx(float(num), rel=1e-5, abs=1e-9)


def test_amrp_errors():
  for kw, needle in (({"prior": [1.0, 1.0]}, "prior"), ({"prior": [2.0, 2.0, 2.0]}, "prior"),
                     ({"prior": [-1.0, 2.0, 2.0]}, "prior"), ({"rho": 1.5}, "rho"),
                     ({"lam": -1.0}, "lam"), ({"k_s": -1.0}, "k_s"), ({"k_p": -1.0}, "k_p"),
                     ({"eps": 0.0}, "eps"), ({"interval": 0}, "interval"),
                     ({"interval": 1.5}, "interval"), ({"use_s": 2}, "use_s")):
    with pytest.raises(ValueError, match=needle):
      A.amrp.init(K, **kw)
  with pytest.raises(ValueError, match="num_channels"):
    A.amrp.init(0)
  with pytest.raises(ValueError, match="r_BGK"):
    A.amrp.update(A.amrp.init(K), RS[0, ..., :2])


# ----------------------------------------------------------------------------- DRBO

DRBO_RS = [np.array([[[1.0, 0.0], [0.0, 0.0]]], np.float32),
           np.array([[[1.0, 1.0], [1.0, 0.0]]], np.float32),
           np.array([[[0.0, 1.0], [np.nan, 1.0]]], np.float32),
           np.array([[[1.0, 1.0], [1.0, 1.0]]], np.float32)]


def _run(update, state, rs):
  outs = []
  for r in rs:
    big_r, state, m = update(state, r)
    outs.append((np.asarray(big_r), np.asarray(state.weights), m))
  return outs, state


def test_drbo_inverse_hand_sequence():
  for tau in (0.0, 0.5):
    outs, state = _run(jax.jit(A.drbo_inverse.update), A.drbo_inverse.init(2, interval=2, tau=tau),
                       DRBO_RS)
    # Step 1: weights 1; R = row sums. No recompute (1 mod 2 != 0).
    np.testing.assert_allclose(outs[0][0], [[1.0, 0.0]])
    np.testing.assert_allclose(outs[0][1], [1.0, 1.0])
    # Step 2: n = (4, 4), N = 4, xbar = (3/4, 1/4): a = (7/8, 5/8), bonus = sqrt(2 ln 4 / 4).
    np.testing.assert_allclose(outs[1][0], [[2.0, 1.0]])
    bonus = math.sqrt(2 * math.log(4) / 4)
    inv = [1 / (7 / 8 + bonus - tau * 5 / 8), 1 / (5 / 8 + bonus - tau * 5 / 8)]
    w2 = [2 * inv[0] / sum(inv), 2 * inv[1] / sum(inv)]
    np.testing.assert_allclose(outs[1][1], w2, rtol=1e-6)
    # Step 3 uses w2; the NaN entry is skipped in R and in the statistics.
    np.testing.assert_allclose(outs[2][0], [[w2[1], w2[1]]], rtol=1e-6)
    np.testing.assert_allclose(outs[2][2]["count"], [5, 6])
    np.testing.assert_allclose(outs[2][1], w2, rtol=1e-6)  # no recompute at t = 3
    # Step 4: n = (7, 8), N = 8, xbar = (5/7, 5/8).
    a = [(5 / 7 + 1) / 2, (5 / 8 + 1) / 2]
    u = [a[0] + math.sqrt(2 * math.log(8) / 7), a[1] + math.sqrt(2 * math.log(8) / 8)]
    inv = [1 / (u[i] - tau * min(a)) for i in range(2)]
    np.testing.assert_allclose(outs[3][1], [2 * x / sum(inv) for x in inv], rtol=1e-5)
    np.testing.assert_allclose(outs[3][2]["weights"], w2, rtol=1e-6)  # weights in use


def test_drbo_delta_hand_sequence():
  outs, _ = _run(jax.jit(A.drbo_delta.update), A.drbo_delta.init(2, interval=2, temperature=0.5),
                 DRBO_RS)
  # t = 2: a = (xbar(2) - 0)/2 = (3/8, 1/8); z = a / (T * 2).
  z = np.array([3 / 8, 1 / 8]) / (0.5 * 2)
  w2 = 2 * np.exp(z) / np.exp(z).sum()
  np.testing.assert_allclose(outs[1][1], w2, rtol=1e-6)
  np.testing.assert_allclose(outs[0][1], [1.0, 1.0])
  np.testing.assert_allclose(outs[2][1], w2, rtol=1e-6)
  # t = 4: xbar(4) = (5/7, 5/8), xbar(2) = (3/4, 1/4).
  a = (np.array([5 / 7, 5 / 8]) - np.array([3 / 4, 1 / 4])) / 2
  z = a / (0.5 * 4)
  np.testing.assert_allclose(outs[3][1], 2 * np.exp(z) / np.exp(z).sum(), rtol=1e-5)
  # tau shifts every a_k equally, so it cancels in the normalisation.
  outs_tau, _ = _run(A.drbo_delta.update, A.drbo_delta.init(2, interval=2, temperature=0.5,
                                                            tau=0.7), DRBO_RS[:2])
  np.testing.assert_allclose(outs_tau[1][1], w2, rtol=1e-6)


def test_drbo_vmap_over_init_and_errors():
  taus = jnp.array([0.0, 0.5])
  states = jax.vmap(lambda t: A.drbo_inverse.init(2, interval=2, tau=t))(taus)
  upd = jax.vmap(A.drbo_inverse.update, in_axes=(0, None))
  for r in DRBO_RS[:2]:
    _, states, _ = upd(states, r)
  for i, t in enumerate((0.0, 0.5)):
    outs, _ = _run(A.drbo_inverse.update, A.drbo_inverse.init(2, interval=2, tau=t), DRBO_RS[:2])
    np.testing.assert_allclose(states.weights[i], outs[1][1], rtol=1e-6)
  for kw, needle in (({"interval": 0}, "interval"), ({"tau": -1.0}, "tau"),
                     ({"temperature": 0.0}, "temperature")):
    with pytest.raises(ValueError, match=needle):
      A.drbo_delta.init(2, **kw)
  with pytest.raises(ValueError, match="r_BGK"):
    A.drbo_inverse.update(A.drbo_inverse.init(3), DRBO_RS[0])


# ------------------------------------------------------------------------ Lagrangian

def test_lagrangian_hand_sequence():
  sig = lambda x: 1 / (1 + math.exp(-x))
  state = A.lagrangian.init(3, objective=0, thresholds=[0.0, 0.5, 0.8], lr=0.1)
  upd = jax.jit(A.lagrangian.update)
  # Step 1: s = (0.5, 0.5), M = 2, objective coefficient 2 - 1 = 1.
  r1 = np.array([[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]], np.float32)
  big_r, state, m = upd(state, r1)
  np.testing.assert_allclose(big_r, [[1.5, 1.0]])
  np.testing.assert_allclose(m["weights"], [1.0, 0.5, 0.5])
  np.testing.assert_allclose(state.multipliers, [0.0, 0.0, 0.1 * (0.8 - 1.0)], atol=1e-7)
  # Step 2: lambda = (0, 0, -0.02).
  r2 = np.array([[[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]], np.float32)
  big_r, state, m = upd(state, r2)
  coef = 2 - 0.5 - sig(-0.02)
  np.testing.assert_allclose(big_r, [[coef + 0.5, coef]], rtol=1e-6)
  np.testing.assert_allclose(state.multipliers, [0.0, 0.0, -0.02 + 0.08], rtol=1e-6, atol=1e-7)
  # Step 3: NaN constraint channel keeps its multiplier; NaN terms drop out of R.
  r3 = np.array([[[0.0, 1.0, np.nan], [1.0, 1.0, np.nan]]], np.float32)
  big_r, state, m = upd(state, r3)
  coef = 2 - 0.5 - sig(0.06)
  np.testing.assert_allclose(big_r, [[0.5, coef + 0.5]], rtol=1e-6)
  np.testing.assert_allclose(state.multipliers, [0.0, 0.1 * (0.5 - 1.0), 0.06], rtol=1e-6)
  # A subset of constraints: channel 1 unconstrained gets coefficient 0, M = 1.
  st = A.lagrangian.init(3, objective=2, constrained=[True, False, False], init_multiplier=1.0)
  np.testing.assert_allclose(A.lagrangian.coefficients(st), [sig(1.0), 0.0, 1 - sig(1.0)],
                             rtol=1e-6)


def test_lagrangian_vmap_over_init_equals_loop():
  lrs = jnp.array([0.0, 0.1, 1.0])
  ths = jnp.array([[0.0, 0.2, 0.9], [0.0, 0.5, 0.5], [0.0, 0.9, 0.1]])
  states = jax.vmap(lambda lr, th: A.lagrangian.init(3, lr=lr, thresholds=th))(lrs, ths)
  upd = jax.jit(jax.vmap(A.lagrangian.update, in_axes=(0, None)))
  for r in RS[:3]:
    big_r, states, _ = upd(states, r)
  for i in range(3):
    st = A.lagrangian.init(3, lr=float(lrs[i]), thresholds=ths[i])
    for r in RS[:3]:
      ref_r, st, _ = A.lagrangian.update(st, r)
    np.testing.assert_allclose(states.multipliers[i], st.multipliers, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(big_r[i], ref_r, rtol=1e-6)


def test_lagrangian_errors():
  for kw, needle in (({"objective": 3}, "objective"), ({"thresholds": [0.1, 0.2]}, "thresholds"),
                     ({"lr": -0.1}, "lr"), ({"constrained": [True, False]}, "constrained"),
                     ({"constrained": [True, False, False]}, "constrained")):
    with pytest.raises(ValueError, match=needle):
      A.lagrangian.init(3, **kw)
  with pytest.raises(ValueError, match="num_channels"):
    A.lagrangian.init(1)
