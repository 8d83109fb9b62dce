"""Decoder building blocks: RMSNorm, RoPE (plain and llama3-scaled), GQA attention with an
explicit per-layer KV cache, SwiGLU MLP.

Every parameter carries logical axis names; mesh axes live in `mr_rl.models.sharding`.
Numerics follow the transformers reference implementations (Qwen3 / Llama modeling files):
RMSNorm in float32, softmax in float32, non-interleaved ("rotate half") RoPE.

Shape letters (suffixes and, in lower case, einsum subscripts) are those of docs/shapes.md:
N rows (one sequence each; the model knows nothing of prompts or groups), T positions fed in
this call, C key/value slots (T without a cache, the cache length with one), D model width,
F MLP width, H query heads, J key/value heads, Q = H // J query heads per key/value head,
I = Q * T grouped query rows of one key/value head (cached attention), W per-head width.
"""

from __future__ import annotations

import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.models.config import ModelConfig

# Finite mask value: a fully masked row (a left-padding query) stays finite instead of NaN,
# so padding never poisons real positions through 0 * NaN in the value matmul.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

kernel_init = nn.initializers.normal(stddev=0.02)


def precision_of(config: ModelConfig):
  return None if config.matmul_precision is None else jax.lax.Precision(config.matmul_precision)


def param_with_axes(module: nn.Module, name: str, init_fn, shape, axes, dtype):
  """Declares a parameter annotated with logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init_fn, axes), shape, dtype)


def lora_delta(module: nn.Module, name: str, x, a_spec: str, b_spec: str, prec):
  """The low-rank update (x @ a) @ b of kernel `name`'s adapter in the 'lora' collection, or 0.

  The collection holds {'a': [*in, R], 'b': [R, *out]} per adapted kernel, b already scaled
  by alpha / R (`mr_rl.models.lora.Adapted.variables`); without the collection (the base,
  the reference policy) the kernel is used alone. A learner forward with LoRA dropout also
  finds per-row keys 'keys' [N, 2] and the rate 'p' there: the adapter then reads
  x * mask / (1 - p), mask ~ Bernoulli(1 - p) drawn per row from its key (PEFT's lora_dropout).
  """
  if not module.has_variable("lora", name):
    return 0.0
  ab = module.get_variable("lora", name)
  if "keys" in ab:
    keep = 1.0 - ab["p"]
    mask = jax.vmap(lambda k: jax.random.bernoulli(k, keep, x.shape[1:]))(ab["keys"])
    x = jnp.where(mask, x / keep.astype(x.dtype), jnp.zeros((), x.dtype))
  h = jnp.einsum(a_spec, x, ab["a"].astype(x.dtype), precision=prec)
  return jnp.einsum(b_spec, h, ab["b"].astype(x.dtype), precision=prec)


@flax.struct.dataclass
class LayerCache:
  """KV cache of one layer: keys k [N, J, W, C] (stored transposed) and values v [N, J, C, W]
  (C slots).

  Both layouts make decode attention two plain batched matmuls over (batch row, key/value
  head) whose operands are read in place: scores q[N,J,I,W] @ k[N,J,W,C] and outputs
  p[N,J,I,C] @ v[N,J,C,W]. With keys stored [.., C, W], XLA:CPU repacks the whole key cache
  for the scores matmul on every step and layer (measured: 2x slower attention; BUILD_NOTES.md).
  """
  k: jax.Array
  v: jax.Array


Cache = tuple  # tuple[LayerCache, ...] over layers

CACHE_K_AXES = ("cache_batch", "kv_heads", "kv", "cache_length")
CACHE_V_AXES = ("cache_batch", "kv_heads", "cache_length", "kv")


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=None) -> Cache:
  """Zero KV cache: a tuple over layers of LayerCache(k [N, J, W, C], v [N, J, C, W]).

  Args:
    config: model config.
    batch_size: N.
    max_len: C, slots available for prompt + generated tokens.
    dtype: cache dtype (default config.dtype).

  Raises:
    ValueError: non-positive sizes, or max_len beyond config.max_seq_len.
  """
  if int(batch_size) <= 0:
    raise ValueError(f"init_cache: batch_size must be positive, got {batch_size}")
  if int(max_len) <= 0:
    raise ValueError(f"init_cache: max_len must be positive, got {max_len}")
  if max_len > config.max_seq_len:
    raise ValueError(f"init_cache: max_len={max_len} exceeds the model's max_seq_len="
                     f"{config.max_seq_len}")
  dtype = config.dtype if dtype is None else jnp.dtype(dtype)
  k_shape, v_shape = cache_shapes(config, int(batch_size), int(max_len))
  return tuple(LayerCache(k=jnp.zeros(k_shape, dtype), v=jnp.zeros(v_shape, dtype))
               for _ in range(config.n_layers))


def cache_shapes(config: ModelConfig, batch_size: int, max_len: int):
  """(k_shape, v_shape) of one layer's cache: ([N, J, W, C], [N, J, C, W]) (see LayerCache)."""
  J, W = config.n_kv_heads, config.head_dim
  return (batch_size, J, W, max_len), (batch_size, J, max_len, W)


def cache_length(cache: Cache) -> int:
  """C, the number of slots of a cache."""
  return cache[0].v.shape[2]


def grow_cache(cache: Cache, extra: int) -> Cache:
  """Appends `extra` zero slots to every layer's cache (one copy; the sampler's segments)."""
  pad = lambda a, axis: jnp.pad(a, [(0, extra) if i == axis else (0, 0) for i in range(a.ndim)])
  return tuple(LayerCache(k=pad(c.k, 3), v=pad(c.v, 2)) for c in cache)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """RoPE inverse frequencies [W // 2] (float32), llama3 scaling applied if configured.

  Llama 3.1 scaling: wavelengths above original_max/low_freq_factor are divided by `factor`,
  below original_max/high_freq_factor are kept, in between smoothly interpolated.
  """
  dim = config.head_dim
  inv = (1.0 / (np.float32(config.rope_theta) **
                (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim))))
  inv = inv.astype(np.float32)
  if config.rope_scaling is None:
    return inv
  s = dict(config.rope_scaling)
  factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
  old = s["original_max_position_embeddings"]
  low_wl, high_wl = old / lo, old / hi
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wl, inv / factor, inv)
  smooth = (old / wavelen - lo) / (hi - lo)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= high_wl) & (wavelen <= low_wl)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions_NT: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotate-half RoPE at integer positions [N, T] (computed in float32).

  Args:
    x: queries [N, T, H, W] or keys [N, T, J, W].
    positions_NT: int positions.
    inv_freq: [W // 2] from `rope_inv_freq`.
  """
  angles = positions_NT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [N, T, W/2]
  emb = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(emb), jnp.sin(emb)
  xf = x.astype(jnp.float32)
  half = xf.shape[-1] // 2
  rot = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
  return (xf * cos + rot * sin).astype(x.dtype)


class RMSNorm(nn.Module):
  """y = w * (x / sqrt(mean(x^2) + eps)), normalised in float32 and cast back (as in HF)."""
  eps: float
  param_dtype: Any = jnp.float32
  axis_name: str = "norm"

  @nn.compact
  def __call__(self, x):
    w = param_with_axes(self, "scale", nn.initializers.ones, (x.shape[-1],), (self.axis_name,),
                        self.param_dtype)
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return w.astype(x.dtype) * xf.astype(x.dtype)


def attention_mask(kv_mask_NC, T: int, C: int, cache_index) -> jax.Array:
  """Boolean mask [N, T, C]: query t (at slot cache_index + t) sees slot c iff kv_mask_NC[n, c]
  and c <= that slot."""
  q_slot_T = cache_index + jnp.arange(T, dtype=jnp.int32)
  causal_TC = jnp.arange(C, dtype=jnp.int32)[None, :] <= q_slot_T[:, None]
  return jnp.logical_and(kv_mask_NC.astype(bool)[:, None, :], causal_TC[None])


class Attention(nn.Module):
  """Grouped-query attention with optional QK-norm and an explicit KV cache.

  __call__(x_NTD, positions_NT, kv_mask_NC, layer_cache, cache_index, segment_ids_NT=None)
  -> (y_NTD, new_cache): layer_cache None attends over this call's own T keys (new_cache None;
  with `segment_ids_NT`, packed rows, only keys of the query's own segment); otherwise the T
  new keys/values are written at slots [cache_index, cache_index + T) of the LayerCache first.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x_NTD, positions_NT, kv_mask_NC, layer_cache, cache_index,
               segment_ids_NT=None):
    cfg = self.config
    H, J, W, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    Q = H // J
    prec = precision_of(cfg)
    pd, dt = cfg.param_dtype, cfg.dtype
    wq = param_with_axes(self, "q_proj", kernel_init, (D, H, W), ("embed", "heads", "kv"), pd)
    wk = param_with_axes(self, "k_proj", kernel_init, (D, J, W), ("embed", "kv_heads", "kv"), pd)
    wv = param_with_axes(self, "v_proj", kernel_init, (D, J, W), ("embed", "kv_heads", "kv"), pd)
    wo = param_with_axes(self, "o_proj", kernel_init, (H, W, D), ("heads", "kv", "embed"), pd)
    x = x_NTD.astype(dt)
    q_NTHW = jnp.einsum("ntd,dhw->nthw", x, wq.astype(dt), precision=prec)
    k_NTJW = jnp.einsum("ntd,djw->ntjw", x, wk.astype(dt), precision=prec)
    v_NTJW = jnp.einsum("ntd,djw->ntjw", x, wv.astype(dt), precision=prec)
    q_NTHW += lora_delta(self, "q_proj", x, "ntd,dr->ntr", "ntr,rhw->nthw", prec)
    k_NTJW += lora_delta(self, "k_proj", x, "ntd,dr->ntr", "ntr,rjw->ntjw", prec)
    v_NTJW += lora_delta(self, "v_proj", x, "ntd,dr->ntr", "ntr,rjw->ntjw", prec)
    if cfg.qk_norm:
      q_NTHW = RMSNorm(cfg.norm_eps, pd, axis_name="kv", name="q_norm")(q_NTHW)
      k_NTJW = RMSNorm(cfg.norm_eps, pd, axis_name="kv", name="k_norm")(k_NTJW)
    inv_freq = rope_inv_freq(cfg)
    q_NTHW = apply_rope(q_NTHW, positions_NT, inv_freq)
    k_NTJW = apply_rope(k_NTJW, positions_NT, inv_freq)
    N, T = x.shape[:2]

    if layer_cache is None:
      # Training / scoring: keys and values are this call's own (C = T).
      mask_NTC = attention_mask(kv_mask_NC, T, T, 0)
      if segment_ids_NT is not None:  # packed rows: a query sees only its own segment
        mask_NTC = mask_NTC & (segment_ids_NT[:, :, None] == segment_ids_NT[:, None, :])
      q_NTJQW = q_NTHW.reshape(N, T, J, Q, W)
      scores = jnp.einsum("ntjqw,ncjw->njqtc", q_NTJQW, k_NTJW, precision=prec,
                          preferred_element_type=jnp.float32) * (W ** -0.5)
      scores = jnp.where(mask_NTC[:, None, None], scores, _MASK_VALUE)
      probs = jax.nn.softmax(scores, axis=-1).astype(dt)
      out_NTHW = jnp.einsum("njqtc,ncjw->ntjqw", probs, v_NTJW,
                            precision=prec).reshape(N, T, H, W)
      return self._out(out_NTHW, wo, prec), None

    # With a cache (see LayerCache for the layouts): write the T new entries at slots
    # [cache_index, cache_index + T).
    ck = jax.lax.dynamic_update_slice(
        layer_cache.k, jnp.transpose(k_NTJW, (0, 2, 3, 1)).astype(layer_cache.k.dtype),
        (0, 0, 0, cache_index))
    cv = jax.lax.dynamic_update_slice(
        layer_cache.v, jnp.swapaxes(v_NTJW, 1, 2).astype(layer_cache.v.dtype),
        (0, 0, cache_index, 0))
    new_cache = LayerCache(k=ck, v=cv)
    keys_NJWC, values_NJCW = ck.astype(dt), cv.astype(dt)
    C = values_NJCW.shape[2]
    mask_NTC = attention_mask(kv_mask_NC, T, C, cache_index)
    # Queries grouped per key/value head, [N, J, I, W] with I = Q*T (row q*T + t), so both
    # products are batched matmuls over (batch row, key/value head) reading the cache in place.
    q_NJIW = jnp.transpose(q_NTHW.reshape(N, T, J, Q, W), (0, 2, 3, 1, 4)).reshape(N, J, Q * T, W)
    scores = jnp.einsum("njiw,njwc->njic", q_NJIW, keys_NJWC, precision=prec,
                        preferred_element_type=jnp.float32) * (W ** -0.5)
    mask_NIC = jnp.tile(mask_NTC, (1, Q, 1))  # row q*T + t uses query t's mask
    scores = jnp.where(mask_NIC[:, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out_NJIW = jnp.einsum("njic,njcw->njiw", probs, values_NJCW, precision=prec)
    out_NTHW = jnp.transpose(out_NJIW.reshape(N, J, Q, T, W), (0, 3, 1, 2, 4)).reshape(N, T, H, W)
    return self._out(out_NTHW, wo, prec), new_cache

  def _out(self, out_NTHW, wo, prec):
    """The output projection (with its adapter, if any)."""
    y = jnp.einsum("nthw,hwd->ntd", out_NTHW, wo.astype(out_NTHW.dtype), precision=prec)
    return y + lora_delta(self, "o_proj", out_NTHW, "nthw,hwr->ntr", "ntr,rd->ntd", prec)


class MLP(nn.Module):
  """SwiGLU MLP: down(silu(gate(x)) * up(x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_NTD):
    cfg = self.config
    D, F, pd, dt = cfg.d_model, cfg.d_ff, cfg.param_dtype, cfg.dtype
    prec = precision_of(cfg)
    wg = param_with_axes(self, "gate_proj", kernel_init, (D, F), ("embed", "mlp"), pd)
    wu = param_with_axes(self, "up_proj", kernel_init, (D, F), ("embed", "mlp"), pd)
    wd = param_with_axes(self, "down_proj", kernel_init, (F, D), ("mlp", "embed"), pd)
    x = x_NTD.astype(dt)
    g = jnp.einsum("ntd,df->ntf", x, wg.astype(dt), precision=prec)
    u = jnp.einsum("ntd,df->ntf", x, wu.astype(dt), precision=prec)
    g += lora_delta(self, "gate_proj", x, "ntd,dr->ntr", "ntr,rf->ntf", prec)
    u += lora_delta(self, "up_proj", x, "ntd,dr->ntr", "ntr,rf->ntf", prec)
    h = nn.with_logical_constraint(jax.nn.silu(g) * u, ("activation_batch", "activation_length",
                                                       "activation_mlp"))
    y = jnp.einsum("ntf,fd->ntd", h, wd.astype(dt), precision=prec)
    return y + lora_delta(self, "down_proj", h, "ntf,fr->ntr", "ntr,rd->ntd", prec)
