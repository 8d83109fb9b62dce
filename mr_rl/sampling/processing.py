"""Next-token selection: temperature, top-k, top-p (nucleus) and greedy decoding.

Pure jnp functions used inside the jitted decode loop (see `sampler.py`). The order of
the filters follows transformers' `generate`: temperature first, then top-k, then top-p.

Two log-probabilities exist for a sampled token:
  * the *policy* log-probability `log_softmax(logits)[token]` (temperature 1, no
    filtering) -- this is what the sampler returns, because the RL update reuses it as
    `logp_old` and it must equal a fresh forward pass of the policy (docs/methods.md §4);
  * the log-probability under the filtered, tempered distribution actually sampled from
    (`filtered_log_probs`; public and tested against a numpy reference, but nothing in the
    trainer uses it).

Shape letters (docs/shapes.md): N rows (any leading dims; the sampler passes one row per
decoded sequence), V vocabulary. The candidates kept by the top-k sort (`top_k` of them, or all
V) and the inverse CDF's blocks are named in words, not letters.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static next-token selection settings (hashable; part of the compile key).

  Attributes:
    temperature: softmax temperature T; 0 means greedy (argmax) decoding.
    top_k: keep the k most likely tokens; 0 disables the filter.
    top_p: keep the smallest set of tokens whose probability mass reaches top_p
      (ties at the boundary are kept); 1.0 disables the filter.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool):
      raise TypeError(f"temperature must be a number, got {self.temperature!r}")
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
    if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
      raise TypeError(f"top_k must be an int, got {self.top_k!r}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0 (0 = disabled), got {self.top_k}")
    if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool):
      raise TypeError(f"top_p must be a number, got {self.top_p!r}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def filtered_logits(logits_NV: jax.Array, params: SamplingParams) -> jax.Array:
  """Tempered logits with top-k / top-p filtered tokens set to -inf.

  Args:
    logits_NV: raw model logits (any leading shape, vocabulary last).
    params: sampling settings; must not be greedy.

  Returns:
    float32 array of the same shape; `softmax` of it is the sampling distribution.
  """
  if params.greedy:
    raise ValueError("filtered_logits is undefined for temperature=0 (greedy)")
  x_NV = logits_NV.astype(jnp.float32) / params.temperature
  vocab = x_NV.shape[-1]
  top_k = params.top_k if 0 < params.top_k < vocab else 0
  if top_k == 0 and params.top_p >= 1.0:
    return x_NV
  if top_k:
    # Descending values of the k best tokens; threshold at the k-th (ties kept, as HF).
    top_vals = jax.lax.top_k(x_NV, top_k)[0]  # [..., top_k], descending
  else:
    top_vals = -jnp.sort(-x_NV, axis=-1)  # [..., V], descending
  if params.top_p < 1.0:
    # Nucleus over the (top-k) survivors: keep token i iff the mass strictly before it,
    # in descending order, is below top_p. The first token is always kept.
    top_probs = jax.nn.softmax(top_vals, axis=-1)
    mass_before = jnp.cumsum(top_probs, axis=-1) - top_probs
    keep = mass_before < params.top_p
    keep = keep.at[..., 0].set(True)
    thresh_N1 = jnp.min(jnp.where(keep, top_vals, jnp.inf), axis=-1, keepdims=True)
  else:
    thresh_N1 = top_vals[..., -1:]
  return jnp.where(x_NV >= thresh_N1, x_NV, _NEG_INF)


def filtered_log_probs(logits_NV: jax.Array, params: SamplingParams) -> jax.Array:
  """Log-probabilities of the distribution actually sampled from (-inf if filtered)."""
  return jax.nn.log_softmax(filtered_logits(logits_NV, params), axis=-1)


def sample_tokens(logits_NV: jax.Array, key: jax.Array, params: SamplingParams) -> jax.Array:
  """Draws one token per row (argmax when greedy).

  Args:
    logits_NV: raw model logits [..., V].
    key: PRNG key (unused when greedy).
    params: sampling settings.

  Returns:
    int32 token ids of shape logits_NV.shape[:-1].
  """
  if params.greedy:
    return jnp.argmax(logits_NV, axis=-1).astype(jnp.int32)
  return inverse_cdf_sample(filtered_logits(logits_NV, params), key)


def _block_size(vocab: int) -> int:
  """Block width of the two-level inverse CDF: a power of two near sqrt(V), at least 16."""
  return max(16, 1 << (max(1, math.isqrt(vocab - 1) + 1) - 1).bit_length())


def _last_positive(x: jax.Array) -> jax.Array:
  """Index of the last entry > 0 along the last axis (0 if none)."""
  n = x.shape[-1]
  return (n - 1 - jnp.argmax(jnp.flip(x > 0, axis=-1), axis=-1)).astype(jnp.int32)


def _invert(cdf: jax.Array, u_N: jax.Array, weights: jax.Array) -> jax.Array:
  """Smallest i with cdf[..., i] > u along the last axis, never past the last entry of
  positive weight (`cdf` and `weights` share their shape)."""
  idx_N = jnp.sum(cdf <= u_N[..., None], axis=-1, dtype=jnp.int32)
  return jnp.minimum(idx_N, _last_positive(weights))


def inverse_cdf_sample(x_NV: jax.Array, key: jax.Array) -> jax.Array:
  """Draws token ~ softmax(x) per row by inverting the CDF with one uniform per row.

  Two levels, so no length-V cumulative sum is ever formed: the vocabulary is cut into
  blocks of about sqrt(V) tokens; a block is drawn by inverting the CDF of the block masses,
  then a token inside it by inverting the block's own CDF with the leftover of the same
  uniform. With e_i = exp(x_i - max x), block masses m_j and total mass Z,
  P(token i in block j) = (m_j / Z) (e_i / m_j) = e_i / Z: exact up to float32 rounding.
  On CPU this is about 3x cheaper than Gumbel-max (`jax.random.categorical`, which needs V
  random numbers and two logarithms per row) and avoids the long sequential scan of a full
  cumulative sum. -inf (filtered) entries have probability 0 and are never
  drawn.

  Args:
    x_NV: float32 logits [..., V] with at least one finite entry per row.
    key: PRNG key.

  Returns:
    int32 token ids [...].
  """
  return inverse_cdf_from_uniform(x_NV, jax.random.uniform(key, x_NV.shape[:-1], jnp.float32))


def row_step_keys(key: jax.Array, row_N: jax.Array, s_N: jax.Array) -> jax.Array:
  """The per-row key schedule: `fold_in(fold_in(key, row), s)` for each row's index in the
  rollout and its decode step `s`, so a draw depends on (key, row, s) only -- not on the
  batch, slot or time the row is decoded in (`engine.py`; `Sampler(key_schedule="row")`)."""
  return jax.vmap(lambda r, s: jax.random.fold_in(jax.random.fold_in(key, r), s))(row_N, s_N)


def row_uniforms(keys_N: jax.Array) -> jax.Array:
  """One uniform in [0, 1) per row from that row's own key (`keys_N` [N] typed or [N, 2] raw)."""
  return jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys_N)


def sample_tokens_rows(logits_NV: jax.Array, keys_N: jax.Array,
                       params: SamplingParams) -> jax.Array:
  """`sample_tokens` with one PRNG key per row (the per-row key schedule of `engine.py`).

  Args:
    logits_NV: raw model logits [N, V].
    keys_N: a key per row (unused when greedy).
    params: sampling settings.

  Returns:
    int32 token ids [N].
  """
  if params.greedy:
    return jnp.argmax(logits_NV, axis=-1).astype(jnp.int32)
  return inverse_cdf_from_uniform(filtered_logits(logits_NV, params), row_uniforms(keys_N))


def inverse_cdf_from_uniform(x_NV: jax.Array, u_N: jax.Array) -> jax.Array:
  """The draw of `inverse_cdf_sample` for given uniforms `u_N` in [0, 1) (shape x_NV.shape[:-1])."""
  lead, vocab = x_NV.shape[:-1], x_NV.shape[-1]
  e_NV = jnp.exp(x_NV - jnp.max(x_NV, axis=-1, keepdims=True))
  width = _block_size(vocab)
  n_blocks = -(-vocab // width)
  e_blocks = jnp.pad(e_NV, [(0, 0)] * len(lead) + [(0, n_blocks * width - vocab)]).reshape(
      lead + (n_blocks, width))  # [..., n_blocks, width]
  block_mass = jnp.sum(e_blocks, axis=-1)  # [..., n_blocks]
  block_cdf = jnp.cumsum(block_mass, axis=-1)
  mass_N = u_N * block_cdf[..., -1]  # the uniform scaled to the total mass
  block_N = _invert(block_cdf, mass_N, block_mass)
  before_N = jnp.take_along_axis(block_cdf - block_mass, block_N[..., None], axis=-1)[..., 0]
  # The drawn block's entries, [..., width].
  inner = jnp.take_along_axis(e_blocks, block_N[..., None, None], axis=-2)[..., 0, :]
  offset_N = _invert(jnp.cumsum(inner, axis=-1), mass_N - before_N, inner)
  return block_N * width + offset_N


def token_log_probs(logits_NV: jax.Array, tokens_N: jax.Array) -> jax.Array:
  """Policy log-probability log_softmax(logits)[token] at temperature 1 (float32)."""
  x_NV = logits_NV.astype(jnp.float32)
  picked_N = jnp.take_along_axis(x_NV, tokens_N[..., None], axis=-1)[..., 0]
  return picked_N - jax.nn.logsumexp(x_NV, axis=-1)
