"""Sampler throughput: mr_rl's jitted KV-cache sampler vs transformers `generate`.

Default (CPU, the calibration setting of docs/benchmarks.md, "Sampler"): a random Qwen3 written by
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

`--long-tail` compares instead, side by side, the continuous engine
(`mr_rl.sampling.Engine`), the static sampler in micro-batches of the same row count and
transformers `generate`, on rows whose lengths are drawn from a lognormal (EOS forced at each
row's drawn length, the same lengths for every engine): slot utilization and tokens/s.

  python benchmarks/sampler.py --long-tail --quick --json out.json
"""

from __future__ import annotations

import argparse
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
import report  # noqa: E402

if __name__ == "__main__" and "--profile" in sys.argv:
  op_profile.enable_thunk_tracing()  # before jax starts

if (__name__ == "__main__" and "--long-tail" in sys.argv and "--quick" in sys.argv
    and "--threads" not in sys.argv):
  # The quick long-tail run is single-threaded on both sides: on a loaded 2-core machine torch's
  # two OpenMP threads ran transformers `generate` ~10x slower than one (measured).
  sys.argv += ["--threads", "1"]

if __name__ == "__main__" and "--threads" in sys.argv:
  # Thread count must be fixed before jax / torch start their pools.
  _n = sys.argv[sys.argv.index("--threads") + 1]
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_cpu_multi_thread_eigen={'false' if _n == '1' else 'true'}"
                             f" intra_op_parallelism_threads={_n}")
  os.environ["OMP_NUM_THREADS"] = _n

import flax.linen as nn
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


#: ~20M-parameter random Qwen3 of the long-tail run (8 layers, d=512, 8 heads / 4 KV heads).
LONG_TAIL_MODEL = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024,
                       num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                       head_dim=64, tie_word_embeddings=True)


def forced_lengths(rows: int, cap: int, seed: int = 0) -> np.ndarray:
  """Response lengths (EOS included) from a lognormal with mean about cap / 4, in [1, cap]."""
  sigma = 1.0
  mu = np.log(cap / 4) - sigma ** 2 / 2
  lengths = np.random.default_rng(seed).lognormal(mu, sigma, rows)
  return np.clip(np.round(lengths), 1, cap).astype(np.int32)


def countdown_mask(fed, vocab: int, cap: int, xp):
  """Benchmark-only forcing of each row's length, shared by every engine: token ids fall in
  blocks of `vocab // (cap + 1)`; after a token of block c >= 2 only tokens of block c - 1
  may follow (the random model's logits pick among them), after block 1 (or EOS / padding,
  block 0) only EOS (id 0).
  A prompt ending in a token of block L thus gets a response of exactly L tokens, sampled
  from the model within those constraints. Returns the allowed-token mask [..., V]."""
  width = vocab // (cap + 1)
  block = fed // width
  v_block = xp.arange(vocab) // width
  allowed = v_block[None, :] == (block - 1)[:, None]
  return xp.where((block <= 1)[:, None], xp.arange(vocab)[None, :] == 0, allowed)


def forced_model(cfg, cap: int):
  """The mr_rl model with `countdown_mask` applied to its logits (an nn.Module subclass)."""
  class ForcedLength(models.Transformer):
    @nn.compact
    def __call__(self, tokens_NT, positions_NT, **kw):
      logits, cache = super().__call__(tokens_NT, positions_NT, **kw)
      n, t = tokens_NT.shape
      allowed = countdown_mask(tokens_NT.reshape(-1), cfg.vocab_size, cap, jnp).reshape(
          n, t, -1)
      return jnp.where(allowed, logits, -1e9).astype(logits.dtype), cache
  return ForcedLength(cfg)


def long_tail_prompts(lengths, prompt_len: int, vocab: int, cap: int, seed: int = 1):
  """Full-length prompts whose last token sets each row's response length."""
  rng = np.random.default_rng(seed)
  width = vocab // (cap + 1)
  tokens = rng.integers(1, vocab, (len(lengths), prompt_len)).astype(np.int32)
  tokens[:, -1] = lengths * width + rng.integers(0, width, len(lengths))
  return tokens, np.ones_like(tokens)


def long_tail_main(argv):
  """Continuous engine vs static micro-batches vs transformers `generate` (see module doc)."""
  p = argparse.ArgumentParser(description="--long-tail: " + __doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", type=int, default=256)
  p.add_argument("--slots", type=int, default=64, help="continuous slots = static micro-batch")
  p.add_argument("--cap", type=int, default=256, help="max_new_tokens")
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--steps-per-call", type=int, default=8)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--no-hf", action="store_true")
  p.add_argument("--threads", type=int, default=None,
                 help="CPU threads for jax and torch (1 is steadier on a loaded machine)")
  p.add_argument("--quick", action="store_true",
                 help="64 rows through 16 slots, cap 96, 1 run, --threads 1 unless given")
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  if a.quick:
    a.rows, a.slots, a.cap, a.repeats = 64, 16, 96, 1
  import torch
  import transformers
  from mr_rl.sampling import Engine
  if a.threads:
    torch.set_num_threads(a.threads)
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen3Config(**LONG_TAIL_MODEL, max_position_embeddings=4096,
                                    bos_token_id=None, eos_token_id=0, pad_token_id=0)
  hf_model = transformers.Qwen3ForCausalLM(hf_cfg).eval()
  with tempfile.TemporaryDirectory() as tmp:
    hf_model.save_pretrained(tmp)
    base, params = models.load_pretrained(tmp)
  cfg = base.config
  model = forced_model(cfg, a.cap)
  lengths = forced_lengths(a.rows, a.cap)
  tokens, mask = long_tail_prompts(lengths, a.prompt_len, cfg.vocab_size, a.cap)
  res = dict(rows=a.rows, slots=a.slots, cap=a.cap, prompt_len=a.prompt_len, threads=a.threads,
             params=models.count_params(cfg), mean_length=float(lengths.mean()),
             max_length=int(lengths.max()), load_avg_start=os.getloadavg(), engines={})
  print(f"{res['params'] / 1e6:.1f}M params; {a.rows} rows, lengths mean {lengths.mean():.1f} "
        f"max {lengths.max()} (cap {a.cap}); load average {res['load_avg_start']}", flush=True)
  total = int(lengths.sum())
  kw = dict(max_new_tokens=a.cap, temperature=1.0, eos_id=0, pad_id=0)
  key = jax.random.PRNGKey(0)
  engine = Engine(model, slots=a.slots, steps_per_call=a.steps_per_call, **kw)
  static = Sampler(model, **kw)
  chunks = [slice(i, i + a.slots) for i in range(0, a.rows, a.slots)]

  def run_continuous():
    out = engine(params, tokens, mask, key=key)
    return out.lengths, engine.last_stats.slot_utilization

  def run_static():
    got, slot_steps = [], 0
    for c in chunks:
      out = jax.device_get(static(params, tokens[c], mask[c], key=key))
      got.append(out.lengths)
      slot_steps += int(out.steps) * out.lengths.shape[0]
    got = np.concatenate(got)
    return got, got.sum() / slot_steps

  class Forced(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
      allowed = countdown_mask(input_ids[:, -1], cfg.vocab_size, a.cap, torch)
      return scores.masked_fill(~allowed, -float("inf"))

  def run_hf():
    got, slot_steps = [], 0
    for c in chunks:
      with torch.no_grad():
        out = hf_model.generate(torch.as_tensor(tokens[c], dtype=torch.long),
                                attention_mask=torch.as_tensor(mask[c], dtype=torch.long),
                                do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=a.cap, eos_token_id=0, pad_token_id=0,
                                logits_processor=[Forced()])
      resp = out[:, a.prompt_len:].numpy()
      n = np.where((resp == 0).any(1), (resp == 0).argmax(1) + 1, resp.shape[1])
      got.append(n)
      slot_steps += resp.shape[1] * resp.shape[0]
    got = np.concatenate(got)
    return got, got.sum() / slot_steps

  runs = {"continuous": run_continuous, "static": run_static}
  if not a.no_hf:
    runs["transformers"] = run_hf
  times = {name: [] for name in runs}
  for name, fn in runs.items():  # warm-up (compiles; transformers needs none)
    if name != "transformers":
      t0 = time.perf_counter()
      fn()
      res["engines"][name] = dict(first_run_s=time.perf_counter() - t0)
  for _ in range(a.repeats):  # alternate, so background load hits all alike
    for name, fn in runs.items():
      t0 = time.perf_counter()
      got, util = fn()
      times[name].append(time.perf_counter() - t0)
      np.testing.assert_array_equal(np.asarray(got), lengths, err_msg=name)
      res["engines"].setdefault(name, {})["slot_utilization"] = float(util)
  for name, t in times.items():
    r = res["engines"][name]
    r.update(times_s=t, tokens_per_s=total / statistics.median(t))
    print(f"{name:13s} slot utilization {r['slot_utilization']:.3f}  "
          f"{r['tokens_per_s']:7.0f} tok/s  (runs {[round(x, 2) for x in t]} s)", flush=True)
  cont, stat = res["engines"]["continuous"], res["engines"]["static"]
  res["continuous_over_static"] = cont["tokens_per_s"] / stat["tokens_per_s"]
  res["calls"] = engine.last_stats.calls
  res["load_avg_end"] = os.getloadavg()
  print(f"continuous / static = {res['continuous_over_static']:.2f}x; "
        f"load average at end {res['load_avg_end']}")
  return report.write_json(res, a.json)


def main(argv=None):
  args = sys.argv[1:] if argv is None else list(argv)
  if "--long-tail" in args:
    return long_tail_main([x for x in args if x != "--long-tail"])
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
  return report.write_json(res, a.json)


if __name__ == "__main__":
  main()
