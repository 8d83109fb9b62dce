"""KL estimators (Schulman 2020; METHODS.md section 5).

Sample-based estimators of ``KL(pi || pi_ref)`` evaluated per token on tokens sampled
from ``pi``, with ``x = logp_ref - logp``:

* ``k1 = -x``                 unbiased, high variance, can be negative;
* ``k2 = x^2 / 2``            biased, low variance, non-negative;
* ``k3 = exp(x) - 1 - x``     unbiased, low variance, non-negative (x clamped to [-20, 20]).

``exact_kl`` gives the full-vocabulary per-token KL from both models' logits.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jnp.ndarray
K3_CLAMP = 20.0


def _x(logp_BT, logp_ref_BT) -> Array:
  logp_BT = jnp.asarray(logp_BT)
  logp_ref_BT = jnp.asarray(logp_ref_BT)
  if logp_BT.shape != logp_ref_BT.shape:
    raise ValueError(f'logp_BT {logp_BT.shape} and logp_ref_BT {logp_ref_BT.shape} must match.')
  return logp_ref_BT - logp_BT


def k1(logp_BT, logp_ref_BT) -> Array:
  """``k1 = logp - logp_ref`` per token."""
  return -_x(logp_BT, logp_ref_BT)


def k2(logp_BT, logp_ref_BT) -> Array:
  """``k2 = (logp_ref - logp)^2 / 2`` per token."""
  x = _x(logp_BT, logp_ref_BT)
  return 0.5 * x * x


def k3(logp_BT, logp_ref_BT) -> Array:
  """``k3 = exp(x) - 1 - x`` with ``x = clip(logp_ref - logp, -20, 20)`` per token."""
  x = jnp.clip(_x(logp_BT, logp_ref_BT), -K3_CLAMP, K3_CLAMP)
  return jnp.expm1(x) - x


def exact_kl(logits_BTV, ref_logits_BTV) -> Array:
  """Per-token ``KL(pi || pi_ref) = sum_v pi(v) (log pi(v) - log pi_ref(v))``.

  Computed in float32 from ``log_softmax`` of both logits (METHODS.md section 5).

  Returns:
    kl_BT, float32, non-negative up to rounding.
  """
  logits_BTV = jnp.asarray(logits_BTV)
  ref_logits_BTV = jnp.asarray(ref_logits_BTV)
  if logits_BTV.shape != ref_logits_BTV.shape:
    raise ValueError(f'logits_BTV {logits_BTV.shape} and ref_logits_BTV '
                     f'{ref_logits_BTV.shape} must match.')
  logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  logq = jax.nn.log_softmax(ref_logits_BTV.astype(jnp.float32), axis=-1)
  return jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)


KL_ESTIMATORS = {'k1': k1, 'k2': k2, 'k3': k3}


def get_kl_estimator(name: str) -> Callable[[Array, Array], Array]:
  """Returns ``k1``, ``k2`` or ``k3`` by name (ValueError otherwise)."""
  if name not in KL_ESTIMATORS:
    raise ValueError(f'Unknown KL estimator {name!r}; valid names: {sorted(KL_ESTIMATORS)}.')
  return KL_ESTIMATORS[name]
