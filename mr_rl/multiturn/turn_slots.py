"""The slot programs of multi-turn rollouts: the engine's (`mr_rl.sampling.slots`) plus
`append`, which prefills observations into paused slots (docs/multiturn.md).

Shape letters (docs/shapes.md): N slots, S response columns (the slot's whole turn budget:
sampled and observation tokens), C = P + S key columns, A the observation bucket, R the rows
of one `append` call (`append_rows`), L, J, W as in the model.

A slot's response columns hold the trajectory after its prompt: each turn's sampled tokens,
then the observation's tokens, in order. The decode step feeds `x` (the last token) at key
column P - 1 + s and samples column s; a turn ends when the slot samples an end-of-turn id
(the programs' `eos_ids`), which leaves the slot paused (not live) at s = s_end with
`x` = that id. `append(slots_R, ids_RA, n_R)` then, for each row r with n_R[r] >= 1, feeds
[x, ids[0], ..., ids[n - 2]] of slot slots_R[r] at key columns P - 1 + s_end ...
P - 2 + s_end + n (positions continuing the slot's), writes the n ids into response columns
[s_end, s_end + n) with log-prob 0, and resumes the slot at s_end + n with x = ids[n - 1]: the
next decode step samples the first token of the next turn. Rows with n_R[r] = 0 change
nothing. The prompt and earlier turns stay in the cache; nothing is prefilled twice.

The R rows run as one batch of the model: each row's slot cache is copied with A spare
columns and the new tokens go in at the spare columns (one cache index for every row); their
keys and values are then written at the slot's own columns. Attention reads a set of keys, not
their places, so a row's result is the same bits whatever the other rows hold. With a mesh
(`mesh`, `rules`) `append` is traced and run under it like the engine's programs, and the
state keeps the engine's shardings (slots over the batch axes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mr_rl import compilation
from mr_rl.models import LayerCache
from mr_rl.sampling.slots import SlotPrograms, SlotState


class TurnPrograms(SlotPrograms):
  """`SlotPrograms` with `append` (module docstring); the same arguments, plus `append_rows`
  (R, rows per `append` call; fixed, so the program compiles once)."""

  def __init__(self, model, *, append_rows: int = 8, **kw):
    super().__init__(model, **kw)
    if not 1 <= append_rows <= self.slots:
      raise ValueError(f"append_rows must be in [1, slots={self.slots}], got {append_rows}")
    self.append_rows = int(append_rows)
    # Traced and called under the mesh as the engine's programs are (`SlotPrograms._on_mesh`):
    # the model's logical constraints bind to it (and a Pallas attention kernel would sit in
    # its shard_map; the cached path `append` takes runs none today).
    self.append = self._on_mesh(jax.jit(
        compilation.program("engine_append", self._wrap(self._append)), donate_argnums=1))

  def _append(self, params, state: SlotState, slots_R, ids_RA, n_R) -> SlotState:
    """Prefills observation ids_RA[r, :n_R[r]] into paused slot slots_R[r] for every row with
    n_R[r] >= 1 (int32; distinct slots, n <= A; the host checks s_end + n < S)."""
    rows, a = ids_RA.shape
    n_new, n_slots = self.max_new_tokens, self.slots
    cols = state.kv_mask.shape[1]
    bucket = cols - n_new
    valid_R = n_R > 0
    slot_R = jnp.where(valid_R, slots_R, 0)          # the rows read (a harmless slot if unused)
    put_R = jnp.where(valid_R, slots_R, n_slots)     # the rows written (out of range: dropped)
    s_R = state.s[slot_R]
    col0_R = bucket - 1 + s_R
    feed_RA = jnp.concatenate([state.x[slot_R][:, None], ids_RA[:, :-1]], axis=1)
    pos_RA = (state.length[slot_R] - 1 + s_R)[:, None] + jnp.arange(a, dtype=jnp.int32)
    # Each row's slot cache with A spare columns, where the new tokens go in (cache index C):
    # a key column < col0 is read where the slot's mask has it, the new tokens causally.
    spare = LayerCache(
        k=jnp.pad(state.cache.k[:, slot_R], ((0, 0),) * 4 + ((0, a),)),
        v=jnp.pad(state.cache.v[:, slot_R], ((0, 0),) * 3 + ((0, a), (0, 0))))
    span = jnp.arange(cols + a)
    kv_mask_RC = ((jnp.pad(state.kv_mask[slot_R], ((0, 0), (0, a))) & (span < col0_R[:, None]))
                  | ((span >= cols) & (span < cols + n_R[:, None])))
    _, spare = self.model.apply({"params": params}, feed_RA, pos_RA, kv_mask_NC=kv_mask_RC,
                                cache=spare, cache_index=cols)
    # The new keys and values at the slot's columns [col0, col0 + A) (those past C dropped;
    # those past col0 + n hold padding's keys, hidden by the key mask until overwritten).
    col_RA = col0_R[:, None] + jnp.arange(a)
    at_RA = jnp.broadcast_to(put_R[:, None], (rows, a))
    new_k = jnp.moveaxis(spare.k[..., cols:], (1, 4), (0, 1))      # [R, A, L, J, W]
    new_v = jnp.moveaxis(spare.v[:, :, :, cols:], (1, 3), (0, 1))  # [R, A, L, J, W]
    cache = LayerCache(k=state.cache.k.at[:, at_RA, :, :, col_RA].set(new_k, mode="drop"),
                       v=state.cache.v.at[:, at_RA, :, col_RA].set(new_v, mode="drop"))
    j_S = jnp.arange(n_new)
    obs_RS = (j_S >= s_R[:, None]) & (j_S < (s_R + n_R)[:, None])
    ids_RS = jnp.take_along_axis(ids_RA, jnp.clip(j_S - s_R[:, None], 0, a - 1), axis=1)
    mask_RC = state.kv_mask[slot_R] | ((span[:cols] >= col0_R[:, None])
                                       & (span[:cols] < (col0_R + n_R)[:, None]))
    put = lambda arr, value: self._batch_sharded(arr.at[put_R].set(value, mode="drop"), n_slots)
    return state.replace(
        cache=self._cache_sharded(cache),
        kv_mask=put(state.kv_mask, mask_RC),
        x=put(state.x, ids_RA[jnp.arange(rows), jnp.maximum(n_R - 1, 0)]),
        s=put(state.s, s_R + n_R),
        live=put(state.live, True),
        eos=put(state.eos, False),
        tokens=put(state.tokens, jnp.where(obs_RS, ids_RS, state.tokens[slot_R])),
        logprobs=put(state.logprobs, jnp.where(obs_RS, 0.0, state.logprobs[slot_R])))
