"""Static (stateless) aggregators `r[..., K] -> R[...]` (docs/methods.md §1).

Shape letters (docs/shapes.md): `K` reward channels, the last axis; any leading axes (e.g.
`B` prompts x `G` responses) are kept.

All functions are pure jnp, jittable and vmappable; each validates its concrete
arguments, then calls a jitted core (so eager calls compile once per shape and the
core inlines under an outer jit). Hyperparameters may be traced (so `jax.vmap`
sweeps them and `jax.grad` reaches `lam` and `tau`). Checks on
hyperparameters (`w` length, `anchor` range, `lam >= 0`, `0 <= p < 1`, ...) run on
concrete values and raise ValueError naming the argument.

NaN handling (docs/methods.md §0: NaN = channel not applicable): every rule skips
NaN channels as described in its docstring, and a row whose channels are all NaN
yields a NaN scalar, which the advantage code turns into advantage 0.

Each rule registers itself in the aggregator registry right after its definition
(`@stateless(rule, ...)` on a small adapter, see `registry`); the registry reads the
hyperparameters and their defaults from the rule's own signature.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.aggregators import _common as C
from mr_rl.aggregators.registry import stateless

Array = jax.Array


def additive(r: Any) -> Array:
  """Additive aggregation `mean_k r_k` (docs/methods.md §1; the papers' (RP+RA)/2).

  NaN: the mean is over the applicable channels only (NaN channels are skipped, the
  remaining ones keep equal weight); an all-NaN row gives NaN.

  Args:
    r: rewards `[..., K]`.

  Returns:
    `R[...]`.
  """
  return _additive(C.check_rewards(r))


@jax.jit
def _additive(r: Array) -> Array:
  valid = C.valid_mask(r)
  n = jnp.sum(valid, axis=-1)
  out = jnp.sum(C.nan_to_zero(r), axis=-1) / jnp.maximum(n, 1)
  return jnp.where(n == 0, jnp.nan, out)


@stateless(additive, linear=True)
def _additive_rule(h, r, key):
  del h, key
  return additive(r), {"weights": jnp.ones((r.shape[-1],), r.dtype) / r.shape[-1]}


def weighted_sum(r: Any, w: Any) -> Array:
  """Weighted sum `sum_k w_k r_k` (docs/methods.md §1, e.g. `0.9 RP + 0.1 RA`).

  NaN: a NaN channel contributes nothing (its term is dropped; the other weights are
  NOT renormalised); an all-NaN row gives NaN.

  Args:
    r: rewards `[..., K]`.
    w: weights `[K]` (a scalar is broadcast to every channel).

  Returns:
    `R[...]`.

  Raises:
    ValueError: `w` is neither a scalar nor of shape `[K]`, or (concrete) has a negative or
      non-finite entry or is all zero.
  """
  r = C.check_rewards(r)
  w = _check_weights(w, r.shape[-1])
  return _weighted(r, w)


def _check_weights(w: Any, num_channels: int) -> Array:
  """`w` as a `[K]` vector; concrete weights must be finite, >= 0 and not all zero (a negative
  weight pays for lowering a channel, all-zero weights train on nothing)."""
  w = C.check_vector(w, num_channels, "w")
  v = C.concrete(w)
  if v is not None and (not np.all(np.isfinite(v)) or np.any(v < 0) or not np.any(v > 0)):
    raise ValueError(f"`w` must be finite, non-negative and not all zero; got {v.tolist()}.")
  return w


_weighted = jax.jit(C.weighted_nansum)


@stateless(weighted_sum, aliases=("weighted",), linear=True,
           arrays=lambda k, w: {"w": _check_weights(w, k)})
def _weighted_sum_rule(h, r, key):
  del key
  return weighted_sum(r, h["w"]), {"weights": h["w"]}


def min_and(r: Any) -> Array:
  """AND rule `min_k r_k` (docs/methods.md §1).

  NaN: the minimum over the applicable channels; an all-NaN row gives NaN.
  """
  r = C.check_rewards(r)
  return _min_and(r)


@jax.jit
def _min_and(r: Array) -> Array:
  return jnp.nanmin(r, axis=-1)  # nanmin of an all-NaN row is NaN.


@stateless(min_and, aliases=("min",), linear=False)
def _min_and_rule(h, r, key):
  del h, key
  return min_and(r), {}


def rp_only(r: Any, primary: Any = 0) -> Array:
  """The primary channel alone (docs/methods.md §1, "RP-only").

  NaN: the result is NaN exactly where the primary channel is NaN (other channels
  are ignored), so a sample without a primary reward gets advantage 0.

  Args:
    r: rewards `[..., K]`.
    primary: index of the primary channel in `[0, K)`.

  Raises:
    ValueError: `primary` is not an integer in `[0, K)`.
  """
  r = C.check_rewards(r)
  primary = C.check_index(primary, r.shape[-1], "primary")
  return _take(r, primary)


@jax.jit
def _take(r: Array, index: Array) -> Array:
  return jnp.take(r, index, axis=-1)


@stateless(rp_only, linear=True,
           arrays=lambda k, primary: {"primary": C.check_index(primary, k, "primary")})
def _rp_only_rule(h, r, key):
  del key
  onehot = (jnp.arange(r.shape[-1]) == h["primary"]).astype(r.dtype)
  return rp_only(r, h["primary"]), {"weights": onehot}


def lsc_soft_and(r: Any, tau: Any = 0.1) -> Array:
  """LSC soft-AND **(project definition, docs/methods.md §1)**.

  `R = -tau * log(mean_k exp(-r_k / tau))`; `tau -> 0` gives `min_k r_k`, `tau -> inf`
  gives `mean_k r_k`. Evaluated in the shifted form
  `m - tau * log1p(mean_k expm1(-(r_k - m) / tau))` with `m = min_k r_k`, which is exact
  algebraically and keeps full precision at both limits (no overflow as tau -> 0, no
  cancellation as tau -> inf).

  NaN: the mean runs over the applicable channels; an all-NaN row gives NaN.

  Args:
    r: rewards `[..., K]`.
    tau: temperature, > 0 (scalar; may be traced, differentiable).

  Raises:
    ValueError: `tau <= 0`.
  """
  r = C.check_rewards(r)
  _check_tau(tau)
  return _lsc(r, C.as_float(tau))


def _check_tau(tau: Any) -> None:
  C.check_range(tau, "tau", lo=0.0, lo_open=True)


@jax.jit
def _lsc(r: Array, tau: Array) -> Array:
  valid = C.valid_mask(r)
  n = jnp.sum(valid, axis=-1)
  m = jnp.min(jnp.where(valid, r, jnp.inf), axis=-1, keepdims=True)
  m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
  z = jnp.where(valid, -(r - m_safe) / tau, 0.0)  # <= 0 on valid entries.
  mean_em1 = jnp.sum(jnp.where(valid, jnp.expm1(z), 0.0), axis=-1) / jnp.maximum(n, 1)
  out = m_safe[..., 0] - tau * jnp.log1p(mean_em1)
  return jnp.where(n == 0, jnp.nan, out)


@stateless(lsc_soft_and, aliases=("lsc",), linear=False, check=_check_tau)
def _lsc_soft_and_rule(h, r, key):
  del key
  return lsc_soft_and(r, h["tau"]), {}


def _check_lam(lam: Any) -> None:
  C.check_range(lam, "lam", lo=0.0)


def _tag_gates(lam: Any, anchor: Array, num_channels: int) -> Array:
  """`[K]` gates with the anchor's entry set to 0."""
  _check_lam(lam)
  lam = C.check_vector(lam, num_channels, "lam")
  return jnp.where(jnp.arange(num_channels) == anchor, 0.0, lam)


def tag(r: Any, anchor: Any = 0, lam: Any = 1.0) -> Array:
  """Trust-Anchored Gating (TAG paper; docs/methods.md §1).

  `f = r_a * (1 + sum_{k != a} lam_k r_k) / (1 + sum_{k != a} lam_k)`.
  For binary rewards: auxiliary-only success and total failure score 0, joint success
  scores 1, primary-only success scores `1 / (1 + sum_{k != a} lam_k)`.

  NaN: a NaN anchor gives NaN (no trusted signal, so advantage 0); a NaN auxiliary
  channel is dropped from both sums (numerator and normaliser), so the gate is
  renormalised over the applicable auxiliaries.

  Args:
    r: rewards `[..., K]`.
    anchor: index `a` of the anchor channel in `[0, K)` (default 0).
    lam: gate strengths `lam_k >= 0`, a scalar (same for every auxiliary) or `[K]`
      (the anchor's entry is ignored); default 1. May be traced; differentiable.

  Raises:
    ValueError: `anchor` out of range, `lam` negative or of the wrong length.
  """
  r = C.check_rewards(r)
  k = r.shape[-1]
  anchor = C.check_index(anchor, k, "anchor")
  return _tag(r, anchor, _tag_gates(lam, anchor, k))


@jax.jit
def _tag(r: Array, anchor: Array, gates: Array) -> Array:
  valid = C.valid_mask(r)
  g = jnp.where(valid, gates, 0.0)  # [..., K]
  num = 1.0 + jnp.sum(g * C.nan_to_zero(r), axis=-1)
  den = 1.0 + jnp.sum(g, axis=-1)
  return jnp.take(r, anchor, axis=-1) * num / den


def _tag_arrays(num_channels: int, anchor: Any, lam: Any) -> dict[str, Array]:
  anchor = C.check_index(anchor, num_channels, "anchor")
  return {"anchor": anchor, "lam": _tag_gates(lam, anchor, num_channels)}


@stateless(tag, linear=False, check=lambda anchor, lam: _check_lam(lam), arrays=_tag_arrays)
def _tag_rule(h, r, key):
  del key
  return tag(r, h["anchor"], h["lam"]), {}


def rubric_dropout_mask(key: Array, num_channels: int, p: Any) -> Array:
  """Keep-mask for Rubric Dropout **(project definition, docs/methods.md §1)**.

  Each channel is dropped independently with probability `p`; if every channel was
  dropped, one channel drawn uniformly is kept. Hence
  `P(keep k) = (1 - p) + p**K / K`.

  Args:
    key: PRNG key.
    num_channels: K.
    p: drop probability in `[0, 1)` (may be traced).

  Returns:
    Boolean mask `[K]`, at least one True.

  Raises:
    ValueError: `p` outside `[0, 1)`, or `key` is None.
  """
  if key is None:
    raise ValueError("`key` is required for rubric dropout (a PRNG key, e.g. jax.random.key(0)).")
  _check_p(p)
  return _dropout_mask(key, num_channels, C.as_float(p))


def _check_p(p: Any) -> None:
  C.check_range(p, "p", lo=0.0, hi=1.0, hi_open=True)


@functools.partial(jax.jit, static_argnums=1)
def _dropout_mask(key: Array, num_channels: int, p: Array) -> Array:
  k_drop, k_pick = jax.random.split(key)
  keep = jax.random.uniform(k_drop, (num_channels,)) >= p
  fallback = jax.nn.one_hot(jax.random.randint(k_pick, (), 0, num_channels), num_channels) > 0
  return jnp.where(jnp.any(keep), keep, fallback)


def rubric_dropout(r: Any, key: Array, p: Any = 0.5) -> Array:
  """Rubric Dropout **(project definition, docs/methods.md §1)**.

  Draws one keep-mask over channels for the whole call (one step), see
  `rubric_dropout_mask`, and returns the mean over the kept channels.

  NaN: the mean runs over the kept channels that apply; a row whose kept channels
  are all NaN gives NaN.

  Args:
    r: rewards `[..., K]`.
    key: PRNG key (fold in the step number outside).
    p: drop probability in `[0, 1)` (default 0.5).

  Raises:
    ValueError: `p` outside `[0, 1)`, or `key` is None.
  """
  r = C.check_rewards(r)
  mask = rubric_dropout_mask(key, r.shape[-1], p)
  return _additive(jnp.where(mask, r, jnp.nan))


@stateless(rubric_dropout, linear=True, needs_key=True, check=_check_p)
def _rubric_dropout_rule(h, r, key):
  mask = rubric_dropout_mask(key, r.shape[-1], h["p"])
  big_r = additive(jnp.where(mask, r, jnp.nan))
  return big_r, {"weights": mask / jnp.sum(mask).astype(r.dtype), "keep_mask": mask}
