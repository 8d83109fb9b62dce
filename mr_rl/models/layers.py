"""Decoder building blocks: RMSNorm, RoPE (plain and llama3-scaled), GQA attention with an
explicit per-layer KV cache, SwiGLU MLP.

Every parameter carries logical axis names; mesh axes live in `mr_rl.models.sharding`.
Numerics follow the transformers reference implementations (Qwen3 / Llama modeling files):
RMSNorm in float32, softmax in float32, non-interleaved ("rotate half") RoPE.
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


@flax.struct.dataclass
class LayerCache:
  """KV cache of one layer: keys k [B, n_kv_heads, head_dim, S_max] (stored transposed) and
  values v [B, n_kv_heads, S_max, head_dim].

  Both layouts make decode attention two plain batched matmuls over (batch, kv head) whose
  operands are read in place: scores q[B,K,G,Dh] @ k[B,K,Dh,S] and outputs p[B,K,G,S] @
  v[B,K,S,Dh]. With keys stored [.., S, Dh], XLA:CPU repacks the whole key cache for the
  scores matmul on every step and layer (measured: 2x slower attention; BUILD_NOTES.md).
  """
  k: jax.Array
  v: jax.Array


Cache = tuple  # tuple[LayerCache, ...] over layers

CACHE_K_AXES = ("cache_batch", "kv_heads", "kv", "cache_length")
CACHE_V_AXES = ("cache_batch", "kv_heads", "cache_length", "kv")


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=None) -> Cache:
  """Zero KV cache: a tuple over layers of LayerCache(k [B, K, head_dim, max_len],
  v [B, K, max_len, head_dim]).

  Args:
    config: model config.
    batch_size: B.
    max_len: S_max, slots available for prompt + generated tokens.
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
  """(k_shape, v_shape) of one layer's cache (see LayerCache)."""
  K, Dh = config.n_kv_heads, config.head_dim
  return (batch_size, K, Dh, max_len), (batch_size, K, max_len, Dh)


def cache_length(cache: Cache) -> int:
  """S_max, the number of slots of a cache."""
  return cache[0].v.shape[2]


def grow_cache(cache: Cache, extra: int) -> Cache:
  """Appends `extra` zero slots to every layer's cache (one copy; the sampler's segments)."""
  pad = lambda a, axis: jnp.pad(a, [(0, extra) if i == axis else (0, 0) for i in range(a.ndim)])
  return tuple(LayerCache(k=pad(c.k, 3), v=pad(c.v, 2)) for c in cache)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """RoPE inverse frequencies [head_dim // 2] (float32), llama3 scaling applied if configured.

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


def apply_rope(x_BTHD: jax.Array, positions_BT: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotate-half RoPE on x [B, T, H, D] at integer positions [B, T] (computed in float32)."""
  freqs_BTF = positions_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  emb = jnp.concatenate([freqs_BTF, freqs_BTF], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(emb), jnp.sin(emb)
  x = x_BTHD.astype(jnp.float32)
  half = x.shape[-1] // 2
  rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return (x * cos + rot * sin).astype(x_BTHD.dtype)


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


def attention_mask(kv_mask_BS, T: int, S: int, cache_index) -> jax.Array:
  """Boolean mask [B, T, S]: query t (slot cache_index + t) sees slot s iff kv_mask and s <= slot."""
  q_slot_T = cache_index + jnp.arange(T, dtype=jnp.int32)
  causal_TS = jnp.arange(S, dtype=jnp.int32)[None, :] <= q_slot_T[:, None]
  return jnp.logical_and(kv_mask_BS.astype(bool)[:, None, :], causal_TS[None])


class Attention(nn.Module):
  """Grouped-query attention with optional QK-norm and an explicit KV cache."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, positions_BT, kv_mask_BS, layer_cache, cache_index):
    cfg = self.config
    H, K, Dh, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    G = H // K
    prec = precision_of(cfg)
    pd, dt = cfg.param_dtype, cfg.dtype
    wq = param_with_axes(self, "q_proj", kernel_init, (D, H, Dh), ("embed", "heads", "kv"), pd)
    wk = param_with_axes(self, "k_proj", kernel_init, (D, K, Dh), ("embed", "kv_heads", "kv"), pd)
    wv = param_with_axes(self, "v_proj", kernel_init, (D, K, Dh), ("embed", "kv_heads", "kv"), pd)
    wo = param_with_axes(self, "o_proj", kernel_init, (H, Dh, D), ("heads", "kv", "embed"), pd)
    x = x_BTD.astype(dt)
    q = jnp.einsum("btd,dhk->bthk", x, wq.astype(dt), precision=prec)
    k = jnp.einsum("btd,dhk->bthk", x, wk.astype(dt), precision=prec)
    v = jnp.einsum("btd,dhk->bthk", x, wv.astype(dt), precision=prec)
    if cfg.qk_norm:
      q = RMSNorm(cfg.norm_eps, pd, axis_name="kv", name="q_norm")(q)
      k = RMSNorm(cfg.norm_eps, pd, axis_name="kv", name="k_norm")(k)
    inv_freq = rope_inv_freq(cfg)
    q = apply_rope(q, positions_BT, inv_freq)
    k = apply_rope(k, positions_BT, inv_freq)
    B, T = x.shape[:2]

    if layer_cache is None:
      # Training / scoring: keys and values are this call's own [B, T, K, Dh].
      mask_BTS = attention_mask(kv_mask_BS, T, T, 0)
      q = q.reshape(B, T, K, G, Dh)
      scores = jnp.einsum("btkgd,bskd->bkgts", q, k, precision=prec,
                          preferred_element_type=jnp.float32) * (Dh ** -0.5)
      scores = jnp.where(mask_BTS[:, None, None], scores, _MASK_VALUE)
      probs = jax.nn.softmax(scores, axis=-1).astype(dt)
      out = jnp.einsum("bkgts,bskd->btkgd", probs, v, precision=prec).reshape(B, T, H, Dh)
      return jnp.einsum("bthk,hkd->btd", out, wo.astype(dt), precision=prec), None

    # With a cache (see LayerCache for the layouts): write the T new entries at slots
    # [cache_index, cache_index + T).
    ck = jax.lax.dynamic_update_slice(
        layer_cache.k, jnp.transpose(k, (0, 2, 3, 1)).astype(layer_cache.k.dtype),
        (0, 0, 0, cache_index))
    cv = jax.lax.dynamic_update_slice(
        layer_cache.v, jnp.swapaxes(v, 1, 2).astype(layer_cache.v.dtype), (0, 0, cache_index, 0))
    new_cache = LayerCache(k=ck, v=cv)
    keys_BKDS, values_BKSD = ck.astype(dt), cv.astype(dt)
    S = values_BKSD.shape[2]
    mask_BTS = attention_mask(kv_mask_BS, T, S, cache_index)
    # Queries grouped per KV head, [B, K, G*T, Dh] (row g*T + t), so both products are batched
    # matmuls over (batch, kv head) reading the cache in place.
    q_BKMD = jnp.transpose(q.reshape(B, T, K, G, Dh), (0, 2, 3, 1, 4)).reshape(B, K, G * T, Dh)
    scores = jnp.einsum("bkmd,bkds->bkms", q_BKMD, keys_BKDS, precision=prec,
                        preferred_element_type=jnp.float32) * (Dh ** -0.5)
    mask_BMS = jnp.tile(mask_BTS, (1, G, 1))  # row g*T + t uses query t's mask
    scores = jnp.where(mask_BMS[:, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum("bkms,bksd->bkmd", probs, values_BKSD, precision=prec)
    out = jnp.transpose(out.reshape(B, K, G, T, Dh), (0, 3, 1, 2, 4)).reshape(B, T, H, Dh)
    y = jnp.einsum("bthk,hkd->btd", out, wo.astype(dt), precision=prec)
    return y, new_cache


class MLP(nn.Module):
  """SwiGLU MLP: down(silu(gate(x)) * up(x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.config
    D, F, pd, dt = cfg.d_model, cfg.d_ff, cfg.param_dtype, cfg.dtype
    prec = precision_of(cfg)
    wg = param_with_axes(self, "gate_proj", kernel_init, (D, F), ("embed", "mlp"), pd)
    wu = param_with_axes(self, "up_proj", kernel_init, (D, F), ("embed", "mlp"), pd)
    wd = param_with_axes(self, "down_proj", kernel_init, (F, D), ("mlp", "embed"), pd)
    x = x_BTD.astype(dt)
    g = jnp.einsum("btd,df->btf", x, wg.astype(dt), precision=prec)
    u = jnp.einsum("btd,df->btf", x, wu.astype(dt), precision=prec)
    h = nn.with_logical_constraint(jax.nn.silu(g) * u, ("activation_batch", "activation_length",
                                                       "activation_mlp"))
    return jnp.einsum("btf,fd->btd", h, wd.astype(dt), precision=prec)
