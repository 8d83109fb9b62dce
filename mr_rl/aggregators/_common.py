"""Shared helpers for the aggregators: NaN-aware statistics and argument checks.

Shape letters (docs/shapes.md): `B` prompts, `G` responses per prompt, `K` reward channels.

NaN convention (docs/methods.md §0): a NaN reward means "this channel does not
apply to this sample" and is skipped by every statistic. Checks on hyperparameters
run only on concrete values, so every function stays jittable and vmappable when
its inputs are traced.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def float_dtype():
  """The default float dtype (float32, or float64 under `jax_enable_x64`)."""
  return jnp.result_type(float)


def as_float(x: Any) -> Array:
  """`x` as an array of the default float dtype."""
  return jnp.asarray(x, dtype=float_dtype())


def concrete(x: Any) -> np.ndarray | None:
  """The numpy value of `x`, or None when `x` is (or contains) a tracer."""
  if isinstance(x, jax.core.Tracer):
    return None
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def signature_defaults(fn: Callable[..., Any], skip: int = 1,
                       exclude: Sequence[str] = ()) -> tuple[dict[str, Any], tuple[str, ...]]:
  """The hyperparameters of `fn` read from its signature: the one place for their defaults.

  Args:
    fn: a rule function `fn(r, ..., **hp)` or an `init(num_channels, **hp)`.
    skip: leading parameters that are not hyperparameters (rewards, `num_channels`).
    exclude: further parameters to leave out (e.g. `key`).

  Returns:
    `({name: default}, required)`: the default is None for a parameter without one, and
    `required` names those.
  """
  params = [p for p in list(inspect.signature(fn).parameters.values())[skip:]
            if p.name not in exclude]
  defaults = {p.name: None if p.default is p.empty else p.default for p in params}
  return defaults, tuple(p.name for p in params if p.default is p.empty)


def check_num_channels_arg(num_channels: Any) -> int:
  """`num_channels` (K) as an int; raises ValueError unless it is a positive integer."""
  if not isinstance(num_channels, (int, np.integer)) or num_channels < 1:
    raise ValueError(f"`num_channels` must be a positive int; got {num_channels!r}.")
  return int(num_channels)


class ChannelState:
  """Base of the stateful rules' states: `num_channels` is K, the length of a `[K]` field.

  Attributes:
    CHANNEL_FIELD: the name of that field (a class constant, not a pytree leaf).
  """
  CHANNEL_FIELD: ClassVar[str] = "weights"

  @property
  def num_channels(self) -> int:
    return getattr(self, self.CHANNEL_FIELD).shape[-1]


def check_rewards(r: Any, name: str = "r", min_ndim: int = 1) -> Array:
  """Returns `r` as a float array with at least `min_ndim` dims and K >= 1."""
  r = jnp.asarray(r)
  if not jnp.issubdtype(r.dtype, jnp.floating):
    r = r.astype(float_dtype())
  if r.ndim < min_ndim:
    raise ValueError(f"`{name}` must have at least {min_ndim} dims [..., K]; got shape {r.shape}.")
  if r.shape[-1] < 1:
    raise ValueError(f"`{name}` must have at least one channel (last axis); got shape {r.shape}.")
  return r


def check_vector(x: Any, num_channels: int, name: str) -> Array:
  """Broadcasts a scalar or checks a `[K]` vector; raises ValueError naming `name`."""
  x = as_float(x)
  if x.ndim == 0:
    return jnp.broadcast_to(x, (num_channels,))
  if x.shape != (num_channels,):
    raise ValueError(
        f"`{name}` must be a scalar or have shape [K] = ({num_channels},); got shape {x.shape}.")
  return x


def check_index(x: Any, num_channels: int, name: str) -> Array:
  """A channel index in [0, K) as an int32 array; concrete values are range-checked."""
  v = concrete(x)
  if v is not None:
    if v.ndim != 0 or not float(v).is_integer():
      raise ValueError(f"`{name}` must be an integer channel index; got {v!r}.")
    if not 0 <= int(v) < num_channels:
      raise ValueError(f"`{name}` = {int(v)} is out of range for K = {num_channels} channels.")
  return jnp.asarray(x, dtype=jnp.int32)


def check_range(x: Any, name: str, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> None:
  """Raises ValueError naming `name` when a concrete `x` leaves [lo, hi] (or open ends)."""
  v = concrete(x)
  if v is None:
    return
  v = np.asarray(v, dtype=np.float64)
  if np.any(np.isnan(v)):
    raise ValueError(f"`{name}` must not be NaN; got {v!r}.")
  bad = np.zeros(v.shape, dtype=bool)
  if lo is not None:
    bad |= (v <= lo) if lo_open else (v < lo)
  if hi is not None:
    bad |= (v >= hi) if hi_open else (v > hi)
  if np.any(bad):
    lb = "(" if lo_open else "["
    rb = ")" if hi_open else "]"
    interval = f"{lb}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{rb}"
    raise ValueError(f"`{name}` must lie in {interval}; got {v.tolist()!r}.")


def check_num_channels(r: Array, num_channels: int, name: str = "r_BGK") -> None:
  """Raises ValueError when the last axis of `r` is not the state's K (static shapes)."""
  if r.shape[-1] != num_channels:
    raise ValueError(
        f"`{name}` has K = {r.shape[-1]} channels (last axis) but the aggregator state was "
        f"initialised with {num_channels}.")


def valid_mask(r: Array) -> Array:
  """True where a reward applies (is not NaN)."""
  return ~jnp.isnan(r)


def nan_to_zero(r: Array) -> Array:
  return jnp.where(jnp.isnan(r), 0.0, r)


def row_all_nan(r: Array) -> Array:
  """`[..., K] -> [...]`: True where every channel of the row is NaN."""
  return jnp.all(jnp.isnan(r), axis=-1)


def weighted_nansum(r: Array, w: Array) -> Array:
  """`sum_k w_k r_k` over the applicable channels; NaN where the row is all NaN."""
  out = jnp.sum(nan_to_zero(r) * w, axis=-1)
  return jnp.where(row_all_nan(r), jnp.nan, out)


def batch_moments(r_BGK: Array) -> tuple[Array, Array, Array]:
  """NaN-aware per-channel mean and population variance (ddof = 0) over all B*G samples.

  Returns:
    (mean_K, var_K, count_K); mean and var are 0 where a channel has no valid sample.
  """
  k = r_BGK.shape[-1]
  r = r_BGK.reshape(-1, k)
  valid = valid_mask(r)
  count = jnp.sum(valid, axis=0).astype(r.dtype)
  denom = jnp.maximum(count, 1.0)
  mean = jnp.sum(jnp.where(valid, r, 0.0), axis=0) / denom
  var = jnp.sum(jnp.where(valid, (r - mean) ** 2, 0.0), axis=0) / denom
  return mean, var, count
