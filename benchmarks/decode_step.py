"""One decode step of the model on XLA:CPU, timed and (with --profile) broken down per op.

    python benchmarks/decode_step.py                # ms per step: 4 layers, d 256, 64 rows
    python benchmarks/decode_step.py --profile      # + the per-op table (benchmarks/op_profile)

A 100-step `fori_loop` of `Transformer.apply` with a KV cache of 160 slots (the decode step of
the sampler without sampling), best of 3. Figures: docs/benchmarks.md, "Layer scan on XLA:CPU".
"""

from __future__ import annotations

import argparse
import os
import sys
import time

STEPS = 100


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--profile", action="store_true")
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--rows", type=int, default=64)
  a = p.parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import op_profile
  if a.profile:
    op_profile.enable_thunk_tracing()
  import jax
  import jax.numpy as jnp
  from mr_rl import models
  cfg = models.ModelConfig(vocab_size=1024, d_model=256, n_layers=a.layers, n_heads=8,
                           n_kv_heads=4, head_dim=32, d_ff=768, max_seq_len=1024)
  model = models.Transformer(cfg)
  params = models.init_params(model, jax.random.PRNGKey(0))
  N, C = a.rows, 160
  cache = models.init_cache(cfg, N, C)
  kv = jnp.ones((N, C), jnp.int32)

  @jax.jit
  def run(params, cache):
    def body(i, carry):
      cache, x = carry
      lg, cache = model.apply({"params": params}, x[:, None], jnp.full((N, 1), 32 + i),
                              kv_mask_NC=kv, cache=cache, cache_index=32 + i)
      return cache, jnp.argmax(lg[:, 0], -1).astype(jnp.int32)
    return jax.lax.fori_loop(0, STEPS, body, (cache, jnp.ones((N,), jnp.int32)))

  jax.block_until_ready(run(params, cache))
  best = float("inf")
  for _ in range(3):
    t0 = time.perf_counter()
    jax.block_until_ready(run(params, cache))
    best = min(best, time.perf_counter() - t0)
  print(f"load average {os.getloadavg()[0]:.2f}: {best / STEPS * 1e3:.2f} ms per decode step")
  if a.profile:
    hlo = run.lower(params, cache).compile().as_text()
    for ms, kind, op in op_profile.op_table(lambda: run(params, cache), hlo, per=STEPS, top=12):
      print(f"{ms:7.3f} ms  {kind[:28]:28s} {op[-80:]}")


if __name__ == "__main__":
  main()
