"""KL estimators (Schulman 2020; docs/methods.md §5).

Shape letters (docs/shapes.md): ``N`` rows (sequences: a rollout batch of ``B`` prompts x
``G`` responses, flattened, or a micro-batch of them), ``T`` token positions, ``V``
vocabulary.

Sample-based estimators of ``KL(pi || pi_ref)`` evaluated per token on tokens sampled
from ``pi``, with ``x = logp_ref - logp``:

* ``k1 = -x``                 unbiased, high variance, can be negative;
* ``k2 = x^2 / 2``            biased, low variance, non-negative;
* ``k3 = exp(x) - 1 - x``     unbiased, low variance, non-negative (x clamped to [-20, 20]).

Each registers itself in ``KL_ESTIMATORS`` (``mr_rl.registry.Registry``) under its function
name; ``get_kl_estimator(name)`` looks one up. ``exact_kl`` gives the full-vocabulary
per-token KL from both models' logits.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from mr_rl.registry import Registry

Array = jnp.ndarray
K3_CLAMP = 20.0
KL_ESTIMATORS: Registry[Callable[[Array, Array], Array]] = Registry('KL estimator')


def _x(logp_NT, logp_ref_NT) -> Array:
  logp_NT = jnp.asarray(logp_NT)
  logp_ref_NT = jnp.asarray(logp_ref_NT)
  if logp_NT.shape != logp_ref_NT.shape:
    raise ValueError(f'logp_NT {logp_NT.shape} and logp_ref_NT {logp_ref_NT.shape} must match.')
  return logp_ref_NT - logp_NT


@KL_ESTIMATORS.register
def k1(logp_NT, logp_ref_NT) -> Array:
  """``k1 = logp - logp_ref`` per token."""
  return -_x(logp_NT, logp_ref_NT)


@KL_ESTIMATORS.register
def k2(logp_NT, logp_ref_NT) -> Array:
  """``k2 = (logp_ref - logp)^2 / 2`` per token."""
  x = _x(logp_NT, logp_ref_NT)
  return 0.5 * x * x


@KL_ESTIMATORS.register
def k3(logp_NT, logp_ref_NT) -> Array:
  """``k3 = exp(x) - 1 - x`` with ``x = clip(logp_ref - logp, -20, 20)`` per token."""
  x = jnp.clip(_x(logp_NT, logp_ref_NT), -K3_CLAMP, K3_CLAMP)
  return jnp.expm1(x) - x


def exact_kl(logits_NTV, ref_logits_NTV) -> Array:
  """Per-token ``KL(pi || pi_ref) = sum_v pi(v) (log pi(v) - log pi_ref(v))``.

  Computed in float32 from ``log_softmax`` of both logits (docs/methods.md §5).

  Returns:
    kl_NT, float32, non-negative up to rounding.
  """
  logits_NTV = jnp.asarray(logits_NTV)
  ref_logits_NTV = jnp.asarray(ref_logits_NTV)
  if logits_NTV.shape != ref_logits_NTV.shape:
    raise ValueError(f'logits_NTV {logits_NTV.shape} and ref_logits_NTV '
                     f'{ref_logits_NTV.shape} must match.')
  logp = jax.nn.log_softmax(logits_NTV.astype(jnp.float32), axis=-1)
  logq = jax.nn.log_softmax(ref_logits_NTV.astype(jnp.float32), axis=-1)
  return jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)


def get_kl_estimator(name: str) -> Callable[[Array, Array], Array]:
  """Returns ``k1``, ``k2`` or ``k3`` by name.

  Raises:
    UnknownNameError (a ValueError): unknown ``name``; the message lists the valid ones.
  """
  return KL_ESTIMATORS.get(name)


@jax.jit
def reference_kl(ref_logp_NT, logp_NT, response_mask_NT) -> dict:
  """k1 and k3 of KL(pi || pi_0) per response token on tokens sampled from pi (pi: the
  sampler's log-probs `logp_NT`, pi_0: `ref_logp_NT`); the trainer's `kl_ref/*` metrics."""
  resp = response_mask_NT.astype(jnp.float32)
  x = jnp.clip(ref_logp_NT - logp_NT, -K3_CLAMP, K3_CLAMP)  # log pi_ref - log pi
  denom = jnp.maximum(resp.sum(), 1.0)
  return {"kl_ref/k1": (-x * resp).sum() / denom,
          "kl_ref/k3": ((jnp.exp(x) - 1 - x) * resp).sum() / denom}
