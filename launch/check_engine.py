"""The continuous engine's share of `launch/check.py`: its slot budget and its compiled programs.

The engine (`mr_rl.sampling.Engine`, `rollout.engine = "continuous"`) keeps a pool of S decode
slots and a prompt store of 2M prefilled prompts (M = ceil(S / G), `Engine.prefill_size`) on the
device for the whole rollout, and runs four programs on them (`mr_rl.sampling.slots`):
`prefill` (M prompts into the store, the store donated), `step` (inserts, then decode steps, the
slot state donated), `gather` (8 finished rows, tiny) and `shrink` (the live slots copied into
the next smaller pool, nothing donated). What is on the device while each runs:

  * `engine_prefill`: its peak (params, store, M prompts' activations) + the slot state;
  * `engine_step`: its peak (params, slot state, store, one decode step's temporaries);
  * `engine_shrink`: its peak (the old pool and the new one) + the store + the params;

each + what the trainer keeps next to the sampler (`check.py`'s `resident["sampler"]`). The
programs are compiled exactly as `Engine.stream` calls them: each is lowered under the mesh's
activation-sharding context (`slots.MeshProgram`), so Pallas attention kernels sit in their
`shard_map` and the model's logical constraints bind, as on the pod.

`slot_budget` is `mr_rl.sampling.memory`'s analytic count (bytes per slot, how many fit); the
check prints it next to the compiled figures, so one can see how far the estimate is off.
"""

from __future__ import annotations

import math


def _per_device(tree) -> int:
  """Bytes of `tree`'s ShapeDtypeStructs on one device, by their shardings."""
  import jax
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def budget_lines(b, gb) -> list[str]:
  """Printable lines of a `memory.SlotBudget` (`gb` formats bytes)."""
  return [f"slot budget (mr_rl.sampling.memory, {b.budget_bytes / 1e9:.1f} GB usable per device "
          f"after headroom): {b.slots} slots fit ({b.slots_per_device} per data-parallel group)",
          f"  per slot {gb(b.bytes_per_slot)} = KV cache {gb(b.cache_bytes_per_slot)} + prompt "
          f"store share {gb(b.store_bytes_per_slot)} + buffers {gb(b.buffer_bytes_per_slot)} + "
          f"working memory (estimated) {gb(b.work_bytes_per_slot)} + the tail shrink's copy "
          f"{gb(b.shrink_bytes_per_slot)}",
          f"  next to params {gb(b.params_bytes)} and resident {gb(b.reserved_bytes)} per device"]


def lowerings(model, *, slots: int, group: int, prompt_cols: int, resp_cols: int, cache_dtype,
              mesh, rules, params_in, key_in, param_bytes: int):
  """The engine's programs at S = `slots` as {name: (lower(), extra resident bytes)}.

  Args:
    model: the sampling model (`rollout.dtype` applied).
    slots: S, the pool size (a multiple of the mesh's data-parallel size).
    group: G (sets M = `Engine.prefill_size(G)`).
    prompt_cols, resp_cols: P (rounded up to its prompt bucket, as the engine does) and S cols.
    cache_dtype: KV-cache dtype or None.
    mesh, rules: the mesh and logical rules.
    params_in, key_in: abstract sharded params and a replicated key.
    param_bytes: the params' bytes per device (resident during `shrink`, not its argument).

  Returns:
    (programs, info): programs maps 'engine_prefill' | 'engine_step' | 'engine_shrink' to
    (zero-argument lowering function, bytes resident besides the program's arguments, bytes of
    its large arguments: params, state, store); info has M, the prompt bucket, the pool sizes
    and the state / store bytes per device.
  """
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from mr_rl.sampling import Engine
  from mr_rl.sampling.sampler import prompt_bucket

  engine = Engine(model, slots=slots, max_new_tokens=resp_cols, eos_id=0, pad_id=0,
                  cache_dtype=cache_dtype, mesh=mesh, rules=rules)
  m = engine.prefill_size(group)
  bucket = prompt_bucket(prompt_cols, None)
  sizes = engine.pool_sizes()
  progs = engine.programs(slots, m)
  lowered = progs.init_program(bucket).lower(key_in)
  shardings = lowered.compile().output_shardings
  state, store = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              lowered.out_info, shardings)
  state_b, store_b = _per_device(state), _per_device(store)
  repl = NamedSharding(mesh, P())
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=repl)
  programs = {
      "engine_prefill": (lambda: progs.prefill.lower(params_in, store, i32(m, bucket),
                                                     i32(m, bucket), i32()),
                         state_b, param_bytes + store_b),
      "engine_step": (lambda: progs.step.lower(params_in, state, store, i32(2 * slots + 1)),
                      0, param_bytes + state_b + store_b),
  }
  if len(sizes) > 1:
    programs["engine_shrink"] = (lambda: progs.shrink.lower(state, i32(sizes[1])),
                                 store_b + param_bytes, state_b)
  info = dict(prefill_prompts=m, bucket=bucket, pool_sizes=sizes, state_bytes=state_b,
              store_bytes=store_b)
  return programs, info
