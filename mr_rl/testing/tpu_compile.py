"""The static sampler compiled by XLA:TPU without a TPU: its memory report and optimized HLO.

libtpu compiles for a TPU topology with no chip attached ("deviceless" ahead-of-time
compilation, `jax.experimental.topologies`), so the TPU compiler's buffer assignment of a
program can be read on any host where libtpu is installed. `sampler_memory` lowers
`Sampler._sample` exactly as `launch/check.py` does (abstract params with their shardings,
row-sharded prompts) on a one-chip mesh and returns XLA:TPU's figures next to the sampler's
final KV-cache size. `tests/sampling/test_sampler_tpu_memory.py` holds the sampler to them.

  python -m mr_rl.testing.tpu_compile --preset qwen3_1_7b --rows 64 --prompt-len 256 \
      --new-tokens 512 --dtype bfloat16      # ~1 min on 2 cores

The attention implementation is pinned ('reference' by default) because 'auto' resolves by
the host's backend at trace time; the sampler's decode attention is the cached path either
way, the choice only reaches the prefill.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

TOPOLOGY = "v5p:1x1x1"  # one chip


def libtpu_available() -> Optional[str]:
  """None if a TPU topology can be described here (libtpu importable), else the reason."""
  try:
    import libtpu  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  except ImportError as e:
    return f"libtpu is not importable ({e})"
  return None


def one_chip_mesh(topology: str = TOPOLOGY):
  """A (data, fsdp, tensor, expert) mesh of 1x1x1x1 over one deviceless TPU chip."""
  # A deviceless client needs no chip, so it need not hold libtpu's one-process lock either
  # (tests and other compiles may run side by side).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  from mr_rl.models import sharding as shd  # pylint: disable=import-outside-toplevel
  td = topologies.get_topology_desc(platform="tpu", topology_name=topology,
                                    chips_per_host_bounds=(1, 1, 1))
  devices = np.array(td.devices[:1]).reshape((1,) * len(shd.MESH_AXES))
  return jax.sharding.Mesh(devices, shd.MESH_AXES)


@dataclasses.dataclass
class SamplerMemory:
  """XLA:TPU's memory report of one sampler program (bytes, per chip).

  Attributes:
    temp: temporaries (`temp_size_in_bytes`): everything the program allocates itself.
    argument, output, generated_code: the report's other sizes.
    cache: the KV cache the sampler allocates, keys [L, N, J, W, C] and values in the cache
      dtype (C = P + S rounded up to the 128 lanes, `sampler.cache_slots`); for `step_memory`
      the donated cache's size.
    compile_s: seconds `.compile()` took.
    slots: C, the cache's slots.
    hlo: the optimized HLO text (`.as_text()`), when asked for.
  """
  temp: int
  argument: int
  output: int
  generated_code: int
  cache: int
  compile_s: float
  slots: int = 0
  hlo: Optional[str] = None

  @property
  def ratio(self) -> float:
    return self.temp / self.cache


def sampler_memory(config, *, rows: int, prompt_len: int, new_tokens: int, cache_dtype=None,
                   attention_impl: str = "reference", segment_tokens: Optional[int] = None,
                   with_hlo: bool = False) -> SamplerMemory:
  """Compiles the static sampler of `config` for one TPU chip (deviceless) and reads its
  memory report.

  Args:
    config: a `ModelConfig` (its `dtype` is the compute dtype).
    rows, prompt_len, new_tokens: N, the prompt bucket P (a power of two >= 8 keeps it as
      is) and S.
    cache_dtype: KV-cache dtype (None: the compute dtype).
    attention_impl: pinned for the prefill (module docstring).
    segment_tokens: the sampler's segment length (None: its default).
    with_hlo: also return the optimized HLO text.
  """
  from mr_rl import models  # pylint: disable=import-outside-toplevel
  from mr_rl.models import layers  # pylint: disable=import-outside-toplevel
  from mr_rl.models import sharding as shd  # pylint: disable=import-outside-toplevel
  from mr_rl.sampling.sampler import (  # pylint: disable=import-outside-toplevel
      DEFAULT_SEGMENT_TOKENS, TPU_WINDOW_ALIGN, Sampler, cache_slots)
  config = config.replace(attention_impl=attention_impl)
  model = models.Transformer(config)
  mesh = one_chip_mesh()
  p_sh = shd.param_shardings(model, mesh)
  params_in = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                           models.abstract_params(model), p_sh)
  sampler = Sampler(model, max_new_tokens=new_tokens, temperature=1.0, eos_id=0, pad_id=0,
                    mesh=mesh, cache_dtype=cache_dtype,
                    segment_tokens=segment_tokens or DEFAULT_SEGMENT_TOKENS)
  tok = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32,
                             sharding=shd.batch_sharding(mesh, (rows, prompt_len)))
  key_in = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec()))
  with shd.activation_sharding(mesh):
    lowered = sampler._jitted.lower(params_in, tok, tok, key_in)  # pylint: disable=protected-access
  t0 = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  itemsize = jnp.dtype(config.dtype if cache_dtype is None else cache_dtype).itemsize
  slots = cache_slots(prompt_len, new_tokens, TPU_WINDOW_ALIGN, config.max_seq_len)
  cache = itemsize * sum(math.prod(s) for s in layers.cache_shapes(config, rows, slots))
  return SamplerMemory(temp=mem.temp_size_in_bytes, argument=mem.argument_size_in_bytes,
                       output=mem.output_size_in_bytes,
                       generated_code=mem.generated_code_size_in_bytes, cache=cache,
                       compile_s=compile_s, slots=slots,
                       hlo=compiled.as_text() if with_hlo else None)


def step_memory(config, *, rows: int, cache_len: int, tokens: int = 1, cache_dtype=None,
                attention_impl: str = "reference") -> SamplerMemory:
  """XLA:TPU's memory report of one model call on its own over a donated cache of `cache_len`
  slots, written in place: its temporaries are that call's working set (the cache itself is
  an argument here). `tokens` = 1: a decode step (the sampler's loop body, a traced slot);
  `tokens` = P - 1: the sampler's prefill (cache_index the static 0)."""
  from mr_rl import models  # pylint: disable=import-outside-toplevel
  from mr_rl.models import layers  # pylint: disable=import-outside-toplevel
  from mr_rl.models import sharding as shd  # pylint: disable=import-outside-toplevel
  config = config.replace(attention_impl=attention_impl)
  model = models.Transformer(config)
  mesh = one_chip_mesh()
  p_sh = shd.param_shardings(model, mesh)
  sds = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
  params_in = jax.tree.map(sds, models.abstract_params(model), p_sh)
  cache_abs = jax.eval_shape(lambda: layers.init_cache(config, rows, cache_len, cache_dtype))
  cache_in = jax.tree.map(sds, cache_abs, shd.cache_shardings(config, mesh, rows, cache_len))
  row = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype,
                                                  sharding=shd.batch_sharding(mesh, shape))
  index_in = jax.ShapeDtypeStruct((), jnp.int32, sharding=jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec()))

  def step(params, cache, x_NT, pos_NT, kv_mask_NC, index):
    return model.apply({"params": params}, x_NT, pos_NT, kv_mask_NC=kv_mask_NC, cache=cache,
                       cache_index=index if tokens == 1 else 0)

  with shd.activation_sharding(mesh):
    lowered = jax.jit(step, donate_argnums=1).lower(
        params_in, cache_in, row((rows, tokens), jnp.int32), row((rows, tokens), jnp.int32),
        row((rows, cache_len), jnp.bool_), index_in)
  t0 = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  itemsize = jnp.dtype(config.dtype if cache_dtype is None else cache_dtype).itemsize
  cache = itemsize * sum(math.prod(s) for s in layers.cache_shapes(config, rows, cache_len))
  return SamplerMemory(temp=mem.temp_size_in_bytes, argument=mem.argument_size_in_bytes,
                       output=mem.output_size_in_bytes,
                       generated_code=mem.generated_code_size_in_bytes, cache=cache,
                       compile_s=compile_s, slots=cache_len)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--preset", default="qwen3_1_7b")
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--prompt-len", type=int, default=256)
  p.add_argument("--new-tokens", type=int, default=512)
  p.add_argument("--dtype", default="bfloat16", help="compute and cache dtype")
  p.add_argument("--attention-impl", default="reference")
  p.add_argument("--hlo", default="", help="write the optimized HLO here")
  p.add_argument("--step", action="store_true",
                 help="also compile one decode step and the prefill alone (working sets)")
  a = p.parse_args(argv)
  reason = libtpu_available()
  if reason:
    raise SystemExit(reason)
  from mr_rl import models  # pylint: disable=import-outside-toplevel
  cfg = models.get_preset(a.preset, dtype=a.dtype)
  m = sampler_memory(cfg, rows=a.rows, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
                     cache_dtype=a.dtype, attention_impl=a.attention_impl, with_hlo=bool(a.hlo))
  gb = lambda b: f"{b / 1e9:.2f} GB"
  print(f"{a.preset} sampler, 1 chip ({TOPOLOGY}), N={a.rows}, P={a.prompt_len}, "
        f"S={a.new_tokens}, {a.dtype}: temp {gb(m.temp)}, final KV cache {gb(m.cache)}, "
        f"temp / cache {m.ratio:.2f}, arguments {gb(m.argument)}, output {gb(m.output)}, "
        f"compile {m.compile_s:.0f} s")
  if a.step:
    step = lambda t: step_memory(cfg, rows=a.rows, cache_len=m.slots, tokens=t,
                                 cache_dtype=a.dtype, attention_impl=a.attention_impl).temp
    decode, prefill = step(1), step(a.prompt_len - 1)
    work = max(decode, prefill)
    print(f"alone, over a donated cache: one decode step's temp {gb(decode)}, the prefill's "
          f"{gb(prefill)}; sampler temp = {(m.temp - work) / m.cache:.2f} x cache + the larger")
  if a.hlo:
    with open(a.hlo, "w") as f:
      f.write(m.hlo)


if __name__ == "__main__":
  main()
