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


def per_device(tree) -> int:
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
  state_b, store_b = per_device(state), per_device(store)
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


def tpu_memory(config, *, topology: str, mesh_shape: dict, slots: int, group: int,
               prompt_cols: int, resp_cols: int, cache_dtype="bfloat16",
               programs=("engine_prefill", "engine_step", "engine_shrink")) -> dict:
  """The engine's programs compiled by XLA:TPU for a TPU topology without a TPU (libtpu,
  deviceless; `jax.experimental.topologies`), as `lowerings` builds them.

  Args:
    config: the model's `ModelConfig` (e.g. with attention_impl='pallas_tpu').
    topology: e.g. 'v5p:1x1x1' (one chip) or 'v5p:2x2x1' (4 chips, one host).
    mesh_shape: mesh axis sizes (`sharding.make_mesh`'s), their product the topology's chips.
    slots, group, prompt_cols, resp_cols, cache_dtype: as `lowerings`.
    programs: the names to compile.

  Returns:
    {'cache': the slot state's KV cache bytes per chip, 'decode_work': one decode step's
    estimated working memory per chip (`memory.decode_work_bytes`), 'info': `lowerings`' info,
    name: {'temp', 'args', 'out', 'alias' (bytes per chip), 'seconds' (to compile), 'mosaic'
    (a Pallas TPU kernel is in the program)}}.
  """
  import time

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import topologies
  from jax.sharding import NamedSharding, PartitionSpec as P

  from mr_rl import models
  from mr_rl.models import sharding as shd
  from mr_rl.sampling import memory

  chips = math.prod(mesh_shape.values())
  bounds = dict(chips_per_host_bounds=(1, 1, 1)) if chips == 1 else {}
  devices = topologies.get_topology_desc(platform="tpu", topology_name=topology,
                                         **bounds).devices
  shape = [int(mesh_shape.get(a, 1)) for a in shd.MESH_AXES]
  mesh = jax.sharding.Mesh(np.array(devices).reshape(shape), shd.MESH_AXES)
  model = models.Transformer(config)
  params_in = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                           models.abstract_params(model), shd.param_shardings(model, mesh))
  key_in = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P()))
  progs, info = lowerings(model, slots=slots, group=group, prompt_cols=prompt_cols,
                          resp_cols=resp_cols, cache_dtype=cache_dtype, mesh=mesh,
                          rules=shd.DEFAULT_RULES, params_in=params_in, key_in=key_in,
                          param_bytes=0)
  per_chip = slots // shd.data_parallel_size(mesh)
  tensor = int(mesh.shape["tensor"])
  out = dict(cache=per_chip * memory.slot_cache_bytes(config, info["bucket"], resp_cols,
                                                      cache_dtype, tensor),
             decode_work=per_chip * memory.decode_work_bytes(config, info["bucket"] + resp_cols,
                                                             tensor),
             info=dict(info, pool_sizes=list(info["pool_sizes"])))
  for name in programs:
    if name not in progs:
      continue
    t0 = time.time()
    compiled = progs[name][0]().compile()
    m = compiled.memory_analysis()
    out[name] = dict(temp=m.temp_size_in_bytes, args=m.argument_size_in_bytes,
                     out=m.output_size_in_bytes, alias=m.alias_size_in_bytes,
                     seconds=round(time.time() - t0, 1),
                     mosaic="tpu_custom_call" in compiled.as_text())
  return out


def main(argv=None) -> int:
  """`python launch/check_engine.py --preset=qwen3_1_7b --slots=64`: the engine's programs
  compiled by XLA:TPU (deviceless, `tpu_memory`), temporaries against the KV cache per chip."""
  import argparse
  import os
  import sys

  p = argparse.ArgumentParser(description=main.__doc__)
  p.add_argument("--preset", default="qwen3_1_7b")
  p.add_argument("--topology", default="v5p:1x1x1")
  p.add_argument("--mesh", default="", help="e.g. data=2,fsdp=2 (default: all chips on data)")
  p.add_argument("--slots", type=int, default=64)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--prompt_len", type=int, default=256)
  p.add_argument("--new_tokens", type=int, default=512)
  p.add_argument("--attention_impl", default="pallas_tpu")
  p.add_argument("--programs", default="engine_prefill,engine_step,engine_shrink")
  a = p.parse_args(sys.argv[1:] if argv is None else argv)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another process may hold libtpu
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax.numpy as jnp

  from mr_rl import models
  chips = math.prod(int(x) for x in a.topology.split(":")[1].split("x"))
  mesh = ({k: int(v) for k, v in (kv.split("=") for kv in a.mesh.split(","))} if a.mesh
          else {"data": chips})
  cfg = models.get_preset(a.preset, attention_impl=a.attention_impl, dtype=jnp.bfloat16,
                          param_dtype=jnp.bfloat16)
  r = tpu_memory(cfg, topology=a.topology, mesh_shape=mesh, slots=a.slots, group=a.group,
                 prompt_cols=a.prompt_len, resp_cols=a.new_tokens,
                 programs=tuple(a.programs.split(",")))
  gb = lambda b: f"{b / 1e9:.3f} GB"
  print(f"{a.preset} on {a.topology} mesh {mesh}, {a.slots} slots, T={a.prompt_len}+"
        f"{a.new_tokens}, bf16 weights and cache, attention {a.attention_impl!r}: per chip KV "
        f"cache {gb(r['cache'])}, one decode step's working set (estimated) "
        f"{gb(r['decode_work'])}; {r['info']}")
  for name in a.programs.split(","):
    if name in r:
      m = r[name]
      print(f"  {name:14s} temp {gb(m['temp'])} = {m['temp'] / r['cache']:.2f} x KV cache; args "
            f"{gb(m['args'])} out {gb(m['out'])} alias {gb(m['alias'])}; Pallas kernel: "
            f"{m['mosaic']}; compiled in {m['seconds']:.0f} s")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
