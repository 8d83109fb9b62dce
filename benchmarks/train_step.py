"""Trainer throughput: the jitted GRPO policy step, and where a demo training step's time goes.

Part 1, update throughput. The jitted policy step of the trainer (`train._policy_step`:
forward + backward of the clipped surrogate, global-norm clip, AdamW; docs/methods.md §3-5) on a
GRPO-shaped batch: left-padded prompts of random length, right-padded responses of random
length, old log-probs from the model itself (ratio 1), group-normal advantages. Two models:

  * demo:       the demo's base policy (configs/demo.py), on its real batch shape
                B*G = 16*8 = 128 rows x (16 prompt + 48 response) = 64 tokens;
  * qwen3_tiny: a random Qwen3 of the sampler calibration's shape (docs/benchmarks.md, "Sampler":
                4 layers, d=256, 8 heads / 4 KV heads, head_dim 32, d_ff 768, vocab 1024,
                tied; 3.4M params),
                on `--rows` x `--seq` (default 128 x 64).

tokens/s counts every position of the [rows, T] batch (padding included: the step computes
on it). FLOPs per step come from XLA (`compiled.cost_analysis()['flops']` of the very
executable timed) and, for comparison, from the analytic count
6 * matmul params * tokens + 12 * L * H * head_dim * T^2 per row (full T x T attention, as
computed under masking). The achieved rate is divided by a large fp32 matmul's rate
measured in the same run (the best of the measurements at start and after part 1).

Part 2, time shares. `train.train(settings, workdir=None)` of configs/demo.py for one task
and method (default `negative`, `additive`) for 1 + `--steps` GRPO steps; the first
(compiling) step is dropped, and the mean of `time/rollout`, `time/reward`, `time/update`
and their shares of the three's sum are reported, with the whole step's wall time (the gap
between the trainer's per-step log calls) for the remainder (metrics, data). Note that
`time/update` covers more than the policy step: aggregation + advantages, batch assembly,
the reference-policy forward pass (every `kl_ref_every`-th step, 10 in the demo, for the
`kl_ref/*` metrics) and the metrics' device_get. Part 1's `step/fwd` is the policy step's time
in forward-pass equivalents; `FLOPs/fwd` is the same ratio by XLA's FLOP counts (3.0 means
the step computes one forward and a backward of twice its cost, nothing more).

Part 3, cost growth (`--cap-growth 48,96,192`): part 2's demo steps at each `max_new_tokens`
cap on the same prompts, with the base policy's `max_position_embeddings` raised in a copy
of its config.json (RoPE: outputs below the old limit unchanged; docs/benchmarks.md, "Update step"),
so the responses are identical (checked) and only the cap changes. The goal: doubling the
cap changes the step time by less than 15%.

  python benchmarks/train_step.py --quick --json /tmp/train_step.json   # ~1-2 min, idle 2 cores
  python benchmarks/train_step.py                                       # more repeats / steps
  python benchmarks/train_step.py --only-cap-growth --cap-growth 48,96,192 --steps 10

The load average (os.getloadavg) is printed and stored at start and end: on a shared CPU
every figure here scales with it. If the demo's base policy
(mr_rl/demo/assets/base_policy) is missing, a 3-step warm start is written to a temporary
directory and used instead (`--base-policy` points elsewhere); then part 1's shapes are
the same, but part 2's responses are those of an untrained model (mostly truncated at 48).

JSON: the top-level `update_tokens_per_s` / `update_flops_fraction` are qwen3_tiny's
(`*_demo` the demo model's); `rollout_share`, `reward_share`, `update_share` are part 2's.
Everything else is under `update`, `shares` and `cap_growth`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from mr_rl import models, settings as settings_lib, train as train_lib, train_step  # noqa: E402
from mr_rl.rl import update as update_lib  # noqa: E402
from mr_rl.rl.batch import LearnerBatch  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/roofline.py
import report  # noqa: E402
from roofline import matmul_flops_per_s  # noqa: E402

QWEN3_TINY = models.ModelConfig(
    family="qwen3", vocab_size=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
    head_dim=32, d_ff=768, qk_norm=True, tie_embeddings=True, max_seq_len=4096)
DEMO_CONFIG = os.path.join(_ROOT, "configs", "demo.py")


# ------------------------------------------------------------------------------ helpers
def analytic_train_flops(cfg: models.ModelConfig, rows: int, T: int) -> float:
  """6 * matmul params * tokens (fwd + bwd) plus full T x T attention (QK^T and AV, x3)."""
  d, h, j, hd, f, L, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                          cfg.n_layers, cfg.vocab_size)
  matmul_params = L * (d * h * hd * 2 + d * j * hd * 2 + 3 * d * f) + d * V
  attention = 3 * L * 4 * h * hd * T * T  # per row: 2 matmuls of 2*T*T*hd per head, fwd+2 bwd
  return 6 * matmul_params * rows * T + rows * attention


def _xla_flops(compiled) -> float | None:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax returns one dict per computation
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"])


def grpo_batch(model, params, rows: int, prompt_len: int, resp_len: int, group_size: int,
               seed: int = 0) -> LearnerBatch:
  """A learner batch shaped like `mr_rl.rl.batch.make_batch`'s, with the model's own old
  log-probs."""
  if rows % group_size:
    raise ValueError(f"rows={rows} must be a multiple of group_size={group_size}")
  rng = np.random.default_rng(seed)
  V, T = model.config.vocab_size, prompt_len + resp_len
  tokens = rng.integers(1, V, size=(rows, T), dtype=np.int32)
  p_len = rng.integers(max(1, prompt_len // 2), prompt_len + 1, size=rows)
  r_len = rng.integers(max(1, resp_len // 4), resp_len + 1, size=rows)
  col = np.arange(T)[None]
  prompt = (col >= prompt_len - p_len[:, None]) & (col < prompt_len)
  resp = (col >= prompt_len) & (col < prompt_len + r_len[:, None])
  mask = (prompt | resp).astype(np.int32)
  tokens = np.where(mask == 1, tokens, 0).astype(np.int32)
  logp_fn = train_step.logprob_forward(model)
  old_logp = logp_fn(params, jnp.asarray(tokens), jnp.asarray(mask))
  resp_mask = jnp.asarray(resp.astype(np.int32))
  return LearnerBatch(
      tokens=jnp.asarray(tokens), mask=jnp.asarray(mask), response_mask=resp_mask,
      old_logp=jnp.where(resp_mask == 1, old_logp, 0.0),
      advantages=jnp.asarray(rng.standard_normal(rows).astype(np.float32))).check()


def time_policy_step(name: str, model, params, update_config, batch: LearnerBatch,
                     repeats: int) -> dict:
  """Compiles the trainer's policy step for `batch`, then times `repeats` steps."""
  learner = update_lib.learner(model, update_config)
  step = learner.step
  state = learner.init(params, jax.random.PRNGKey(1))
  key = jax.random.PRNGKey(0)
  t0 = time.perf_counter()
  compiled = step.lower(state, batch, key).compile()
  compile_s = time.perf_counter() - t0
  state, m = compiled(state, batch, key)  # warm-up run
  jax.block_until_ready((state, m))
  times = []
  for i in range(repeats):
    t0 = time.perf_counter()
    state, m = compiled(state, batch, jax.random.fold_in(key, i + 1))
    jax.block_until_ready((state, m))
    times.append(time.perf_counter() - t0)
  if not np.isfinite(float(m["policy_loss"])):
    raise FloatingPointError(f"{name}: non-finite policy loss {float(m['policy_loss'])}")
  fwd = train_step.logprob_forward(model)  # the trainer's reference forward (grpo_batch's)
  fwd_flops = _xla_flops(fwd.lower(params, batch.tokens, batch.mask).compile())
  fwd_times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fwd(params, batch.tokens, batch.mask))
    fwd_times.append(time.perf_counter() - t0)
  rows, T = batch.shape
  sec = statistics.median(times)
  return dict(model=name, params=models.count_params(model.config), rows=int(rows), T=int(T),
              response_tokens=int(np.asarray(batch.response_mask).sum()),
              compile_s=compile_s, times_s=times, median_s=sec,
              forward_times_s=fwd_times, forward_median_s=statistics.median(fwd_times),
              tokens_per_s=rows * T / sec,
              flops_xla=_xla_flops(compiled), forward_flops_xla=fwd_flops,
              flops_analytic=analytic_train_flops(model.config, rows, T))


# -------------------------------------------------------------------------------- demo
def demo_settings(task: str, method: str, steps: int, base_policy: str):
  """configs/demo.py settings for one (task, method) run of 1 + `steps` GRPO steps."""
  from mr_rl.config_lib.args import load_config_module
  from mr_rl.demo import run as demo_run
  cfg = load_config_module(DEMO_CONFIG).get_config()
  cfg.model.path = base_policy
  base = settings_lib.from_config(cfg)
  ts = demo_run.task_settings(base, cfg.demo, task)
  name, hp = demo_run.method_aggregator(method, len(ts.rewards.channels))
  return dataclasses.replace(ts, aggregator=settings_lib.AggregatorSettings(name, hp),
                             total_steps=steps + 1, log_every=1)


def time_shares(settings, comp) -> dict:
  """Runs train.train without a workdir; per-step means and shares, first step excluded."""
  stamps = []
  t0 = time.perf_counter()
  res = train_lib.train(settings, None, comp=comp,
                        log=lambda _: stamps.append(time.perf_counter()))
  total_s = time.perf_counter() - t0
  hist = res.history[1:]
  if not hist:
    raise ValueError("need at least 2 steps (the first one compiles)")
  mean = {k: float(np.mean([h[f"time/{k}"] for h in hist])) for k in ("rollout", "reward", "update")}
  parts = sum(mean.values())
  ok = len(stamps) == len(res.history)
  wall = float(np.mean(np.diff(stamps))) if ok else float("nan")
  wall_median = float(np.median(np.diff(stamps))) if ok else float("nan")
  return dict(steps_timed=len(hist), first_step_s=stamps[0] - t0 if stamps else float("nan"),
              total_s=total_s, mean_s=mean, step_wall_s=wall, step_wall_median_s=wall_median,
              widths=sorted({h["batch/columns"] for h in res.history if "batch/columns" in h}),
              other_s=wall - parts,
              shares={k: v / parts for k, v in mean.items()},
              response_length_mean=float(np.mean([h["response/length_mean"] for h in hist])),
              truncated_frac=float(np.mean([h["response/truncated_frac"] for h in hist])),
              columns_mean=float(np.mean([h.get("batch/columns", np.nan) for h in hist])),
              lengths=[h["response/length_mean"] for h in res.history])


def cap_growth(base_policy: str, caps, task: str, method: str, steps: int, tmp: str) -> list:
  """The issue-16 cost-growth check: the demo step at several `max_new_tokens` caps on the
  same prompts. The base policy is copied with config.json's `max_position_embeddings` raised
  to fit the largest cap (RoPE: outputs below the old limit are unchanged;
  docs/benchmarks.md, "Update step"), so the
  responses are the same and only the cap changes (checked: equal mean lengths per step)."""
  import shutil
  path = os.path.join(tmp, "base_policy_long")
  shutil.copytree(base_policy, path, dirs_exist_ok=True)
  with open(os.path.join(path, "config.json")) as f:
    cfg = json.load(f)
  cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], 64 + max(caps))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
  out = []
  comp = None
  for cap in caps:
    s = demo_settings(task, method, steps, path)
    s = dataclasses.replace(s, rollout=dataclasses.replace(s.rollout, max_new_tokens=cap))
    comp = train_lib.build(s) if comp is None else dataclasses.replace(comp, settings=s)
    sh = time_shares(s, comp)
    out.append(dict(max_new_tokens=cap, **sh))
    print(f"  cap {cap}: step {sh['step_wall_s']:.3f} s, update {sh['mean_s']['update']:.3f} s, "
          f"rollout {sh['mean_s']['rollout']:.3f} s, columns {sh['columns_mean']:.1f}, "
          f"mean length {sh['response_length_mean']:.2f}", flush=True)
  return out


def ensure_base_policy(path: str | None, tmp: str) -> tuple[str, bool]:
  """(checkpoint path, whether it is a throw-away 3-step warm start made here)."""
  path = path or os.path.join(_ROOT, "mr_rl", "demo", "assets", "base_policy")
  if os.path.isfile(os.path.join(path, "config.json")):
    return path, False
  from mr_rl.demo import warmstart
  out = os.path.join(tmp, "base_policy")
  print(f"no base policy at {path}; writing a 3-step warm start to {out}", flush=True)
  warmstart.train(warmstart.WarmStartConfig(steps=3), out, log_every=0)
  return out, True


# -------------------------------------------------------------------------------- main
def _fmt_update(r: dict, peak: float) -> str:
  flops = r["flops_xla"] if r["flops_xla"] is not None else r["flops_analytic"]
  ratio = (r["flops_xla"] / r["forward_flops_xla"] if r["flops_xla"] and r["forward_flops_xla"]
           else float("nan"))
  return (f"{r['model']:<11s} {r['params'] / 1e6:6.2f}M {r['rows']:4d}x{r['T']:<4d} "
          f"{r['median_s'] * 1e3:9.1f} {r['tokens_per_s']:10.0f} "
          f"{flops / r['median_s'] / 1e9:8.1f} {100 * flops / r['median_s'] / peak:6.1f}% "
          f"{r['flops_analytic'] / r['median_s'] / 1e9:9.1f} {r['forward_median_s'] * 1e3:8.1f} "
          f"{r['median_s'] / r['forward_median_s']:8.1f} {ratio:8.2f} {r['compile_s']:8.1f}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--quick", action="store_true", help="3 repeats, 3 timed demo steps")
  p.add_argument("--repeats", type=int, default=10, help="timed policy steps per model")
  p.add_argument("--steps", type=int, default=10, help="timed demo GRPO steps (after 1 compiling)")
  p.add_argument("--rows", type=int, default=128, help="qwen3_tiny batch rows (multiple of 8)")
  p.add_argument("--seq", type=int, default=64, help="qwen3_tiny tokens per row (1/4 prompt)")
  p.add_argument("--task", default="negative", help="demo task for the time shares")
  p.add_argument("--method", default="additive", help="demo method for the time shares")
  p.add_argument("--base-policy", default=None, help="demo base policy checkpoint directory")
  p.add_argument("--json", default=None, help="write the results here")
  p.add_argument("--cap-growth", default="", help="comma-separated max_new_tokens caps "
                 "(e.g. 48,96,192): also time the demo step at each cap on the same prompts")
  p.add_argument("--only-cap-growth", action="store_true", help="skip parts 1 and 2")
  a = p.parse_args(argv)
  if a.quick:
    a.repeats, a.steps = 3, 3
  for name in ("repeats", "steps", "rows", "seq"):
    if getattr(a, name) < 1:
      raise ValueError(f"--{name} must be >= 1, got {getattr(a, name)}")
  res = dict(backend=jax.default_backend(), devices=str(jax.devices()), cpu_count=os.cpu_count(),
             quick=a.quick, load_avg_start=report.load_avg())
  print(f"backend {res['backend']} ({res['cpu_count']} CPUs), "
        f"load average (1/5/15 min) {res['load_avg_start']}", flush=True)
  t_start = time.perf_counter()

  with tempfile.TemporaryDirectory() as tmp:
    base_policy, throwaway = ensure_base_policy(a.base_policy, tmp)
    res["base_policy"] = "3-step warm start (temporary)" if throwaway else base_policy
    caps = [int(x) for x in a.cap_growth.split(",") if x.strip()]
    if a.only_cap_growth:
      if not caps:
        raise ValueError("--only-cap-growth needs --cap-growth CAPS")
      res["cap_growth"] = cap_growth(base_policy, caps, a.task, a.method, a.steps, tmp)
      res["load_avg_end"] = report.load_avg()
      _print_cap_growth(res)
      return report.write_json(res, a.json)
    settings = demo_settings(a.task, a.method, a.steps, base_policy)
    comp = train_lib.build(settings)

    peak0 = matmul_flops_per_s(reps=8)
    print(f"large fp32 matmul: {peak0 / 1e9:.1f} GFLOP/s", flush=True)

    # Part 1: the policy step alone.
    G = settings.rollout.group_size
    demo_batch = grpo_batch(comp.model, comp.base_params,
                            settings.data.batch_prompts * G, settings.data.max_prompt_len,
                            settings.rollout.max_new_tokens, G)
    upd = {"demo": time_policy_step("demo", comp.model, comp.base_params, settings.update,
                                    demo_batch, a.repeats)}
    print(f"  demo policy step: {upd['demo']['median_s'] * 1e3:.1f} ms", flush=True)
    tiny = models.Transformer(QWEN3_TINY)
    tiny_params = models.init_params(tiny, jax.random.PRNGKey(0))
    tiny_batch = grpo_batch(tiny, tiny_params, a.rows, a.seq // 4, a.seq - a.seq // 4, G)
    upd["qwen3_tiny"] = time_policy_step("qwen3_tiny", tiny, tiny_params, settings.update,
                                         tiny_batch, a.repeats)
    print(f"  qwen3_tiny policy step: {upd['qwen3_tiny']['median_s'] * 1e3:.1f} ms", flush=True)
    peak1 = matmul_flops_per_s(reps=8)
    peak = max(peak0, peak1)
    res["matmul_gflops"] = [peak0 / 1e9, peak1 / 1e9]
    for r in upd.values():
      flops = r["flops_xla"] if r["flops_xla"] is not None else r["flops_analytic"]
      r["flops_source"] = "xla cost_analysis" if r["flops_xla"] is not None else "analytic"
      r["gflops_per_s"] = flops / r["median_s"] / 1e9
      r["flops_fraction"] = flops / r["median_s"] / peak
    res["update"] = upd
    res["load_avg_after_update"] = report.load_avg()

    # Part 2: the trainer's time shares.
    print(f"demo {a.task}/{a.method}: {a.steps + 1} GRPO steps through train.train ...",
          flush=True)
    sh = time_shares(settings, comp)
    res["shares"] = dict(task=a.task, method=a.method, **sh)
    if caps:
      print(f"cap growth {caps}: {a.steps + 1} demo steps each ...", flush=True)
      res["cap_growth"] = cap_growth(base_policy, caps, a.task, a.method, a.steps, tmp)
  res["load_avg_end"] = report.load_avg()
  res["seconds"] = time.perf_counter() - t_start

  t, d = upd["qwen3_tiny"], upd["demo"]
  res.update(update_tokens_per_s=t["tokens_per_s"], update_flops_fraction=t["flops_fraction"],
             update_tokens_per_s_demo=d["tokens_per_s"],
             update_flops_fraction_demo=d["flops_fraction"],
             rollout_share=sh["shares"]["rollout"], reward_share=sh["shares"]["reward"],
             update_share=sh["shares"]["update"])

  print()
  print(f"Policy step (fwd + bwd + AdamW), median of {a.repeats}; large matmul "
        f"{peak0 / 1e9:.1f} / {peak1 / 1e9:.1f} GFLOP/s (start / after), best used as peak")
  print(f"{'model':<11s} {'params':>7s} {'batch':>9s} {'ms/step':>9s} {'tokens/s':>10s} "
        f"{'GFLOP/s':>8s} {'of mm':>7s} {'analytic':>9s} {'fwd ms':>8s} {'step/fwd':>8s} "
        f"{'FLOPs/fwd':>8s} {'compile':>8s}")
  for r in upd.values():
    print(_fmt_update(r, peak))
  print("  (GFLOP/s from XLA cost_analysis of the timed executable; 'analytic' = "
        "6*params*tokens + attention; tokens include padding;\n   fwd = the trainer's jitted "
        "log-prob forward on the same batch, as for the reference policy; step/fwd = time in\n"
        "   forward-pass equivalents, FLOPs/fwd = the same by XLA's FLOP counts; compile in s)")
  print()
  print(f"Demo {a.task}/{a.method} ({res['base_policy']}): mean of {sh['steps_timed']} "
        f"steps after the first ({sh['first_step_s']:.1f} s, compiling)")
  print(f"{'part':<10s} {'s/step':>8s} {'share':>7s}")
  for k in ("rollout", "reward", "update"):
    print(f"{k:<10s} {sh['mean_s'][k]:8.3f} {100 * sh['shares'][k]:6.1f}%")
  print(f"{'(other)':<10s} {sh['other_s']:8.3f}   (step wall {sh['step_wall_s']:.3f} s; "
        "shares are of rollout + reward + update)")
  print(f"  update batch columns (mean): {sh['columns_mean']:.1f}")
  print(f"  part 1's policy step + forward = "
        f"{100 * (d['median_s'] + d['forward_median_s']) / sh['mean_s']['update']:.0f}% "
        f"of time/update; responses: mean length {sh['response_length_mean']:.1f}, "
        f"{100 * sh['truncated_frac']:.0f}% truncated")
  if "cap_growth" in res:
    _print_cap_growth(res)
  print()
  print(f"load average start {res['load_avg_start']}, after part 1 "
        f"{res['load_avg_after_update']}, end {res['load_avg_end']}; total {res['seconds']:.0f} s")
  return report.write_json(res, a.json, announce=True)


def _print_cap_growth(res: dict) -> None:
  rows = res["cap_growth"]
  print()
  print("Cost growth: demo step vs max_new_tokens (same prompts; mean and median of the timed "
        "steps; a step that meets a new width compiles)")
  print(f"{'cap':>5s} {'step s':>8s} {'median s':>9s} {'update s':>9s} {'rollout s':>10s} "
        f"{'columns':>8s} {'widths':>14s} {'mean len':>9s} {'median vs first':>16s}")
  for r in rows:
    widths = ",".join(str(int(w)) for w in r["widths"]) or "-"
    print(f"{r['max_new_tokens']:5d} {r['step_wall_s']:8.3f} {r['step_wall_median_s']:9.3f} "
          f"{r['mean_s']['update']:9.3f} {r['mean_s']['rollout']:10.3f} {r['columns_mean']:8.1f} "
          f"{widths:>14s} {r['response_length_mean']:9.2f} "
          f"{r['step_wall_median_s'] / rows[0]['step_wall_median_s']:16.2f}")
  same = all(r["lengths"] == rows[0]["lengths"] for r in rows)
  print(f"  per-step mean lengths identical across caps: {same}")


if __name__ == "__main__":
  main()
