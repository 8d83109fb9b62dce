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

from mr_rl.models import attention as attention_lib
from mr_rl.models.config import ModelConfig

# Finite mask value: a fully masked row (a left-padding query) stays finite instead of NaN,
# so padding never poisons real positions through 0 * NaN in the value matmul.
_MASK_VALUE = attention_lib.MASK_VALUE

kernel_init = nn.initializers.normal(stddev=0.02)


def precision_of(config: ModelConfig):
  return None if config.matmul_precision is None else jax.lax.Precision(config.matmul_precision)


def param_with_axes(module: nn.Module, name: str, init_fn, shape, axes, dtype):
  """Declares a parameter annotated with logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init_fn, axes), shape, dtype)


def lora_delta(module: nn.Module, name: str, x, a_spec: str, b_spec: str, prec):
  """The low-rank update (x @ a) @ b of kernel `name`'s adapter in the 'lora' collection, or 0.

  The collection holds {'a': [*in, R], 'b': [R, *out]} per adapted kernel (this layer's slice
  of the stacked adapters), b already scaled by alpha / R (`mr_rl.models.lora.Adapted.variables`),
  and 'on' (1.0 / 0.0: whether this layer's kernel is adapted) when the targets adapt it in
  some layers only; without the collection (the base, the reference policy) the kernel is used
  alone. A learner forward with LoRA dropout also finds per-row keys 'keys' [N, 2] and the rate
  'p' there: the adapter then reads x * mask / (1 - p), mask ~ Bernoulli(1 - p) drawn per row
  from its key (PEFT's lora_dropout).
  """
  if not module.has_variable("lora", name):
    return 0.0
  ab = module.get_variable("lora", name)
  if "keys" in ab:
    keep = 1.0 - ab["p"]
    mask = jax.vmap(lambda k: jax.random.bernoulli(k, keep, x.shape[1:]))(ab["keys"])
    x = jnp.where(mask, x / keep.astype(x.dtype), jnp.zeros((), x.dtype))
  h = jnp.einsum(a_spec, x, ab["a"].astype(x.dtype), precision=prec)
  out = jnp.einsum(b_spec, h, ab["b"].astype(x.dtype), precision=prec)
  return out * ab["on"].astype(out.dtype) if "on" in ab else out


@flax.struct.dataclass
class LayerCache:
  """KV cache of the whole decoder stack: keys k [L, N, J, W, C] (stored transposed) and values
  v [L, N, J, C, W] (L layers, C slots); the layer scan reads layer l's [N, J, W, C] /
  [N, J, C, W] in place.

  Both per-layer layouts make decode attention two plain batched matmuls over (batch row,
  key/value head) whose operands are read in place: scores q[N,J,I,W] @ k[N,J,W,C] and outputs
  p[N,J,I,C] @ v[N,J,C,W]. With keys stored [.., C, W], XLA:CPU repacks the whole key cache
  for the scores matmul on every step and layer (measured: 1.17 vs 0.47 ms per layer).
  """
  k: jax.Array
  v: jax.Array


Cache = LayerCache  # one LayerCache holds every layer (leading axis L)

CACHE_K_AXES = ("layers", "cache_batch", "kv_heads", "kv", "cache_length")
CACHE_V_AXES = ("layers", "cache_batch", "kv_heads", "cache_length", "kv")


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=None) -> Cache:
  """Zero KV cache: LayerCache(k [L, N, J, W, C], v [L, N, J, C, W]).

  Args:
    config: model config.
    batch_size: N.
    max_len: C, slots available for prompt + generated tokens.
    dtype: cache dtype (default config.dtype, the compute dtype).

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
  return LayerCache(k=jnp.zeros(k_shape, dtype), v=jnp.zeros(v_shape, dtype))


def cache_shapes(config: ModelConfig, batch_size: int, max_len: int):
  """(k_shape, v_shape) of a cache: ([L, N, J, W, C], [L, N, J, C, W]) (see LayerCache)."""
  L, J, W = config.n_layers, config.n_kv_heads, config.head_dim
  return (L, batch_size, J, W, max_len), (L, batch_size, J, max_len, W)


def cache_length(cache: Cache) -> int:
  """C, the number of slots of a cache."""
  return cache.v.shape[3]


def cache_batch(cache: Cache) -> int:
  """N, the rows of a cache."""
  return cache.v.shape[1]


def write_cache(cache: Cache, new_k, new_v, cache_index) -> Cache:
  """The cache with every layer's T new entries (k [L, N, J, W, T], v [L, N, J, T, W]) written
  at slots [cache_index, cache_index + T): one in-place update of the stacked arrays. A
  per-row cache_index [N] (T = 1, the continuous engine's slots) writes row n at its own slot
  (`write_rows`)."""
  zero = jnp.int32(0)
  if jnp.ndim(cache_index):
    return write_rows(cache, new_k, new_v, cache_index)
  return LayerCache(
      k=jax.lax.dynamic_update_slice(cache.k, new_k.astype(cache.k.dtype),
                                     (zero, zero, zero, zero, cache_index)),
      v=jax.lax.dynamic_update_slice(cache.v, new_v.astype(cache.v.dtype),
                                     (zero, zero, zero, cache_index, zero)))


def write_rows(cache: Cache, new_k, new_v, index_N, write_N=None) -> Cache:
  """Row n's T new entries (k [L, N, J, W, T], v [L, N, J, T, W]) written at slots
  [index_N[n], index_N[n] + T) (rows with write_N[n] False, if given, unchanged): one in-place
  dynamic_update_slice per row, in a loop over the rows; under an ambient mesh inside a
  `shard_map` over the cache's own sharding (logical axes CACHE_K_AXES / CACHE_V_AXES), so each
  device loops over its own rows only. The continuous engine's decode writes (T = 1) and slot
  inserts (T = P).

  (One scatter of all rows, the earlier form, made XLA:TPU lay the cache out differently inside
  the engine's decode loop than at its boundary, i.e. copy the whole cache into and out of every
  `step` call; a row loop over the global rows of a sharded cache all-gathers the new entries in
  every iteration. docs/accelerators.md, "Continuous engine on TPU".)"""
  def rows(k, v, nk, nv, index, *write):
    zero = jnp.int32(0)

    def row(n, kv):
      k, v = kv
      k_at, v_at = (zero, n, zero, zero, index[n]), (zero, n, zero, index[n], zero)
      k_n = jax.lax.dynamic_slice_in_dim(nk, n, 1, axis=1).astype(k.dtype)
      v_n = jax.lax.dynamic_slice_in_dim(nv, n, 1, axis=1).astype(v.dtype)
      if write:  # rows not written keep their entries
        k_n = jnp.where(write[0][n], k_n, jax.lax.dynamic_slice(k, k_at, k_n.shape))
        v_n = jnp.where(write[0][n], v_n, jax.lax.dynamic_slice(v, v_at, v_n.shape))
      return (jax.lax.dynamic_update_slice(k, k_n, k_at),
              jax.lax.dynamic_update_slice(v, v_n, v_at))
    return jax.lax.fori_loop(0, index.shape[0], row, (k, v))

  write = () if write_N is None else (write_N,)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return LayerCache(*rows(cache.k, cache.v, new_k, new_v, index_N, *write))
  P = jax.sharding.PartitionSpec

  def spec(axes, shape):  # the logical spec, an axis dropped where it does not divide
    out = []
    for ax, dim in zip(nn.logical_to_mesh_axes(axes), shape):
      names = tuple(a for a in ((ax,) if isinstance(ax, str) else (ax or ()))
                    if a in mesh.axis_names)
      out.append((names or None) if dim % math.prod(mesh.shape[a] for a in names) == 0
                 else None)
    return P(*out)
  k_spec, v_spec = spec(CACHE_K_AXES, cache.k.shape), spec(CACHE_V_AXES, cache.v.shape)
  row_spec = P(k_spec[1])
  k, v = jax.shard_map(rows, mesh=mesh,
                       in_specs=(k_spec, v_spec, k_spec, v_spec) + (row_spec,) * (1 + len(write)),
                       out_specs=(k_spec, v_spec), check_vma=False)(
                           cache.k, cache.v, new_k, new_v, index_N, *write)
  return LayerCache(k=k, v=v)


def prefill_layer(cache: Cache, layer, new_k, new_v) -> Cache:
  """An empty cache with layer `layer` (an int32 scalar) replaced by its T new entries (k
  [N, J, W, T], v [N, J, T, W]) at slots [0, T) and zeros after them: one in-place update of
  a whole layer (the prefill's write inside the layer scan). Whole layers, not [.., T] slabs:
  XLA:TPU then keeps the cache in the layout the decode steps read (a T off the 128-lane
  grid made it lay out the keys W-minor for the prefill and copy the cache for the decode)."""
  zero = jnp.int32(0)
  C = cache_length(cache)
  pad = lambda x, axis: jnp.pad(x, [(0, C - x.shape[axis]) if i == axis else (0, 0)
                                    for i in range(x.ndim)])
  return LayerCache(
      k=jax.lax.dynamic_update_slice(cache.k, pad(new_k, 3)[None].astype(cache.k.dtype),
                                     (layer, zero, zero, zero, zero)),
      v=jax.lax.dynamic_update_slice(cache.v, pad(new_v, 2)[None].astype(cache.v.dtype),
                                     (layer, zero, zero, zero, zero)))


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


class Attention(nn.Module):
  """Grouped-query attention with optional QK-norm and an explicit KV cache.

  __call__(x_NTD, positions_NT, kv_mask_NC, layer_cache, cache_index, segment_ids_NT=None)
  -> (y_NTD, new_kv):

  * layer_cache None: the T tokens attend to each other (`mr_rl.models.attention.attend`, the
    configured implementation): causally, real keys only, and with `segment_ids_NT` (packed
    rows) only keys of the query's own segment; new_kv is None.
  * layer_cache (this layer's k [N, J, W, C], v [N, J, C, W]) and cache_index (a scalar, or
    one per row [N] when T = 1): the T new tokens sit at slots [cache_index, cache_index + T);
    query t attends to the cached slots c < cache_index with kv_mask_NC[n, c] and to new token
    t' <= t with kv_mask_NC at its slot. A key mask narrower than the cache ([N, C'], C' < C:
    the Transformer's `attend_len`) reads the first C' slots only. The cache is read once and
    not written here: new_kv = (k [N, J, W, T], v [N, J, T, W]) in the cache dtype, which the
    caller writes (`layers.write_cache`).
  * `prefill` (a module attribute): the cache path at slot 0 of an empty cache (no cached
    slot is visible), computed as the self-attention of the first case.
  New keys and values are rounded to the cache dtype before they are attended to, so a token
  sees its own key as later steps read it from the cache.
  """
  config: ModelConfig
  prefill: bool = False

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
    q_NTHW = nn.with_logical_constraint(
        q_NTHW, ("activation_batch", "activation_length", "activation_heads", None))
    N, T = x.shape[:2]
    q_NTJQW = q_NTHW.reshape(N, T, J, Q, W)
    if layer_cache is not None:  # as the cache will hold them
      k_NTJW = k_NTJW.astype(layer_cache.k.dtype).astype(dt)
      v_NTJW = v_NTJW.astype(layer_cache.v.dtype).astype(dt)
      new_kv = (jnp.transpose(k_NTJW, (0, 2, 3, 1)).astype(layer_cache.k.dtype),
                jnp.swapaxes(v_NTJW, 1, 2).astype(layer_cache.v.dtype))
    else:
      new_kv = None

    if layer_cache is None or self.prefill:
      seg_NT = kv_mask_NC[:, :T] if segment_ids_NT is None else segment_ids_NT
      out_NTJQW = attention_lib.attend(q_NTJQW, k_NTJW, v_NTJW, seg_NT,
                                       impl=cfg.attention_impl, dtype=dt, precision=prec,
                                       packed=segment_ids_NT is not None)
      return self._out(out_NTJQW.reshape(N, T, H, W), wo, prec), new_kv
    return self._out(self._cached(q_NTJQW, k_NTJW, v_NTJW, kv_mask_NC, layer_cache,
                                  cache_index, prec), wo, prec), new_kv

  def _cached(self, q_NTJQW, k_NTJW, v_NTJW, kv_mask_NC, layer_cache, cache_index, prec):
    """Attention of T new tokens over the cached slots before cache_index and each other:
    [N, T, H, W]. Queries are grouped per key/value head, [N, J, I, W] with I = Q*T (row
    q*T + t), so every product is a batched matmul over (batch row, key/value head) reading the
    cache in place."""
    N, T, J, Q, W = q_NTJQW.shape
    dt = q_NTJQW.dtype
    # The key mask's width C is what is read: a prefix window of a longer cache (the
    # Transformer's `attend_len`) is a static slice, which XLA fuses into the reads below.
    C = kv_mask_NC.shape[1]
    keys_NJWC, values_NJCW = layer_cache.k[..., :C], layer_cache.v[:, :, :C]
    keys_NJWC, values_NJCW = keys_NJWC.astype(dt), values_NJCW.astype(dt)
    q_NJIW = jnp.transpose(q_NTJQW, (0, 2, 3, 1, 4)).reshape(N, J, Q * T, W)
    index_N1 = jnp.reshape(cache_index, (-1, 1))  # [1, 1], or [N, 1] per row (T = 1)
    old_NC = kv_mask_NC.astype(bool) & (jnp.arange(C, dtype=jnp.int32)[None] < index_N1)
    if jnp.ndim(cache_index):
      new_NT = jnp.take_along_axis(kv_mask_NC, index_N1, axis=1)
    else:
      new_NT = jax.lax.dynamic_slice_in_dim(kv_mask_NC, cache_index, T, axis=1)
    new_NTT = new_NT.astype(bool)[:, None, :] & jnp.tri(T, dtype=bool)[None]
    if T == 1:  # decode: reductions XLA fuses with the layer's cache slice (read once)
      s_old = jnp.sum(q_NJIW[..., None].astype(jnp.float32) * keys_NJWC[:, :, None], axis=3)
    else:
      s_old = jnp.einsum("njiw,njwc->njic", q_NJIW, keys_NJWC, precision=prec,
                         preferred_element_type=jnp.float32)
    s_new = jnp.einsum("njiw,ntjw->njit", q_NJIW, k_NTJW, precision=prec,
                       preferred_element_type=jnp.float32)
    s_old = jnp.where(old_NC[:, None, None], s_old * (W ** -0.5), _MASK_VALUE)
    s_new = jnp.where(jnp.tile(new_NTT, (1, Q, 1))[:, None], s_new * (W ** -0.5), _MASK_VALUE)
    probs = jax.nn.softmax(jnp.concatenate([s_old, s_new], axis=-1), axis=-1).astype(dt)
    if T == 1:
      old = jnp.sum(probs[..., :C, None] * values_NJCW[:, :, None], axis=3)
    else:
      old = jnp.einsum("njic,njcw->njiw", probs[..., :C], values_NJCW, precision=prec)
    out_NJIW = old + jnp.einsum("njit,ntjw->njiw", probs[..., C:], v_NTJW, precision=prec)
    return jnp.transpose(out_NJIW.reshape(N, J, Q, T, W), (0, 3, 1, 2, 4)).reshape(N, T, J * Q, W)

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
