"""Exact conditional-mean GRPO drift of the two-channel decision (docs/methods.md §9).

The model (a project reconstruction of the TAG paper's two-channel MDP; the paper's
proofs were not available):

* action P ("attempt the task"): primary reward ``r1 ~ Bern(rho)`` and auxiliary
  reward ``r2 ~ Bern(eta)``, independent;
* action S ("shortcut"): ``r1 = 0``, ``r2 = 1``;
* policy ``pi(P) = p = sigmoid(theta)``, so ``d/dtheta log pi(P) = 1 - p`` and
  ``d/dtheta log pi(S) = -p``.

A GRPO group holds ``G`` independent samples; the expected update of the log-odds is

    drift(theta) = E[ (1/G) sum_i A_i d/dtheta log pi(a_i) ].

Exact evaluation for finite G
-----------------------------
Outcome types are P00, P01, P10, P11 (action P with ``(r1, r2)``) and S.  S has the
same reward vector ``(0, 1)`` as P01, so every group statistic (and hence every
advantage) depends only on the counts ``c_y`` of the four reward vectors
``y in {00, 01, 10, 11}``, which are multinomial with probabilities

    w_00 = p (1-rho)(1-eta),  w_01 = p (1-rho) eta + (1-p),
    w_10 = p rho (1-eta),     w_11 = p rho eta.

Inside the 01 bucket the split into P01 and S is binomial, independent of the rest,
with ``P(S | 01) = (1-p) / w_01``.  All estimators here centre the advantages within
the group (``sum_i A_i = 0``), and ``d/dtheta log pi(a) = (1-p) - [a = S]``, hence
exactly

    drift = -(1/G) E[ n_S A_01 ] = -((1-p) / w_01) (1/G) E_c[ c_01 A_01(c) ],

the expected advantage mass the group puts on shortcut samples, with a minus sign.
We enumerate all ``C(G+3, 3)`` compositions ``c`` (precomputed once per G in numpy)
and evaluate the multinomial weights and advantages in ``jnp``, so the result is
exact up to float32 rounding and is jittable, vmappable and differentiable (e.g. in
the aggregator's parameters).  ``tests/theory/test_theory.py`` checks this reduction against
a brute-force sum over all ``5**G`` ordered outcome sequences and against Monte Carlo.

The limit G -> inf
------------------
Group mean and (Bessel) std converge to the population mean ``mu = sum_y w_y R_y``
and std ``sigma`` of the reward mixture, so ``A_y = (R_y - mu) / (sigma + eps)`` and
``(1/G) E[c_01 A_01] -> w_01 A_01``, giving the closed form

    drift_inf = -(1-p) (R_01 - mu) / (sigma + eps)
              = p (1-p) (E[R | P] - R(S)) / (sigma + eps),

(use ``R(S) - mu = p (R(S) - E[R | P])``).  Without std normalisation (Dr.GRPO)
the denominator is 1; at finite G Dr.GRPO's drift is exactly ``(1 - 1/G)`` times it.

Shape letters (docs/shapes.md): Y the four outcomes 00, 01, 10, 11; Z the compositions of a
group; K the two channels.

Numerical conventions: advantages use the group deviation written as
``d_y = sum_u (c_u/G) (R_y - R_u)``, which is exactly zero in every zero-variance
group, so such groups get advantage exactly 0 (docs/methods.md §3), and square
roots are guarded so gradients stay finite there.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Aggregator = Callable[[Array], Array]

# Reward vectors (r1, r2) of the four buckets, in the order 00, 01, 10, 11.
REWARD_VECTORS_YK = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]], np.float32)
SHORTCUT_BUCKET = 1  # S shares the reward vector (0, 1) with P01.
GRPO_EPS = 1e-6  # docs/methods.md §3.
GDPO_EPS = 1e-4  # docs/methods.md §3 (Liu et al. 2026).


# --------------------------------------------------------------------------- inputs


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _check_scalar(name: str, x) -> None:
  if jnp.ndim(x) != 0:
    raise ValueError(f"{name} must be a scalar (use jax.vmap for grids), got shape "
                     f"{jnp.shape(x)}")


def _check_prob(name: str, x) -> None:
  _check_scalar(name, x)
  if _is_concrete(x):
    arr = np.asarray(x, dtype=np.float64)
    if not np.all((arr >= 0.0) & (arr <= 1.0)):
      raise ValueError(f"{name} must lie in [0, 1], got {x!r}")


def _check_group_size(group_size) -> None:
  if group_size is None:
    return
  if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
    raise TypeError(f"group_size must be an int >= 2 or None, got {group_size!r}")
  if group_size < 2:
    raise ValueError(f"group_size must be >= 2 (Bessel-corrected std) or None, got {group_size}")


def aggregate_rewards(aggregator: Aggregator) -> Array:
  """Scalar rewards ``R_Y`` of the four reward vectors 00, 01, 10, 11.

  Args:
    aggregator: any callable ``r[..., K=2] -> R[...]`` (docs/methods.md §1-2).

  Returns:
    ``R_Y`` of shape ``(4,)``.
  """
  if not callable(aggregator):
    raise TypeError(f"aggregator must be callable r[..., K] -> R[...], got {aggregator!r}")
  R_Y = jnp.asarray(aggregator(jnp.asarray(REWARD_VECTORS_YK)))
  if R_Y.shape != (4,):
    raise ValueError(
        f"aggregator must map r[4, 2] to R[4] (reduce the last axis), got shape {R_Y.shape}")
  return R_Y.astype(jnp.float32)


def table_aggregator(R_Y) -> Aggregator:
  """The aggregator that reads ``R`` from a table over the binary reward vectors.

  ``R_Y[2 r1 + r2]`` for ``r`` in ``{0, 1}^2``, so ``aggregate_rewards(table_aggregator(
  aggregate_rewards(agg)))`` equals ``aggregate_rewards(agg)``.  With ``R_Y`` traced, one
  compiled drift serves every aggregator (vmap over a stack of tables).
  """
  R_Y = jnp.asarray(R_Y, jnp.float32)
  if R_Y.shape != (4,):
    raise ValueError(f"R_Y must have shape (4,) (rewards of 00, 01, 10, 11), got {R_Y.shape}")
  return lambda r: R_Y[(2 * r[..., 0] + r[..., 1]).astype(jnp.int32)]


def bucket_probs(theta, rho, eta) -> tuple[Array, Array]:
  """Reward-vector probabilities and the shortcut share of the 01 bucket.

  Args:
    theta: log-odds of action P (scalar).
    rho: primary success rate of P.
    eta: auxiliary success rate of P (channel compatibility).

  Returns:
    ``(w_Y, s_share)``: ``w_Y`` (4,) the probabilities of 00, 01, 10, 11 and
    ``s_share = (1-p) / w_01 = P(S | 01)`` (0 where ``w_01 = 0``).
  """
  theta = jnp.asarray(theta, jnp.float32)
  rho = jnp.asarray(rho, jnp.float32)
  eta = jnp.asarray(eta, jnp.float32)
  p = jax.nn.sigmoid(theta)
  q = jax.nn.sigmoid(-theta)  # 1 - p without cancellation.
  w_Y = jnp.stack([p * (1 - rho) * (1 - eta), p * (1 - rho) * eta + q, p * rho * (1 - eta),
                   p * rho * eta])
  w01 = w_Y[SHORTCUT_BUCKET]
  s_share = jnp.where(w01 > 0, q / jnp.where(w01 > 0, w01, 1.0), 0.0)
  return w_Y, s_share


# ------------------------------------------------------------------ enumeration


@functools.lru_cache(maxsize=8)
def compositions(group_size: int) -> tuple[np.ndarray, np.ndarray]:
  """All compositions of ``group_size`` into the four reward buckets.

  Args:
    group_size: G.

  Returns:
    ``(counts_ZY, log_coef_Z)``: float32 counts (``Z = binom(G+3, 3)`` rows) and the
    log multinomial coefficients ``log G! - sum_y log c_y!`` (computed in float64).
  """
  _check_group_size(group_size)
  G = int(group_size)
  blocks = []
  for c0 in range(G + 1):
    m = G - c0
    i, j = np.triu_indices(m + 1)  # 0 <= i <= j <= m.
    c1, c2, c3 = i, j - i, m - j
    blocks.append(np.stack([np.full_like(i, c0), c1, c2, c3], axis=1))
  counts = np.concatenate(blocks).astype(np.int64)
  lg = np.array([math.lgamma(k + 1.0) for k in range(G + 1)])
  log_coef = math.lgamma(G + 1.0) - lg[counts].sum(axis=1)
  return counts.astype(np.float32), log_coef.astype(np.float32)


def composition_probs(w_Y: Array, counts_ZY: np.ndarray, log_coef_Z: np.ndarray) -> Array:
  """Multinomial probabilities of the compositions, safe where some ``w_y = 0``."""
  # Guarded log: buckets with w_y = 0 contribute c_y log w_y = 0 when c_y = 0 (and -inf
  # otherwise) without NaN gradients.  Masks are built in numpy so that jit does not
  # constant-fold large arrays.
  c = jnp.asarray(counts_ZY)
  pos_Y = w_Y > 0
  logw_Y = jnp.where(pos_Y, jnp.log(jnp.where(pos_Y, w_Y, 1.0)), -jnp.inf)
  logp = jnp.asarray(log_coef_Z) + jnp.sum(
      jnp.where(jnp.asarray(counts_ZY > 0), c * logw_Y[None, :], 0.0), axis=1)
  return jnp.exp(logp)


def _safe_sqrt(x: Array) -> Array:
  pos = x > 0
  return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def group_deviation(counts_ZY: Array, R_Y: Array, total) -> Array:
  """``d_ZY = sum_u (c_u / G) (R_y - R_u)``: deviation of outcome y from the group mean.

  ``total = G = sum_u c_u``; the counts may also be population probabilities (then
  ``total = 1``: G -> inf).  Exactly zero for every present bucket of a zero-variance
  group.
  """
  diff_YY = R_Y[:, None] - R_Y[None, :]
  return jnp.einsum("zu,yu->zy", counts_ZY, diff_YY) / total


def _normalise(d_ZY: Array, var_Z: Array, eps: float) -> Array:
  std_Z = _safe_sqrt(var_Z)
  return jnp.where(std_Z[:, None] > 0, d_ZY / (std_Z[:, None] + eps), 0.0)


# ---------------------------------------------------------------- GRPO/Dr.GRPO


def expected_drift(theta, *, rho, eta, aggregator: Aggregator, group_size: int | None = 8,
                   normalize_std: bool = True, eps: float = GRPO_EPS) -> Array:
  """Exact expected GRPO (or Dr.GRPO) update of the log-odds (docs/methods.md §9).

  Args:
    theta: log-odds of action P, scalar (vmap for batches).
    rho: primary success rate of P in [0, 1].
    eta: auxiliary success rate of P in [0, 1].
    aggregator: callable ``r[..., 2] -> R[...]`` turning the reward vector into the
      scalar reward (e.g. ``functools.partial(aggregators.tag, anchor=0, lam=1.0)``).
    group_size: G >= 2 (exact enumeration) or None for the G -> inf closed form.
    normalize_std: True for GRPO ``A = (R - mean) / (std + eps)`` (Bessel std),
      False for Dr.GRPO ``A = R - mean`` (docs/methods.md §3).
    eps: the GRPO std epsilon.

  Returns:
    The scalar ``E[(1/G) sum_i A_i d/dtheta log pi(a_i)]``; positive moves toward P.
  """
  _check_scalar("theta", theta)
  _check_prob("rho", rho)
  _check_prob("eta", eta)
  _check_group_size(group_size)
  R_Y = aggregate_rewards(aggregator)
  w_Y, s_share = bucket_probs(theta, rho, eta)
  q = jax.nn.sigmoid(-jnp.asarray(theta, jnp.float32))
  if group_size is None:
    d_Y = group_deviation(w_Y[None, :], R_Y, 1.0)[0]
    if not normalize_std:
      return -q * d_Y[SHORTCUT_BUCKET]
    sigma = _safe_sqrt(jnp.sum(w_Y * d_Y**2))
    a01 = jnp.where(sigma > 0, d_Y[SHORTCUT_BUCKET] / (sigma + eps), 0.0)
    return -q * a01
  counts_np, log_coef = compositions(group_size)
  counts = jnp.asarray(counts_np)
  probs_Z = composition_probs(w_Y, counts_np, log_coef)
  d_ZY = group_deviation(counts, R_Y, float(group_size))
  if normalize_std:
    var_Z = jnp.sum(counts * d_ZY**2, axis=1) / (group_size - 1)
    A_ZY = _normalise(d_ZY, var_Z, eps)
  else:
    A_ZY = d_ZY
  mass = jnp.sum(probs_Z * counts[:, SHORTCUT_BUCKET] * A_ZY[:, SHORTCUT_BUCKET])
  return -s_share * mass / group_size


def closed_form_drift_inf(theta, *, rho, eta, aggregator: Aggregator,
                          normalize_std: bool = True, eps: float = GRPO_EPS) -> Array:
  """``p (1-p) (E[R|P] - R(S)) / (sigma_R + eps)``: the G -> inf drift written directly.

  An independent transcription of the limit formula in the module docstring (used as a
  cross-check of ``expected_drift(group_size=None)``).
  """
  _check_scalar("theta", theta)
  _check_prob("rho", rho)
  _check_prob("eta", eta)
  R_Y = aggregate_rewards(aggregator)
  theta = jnp.asarray(theta, jnp.float32)
  p, q = jax.nn.sigmoid(theta), jax.nn.sigmoid(-theta)
  probs_Y_given_P = jnp.stack([(1 - rho) * (1 - eta), (1 - rho) * eta, rho * (1 - eta),
                               rho * eta])
  mean_given_P = jnp.sum(probs_Y_given_P * R_Y)
  R_shortcut = R_Y[SHORTCUT_BUCKET]
  mu = p * mean_given_P + q * R_shortcut
  var = p * jnp.sum(probs_Y_given_P * (R_Y - mu)**2) + q * (R_shortcut - mu)**2
  scale = _safe_sqrt(var) + eps if normalize_std else 1.0
  return p * q * (mean_given_P - R_shortcut) / scale


# ------------------------------------------------------------------------- GDPO


def expected_drift_gdpo(theta, *, rho, eta, weights=(1.0, 1.0), group_size: int | None = 8,
                        batch_normalize: bool = True, eps: float = GDPO_EPS) -> Array:
  """Exact expected GDPO update of the log-odds (docs/methods.md §3 and §9).

  Per channel ``A_k = (r_k - mean_g r_k) / (std_g r_k + eps)`` (Bessel std, zero-std
  channel groups give 0), ``S = sum_k w_k A_k``, then the batch normalisation
  ``A = (S - mean_batch S) / (std_batch S + eps)``.  In the single-decision model the
  batch is taken as infinitely many independent groups (B -> inf), so the batch
  statistics are the population ones over groups and members: ``mean_batch S = 0``
  exactly (S is centred in each group) and ``std_batch S = sqrt(E[(1/G) sum_i S_i^2])``.
  The batch step is therefore one positive scalar per (theta, rho, eta): it rescales the
  drift and never changes its sign.  ``batch_normalize=False`` gives MO-GRPO.

  Args:
    theta: log-odds of P (scalar).
    rho: primary success rate of P.
    eta: auxiliary success rate of P.
    weights: channel weights ``w_K`` (2,), e.g. AMRP's weights.
    group_size: G >= 2, or None for G -> inf (population per-channel statistics).
    batch_normalize: apply the batch normalisation (GDPO) or not (MO-GRPO).
    eps: GDPO epsilon (1e-4), used for both normalisations.

  Returns:
    The scalar expected update.
  """
  _check_scalar("theta", theta)
  _check_prob("rho", rho)
  _check_prob("eta", eta)
  _check_group_size(group_size)
  w_K = jnp.asarray(weights, jnp.float32)
  if w_K.shape != (2,):
    raise ValueError(f"weights must have shape (2,), got {w_K.shape}")
  w_Y, s_share = bucket_probs(theta, rho, eta)
  r_YK = jnp.asarray(REWARD_VECTORS_YK)
  if group_size is None:
    counts = w_Y[None, :]
    probs_Z = jnp.ones((1,))
    G, ddof = 1.0, 0.0
  else:
    counts_np, log_coef = compositions(group_size)
    counts = jnp.asarray(counts_np)
    probs_Z = composition_probs(w_Y, counts_np, log_coef)
    G, ddof = float(group_size), 1.0
  S_ZY = 0.0
  for k in range(2):
    d_ZY = group_deviation(counts, r_YK[:, k], G)
    var_Z = jnp.sum(counts * d_ZY**2, axis=1) / (G - ddof)
    S_ZY = S_ZY + w_K[k] * _normalise(d_ZY, var_Z, eps)
  if group_size is None:
    mass = w_Y[SHORTCUT_BUCKET] * S_ZY[0, SHORTCUT_BUCKET]
  else:
    mass = jnp.sum(probs_Z * counts[:, SHORTCUT_BUCKET] * S_ZY[:, SHORTCUT_BUCKET]) / G
  drift = -s_share * mass
  if not batch_normalize:
    return drift
  second_moment = jnp.sum(probs_Z * jnp.sum(counts * S_ZY**2, axis=1)) / G
  std_batch = _safe_sqrt(second_moment)
  return jnp.where(std_batch > 0, drift / (std_batch + eps), 0.0)
