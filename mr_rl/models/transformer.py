"""Flax Linen decoder for Qwen3 (dense), Llama 3.x / DeepSeek-Math and Qwen3-MoE.

Pre-norm blocks: h = x + Attn(RMSNorm(x)); y = h + MLP_or_MoE(RMSNorm(h)); final RMSNorm and
an lm head (tied to the embedding or separate). Explicit params, explicit KV cache (one
`layers.LayerCache` of stacked [L, ...] arrays), explicit positions so left-padded batches work.

The L decoder blocks run under one `nn.scan` over stacked parameters (params['layers'][...]
with a leading layer axis, logical name 'layers'; MaxText's `scan_layers`): every program holds
one copy of the block whatever the depth, so compile time and program size do not grow with
L (docs/accelerators.md, "Compile model"). With `remat` the scanned block is rematerialised in
the backward pass (one block's activations kept per layer boundary).

Shape letters (docs/shapes.md): N rows (one sequence each; in a rollout one row per sampled
response), T positions fed in this call, C key/value slots (T without a cache, the cache
length with one), D model width, V vocabulary, L layers; attention's further letters are
listed in `layers`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.models.config import ModelConfig
from mr_rl.models.layers import (MLP, Attention, LayerCache, RMSNorm, cache_batch, cache_length,
                                 param_with_axes, precision_of, prefill_layer, write_cache)
from mr_rl.models.moe import MoEBlock

_RESID_AXES = ("activation_batch", "activation_length", "activation_embed")
LAYERS = "layers"  # the scanned block's parameter name and the layer axis's logical name


def positions_from_mask(mask_NT: jax.Array) -> jax.Array:
  """Position ids for a left-padded batch: clip(cumsum(mask) - 1, 0), int32 [N, T]."""
  return jnp.maximum(jnp.cumsum(mask_NT.astype(jnp.int32), axis=-1) - 1, 0)


class Block(nn.Module):
  """One pre-norm decoder layer, in the scan's form: (x, this layer's cache slice, broadcast
  inputs) -> (x, this layer's new K/V or None).

  With `prefill` (cache_index 0 of an empty cache, which attention does not read) the form is
  ((x, the whole cache), this layer's index, ...) -> ((x, the cache with this layer's new K/V
  written in place, `layers.prefill_layer`), None): the prefill's K/V go straight into the
  cache, not through a stacked [L, ...] copy of their own (XLA:TPU's memory report,
  docs/accelerators.md).
  """
  config: ModelConfig
  prefill: bool = False

  @nn.compact
  def __call__(self, x_NTD, layer_cache, positions_NT, kv_mask_NC, cache_index,
               segment_ids_NT=None):
    cfg = self.config
    if self.prefill:
      (x_NTD, cache), layer = x_NTD, layer_cache
      layer_cache = cache  # attention reads only its dtypes (the prefill reads no slot)
    h = RMSNorm(cfg.norm_eps, cfg.param_dtype, name="attn_norm")(x_NTD)
    a, new_kv = Attention(cfg, self.prefill, name="attn")(h, positions_NT, kv_mask_NC,
                                                          layer_cache, cache_index,
                                                          segment_ids_NT)
    x = nn.with_logical_constraint(x_NTD + a, _RESID_AXES)
    h = RMSNorm(cfg.norm_eps, cfg.param_dtype, name="mlp_norm")(x)
    m = MoEBlock(cfg, name="mlp")(h) if cfg.is_moe else MLP(cfg, name="mlp")(h)
    y = nn.with_logical_constraint(x + m, _RESID_AXES)
    if self.prefill:
      return (y, prefill_layer(cache, layer, *new_kv)), None
    return y, new_kv


def _layer_stack(cfg: ModelConfig, prefill: bool):
  """The scanned decoder stack: nn.scan over L blocks, params (and LoRA adapters) stacked on a
  leading 'layers' axis, the cache sliced per layer, the other inputs broadcast."""
  block = nn.remat(Block, prevent_cse=False) if cfg.remat else Block
  return nn.scan(block, variable_axes={"params": 0, "lora": 0}, split_rngs={"params": True},
                 in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                 length=cfg.n_layers, metadata_params={nn.PARTITION_NAME: LAYERS})(
                     cfg, prefill, name=LAYERS)


class Transformer(nn.Module):
  """Decoder-only LM.

  __call__(tokens_NT, positions_NT, *, kv_mask_NC=None, cache=None, cache_index=None,
           return_hidden=False, segment_ids_NT=None, head_start=0, attend_len=None)
    -> (logits, new_cache[, hidden_NTD]), logits [N, T - head_start, V]

  * cache None (training / scoring): causal attention over the T tokens; kv_mask_NC ([N, T],
    default all ones) is 1 on real tokens, 0 on padding; padded keys are never attended to.
    new_cache is None. `segment_ids_NT` (int, packed rows: several sequences per row) also
    restricts every query to the keys of its own segment (positions must restart per segment).
  * cache given (a LayerCache, see `layers.LayerCache`): the T new K/V are written at slots
    [cache_index, cache_index + T); query t attends to slot c iff kv_mask_NC[n, c] ([N, C], set
    by the caller for the new slots) and c <= cache_index + t. A cache_index given as the
    Python int 0 is a prefill into an empty cache: it runs the self-attention kernel of the
    first case (`attention_impl`) and never reads the cache. With T = 1, cache_index may be
    [N], one slot per row (the continuous engine: every slot at its own step).
    `attend_len` (a static int, default C) narrows what attention reads to the cache's first
    attend_len slots, a prefix window that must hold the new tokens' slots (a scalar
    cache_index): the static sampler allocates its cache once at full length and decodes in
    segments whose attention reads only the filled prefix, while the writes still go in
    place into the full cache.
  hidden_NTD is the final-normed hidden state (input of the lm head), for every column.
  The lm head runs on columns [head_start, T) only (a static int): column j of the logits is
  position head_start + j (the policy step's response window,
  `mr_rl.rl.batch.LearnerBatch.response_start`).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_NT, positions_NT, *, kv_mask_NC=None, cache=None, cache_index=None,
               return_hidden=False, segment_ids_NT=None, head_start=0, attend_len=None):
    cfg = self.config
    if tokens_NT.ndim != 2 or positions_NT.shape != tokens_NT.shape:
      raise ValueError(f"tokens_NT must be [N, T] and positions_NT the same shape; got "
                       f"{tokens_NT.shape} and {positions_NT.shape}")
    N, T = tokens_NT.shape
    if not isinstance(head_start, (int, np.integer)) or not 0 <= head_start < T:
      raise ValueError(f"head_start must be a static int in [0, T={T}), got {head_start!r}")
    if segment_ids_NT is not None and (cache is not None or segment_ids_NT.shape != (N, T)):
      raise ValueError(f"segment_ids_NT must be [N, T] = {(N, T)} and used without a cache; got "
                       f"{segment_ids_NT.shape}, cache {'given' if cache is not None else 'None'}")
    prefill = False
    cache_index_arg = cache_index
    if cache is None:
      if cache_index is not None:
        raise ValueError("cache_index given without a cache")
      C = T
    else:
      if not isinstance(cache, LayerCache):
        raise TypeError(f"cache must be a LayerCache of stacked [L, ...] arrays "
                        f"(layers.init_cache), got {type(cache).__name__}")
      if cache.k.shape[0] != cfg.n_layers:
        raise ValueError(f"cache has {cache.k.shape[0]} layers, model has {cfg.n_layers}")
      if cache_index is None:
        raise ValueError("cache given without cache_index")
      C = cache_length(cache)
      if cache_batch(cache) != N:
        raise ValueError(f"cache batch {cache_batch(cache)} != tokens batch {N}")
      if T > C:
        raise ValueError(f"writing {T} tokens into a KV cache of max_len {C}: the prompt is "
                         "longer than the cache (use a larger max_len in init_cache)")
      if isinstance(cache_index, (int, np.integer)):
        if not 0 <= cache_index <= C - T:
          raise ValueError(f"cache write beyond max_len: cache_index={cache_index} + {T} new "
                           f"tokens > cache max_len {C}")
        prefill = int(cache_index) == 0
      cache_index = jnp.asarray(cache_index, jnp.int32)
      if cache_index.ndim and (cache_index.shape != (N,) or T != 1):
        raise ValueError(f"a per-row cache_index must be [N] = [{N}] with one new token per "
                         f"row; got shape {cache_index.shape} for T={T}")
    if kv_mask_NC is None:
      if cache is not None:
        raise ValueError("kv_mask_NC is required with a cache (1 on filled real slots)")
      kv_mask_NC = jnp.ones((N, T), jnp.int32)
    elif kv_mask_NC.shape != (N, C):
      raise ValueError(f"kv_mask_NC must have shape {(N, C)}, got {kv_mask_NC.shape}")
    if attend_len is not None:
      if cache is None or jnp.ndim(cache_index) or not isinstance(attend_len, (int, np.integer)):
        raise ValueError("attend_len must be a static int, given with a cache and a scalar "
                         f"cache_index; got {attend_len!r}")
      if not T <= attend_len <= C:
        raise ValueError(f"attend_len must be in [T={T}, C={C}], got {attend_len}")
      if isinstance(cache_index_arg, (int, np.integer)) and cache_index_arg + T > attend_len:
        raise ValueError(f"the new tokens' slots [{cache_index_arg}, {cache_index_arg + T}) lie "
                         f"beyond attend_len={attend_len}")
      # Attention reads the first attend_len slots only (layers.Attention slices each layer's
      # cache to the key mask's width); the writes below still go into the full cache.
      kv_mask_NC = kv_mask_NC[:, :int(attend_len)]

    emb = param_with_axes(self, "embedding", nn.initializers.normal(0.02),
                          (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), cfg.param_dtype)
    x = jnp.take(emb, tokens_NT, axis=0).astype(cfg.dtype)
    x = nn.with_logical_constraint(x, _RESID_AXES)
    if prefill:  # each layer writes its K/V into the cache in place (Block)
      (x, new_cache), _ = _layer_stack(cfg, prefill)(
          (x, cache), jnp.arange(cfg.n_layers, dtype=jnp.int32), positions_NT, kv_mask_NC,
          cache_index, segment_ids_NT)
    else:
      x, new_kv = _layer_stack(cfg, prefill)(x, cache, positions_NT, kv_mask_NC, cache_index,
                                             segment_ids_NT)
      new_cache = None if cache is None else write_cache(cache, *new_kv, cache_index)
    h = RMSNorm(cfg.norm_eps, cfg.param_dtype, name="final_norm")(x)
    h_head = h[:, int(head_start):] if head_start else h
    prec = precision_of(cfg)
    if cfg.tie_embeddings:
      logits = jnp.einsum("ntd,vd->ntv", h_head, emb.astype(cfg.dtype), precision=prec,
                          preferred_element_type=cfg.logits_dtype)
    else:
      w = param_with_axes(self, "lm_head", nn.initializers.normal(0.02),
                          (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), cfg.param_dtype)
      logits = jnp.einsum("ntd,dv->ntv", h_head, w.astype(cfg.dtype), precision=prec,
                          preferred_element_type=cfg.logits_dtype)
    logits = nn.with_logical_constraint(
        logits.astype(cfg.logits_dtype),
        ("activation_batch", "activation_length", "activation_vocab"))
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


def positions_from_segments(segment_ids_NT: jax.Array) -> jax.Array:
  """Position ids of packed rows: 0 at the first token of each segment (a run of equal ids),
  counting up within it, int32 [N, T]."""
  seg = jnp.asarray(segment_ids_NT)
  idx = jnp.broadcast_to(jnp.arange(seg.shape[1], dtype=jnp.int32), seg.shape)
  start = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  return idx - jax.lax.cummax(jnp.where(start, idx, 0), axis=1)


def logits(model: Transformer, params, tokens_NT: jax.Array, mask_NT: jax.Array | None = None,
           segment_ids_NT: jax.Array | None = None, *, head_start: int = 0):
  """Full-sequence logits [N, T, V] for a left-padded batch (mask 1 on real tokens), or for
  packed rows (`segment_ids_NT`: 1, 2, ... per sequence, 0 on padding; positions restart and
  attention stays within each segment). With `head_start` (a static int) the trunk still runs
  over all T columns but the lm head only over columns [head_start, T): [N, T - head_start, V].

  `params` may be a LoRA policy (`mr_rl.models.lora.Adapted`: base plus adapters).
  Values at padded positions are finite but meaningless.
  """
  if mask_NT is None:
    mask_NT = jnp.ones(tokens_NT.shape, jnp.int32)
  if mask_NT.shape != tokens_NT.shape:
    raise ValueError(f"mask_NT shape {mask_NT.shape} != tokens_NT shape {tokens_NT.shape}")
  from mr_rl.models import lora  # local import: lora reads the model's layout
  variables = lora.variables_of(params)
  if segment_ids_NT is None:
    out, _ = model.apply(variables, tokens_NT, positions_from_mask(mask_NT), kv_mask_NC=mask_NT,
                         head_start=head_start)
    return out
  out, _ = model.apply(variables, tokens_NT, positions_from_segments(segment_ids_NT),
                       kv_mask_NC=mask_NT, segment_ids_NT=segment_ids_NT, head_start=head_start)
  return out


# ------------------------------------------------------------------ per-layer <-> stacked layout
def _is_layer_dict(x, key: str) -> bool:
  return hasattr(x, "keys") and key in x


def _slice_leaf(x, i: int):
  """Layer i of a stacked leaf (an array, or a ShapeDtypeStruct with its sharding)."""
  if isinstance(x, jax.ShapeDtypeStruct):
    sh = x.sharding
    if isinstance(sh, jax.sharding.NamedSharding):
      sh = jax.sharding.NamedSharding(sh.mesh, jax.sharding.PartitionSpec(*tuple(sh.spec)[1:]))
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=sh)
  return x[i]


def layer_of(tree, i: int):
  """Layer i of a stacked subtree (arrays, or ShapeDtypeStructs keeping their sharding)."""
  return jax.tree.map(lambda a: _slice_leaf(a, i), tree)


def unstack_layers(tree, n_layers: int):
  """`tree` with every {'layers': stacked block} replaced by {'layers_0': block 0, ...,
  'layers_{L-1}': ...}: the per-layer layout of decoders before the layer scan (old checkpoints;
  the order `tiny_assets.host_params` draws weights in). Works on params, adapters, optimizer states
  and train states (any pytree holding such dicts), of arrays or ShapeDtypeStructs."""
  def fix(x):
    if not _is_layer_dict(x, LAYERS):
      return x
    out = {k: v for k, v in x.items() if k != LAYERS}
    for i in range(n_layers):
      out[f"{LAYERS}_{i}"] = jax.tree.map(lambda a, i=i: _slice_leaf(a, i), x[LAYERS])
    return out
  return jax.tree.map(fix, tree, is_leaf=lambda x: _is_layer_dict(x, LAYERS))


def stack_layers(tree, n_layers: int):
  """The inverse of `unstack_layers`: per-layer blocks 'layers_0' ... stacked into 'layers'
  (arrays along a new leading axis)."""
  first = f"{LAYERS}_0"

  def fix(x):
    if not _is_layer_dict(x, first):
      return x
    names = [f"{LAYERS}_{i}" for i in range(n_layers)]
    missing = [n for n in names if n not in x]
    if missing:
      raise ValueError(f"per-layer tree lacks {missing[:4]} (a {n_layers}-layer model)")
    out = {k: v for k, v in x.items() if not (k.startswith(f"{LAYERS}_") and k[7:].isdigit())}
    out[LAYERS] = jax.tree.map(lambda *xs: jnp.stack(xs), *[x[n] for n in names])
    return out
  return jax.tree.map(fix, tree, is_leaf=lambda x: _is_layer_dict(x, first))

