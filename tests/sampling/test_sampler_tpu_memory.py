"""The static sampler holds its KV cache once under the TPU compiler (issue 39).

XLA:TPU compiles here without a chip (libtpu's deviceless ahead-of-time compile,
`mr_rl.testing.tpu_compile`). Decoding runs in segments whose attention reads a prefix window
of the cache; when each segment had a cache of its own width (grown by a copy between
segments), or when a segment's window gave the cache another layout, the memory report held
a cache-sized buffer per segment (Qwen3-1.7B, 64 rows, 256 + 512 tokens: 23.1 GB of
temporaries for a 5.6 GB cache; docs/accelerators.md).
"""

import jax.numpy as jnp
import pytest

from mr_rl import models
from mr_rl.sampling.sampler import (TPU_WINDOW_ALIGN, cache_slots, segment_ends,
                                    segment_windows)
from mr_rl.testing import tpu_compile

# A tiny Qwen3 with the real models' 128-wide heads: XLA:TPU lays out (and pads) a cache by
# its minor dimensions, so a narrower head would not show the layouts the real cache gets.
CONFIG = models.ModelConfig(
    family="qwen3", vocab_size=256, d_model=128, n_layers=4, n_heads=2, n_kv_heads=1,
    head_dim=128, d_ff=256, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True,
    max_seq_len=1024, dtype=jnp.bfloat16)


def test_segment_windows():
  ends = segment_ends(512, 64)
  assert segment_windows(256, 512, ends) == tuple((e, 256 + e) for e in ends)
  # On TPU: windows on the 128-lane grid, equal windows merged, the last one the whole cache.
  assert segment_windows(256, 512, ends, TPU_WINDOW_ALIGN) == (
      (128, 384), (256, 512), (384, 640), (512, 768))
  assert segment_windows(64, 128, segment_ends(128, 32), 128) == ((64, 128), (128, 256))
  assert cache_slots(64, 128, TPU_WINDOW_ALIGN) == 256
  assert cache_slots(64, 128, TPU_WINDOW_ALIGN, max_len=200) == 192  # within max_seq_len


def test_sampler_holds_its_cache_once_under_xla_tpu():
  """XLA:TPU temporaries <= 1.3 x the KV cache + one step's working set.

  The working set is XLA:TPU's own figure for one model call compiled alone over a donated
  cache of the sampler's length (`step_memory`), the larger of a decode step (the loop body)
  and the prefill: temporaries (weights cast to the compute dtype, activations, logits) the
  sampler needs once whatever its segments. 0.3 x the cache leaves room for the loop state
  and the prefill's one padded layer; a second cache-sized buffer (a copy per segment, or a
  relayout between segments) is 1 x: before issue 39 this program held 38.6 MB against a
  bound of 19.1 MB. Four segments of 64 tokens (windows 128 ... 320, off the lane grid for
  the CPU's layout) in three loops, about 30 s of compiles on a loaded 2-core host.
  """
  reason = tpu_compile.libtpu_available()
  if reason:
    pytest.skip(f"XLA:TPU's deviceless compile needs libtpu: {reason}")
  rows, prompt_len, new_tokens = 32, 64, 256
  m = tpu_compile.sampler_memory(CONFIG, rows=rows, prompt_len=prompt_len,
                                 new_tokens=new_tokens, segment_tokens=64)
  assert m.slots == 384  # P + S on the 128-lane grid
  work = max(tpu_compile.step_memory(CONFIG, rows=rows, cache_len=m.slots, tokens=t).temp
             for t in (1, prompt_len - 1))
  mb = lambda b: f"{b / 1e6:.2f} MB"
  assert m.temp <= 1.3 * m.cache + work, (
      f"sampler temporaries {mb(m.temp)} > 1.3 x KV cache {mb(m.cache)} + one step's working "
      f"set {mb(work)}: the cache is held more than once")
