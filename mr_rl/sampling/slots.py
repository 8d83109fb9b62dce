"""Device side of the continuous engine (`engine.py`): a pool of decode slots and its programs.

Shape letters (docs/shapes.md): N the decode slots (the rows the model is given at a decode
step; the engine's `slots`), P prompt columns (the rollout's prompt bucket), S response
columns (`max_new_tokens`), C = P + S cache slots of one decode slot, V vocabulary, L layers,
J key/value heads, W head width. A prompt store entry is indexed by `e`, one of 2 * M entries
(M prompts prefilled per call, `SlotPrograms.prefill_prompts`).

Layout of a slot (the static sampler's layout of one row, `sampler.py`): the row's prompt,
left-padded to P, fills cache columns [0, P - 1) (its last token is fed at decode step 0);
decode step s feeds one token at cache column P - 1 + s and RoPE position len - 1 + s (len =
the real prompt length) and writes response column s. Every slot has its own step s, so the
model takes one cache index per slot (`Transformer`'s per-row `cache_index`): the matmuls are
batched over all slots, each slot's attention masks the columns past its own, and the new keys
and values are written into the stacked cache in place, slot by slot (`layers.write_rows`; one
scatter made XLA:TPU copy the cache in and out of every `step` call). (A `jax.vmap` of the
model over slots, the earlier form, made XLA copy the layer-stacked cache: 5x its size in
temporaries at a 1.7B pool.) Every program is traced and run under the mesh
(`MeshProgram`), so Pallas kernels sit in their shard_map: docs/accelerators.md, "Continuous
engine on TPU".

Four jitted programs, each compiled once per (slots, prompt bucket):
  * `prefill`: M prompts through the model once into one half of the prompt store (the G
    responses of a prompt share this prefill, `engine.py`);
  * `step`: first copies store entries into the slots the host assigned new rows (the prompt's
    P columns, its key mask, last token and length), then runs up to `steps_per_call` decode
    steps over all slots, stopping early once a slot is free while rows wait in the host's
    queue, so the host can refill it at once;
  * `gather`: the token and log-prob rows of up to `GATHER_ROWS` finished slots, replicated;
  * `shrink`: the live slots compacted into the pool of the next smaller size `shrink_at`
    (the engine's tail, once no rows are queued and at most that many slots are live).
Draws follow the per-row key schedule `processing.row_step_keys` (key, row, s): a row's tokens
do not depend on its slot or on when it was inserted.
"""

from __future__ import annotations

import functools
from typing import Optional

import chex
import flax
import jax
import jax.numpy as jnp

from mr_rl import compilation
from mr_rl.models import LayerCache, init_cache, positions_from_mask
from mr_rl.models.layers import cache_batch, cache_length, write_rows
from mr_rl.sampling import processing

# Finished slots read out per `gather` call (fixed, so the program compiles once).
GATHER_ROWS = 8


@flax.struct.dataclass
class SlotState:
  """The slot pool, carried from call to call (donated to `step`).

  Attributes:
    cache: LayerCache(k [L, N, J, W, C], v [L, N, J, C, W]) (layers stacked).
    kv_mask: bool [N, C], filled real key columns of each slot.
    x: int32 [N], the token fed at the slot's next step.
    length: int32 [N], real prompt length of the slot's row.
    s: int32 [N], the slot's decode step (response column written next; tokens generated so far).
    row: int32 [N], rollout row in the slot (-1: never used).
    live: bool [N], the slot decodes an unfinished row.
    eos: bool [N], the slot's row ended with an EOS token.
    tokens: int32 [N, S], the slot's response so far (valid in [0, s)).
    logprobs: float32 [N, S], their temperature-1 policy log-probs.
    key: the rollout's base PRNG key.
  """
  cache: tuple
  kv_mask: jax.Array
  x: jax.Array
  length: jax.Array
  s: jax.Array
  row: jax.Array
  live: jax.Array
  eos: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  key: jax.Array


@flax.struct.dataclass
class PromptStore:
  """Prefilled prompts, 2 * M entries (two halves written in turn by `prefill`).

  Attributes:
    cache: LayerCache(k [L, 2M, J, W, P], v [L, 2M, J, P, W]); columns [0, P - 1) filled.
    mask: bool [2M, P], the prompt masks (left-padded).
    last: int32 [2M], the last prompt token (fed at decode step 0).
    length: int32 [2M], real prompt lengths.
  """
  cache: tuple
  mask: jax.Array
  last: jax.Array
  length: jax.Array


def unpack_report(report, slots: int):
  """The host's view of `step`'s packed int32 report [3N + 2] (one transfer): live [N],
  tokens generated s [N], eos [N], decode steps run, busy slot-steps (live rows decoded)."""
  live, s, eos = (report[i * slots:(i + 1) * slots] for i in range(3))
  return live.astype(bool), s, eos.astype(bool), int(report[-2]), int(report[-1])


class MeshProgram:
  """A jitted program whose calls and lowerings run inside `sharding.activation_sharding(mesh,
  rules)`, so every trace sees the mesh (`jax.sharding.get_abstract_mesh()`) and the logical
  rules. The context is entered per call, not around the engine's host loop, whose generator
  yields to code that must not run under it. Other attributes are the jitted function's."""

  def __init__(self, jitted, mesh, rules):
    from mr_rl.models import sharding as shd
    self.jitted = jitted
    self._context = functools.partial(shd.activation_sharding, mesh, rules)

  def __call__(self, *args, **kwargs):
    with self._context():
      return self.jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with self._context():
      return self.jitted.lower(*args, **kwargs)

  def trace(self, *args, **kwargs):
    with self._context():
      return self.jitted.trace(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self.jitted, name)


class SlotPrograms:
  """The jitted programs of one engine (model, decode settings, slot count).

  Args:
    model: an `mr_rl.models.Transformer`.
    slots: N.
    max_new_tokens: S.
    sampling: `processing.SamplingParams`.
    eos_ids: tuple of EOS ids (may be empty).
    steps_per_call: the most decode steps one `step` call runs.
    refill_at: a call ends early once this many slots are free while rows are queued.
    shrink_at: with no rows queued, a call ends early once at most this many slots are live
      (the engine then compacts them into a pool of that size; 0: never).
    prefill_prompts: M, prompts prefilled per `prefill` call.
    cache_dtype: KV-cache dtype (None: the model's dtype).
    mesh, rules: optional device mesh and logical axis rules: slots, the store and the cache
      are split over the mesh's batch axes; reports and gathered rows are replicated.
    max_traces: chex.assert_max_traces bound for each program (None: unchecked); chex counts
      the traces of a program over all SlotPrograms built at the same place (the engine's
      pool sizes).
  """

  def __init__(self, model, *, slots: int, max_new_tokens: int,
               sampling: processing.SamplingParams, eos_ids: tuple, steps_per_call: int,
               refill_at: int, shrink_at: int, prefill_prompts: int, cache_dtype=None,
               mesh=None, rules=None, max_traces: Optional[int] = None):
    self.model = model
    self.slots = slots
    self.max_new_tokens = max_new_tokens
    self.sampling = sampling
    self.eos_ids = eos_ids
    self.steps_per_call = steps_per_call
    self.refill_at = refill_at
    self.shrink_at = shrink_at
    self.prefill_prompts = prefill_prompts
    self.cache_dtype = cache_dtype
    self.mesh = mesh
    self.rules = rules
    wrap = self._wrap = ((lambda f: f) if max_traces is None
                         else (lambda f: chex.assert_max_traces(f, n=max_traces)))
    self._init = functools.lru_cache(maxsize=None)(self._jit_init)
    named = lambda name, fn: compilation.program(f"engine_{name}", wrap(fn))
    self.prefill = self._on_mesh(jax.jit(named("prefill", self._prefill), donate_argnums=1))
    self.step = self._on_mesh(jax.jit(named("step", self._step), donate_argnums=1))
    self.gather = self._on_mesh(jax.jit(named("gather", self._gather)))
    self.shrink = self._on_mesh(jax.jit(named("shrink", self._shrink)))

  def _on_mesh(self, jitted):
    """`jitted`, called and lowered under the mesh's activation-sharding context (as
    `Sampler` runs its program): traced there, the model's logical constraints bind to the mesh
    and each Pallas attention kernel sits in its `shard_map` over the mesh
    (`mr_rl.models.attention`; XLA cannot partition a Mosaic kernel). As is without a mesh."""
    return jitted if self.mesh is None else MeshProgram(jitted, self.mesh, self.rules)

  # --------------------------------------------------------------------------- shardings
  def _batch_sharded(self, x, batch_axis_size: int):
    """Constrains x ([N, ...] or [2M, ...]) to the mesh's batch axes (if divisible) or
    replicates it."""
    if self.mesh is None:
      return x
    from mr_rl.models import sharding as shd
    if batch_axis_size % shd.data_parallel_size(self.mesh):
      return jax.lax.with_sharding_constraint(x, self._replicated())
    return jax.lax.with_sharding_constraint(x, shd.batch_sharding(self.mesh, x.shape, self.rules))

  def _cache_sharded(self, cache):
    if self.mesh is None:
      return cache
    from mr_rl.models import sharding as shd
    batch, length = cache_batch(cache), cache_length(cache)
    if batch % shd.data_parallel_size(self.mesh):
      return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, self._replicated()),
                          cache)
    return jax.lax.with_sharding_constraint(
        cache, shd.cache_shardings(self.model.config, self.mesh, batch, length, self.rules))

  def _replicated(self):
    from jax.sharding import NamedSharding, PartitionSpec
    return NamedSharding(self.mesh, PartitionSpec())

  def _replicate(self, tree):
    if self.mesh is None:
      return tree
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, self._replicated()), tree)

  # ----------------------------------------------------------------------------- programs
  def init(self, key: jax.Array, bucket: int):
    """A fresh slot pool (all slots free) and an empty prompt store for prompt bucket P."""
    return self._init(bucket)(key)

  def init_program(self, bucket: int):
    """The jitted program `init(key, bucket)` runs (e.g. to `.lower` it)."""
    return self._init(bucket)

  def _jit_init(self, bucket: int):
    rows, n_new, m2 = self.slots, self.max_new_tokens, 2 * self.prefill_prompts
    cfg = self.model.config

    def init(key):
      zeros = lambda shape, dtype: self._batch_sharded(jnp.zeros(shape, dtype), shape[0])
      state = SlotState(
          cache=self._cache_sharded(init_cache(cfg, rows, bucket + n_new, self.cache_dtype)),
          kv_mask=zeros((rows, bucket + n_new), jnp.bool_), x=zeros((rows,), jnp.int32),
          length=zeros((rows,), jnp.int32), s=zeros((rows,), jnp.int32),
          row=self._batch_sharded(jnp.full((rows,), -1, jnp.int32), rows),
          live=zeros((rows,), jnp.bool_), eos=zeros((rows,), jnp.bool_),
          tokens=zeros((rows, n_new), jnp.int32), logprobs=zeros((rows, n_new), jnp.float32),
          key=self._replicate(key))
      store = PromptStore(
          cache=self._cache_sharded(init_cache(cfg, m2, bucket, self.cache_dtype)),
          mask=zeros((m2, bucket), jnp.bool_), last=zeros((m2,), jnp.int32),
          length=zeros((m2,), jnp.int32))
      return state, store

    return self._on_mesh(jax.jit(compilation.program("engine_init", self._wrap(init))))

  def _prefill(self, params, store: PromptStore, tokens_MP, mask_MP, half) -> PromptStore:
    """Runs M prompts' first P - 1 tokens through the model into store entries
    [half * M, half * M + M) (`half`: int32 scalar, 0 or 1)."""
    m, bucket = tokens_MP.shape
    mask_MP = mask_MP.astype(jnp.bool_)
    cache = init_cache(self.model.config, m, bucket, self.cache_dtype)
    if bucket > 1:  # (a static cache_index 0: the self-attention kernel)
      _, cache = self.model.apply({"params": params}, tokens_MP[:, :-1],
                                  positions_from_mask(mask_MP)[:, :-1], kv_mask_NC=mask_MP,
                                  cache=cache, cache_index=0)
    start = half * m
    put = lambda dst, src, axis=0: jax.lax.dynamic_update_slice_in_dim(
        dst, src.astype(dst.dtype), start, axis=axis)
    return PromptStore(
        cache=self._cache_sharded(jax.tree.map(lambda d, c: put(d, c, 1), store.cache, cache)),
        mask=self._batch_sharded(put(store.mask, mask_MP), 2 * m),
        last=self._batch_sharded(put(store.last, tokens_MP[:, -1]), 2 * m),
        length=self._batch_sharded(put(store.length, jnp.sum(mask_MP, 1, dtype=jnp.int32)),
                                   2 * m))

  def _insert(self, state: SlotState, store: PromptStore, src_N, row_N) -> SlotState:
    """Slots with src_N >= 0 take store entry src_N and rollout row row_N."""
    ins_N = src_N >= 0
    e_N = jnp.maximum(src_N, 0)
    n_new = self.max_new_tokens

    def copy(c: LayerCache) -> LayerCache:
      # The prompt's P columns of every inserted slot, all layers at once, written slot by slot
      # in place (`write_rows`: a whole-pool select made XLA:TPU copy the cache); the other
      # columns keep stale entries of the slot's previous row, hidden by the key mask until
      # overwritten.
      p = store.cache
      prompts = self._cache_sharded(LayerCache(k=p.k[:, e_N], v=p.v[:, e_N]))  # [L, N, ..P..]
      return self._cache_sharded(write_rows(c, prompts.k, prompts.v,
                                            jnp.zeros_like(e_N), ins_N))

    cache = jax.lax.cond(jnp.any(ins_N), copy, lambda c: c, state.cache)
    pick = lambda new, old: jnp.where(ins_N.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
    kv_mask = pick(jnp.pad(store.mask[e_N], ((0, 0), (0, n_new))), state.kv_mask)
    return state.replace(
        cache=cache, kv_mask=kv_mask, x=pick(store.last[e_N], state.x),
        length=pick(store.length[e_N], state.length), s=pick(0, state.s),
        row=pick(row_N, state.row), live=state.live | ins_N, eos=pick(False, state.eos))

  def _decode_logits(self, params, x_N, pos_N, kv_mask_NC, cache, col_N):
    """One decode step of every slot: logits [N, V] and the cache with column col_N written
    (each slot at its own column: the model's per-row cache index)."""
    logits, cache = self.model.apply({"params": params}, x_N[:, None], pos_N[:, None],
                                     kv_mask_NC=kv_mask_NC, cache=cache, cache_index=col_N)
    return logits[:, 0], cache

  def _step(self, params, state: SlotState, store: PromptStore, plan):
    """Inserts the assigned rows, then decodes up to `steps_per_call` steps (see module doc).

    `plan`: int32 [2N + 1] (one transfer): the store entry for each slot (-1: no insert), the
    rollout row for each slot, and 1 iff rows are still queued after this plan. Returns the
    state and the packed report of `unpack_report`.
    """
    src_N, row_N, queued = plan[:self.slots], plan[self.slots:-1], plan[-1] > 0
    state = self._insert(state, store, src_N, row_N)
    rows, n_new = self.slots, self.max_new_tokens
    bucket = store.mask.shape[1]
    cols = bucket + n_new
    def cond(carry):
      st, i, _ = carry
      n_live = jnp.sum(st.live, dtype=jnp.int32)
      stop = jnp.where(queued, rows - n_live >= self.refill_at, n_live <= self.shrink_at)
      return (i < self.steps_per_call) & (n_live > 0) & ((i == 0) | ~stop)

    def body(carry):
      st, i, busy = carry
      busy = busy + jnp.sum(st.live, dtype=jnp.int32)
      col_N = bucket - 1 + st.s  # < C also for a finished slot (s <= S)
      kv_mask = st.kv_mask | (jnp.arange(cols)[None, :] == col_N[:, None])
      logits_NV, cache = self._decode_logits(params, st.x, st.length - 1 + st.s, kv_mask,
                                             st.cache, col_N)
      keys_N = processing.row_step_keys(st.key, jnp.maximum(st.row, 0), st.s)
      tok_N = processing.sample_tokens_rows(logits_NV, keys_N, self.sampling)
      lp_N = processing.token_log_probs(logits_NV, tok_N)
      write_NS = (jnp.arange(n_new)[None, :] == st.s[:, None]) & st.live[:, None]
      hit_N = jnp.zeros((rows,), jnp.bool_)
      for e in self.eos_ids:
        hit_N = hit_N | (tok_N == e)
      done_N = hit_N | (st.s + 1 >= n_new)
      st = st.replace(
          cache=self._cache_sharded(cache), kv_mask=kv_mask,
          x=jnp.where(st.live, tok_N, st.x),
          s=st.s + st.live.astype(jnp.int32),
          live=st.live & ~done_N, eos=st.eos | (st.live & hit_N),
          tokens=jnp.where(write_NS, tok_N[:, None], st.tokens),
          logprobs=jnp.where(write_NS, lp_N[:, None], st.logprobs))
      return st, i + 1, busy

    state, steps, busy = jax.lax.while_loop(cond, body, (state, jnp.int32(0), jnp.int32(0)))
    report = jnp.concatenate([state.live.astype(jnp.int32), state.s, state.eos.astype(jnp.int32),
                              jnp.stack([steps, busy])])
    return state, self._replicate(report)

  def _gather(self, state: SlotState, slots_m):
    """Token and log-prob rows of the slots `slots_m` (int32 [GATHER_ROWS]), replicated."""
    return self._replicate((state.tokens[slots_m], state.logprobs[slots_m]))

  def _shrink(self, state: SlotState, keep_n):
    """The slots `keep_n` (int32 [shrink_at], the live ones among them) as a smaller pool."""
    n = keep_n.shape[0]
    take = lambda a: self._batch_sharded(a[keep_n], n)
    return state.replace(
        cache=self._cache_sharded(jax.tree.map(lambda a: a[:, keep_n], state.cache)),
        kv_mask=take(state.kv_mask), x=take(state.x), length=take(state.length), s=take(state.s),
        row=take(state.row), live=take(state.live), eos=take(state.eos),
        tokens=take(state.tokens), logprobs=take(state.logprobs))
