"""The CPU/accelerator roofline reference the benchmarks divide by: a large fp32 matmul."""

import time

import jax
import jax.numpy as jnp


def matmul_flops_per_s(n: int = 2048, reps: int = 10) -> float:
  """FLOP/s of an n x n fp32 matmul under jax, best of `reps` timed runs after a warm-up."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - t0)
  return 2 * n ** 3 / min(times)
