"""Deterministic conditional-mean GRPO dynamics (docs/methods.md §9).

``theta_{t+1} = theta_t + lr * drift(theta_t)`` integrated with ``lax.scan``; phase
diagrams over a ``(rho, eta)`` grid with ``jax.vmap``; AMRP trajectories whose weights
follow the expected batch statistics of the current policy.

The named methods (``METHOD_NAMES``) use the aggregators library
(``mr_rl.aggregators``) for the reward rules and the AMRP weight update.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from mr_rl import aggregators
from mr_rl.theory import drift as drift_lib

Array = jax.Array
DriftFn = Callable[[Array], Array]

METHOD_NAMES = ("additive", "weighted_0.9_0.1", "min", "tag", "amrp", "gdpo")
STATELESS_METHODS = ("additive", "weighted_0.9_0.1", "min", "tag", "gdpo")


def integrate(drift_fn: DriftFn, theta0, *, lr: float, num_steps: int) -> Array:
  """Euler steps ``theta_{t+1} = theta_t + lr * drift_fn(theta_t)``.

  Args:
    drift_fn: ``theta -> drift`` (scalar in, scalar out).
    theta0: initial log-odds (scalar; vmap for several starts).
    lr: step size (> 0).
    num_steps: number of Euler steps (>= 1).

  Returns:
    ``theta_traj`` of shape ``(num_steps + 1,)``: theta at steps 0 ... num_steps.
  """
  _check_steps(lr, num_steps)

  def step(theta, _):
    return theta + lr * drift_fn(theta), theta

  theta0 = jnp.asarray(theta0, jnp.float32)
  last, hist = jax.lax.scan(step, theta0, None, length=num_steps)
  return jnp.concatenate([hist, last[None]])


def _check_steps(lr, num_steps) -> None:
  if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
    raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
  if not isinstance(lr, jax.core.Tracer) and not float(lr) > 0:
    raise ValueError(f"lr must be > 0, got {lr!r}")


def phase_diagram(fn: Callable[[Array, Array], Array], rho_grid, eta_grid) -> Array:
  """Evaluates ``fn(rho, eta)`` on the grid with two nested ``jax.vmap``.

  Args:
    fn: ``(rho, eta) -> scalar``, e.g. the drift at fixed theta.
    rho_grid: 1-D grid of rho values.
    eta_grid: 1-D grid of eta values.

  Returns:
    Shape ``(len(eta_grid), len(rho_grid))`` (rows follow eta, columns rho, as in an image).
  """
  rho_grid = jnp.asarray(rho_grid, jnp.float32)
  eta_grid = jnp.asarray(eta_grid, jnp.float32)
  over_rho = jax.vmap(fn, in_axes=(0, None))
  return jax.vmap(over_rho, in_axes=(None, 0))(rho_grid, eta_grid)


# -------------------------------------------------------------------------- AMRP


def expected_batch(theta, rho, eta) -> Array:
  """A two-sample batch ``r[1, 2, 2]`` with the policy's expected channel statistics.

  Channel means under the current mixture are ``m_1 = p rho`` and
  ``m_2 = p eta + (1 - p)``; both channels are binary, so the population variances are
  ``m_k (1 - m_k)``.  The samples ``m_k -/+ sqrt(m_k (1 - m_k))`` have exactly this mean
  and population (ddof 0) variance, which is all AMRP's update reads from a batch
  (docs/methods.md §2, step 2).
  """
  p = jax.nn.sigmoid(jnp.asarray(theta, jnp.float32))
  m_K = jnp.stack([p * rho, p * eta + (1 - p)])
  s_K = jnp.sqrt(jnp.clip(m_K * (1 - m_K), 0.0, None))
  return jnp.stack([m_K - s_K, m_K + s_K])[None]


def amrp_trajectory(theta0, *, rho, eta, lr: float, num_steps: int,
                    group_size: int | None = 8, normalize_std: bool = True,
                    **amrp_hparams) -> tuple[Array, Array]:
  """Log-odds trajectory under AMRP (seed 001, Algorithm 1; docs/methods.md §2, §9).

  At step t the scalar reward is ``R = sum_k w_k r_k`` with the weights in the state
  (the previous step's), the drift is the exact GRPO drift of that weighted sum, and
  the AMRP state is then updated with ``expected_batch(theta_t)``, i.e. the EMA sees the
  expected per-channel mean and population variance of the current policy (the
  ``B -> inf`` batch).  The weight update itself is ``mr_rl.aggregators.amrp.update``.

  Args:
    theta0: initial log-odds (scalar).
    rho: primary success rate of P.
    eta: auxiliary success rate of P.
    lr: step size.
    num_steps: number of Euler steps.
    group_size: G (None for G -> inf).
    normalize_std: GRPO (True) or Dr.GRPO (False) advantages.
    **amrp_hparams: forwarded to ``aggregators.amrp.init`` (rho is named ``ema_rho``
      here to avoid the clash with the success rate).

  Returns:
    ``(theta_traj, weights_traj)``: log-odds at steps 0 ... num_steps, shape
    ``(num_steps + 1,)``, and the weights used at steps 0 ... num_steps - 1, shape
    ``(num_steps, K)``.
  """
  _check_steps(lr, num_steps)
  if "rho" in amrp_hparams:
    raise TypeError("pass AMRP's EMA decay as ema_rho= (rho is the primary success rate)")
  if "ema_rho" in amrp_hparams:
    amrp_hparams["rho"] = amrp_hparams.pop("ema_rho")
  state0 = aggregators.amrp.init(2, **amrp_hparams)

  def step(carry, _):
    theta, state = carry
    weights = state.weights
    d = drift_lib.expected_drift(
        theta, rho=rho, eta=eta, aggregator=lambda r: aggregators.weighted_sum(r, weights),
        group_size=group_size, normalize_std=normalize_std)
    _, state, _ = aggregators.amrp.update(state, expected_batch(theta, rho, eta))
    return (theta + lr * d, state), (theta, weights)

  theta0 = jnp.asarray(theta0, jnp.float32)
  (last, _), (hist, weights) = jax.lax.scan(step, (theta0, state0), None, length=num_steps)
  return jnp.concatenate([hist, last[None]]), weights


# -------------------------------------------------------------- named methods


def aggregator_for(name: str, *, lam: float = 1.0):
  """The library aggregator of a stateless scalar-reward method."""
  if name == "additive":
    return aggregators.additive
  if name == "weighted_0.9_0.1":
    return functools.partial(aggregators.weighted_sum, w=jnp.array([0.9, 0.1]))
  if name == "min":
    return aggregators.min_and
  if name == "tag":
    return functools.partial(aggregators.tag, anchor=0, lam=lam)
  raise ValueError(f"no scalar aggregator for method {name!r}; expected one of "
                   f"{('additive', 'weighted_0.9_0.1', 'min', 'tag')}")


def method_drift(name: str, *, group_size: int | None = 8, lam: float = 1.0) -> Callable:
  """``(theta, rho, eta) -> drift`` for a stateless method in ``STATELESS_METHODS``."""
  if name == "gdpo":
    return lambda theta, rho, eta: drift_lib.expected_drift_gdpo(
        theta, rho=rho, eta=eta, group_size=group_size)
  agg = aggregator_for(name, lam=lam)
  return lambda theta, rho, eta: drift_lib.expected_drift(
      theta, rho=rho, eta=eta, aggregator=agg, group_size=group_size)


def method_trajectory(name: str, theta0, *, rho, eta, lr: float, num_steps: int,
                      group_size: int | None = 8, lam: float = 1.0) -> Array:
  """Log-odds trajectory ``(num_steps + 1,)`` of any method in ``METHOD_NAMES``."""
  if name == "amrp":
    return amrp_trajectory(theta0, rho=rho, eta=eta, lr=lr, num_steps=num_steps,
                           group_size=group_size)[0]
  if name not in STATELESS_METHODS:
    raise ValueError(f"unknown method {name!r}; expected one of {METHOD_NAMES}")
  fn = method_drift(name, group_size=group_size, lam=lam)
  return integrate(lambda th: fn(th, rho, eta), theta0, lr=lr, num_steps=num_steps)
