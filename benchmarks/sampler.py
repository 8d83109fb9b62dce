"""Sampler throughput: mr_rl's jitted KV-cache sampler vs transformers `generate`.

Default (CPU, the calibration setting of BUILD_NOTES.md, "Sampler"): a random Qwen3 written by
transformers (4 layers, d=256, 8 heads / 4 KV heads, head_dim 32, vocab 1024, tied), batch 64, prompt
32, 256 new tokens, plain sampling at temperature 1 on both sides, same weights. Reports tokens/s of
each, their ratio, achieved FLOP/s as a fraction of a large fp32 matmul measured in the same
run, and our time for 64/128/256/512 new tokens.

  python benchmarks/sampler.py                 # full run (a few minutes on 2 cores)
  python benchmarks/sampler.py --quick         # under a minute
  python benchmarks/sampler.py --json out.json
  python benchmarks/sampler.py --cpu-devices 2  # batch split over 2 XLA CPU devices (mesh path)
  python benchmarks/sampler.py --no-hf --profile  # ms per decode step by op (XLA:CPU thunks)
  # Accelerator: a Qwen3-1.7B-shaped random model, tokens/s and HBM-roofline fraction.
  python benchmarks/sampler.py --preset qwen3_1_7b --dtype bfloat16 --batch 64 \
      --prompt-len 256 --new-tokens 1024 --no-hf --hbm-gbps 4800

Timings alternate ours / transformers so that background load hits both alike; each
figure is the median over `--repeats` runs after one warm-up (compilation excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

if __name__ == "__main__" and "--cpu-devices" in sys.argv:
  # Split the host CPU into N XLA devices before jax starts (one decode program per device).
  _d = sys.argv[sys.argv.index("--cpu-devices") + 1]
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={_d}")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # roofline.py, op_profile.py
import op_profile  # noqa: E402

if __name__ == "__main__" and "--profile" in sys.argv:
  op_profile.enable_thunk_tracing()  # before jax starts

if __name__ == "__main__" and "--threads" in sys.argv:
  # Thread count must be fixed before jax / torch start their pools.
  _n = sys.argv[sys.argv.index("--threads") + 1]
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_cpu_multi_thread_eigen={'false' if _n == '1' else 'true'}"
                             f" intra_op_parallelism_threads={_n}")
  os.environ["OMP_NUM_THREADS"] = _n

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mr_rl import models  # noqa: E402
from mr_rl.sampling import Sampler  # noqa: E402
from roofline import matmul_flops_per_s  # noqa: E402

TINY = dict(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, head_dim=32, tie_word_embeddings=True)


def decode_flops_per_token(cfg: models.ModelConfig, context: float) -> float:
  """Forward FLOPs for one decoded token: 2 x matmul params + attention over `context` keys."""
  d, h, j, hd, f, L, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                          cfg.n_layers, cfg.vocab_size)
  per_layer = d * h * hd * 2 + d * j * hd * 2 + 3 * d * f
  return 2 * (L * per_layer + d * V) + L * 4 * h * hd * context


def decode_bytes_per_step(cfg: models.ModelConfig, batch: int, context: float, p_bytes: int,
                          c_bytes: int) -> float:
  """HBM bytes one decode step must read: all weights once plus the filled KV cache."""
  d, h, j, hd, f, L, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                          cfg.n_layers, cfg.vocab_size)
  n_params = L * (d * h * hd * 2 + d * j * hd * 2 + 3 * d * f) + d * V
  return n_params * p_bytes + 2 * L * batch * context * j * hd * c_bytes


def make_prompts(batch: int, length: int, vocab: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, size=(batch, length), dtype=np.int32)
  return tokens, np.ones_like(tokens)


def time_ours(sampler, params, tokens, mask, repeats, key):
  out = sampler(params, tokens, mask, key=key)  # compile + warm up
  jax.block_until_ready(out)
  times = []
  for i in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(sampler(params, tokens, mask, key=jax.random.fold_in(key, i + 1)))
    times.append(time.perf_counter() - t0)
  return times, out


def hf_generate_fn(hf_model, tokens, mask, new_tokens):
  import torch
  ids = torch.as_tensor(tokens, dtype=torch.long)
  am = torch.as_tensor(mask, dtype=torch.long)

  def run():
    with torch.no_grad():
      out = hf_model.generate(ids, attention_mask=am, do_sample=True, temperature=1.0, top_k=0,
                              top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              pad_token_id=0, eos_token_id=None)
    assert out.shape[1] == tokens.shape[1] + new_tokens, out.shape
    return out

  return run


def build_tiny(tmpdir, dtype):
  """Random Qwen3 written by transformers; returns (our model, params, torch model)."""
  import torch
  import transformers
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen3Config(**TINY, max_position_embeddings=4096, bos_token_id=None,
                                    eos_token_id=None, pad_token_id=0)
  hf_model = transformers.Qwen3ForCausalLM(hf_cfg).eval()
  hf_model.save_pretrained(tmpdir)
  model, params = models.load_pretrained(tmpdir, dtype=dtype)
  return model, params, hf_model


def build_preset(name, dtype):
  """Random weights for a named preset (e.g. qwen3_1_7b), created on the default device."""
  cfg = models.get_preset(name, dtype=dtype, param_dtype=dtype)
  model = models.Transformer(cfg)
  params = jax.jit(lambda k: models.init_params(model, k))(jax.random.PRNGKey(0))
  return model, params


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--preset", default="tiny",
                 help="'tiny' (transformers-written random Qwen3) or an mr_rl.models preset name")
  p.add_argument("--dtype", default="float32")
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--new-tokens", type=int, default=256)
  p.add_argument("--scaling", default="64,128,256,512", help="new-token counts for the growth table")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--segment-tokens", type=int, default=None)
  p.add_argument("--no-hf", action="store_true", help="skip transformers generate")
  p.add_argument("--threads", type=int, default=None,
                 help="CPU threads for both jax and torch (default: their defaults)")
  p.add_argument("--cpu-devices", type=int, default=1,
                 help="CPU only: split the host into N XLA devices and shard the batch over a "
                      "data-parallel mesh of them (the sampler's mesh path); transformers keeps "
                      "its threads")
  p.add_argument("--hbm-gbps", type=float, default=None, help="HBM bandwidth for the roofline")
  p.add_argument("--quick", action="store_true", help="64 new tokens, 2 repeats, short scaling")
  p.add_argument("--profile", action="store_true",
                 help="CPU: also print where a decode step goes (ms per step by op, summed over "
                      "devices and threads; benchmarks/op_profile.py)")
  p.add_argument("--json", default=None, help="write the results here")
  a = p.parse_args(argv)
  if a.quick:
    a.new_tokens, a.repeats, a.scaling = 64, 2, "32,64,128"
  dtype = jnp.dtype(a.dtype)
  if a.threads:
    import torch
    torch.set_num_threads(a.threads)
  res = dict(preset=a.preset, batch=a.batch, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
             dtype=a.dtype, threads=a.threads, backend=jax.default_backend(), devices=str(jax.devices()),
             load_avg_start=os.getloadavg())
  print(f"backend {res['backend']}, load average {res['load_avg_start']}", flush=True)

  hf_model = None
  with tempfile.TemporaryDirectory() as tmp:
    if a.preset == "tiny":
      model, params, hf_model = build_tiny(tmp, dtype)
    else:
      model, params = build_preset(a.preset, dtype)
  if a.no_hf:
    hf_model = None
  cfg = model.config
  tokens, mask = make_prompts(a.batch, a.prompt_len, cfg.vocab_size)
  key = jax.random.PRNGKey(1)
  skw = {} if a.segment_tokens is None else dict(segment_tokens=a.segment_tokens)

  peak = matmul_flops_per_s()
  res["matmul_gflops"] = peak / 1e9
  print(f"large fp32 matmul: {peak / 1e9:.1f} GFLOP/s", flush=True)

  if a.cpu_devices > 1:
    if len(jax.devices()) != a.cpu_devices:
      raise ValueError(f"--cpu-devices {a.cpu_devices}: jax sees {len(jax.devices())} devices")
    from mr_rl.models import sharding as shd
    mesh = shd.make_mesh(dict(data=a.cpu_devices))
    params = jax.device_put(params, shd.param_shardings(model, mesh))
    skw["mesh"] = mesh
  res["cpu_devices"] = a.cpu_devices
  sampler = Sampler(model, max_new_tokens=a.new_tokens, temperature=1.0, **skw)
  gen_tokens = a.batch * a.new_tokens
  t0 = time.perf_counter()
  jax.block_until_ready(sampler(params, tokens, mask, key=key))
  res["ours_compile_and_first_run_s"] = time.perf_counter() - t0
  ours_t, hf_t = [], []
  hf_run = hf_generate_fn(hf_model, tokens, mask, a.new_tokens) if hf_model is not None else None
  if hf_run is not None:
    hf_run()  # warm-up
  for i in range(a.repeats):  # alternate, so background load hits both alike
    t0 = time.perf_counter()
    jax.block_until_ready(sampler(params, tokens, mask, key=jax.random.fold_in(key, i + 1)))
    ours_t.append(time.perf_counter() - t0)
    if hf_run is not None:
      t0 = time.perf_counter()
      hf_run()
      hf_t.append(time.perf_counter() - t0)
  ours_s = statistics.median(ours_t)
  res["ours_times_s"] = ours_t
  res["ours_tokens_per_s"] = gen_tokens / ours_s
  print(f"ours: {res['ours_tokens_per_s']:.0f} tok/s (runs {[round(t, 3) for t in ours_t]} s)")
  if hf_run is not None:
    hf_s = statistics.median(hf_t)
    res["hf_times_s"] = hf_t
    res["hf_tokens_per_s"] = gen_tokens / hf_s
    res["speedup_vs_hf"] = hf_s / ours_s
    print(f"transformers generate: {res['hf_tokens_per_s']:.0f} tok/s "
          f"(runs {[round(t, 3) for t in hf_t]} s); ours / hf = {res['speedup_vs_hf']:.2f}x")
  else:
    res["hf_tokens_per_s"] = None

  ctx = a.prompt_len + a.new_tokens / 2  # mean number of keys attended per decode step
  flops = decode_flops_per_token(cfg, ctx) * gen_tokens
  res["ours_gflops"] = flops / ours_s / 1e9
  res["ours_fraction_of_matmul_peak"] = flops / ours_s / peak
  print(f"ours achieved {res['ours_gflops']:.1f} GFLOP/s = "
        f"{100 * res['ours_fraction_of_matmul_peak']:.1f}% of the large-matmul rate")
  if a.hbm_gbps:
    p_bytes = jnp.dtype(cfg.param_dtype).itemsize
    c_bytes = jnp.dtype(cfg.dtype).itemsize
    step_bytes = decode_bytes_per_step(cfg, a.batch, ctx, p_bytes, c_bytes)
    roof_s = a.new_tokens * step_bytes / (a.hbm_gbps * 1e9)
    res["hbm_roofline_fraction"] = roof_s / ours_s
    print(f"HBM roofline ({a.hbm_gbps} GB/s): {roof_s * 1e3:.1f} ms minimum; "
          f"achieved {100 * res['hbm_roofline_fraction']:.1f}%")

  if a.profile:
    hlo = sampler.lower(params, tokens, mask, key=key).compile().as_text()
    rows = op_profile.op_table(lambda: sampler(params, tokens, mask, key=key), hlo,
                               per=a.new_tokens)
    res["profile_ms_per_step"] = [dict(ms=ms, kind=kind, op=op) for ms, kind, op in rows]
    print(f"where a decode step goes (ms per step, {a.new_tokens} steps, prefill included):")
    print(op_profile.format_table(rows), flush=True)

  scaling = {}
  for n in [int(x) for x in a.scaling.split(",") if x]:
    s = Sampler(model, max_new_tokens=n, temperature=1.0, **skw)
    times, _ = time_ours(s, params, tokens, mask, max(1, a.repeats - 1), key)
    scaling[n] = statistics.median(times)
    print(f"  ours, {n:4d} new tokens: {scaling[n]:.3f} s ({a.batch * n / scaling[n]:.0f} tok/s)",
          flush=True)
  res["ours_scaling_s"] = scaling
  res["load_avg_end"] = os.getloadavg()
  print(f"load average at end {res['load_avg_end']}")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(res, f, indent=1)
  return res


if __name__ == "__main__":
  main()
