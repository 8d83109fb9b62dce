"""The continuous engine compiled for TPU without a TPU (XLA:TPU through libtpu, deviceless).

A small model (tiny_qwen3 with 4 layers, width 256 and head width 128, so TPU tiles are not
mostly padding) with `attention_impl='pallas_tpu'`, its engine's programs built as the pod
builds them (`Engine.programs`, through `launch/check_engine.tpu_memory` / `lowerings`):

  * on a v5p:2x2x1 topology (4 chips, mesh data=2, fsdp=2) `engine_prefill`, `engine_step` and
    `engine_shrink` compile, the prefill with its Pallas kernel: the kernel sits in its
    shard_map because the engine traces its programs under the mesh (`slots.MeshProgram`);
    without that XLA refuses to partition the Mosaic kernel;
  * the step does not copy its KV cache: its XLA:TPU temporaries are at most 1.3x the slot
    state's KV cache (per chip) plus one decode step's working set
    (`memory.decode_work_bytes`), on 4 chips and on 1. (With one scatter for the cache writes
    XLA copied the cache in and out of the decode loop in another layout: 1.5x and 2.2x here.)

One subprocess (the TPU plugin stays out of the test process), about 30 s of CPU. Skipped when
libtpu is not importable.
"""

import importlib.util
import json
import os
import sys

import pytest

from mr_rl.testing import xla_env

SLOTS, GROUP, PROMPT, NEW = 16, 8, 256, 512
SIZES = dict(d_model=256, n_heads=4, n_kv_heads=2, head_dim=128, n_layers=4, vocab_size=1024,
             d_ff=512, max_seq_len=1024)
BOUND = 1.3  # engine_step's temporaries / KV cache, besides one step's working set


def _worker():
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another process may hold libtpu
  import jax.numpy as jnp

  from mr_rl import models
  sys.path.insert(0, os.path.join(xla_env.REPO, "launch"))
  import check_engine
  cfg = models.get_preset("tiny_qwen3", attention_impl="pallas_tpu", dtype=jnp.bfloat16,
                          param_dtype=jnp.bfloat16, **SIZES)
  kw = dict(slots=SLOTS, group=GROUP, prompt_cols=PROMPT, resp_cols=NEW)
  return dict(four=check_engine.tpu_memory(cfg, topology="v5p:2x2x1",
                                           mesh_shape={"data": 2, "fsdp": 2}, **kw),
              one=check_engine.tpu_memory(cfg, topology="v5p:1x1x1", mesh_shape={"data": 1},
                                          programs=("engine_step",), **kw))


@pytest.fixture(scope="module")
def compiled():
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not importable: no XLA:TPU compiler to compile the engine with")
  return xla_env.run_worker(__file__, timeout=600)


def test_engine_programs_compile_for_tpu_with_pallas_attention(compiled):
  four = compiled["four"]
  assert len(four["info"]["pool_sizes"]) > 1, four  # the pool shrinks: engine_shrink exists
  for name in ("engine_prefill", "engine_step", "engine_shrink"):
    assert name in four, four
  assert four["engine_prefill"]["mosaic"], four  # the Pallas kernel, in its shard_map


@pytest.mark.parametrize("chips", ["four", "one"])
def test_engine_step_does_not_copy_its_cache(compiled, chips):
  r = compiled[chips]
  temp, cache, work = r["engine_step"]["temp"], r["cache"], r["decode_work"]
  assert temp <= BOUND * cache + work, (
      f"engine_step temporaries {temp / 1e6:.1f} MB > {BOUND} x KV cache {cache / 1e6:.1f} MB "
      f"+ working set {work / 1e6:.1f} MB per chip", r)


if __name__ == "__main__":
  print(json.dumps(_worker()))
