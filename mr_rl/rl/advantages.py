"""Group-relative advantage estimators (docs/methods.md §3).

Every estimator maps rewards of one rollout batch to advantages ``A_BG``:
``B`` prompts, ``G`` sampled responses per prompt, ``K`` reward channels.
Scalar estimators (GRPO, Dr.GRPO, RLOO) read the aggregated reward ``R_BG``;
multi-channel estimators (GDPO, MO-GRPO) read the reward profile ``r_BGK``.

NaN convention (docs/methods.md §0): ``NaN`` means "not applicable". It is
skipped by every statistic; a NaN sample (or, for multi-channel estimators, a
sample whose channels are all NaN) gets advantage 0. A group whose valid values
are all equal, or that holds fewer than two valid values, has zero standard
deviation and gets an all-zero advantage exactly (never NaN or inf). Standard
deviations use the Bessel correction (ddof = 1) throughout, both within groups
and, for GDPO, over the batch (project choice for GDPO; the torch ``std``
default that GRPO implementations use).

All functions are pure jnp and jit-compatible.

Every estimator registers itself in ``ESTIMATORS`` (``mr_rl.registry.Registry``) under its
own function name, with ``@ESTIMATORS.register`` where it is defined; its first parameter
says what it reads: ``R_BG`` (scalar estimators) or ``r_BGK`` (multi-channel ones, which
also take ``weights_K``); its other parameters are its hyperparameters. ``get_advantage``
wraps any of them into one signature.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional

import jax.numpy as jnp

from mr_rl.registry import Registry

Array = jnp.ndarray
ESTIMATORS: Registry[Callable[..., Array]] = Registry('advantage estimator')


def _as_float(x, name: str, ndim: int) -> Array:
  x = jnp.asarray(x)
  if x.ndim != ndim:
    raise ValueError(f'{name} must have {ndim} dimensions, got shape {x.shape}.')
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.float32)
  return x


def _check_eps(eps: float) -> None:
  if not isinstance(eps, (int, float)) or eps < 0:
    raise ValueError(f'eps must be a non-negative number, got {eps!r}.')


def _stats_last(x: Array):
  """NaN-aware statistics along the last axis.

  Returns:
    (valid, n, mean, std, const): ``valid`` marks non-NaN entries; ``n``, ``mean``
    and the Bessel ``std`` keep the reduced axis (size 1); ``const`` is True where
    the valid values are all equal or fewer than two are valid (zero std).
  """
  valid = ~jnp.isnan(x)
  n = valid.sum(-1, keepdims=True)
  x0 = jnp.where(valid, x, 0.0)
  mean = x0.sum(-1, keepdims=True) / jnp.maximum(n, 1)
  dev = jnp.where(valid, x - mean, 0.0)
  var = (dev * dev).sum(-1, keepdims=True) / jnp.maximum(n - 1, 1)
  hi = jnp.where(valid, x, -jnp.inf).max(-1, keepdims=True)
  lo = jnp.where(valid, x, jnp.inf).min(-1, keepdims=True)
  const = (n < 2) | (hi == lo)
  # Guarded sqrt: d sqrt(var)/d var is infinite at var = 0, and the outer jnp.where would turn
  # 0 * inf into NaN gradients (w.r.t. rewards or aggregator hyperparameters) for constant groups.
  std = jnp.where(const, 0.0, jnp.sqrt(jnp.where(const, 1.0, var)))
  return valid, n, mean, std, const


@ESTIMATORS.register
def grpo(R_BG, eps: float = 1e-6) -> Array:
  """GRPO advantage ``(R - mean_g R) / (std_g R + eps)`` (docs/methods.md §3).

  Args:
    R_BG: scalar rewards, NaN where not applicable.
    eps: added to the Bessel-corrected group std.

  Returns:
    A_BG, float.
  """
  _check_eps(eps)
  R_BG = _as_float(R_BG, 'R_BG', 2)
  valid, _, mean, std, const = _stats_last(R_BG)
  return jnp.where(valid & ~const, (R_BG - mean) / (std + eps), 0.0)


@ESTIMATORS.register
def dr_grpo(R_BG) -> Array:
  """Dr.GRPO advantage ``R - mean_g R`` (Liu et al. 2025; docs/methods.md §3).

  Pair it with the ``seq-mean-token-sum-norm`` loss aggregation (losses.py).
  """
  R_BG = _as_float(R_BG, 'R_BG', 2)
  valid, _, mean, _, const = _stats_last(R_BG)
  return jnp.where(valid & ~const, R_BG - mean, 0.0)


@ESTIMATORS.register
def rloo(R_BG) -> Array:
  """RLOO advantage: ``R_i`` minus the mean of the other valid samples of its group.

  With ``n`` valid samples this equals ``n / (n - 1) * (R_i - mean_g R)``
  (docs/methods.md §3).
  """
  R_BG = _as_float(R_BG, 'R_BG', 2)
  valid, n, mean, _, const = _stats_last(R_BG)
  scale = n / jnp.maximum(n - 1, 1)
  return jnp.where(valid & ~const, scale * (R_BG - mean), 0.0)


def _weights(weights_K, K: int) -> Array:
  if weights_K is None:
    return jnp.ones((K,), jnp.float32)
  w = jnp.asarray(weights_K, jnp.float32)
  if w.shape != (K,):
    raise ValueError(f'weights_K must have shape ({K},) to match r_BGK, got {w.shape}.')
  return w


def _channel_sum(r_BGK, weights_K, eps: float):
  """Per-channel group normalisation and weighted sum.

  Returns:
    (S_BG, row_valid_BG, all_const_B1): the weighted sum of the per-channel GRPO
    advantages (NaN channels contribute 0), whether a sample has any valid channel,
    and whether every channel of the group has zero std.
  """
  _check_eps(eps)
  r_BGK = _as_float(r_BGK, 'r_BGK', 3)
  w_K = _weights(weights_K, r_BGK.shape[-1])
  r_BKG = jnp.swapaxes(r_BGK, 1, 2)
  valid, _, mean, std, const = _stats_last(r_BKG)
  A_BKG = jnp.where(valid & ~const, (r_BKG - mean) / (std + eps), 0.0)
  S_BG = jnp.einsum('bkg,k->bg', A_BKG, w_K)
  row_valid = valid.any(1)
  all_const = const.all(1)  # [B, 1]
  return S_BG, row_valid, all_const


@ESTIMATORS.register
def mo_grpo(r_BGK, weights_K=None, eps: float = 1e-6) -> Array:
  """MO-GRPO (Ichihara et al.): ``sum_k w_k (r_k - mean_g r_k)/(std_g r_k + eps)``.

  Per-channel group normalisation and a weighted sum, no batch normalisation
  (docs/methods.md §3). ``weights_K`` defaults to all ones.
  """
  S_BG, row_valid, all_const = _channel_sum(r_BGK, weights_K, eps)
  return jnp.where(row_valid & ~all_const, S_BG, 0.0)


@ESTIMATORS.register
def gdpo(r_BGK, weights_K=None, eps: float = 1e-4) -> Array:
  """GDPO (Liu et al. 2026): per-channel group normalisation, weighted sum, batch norm.

  ``A_k = (r_k - mean_g r_k)/(std_g r_k + eps)``, ``S = sum_k w_k A_k``,
  ``A = (S - mean_batch S)/(std_batch S + eps)`` (docs/methods.md §3), with the
  batch statistics over samples that have at least one valid channel. With AMRP the
  weights are AMRP's ``w^(t-1)`` (docs/methods.md §2). A group in which every
  channel has zero std keeps an all-zero advantage (mathematically ``mean_batch S``
  is 0 because each ``A_k`` is group-centred; the zero is enforced exactly).
  """
  S_BG, row_valid, all_const = _channel_sum(r_BGK, weights_K, eps)
  S_flat = jnp.where(row_valid, S_BG, jnp.nan).reshape(1, -1)
  _, _, mean, std, _ = _stats_last(S_flat)
  A_BG = (S_BG - mean[0, 0]) / (std[0, 0] + eps)
  return jnp.where(row_valid & ~all_const, A_BG, 0.0)


def frac_zero_std(R_BG) -> Array:
  """Share of groups whose scalar advantage is all zero (zero std, docs/methods.md §3)."""
  R_BG = _as_float(R_BG, 'R_BG', 2)
  const = _stats_last(R_BG)[-1]
  return const.astype(jnp.float32).mean()


def frac_zero_std_channels(r_BGK) -> Array:
  """Per-channel share of groups whose channel advantage is all zero; shape ``[K]``."""
  r_BGK = _as_float(r_BGK, 'r_BGK', 3)
  const = _stats_last(jnp.swapaxes(r_BGK, 1, 2))[-1]  # [B, K, 1]
  return const[..., 0].astype(jnp.float32).mean(0)


# --------------------------------------------------------------------------- registry
# Every registered estimator is called as ``fn(R_BG, r_BGK, weights_K) -> A_BG``;
# scalar estimators ignore ``r_BGK``/``weights_K``, channel estimators ignore ``R_BG``.
AdvantageFn = Callable[[Optional[Array], Optional[Array], Optional[Array]], Array]

ADVANTAGE_NAMES = ESTIMATORS.names()
_INPUTS = ('R_BG', 'r_BGK', 'weights_K')


def uses_channels(name: str) -> bool:
  """Whether the estimator ``name`` reads the reward profile ``r_BGK`` (its first parameter).

  Raises:
    UnknownNameError (a ValueError): unknown ``name``; the message lists the valid ones.
    ValueError: the registered function takes neither ``R_BG`` nor ``r_BGK`` first.
  """
  first = next(iter(inspect.signature(ESTIMATORS.get(name)).parameters), None)
  if first not in ('R_BG', 'r_BGK'):
    raise ValueError(f'Advantage estimator {name!r} must take R_BG or r_BGK as its first '
                     f'parameter, got {first!r}.')
  return first == 'r_BGK'


def get_advantage(name: str, **hparams) -> AdvantageFn:
  """Returns the estimator ``name`` with a uniform signature.

  Args:
    name: one of ``ADVANTAGE_NAMES``.
    **hparams: estimator hyperparameters (``eps`` for grpo, gdpo, mo_grpo).

  Returns:
    ``fn(R_BG, r_BGK, weights_K=None) -> A_BG``.

  Raises:
    UnknownNameError (a ValueError): unknown name (the message lists the valid ones).
    ValueError: a hyperparameter the estimator does not take.
  """
  base = ESTIMATORS.get(name)
  accepted = set(inspect.signature(base).parameters) - set(_INPUTS)
  bad = set(hparams) - accepted
  if bad:
    raise ValueError(f'Advantage estimator {name!r} takes hyperparameters {sorted(accepted)}, '
                     f'got unexpected {sorted(bad)}.')
  if not uses_channels(name):

    def fn(R_BG, r_BGK=None, weights_K=None):
      del r_BGK, weights_K
      if R_BG is None:
        raise ValueError(f'Advantage estimator {name!r} needs R_BG (the aggregated reward).')
      return base(R_BG, **hparams)
  else:

    def fn(R_BG, r_BGK=None, weights_K=None):
      del R_BG
      if r_BGK is None:
        raise ValueError(f'Advantage estimator {name!r} needs r_BGK (the reward profile).')
      return base(r_BGK, weights_K, **hparams)

  fn.__name__ = name
  fn.__doc__ = base.__doc__
  return fn
