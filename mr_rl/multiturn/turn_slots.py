"""The slot programs of multi-turn rollouts: the engine's (`mr_rl.sampling.slots`) plus
`append`, which prefills an observation into one paused slot (docs/multiturn.md).

Shape letters (docs/shapes.md): N slots, S response columns (the slot's whole turn budget:
sampled and observation tokens), C = P + S key columns, A the observation bucket (the
`append` program's width), L, J, W as in the model.

A slot's response columns hold the trajectory after its prompt: each turn's sampled tokens,
then the observation's tokens, in order. The decode step feeds `x` (the last token) at key
column P - 1 + s and samples column s; a turn ends when the slot samples an end-of-turn id
(the programs' `eos_ids`), which leaves the slot paused (not live) at s = s_end with
`x` = that id. `append(slot, ids, n)` then feeds [x, ids[0], ..., ids[n - 2]] at key columns
P - 1 + s_end ... P - 2 + s_end + n (positions continuing the slot's), writes the n ids into
response columns [s_end, s_end + n) with log-prob 0, and resumes the slot at s_end + n with
x = ids[n - 1]: the next decode step samples the first token of the next turn. The prompt
and earlier turns stay in the cache; nothing is prefilled twice.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mr_rl import compilation
from mr_rl.models import LayerCache
from mr_rl.sampling.slots import SlotPrograms, SlotState


class TurnPrograms(SlotPrograms):
  """`SlotPrograms` with `append` (module docstring); the same arguments."""

  def __init__(self, model, **kw):
    super().__init__(model, **kw)
    self.append = jax.jit(compilation.program("engine_append", self._wrap(self._append)),
                          donate_argnums=1)

  def _append(self, params, state: SlotState, slot, ids_A, n) -> SlotState:
    """Prefills observation ids_A[:n] into paused slot `slot` (int32 scalars slot, n with
    1 <= n <= A; the host checks s_end + n < S)."""
    a = ids_A.shape[0]
    n_new = self.max_new_tokens
    cols = state.kv_mask.shape[1]
    bucket = cols - n_new
    s = state.s[slot]
    col0 = bucket - 1 + s
    feed_A = jnp.concatenate([state.x[slot][None], ids_A[:-1]])
    pos_A = state.length[slot] - 1 + s + jnp.arange(a, dtype=jnp.int32)
    # The slot's cache with A spare columns, so the A-wide write never runs past C (the
    # columns past s_end + n hold padding's keys, dropped below or hidden by the key mask).
    one = LayerCache(
        k=jnp.pad(state.cache.k[:, slot][:, None], ((0, 0),) * 4 + ((0, a),)),
        v=jnp.pad(state.cache.v[:, slot][:, None], ((0, 0),) * 3 + ((0, a), (0, 0))))
    span = jnp.arange(cols + a)
    kv_mask = jnp.pad(state.kv_mask[slot], (0, a)) | ((span >= col0) & (span < col0 + n))
    _, one = self.model.apply({"params": params}, feed_A[None], pos_A[None],
                              kv_mask_NC=kv_mask[None], cache=one, cache_index=col0)
    cache = LayerCache(k=state.cache.k.at[:, slot].set(one.k[:, 0, ..., :cols]),
                       v=state.cache.v.at[:, slot].set(one.v[:, 0, :, :cols]))
    j_S = jnp.arange(n_new)
    obs_S = (j_S >= s) & (j_S < s + n)
    ids_S = ids_A[jnp.clip(j_S - s, 0, a - 1)]
    return state.replace(
        cache=self._cache_sharded(cache),
        kv_mask=state.kv_mask.at[slot].set(kv_mask[:cols]),
        x=state.x.at[slot].set(ids_A[n - 1]),
        s=state.s.at[slot].set(s + n),
        live=state.live.at[slot].set(True),
        eos=state.eos.at[slot].set(False),
        tokens=state.tokens.at[slot].set(jnp.where(obs_S, ids_S, state.tokens[slot])),
        logprobs=state.logprobs.at[slot].set(jnp.where(obs_S, 0.0, state.logprobs[slot])))
