"""Unbiased pass@k (Chen et al. 2021; docs/methods.md §8).

``pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k / i)``, and 1.0 when
``n - c < k``; ``n`` samples per problem of which ``c`` are correct.

NumPy (or Python) inputs are computed in float64 on the host and validated; jnp inputs
are computed with jnp (jit-compatible, in the default float dtype) and validated only
when they are concrete.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _validate(n, c, k) -> None:
  n, c, k = (np.asarray(v) for v in (n, c, k))
  for name, v in (('n', n), ('c', c), ('k', k)):
    if not np.issubdtype(v.dtype, np.integer) and not np.all(np.mod(v, 1) == 0):
      raise ValueError(f'{name} must hold integers, got {v!r}.')
  if np.any(k < 1):
    raise ValueError(f'k must be >= 1, got {k!r}.')
  if np.any(c < 0) or np.any(c > n):
    raise ValueError(f'c must satisfy 0 <= c <= n, got c={c!r}, n={n!r}.')
  if np.any(k > n):
    raise ValueError(f'k must be <= n, got k={k!r}, n={n!r}.')


def _is_traced(*xs) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in xs)


def _pass_at_k_numpy(n, c, k) -> np.ndarray:
  n, c, k = np.broadcast_arrays(*(np.asarray(v, np.int64) for v in (n, c, k)))
  max_c = int(c.max()) if c.size else 0
  j = np.arange(max_c)  # factor index: i = n - j for j < c
  i = n[..., None] - j
  use = j < c[..., None]
  factor = np.where(use, 1.0 - k[..., None] / np.where(use, i, 1), 1.0)
  out = 1.0 - np.prod(factor, axis=-1)
  return np.where(n - c < k, 1.0, out)


def _pass_at_k_jnp(n, c, k) -> jnp.ndarray:
  n, c, k = jnp.broadcast_arrays(*(jnp.asarray(v) for v in (n, c, k)))
  dtype = jnp.result_type(float)
  nf, kf = n.astype(dtype), k.astype(dtype)
  max_c = jnp.max(c) if c.size else 0

  def body(j, prod):
    use = j < c
    i = nf - j
    return prod * jnp.where(use, 1.0 - kf / jnp.where(use, i, 1.0), 1.0)

  prod = jax.lax.fori_loop(0, max_c, body, jnp.ones(n.shape, dtype))
  return jnp.where(n - c < k, 1.0, 1.0 - prod)


def pass_at_k(n, c, k):
  """Unbiased pass@k per problem, elementwise over broadcast ``n``, ``c``, ``k``.

  Args:
    n: samples per problem (int or integer array).
    c: correct samples per problem, ``0 <= c <= n``.
    k: the k of pass@k, ``1 <= k <= n``.

  Returns:
    float64 numpy array for host inputs, jnp array if any input is a jax array.

  Raises:
    ValueError: on non-integer or out-of-range inputs (checked when concrete).
  """
  if not _is_traced(n, c, k):
    _validate(n, c, k)
  if any(isinstance(v, jax.Array) for v in (n, c, k)):
    return _pass_at_k_jnp(n, c, k)
  return _pass_at_k_numpy(n, c, k)


def mean_pass_at_k(n, c, k):
  """pass@k averaged over problems (docs/methods.md §8)."""
  out = pass_at_k(n, c, k)
  return out.mean() if isinstance(out, jax.Array) else float(np.mean(out))


def pass_at_k_from_correct(correct_BG, k):
  """Mean pass@k from a ``[B, G]`` boolean table (B problems, G samples) of per-sample correctness.

  Every problem has the same number G of samples; NaN-free booleans or 0/1.
  """
  correct_BG = np.asarray(correct_BG)
  if correct_BG.ndim != 2:
    raise ValueError(f'correct_BG must be 2-D [problems, samples], got shape {correct_BG.shape}.')
  n = np.full(correct_BG.shape[0], correct_BG.shape[1])
  c = correct_BG.astype(bool).sum(1)
  return mean_pass_at_k(n, c, k)
