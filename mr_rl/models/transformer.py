"""Flax Linen decoder for Qwen3 (dense), Llama 3.x / DeepSeek-Math and Qwen3-MoE.

Pre-norm blocks: h = x + Attn(RMSNorm(x)); y = h + MLP_or_MoE(RMSNorm(h)); final RMSNorm and
an lm head (tied to the embedding or separate). Explicit params, explicit KV cache (one
LayerCache per layer, see `layers.init_cache`), explicit positions so left-padded batches work.

Shape letters in this module: B batch rows (one sequence each; in a rollout one row per sampled
response, i.e. METHODS.md's B*G rows), T positions fed in this call, S key/value slots (T
without a cache, the cache length S_max with one), D model width, V vocabulary. Attention's
own letters are defined in `layers`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.models.config import ModelConfig
from mr_rl.models.layers import (MLP, Attention, LayerCache, RMSNorm, cache_length,
                                 param_with_axes, precision_of)
from mr_rl.models.moe import MoEBlock

_RESID_AXES = ("activation_batch", "activation_length", "activation_embed")


def positions_from_mask(mask_BT: jax.Array) -> jax.Array:
  """Position ids for a left-padded batch: clip(cumsum(mask) - 1, 0), int32 [B, T]."""
  return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=-1) - 1, 0)


class Block(nn.Module):
  """One pre-norm decoder layer."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, positions_BT, kv_mask_BS, layer_cache, cache_index,
               segment_ids_BT=None):
    cfg = self.config
    h = RMSNorm(cfg.norm_eps, cfg.param_dtype, name="attn_norm")(x_BTD)
    a, new_cache = Attention(cfg, name="attn")(h, positions_BT, kv_mask_BS, layer_cache,
                                               cache_index, segment_ids_BT)
    x = nn.with_logical_constraint(x_BTD + a, _RESID_AXES)
    h = RMSNorm(cfg.norm_eps, cfg.param_dtype, name="mlp_norm")(x)
    m = MoEBlock(cfg, name="mlp")(h) if cfg.is_moe else MLP(cfg, name="mlp")(h)
    return nn.with_logical_constraint(x + m, _RESID_AXES), new_cache


class Transformer(nn.Module):
  """Decoder-only LM.

  __call__(tokens_BT, positions_BT, *, kv_mask_BS=None, cache=None, cache_index=None,
           return_hidden=False, segment_ids_BT=None) -> (logits_BTV, new_cache[, hidden_BTD])

  * cache None (training / scoring): causal attention over the T tokens; kv_mask_BS ([B, T],
    default all ones) is 1 on real tokens, 0 on padding; padded keys are never attended to.
    new_cache is None. `segment_ids_BT` (int, packed rows: several sequences per row) also
    restricts every query to the keys of its own segment (positions must restart per segment).
  * cache given (a tuple of LayerCache, see `layers.LayerCache`): the T new K/V are written
    at slots [cache_index, cache_index + T); query t attends to slot s iff kv_mask_BS[b, s]
    ([B, S_max], set by the caller for the new slots) and s <= cache_index + t.
  hidden_BTD is the final-normed hidden state (input of the lm head).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BT, positions_BT, *, kv_mask_BS=None, cache=None, cache_index=None,
               return_hidden=False, segment_ids_BT=None):
    cfg = self.config
    if tokens_BT.ndim != 2 or positions_BT.shape != tokens_BT.shape:
      raise ValueError(f"tokens_BT must be [B, T] and positions_BT the same shape; got "
                       f"{tokens_BT.shape} and {positions_BT.shape}")
    B, T = tokens_BT.shape
    if segment_ids_BT is not None and (cache is not None or segment_ids_BT.shape != (B, T)):
      raise ValueError(f"segment_ids_BT must be [B, T] = {(B, T)} and used without a cache; got "
                       f"{segment_ids_BT.shape}, cache {'given' if cache is not None else 'None'}")
    if cache is None:
      if cache_index is not None:
        raise ValueError("cache_index given without a cache")
      S = T
    else:
      if len(cache) != cfg.n_layers:
        raise ValueError(f"cache has {len(cache)} layers, model has {cfg.n_layers}")
      if cache_index is None:
        raise ValueError("cache given without cache_index")
      S = cache_length(cache)
      if cache[0].k.shape[0] != B:
        raise ValueError(f"cache batch {cache[0].k.shape[0]} != tokens batch {B}")
      if T > S:
        raise ValueError(f"writing {T} tokens into a KV cache of max_len {S}: the prompt is "
                         "longer than the cache (use a larger max_len in init_cache)")
      if isinstance(cache_index, (int, np.integer)) and not 0 <= cache_index <= S - T:
        raise ValueError(f"cache write beyond max_len: cache_index={cache_index} + {T} new "
                         f"tokens > cache max_len {S}")
      cache_index = jnp.asarray(cache_index, jnp.int32)
    if kv_mask_BS is None:
      if cache is not None:
        raise ValueError("kv_mask_BS is required with a cache (1 on filled real slots)")
      kv_mask_BS = jnp.ones((B, T), jnp.int32)
    elif kv_mask_BS.shape != (B, S):
      raise ValueError(f"kv_mask_BS must have shape {(B, S)}, got {kv_mask_BS.shape}")

    emb = param_with_axes(self, "embedding", nn.initializers.normal(0.02),
                          (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), cfg.param_dtype)
    x = jnp.take(emb, tokens_BT, axis=0).astype(cfg.dtype)
    x = nn.with_logical_constraint(x, _RESID_AXES)
    block_cls = nn.remat(Block) if cfg.remat else Block
    new_cache = []
    for i in range(cfg.n_layers):
      layer_cache = None if cache is None else cache[i]
      x, c = block_cls(cfg, name=f"layers_{i}")(x, positions_BT, kv_mask_BS, layer_cache,
                                                 cache_index, segment_ids_BT)
      new_cache.append(c)
    h = RMSNorm(cfg.norm_eps, cfg.param_dtype, name="final_norm")(x)
    prec = precision_of(cfg)
    if cfg.tie_embeddings:
      logits = jnp.einsum("btd,vd->btv", h, emb.astype(cfg.dtype), precision=prec,
                          preferred_element_type=cfg.logits_dtype)
    else:
      w = param_with_axes(self, "lm_head", nn.initializers.normal(0.02),
                          (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), cfg.param_dtype)
      logits = jnp.einsum("btd,dv->btv", h, w.astype(cfg.dtype), precision=prec,
                          preferred_element_type=cfg.logits_dtype)
    logits = nn.with_logical_constraint(
        logits.astype(cfg.logits_dtype),
        ("activation_batch", "activation_length", "activation_vocab"))
    new_cache = None if cache is None else tuple(new_cache)
    if return_hidden:
      return logits, new_cache, h
    return logits, new_cache


def init_params(model: Transformer, rng: jax.Array, batch_size: int = 1, seq_len: int = 8):
  """Random params (plain arrays, jitted init: the same values `sharding.init_sharded` creates
  on any mesh)."""
  tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
  init = jax.jit(lambda key: nn.meta.unbox(model.init(key, tokens, tokens)["params"]))
  return init(rng)


def abstract_params(model: Transformer, boxed: bool = False):
  """Param shapes/dtypes via jax.eval_shape (no memory). boxed=True keeps logical axis metadata."""
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  variables = jax.eval_shape(lambda t: model.init(jax.random.PRNGKey(0), t, t), tokens)
  params = variables["params"]
  return params if boxed else nn.meta.unbox(params)


def count_params(config: ModelConfig) -> int:
  """Number of parameters of a config, from jax.eval_shape (allocates nothing)."""
  shapes = abstract_params(Transformer(config))
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))


def positions_from_segments(segment_ids_BT: jax.Array) -> jax.Array:
  """Position ids of packed rows: 0 at the first token of each segment (a run of equal ids),
  counting up within it, int32 [B, T]."""
  seg = jnp.asarray(segment_ids_BT)
  idx = jnp.broadcast_to(jnp.arange(seg.shape[1], dtype=jnp.int32), seg.shape)
  start = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  return idx - jax.lax.cummax(jnp.where(start, idx, 0), axis=1)


def logits(model: Transformer, params, tokens_BT: jax.Array, mask_BT: jax.Array | None = None,
           segment_ids_BT: jax.Array | None = None):
  """Full-sequence logits [B, T, V] for a left-padded batch (mask 1 on real tokens), or for
  packed rows (`segment_ids_BT`: 1, 2, ... per sequence, 0 on padding; positions restart and
  attention stays within each segment).

  Values at padded positions are finite but meaningless.
  """
  if mask_BT is None:
    mask_BT = jnp.ones(tokens_BT.shape, jnp.int32)
  if mask_BT.shape != tokens_BT.shape:
    raise ValueError(f"mask_BT shape {mask_BT.shape} != tokens_BT shape {tokens_BT.shape}")
  if segment_ids_BT is None:
    out, _ = model.apply({"params": params}, tokens_BT, positions_from_mask(mask_BT),
                         kv_mask_BS=mask_BT)
    return out
  out, _ = model.apply({"params": params}, tokens_BT, positions_from_segments(segment_ids_BT),
                       kv_mask_BS=mask_BT, segment_ids_BT=segment_ids_BT)
  return out
