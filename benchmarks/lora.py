"""LoRA on CPU: sampling merged vs unmerged, and the learner step's tokens/s against full FT.

Model: a random ~22M-parameter Qwen3 (6 layers, d=512, 8 heads / 4 KV heads, head_dim 64,
d_ff 1408, vocab 8192, tied), fp32. Adapters on all seven kernels of every layer.

Part 1, sampling (docs/architecture.md "Models": the sampler runs merged weights). One jitted decode
step (one token per row, KV cache of `--cache` slots) timed with
  * merged: plain params from `lora.merge` (cost: one merge per rollout, timed separately);
  * unmerged: the `Adapted` variables, the adapters applied as (x a) b in every step.
A rollout of S tokens costs merge + S * t_merged against S * t_unmerged; the break-even S is
printed.

Part 2, update. The jitted GRPO policy step (`mr_rl.rl.update.learner`) on `--rows` x `--seq`
tokens: full fine-tuning (AdamW on every weight) against LoRA at `--rank` (AdamW on the
adapters; the base a frozen argument). tokens/s counts every position of the batch.

  nice -n 10 python benchmarks/lora.py --json /tmp/lora.json    # ~3-5 min on 2 busy cores

The load average (os.getloadavg) is printed at start and end: every figure scales with it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import models
from mr_rl.models import lora as lora_lib
from mr_rl.models.layers import init_cache
from mr_rl.rl import update
from mr_rl.rl.batch import LearnerBatch

CFG = models.ModelConfig(family="qwen3", vocab_size=8192, d_model=512, n_layers=6, n_heads=8,
                         n_kv_heads=4, head_dim=64, d_ff=1408, max_seq_len=1024)


def _time(fn, repeats):
  fn()  # compile / warm
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    ts.append(time.perf_counter() - t0)
  return float(np.median(ts))


def sampling(model, base, adapted, rows, cache_len, repeats):
  cache = init_cache(CFG, rows, cache_len)
  tok = jnp.ones((rows, 1), jnp.int32)
  kv = jnp.ones((rows, cache_len), jnp.int32)

  @jax.jit
  def step(variables, cache):
    logits, cache = model.apply(variables, tok, jnp.full((rows, 1), cache_len // 2, jnp.int32),
                                kv_mask_NC=kv, cache=cache, cache_index=cache_len // 2)
    return logits, cache

  merged = lora_lib.merge(adapted)
  t_merge = _time(lambda: lora_lib.merge(adapted), repeats)
  t_m = _time(lambda: step({"params": merged}, cache)[0], repeats * 5)
  t_u = _time(lambda: step(adapted.variables(), cache)[0], repeats * 5)
  t_base = _time(lambda: step({"params": base}, cache)[0], repeats * 5)
  even = t_merge / (t_u - t_m) if t_u > t_m else float("inf")
  return {"merge_s": t_merge, "step_merged_s": t_m, "step_unmerged_s": t_u,
          "step_base_s": t_base, "break_even_tokens": even}


def update_rate(model, base, rows, seq, rank, repeats):
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, CFG.vocab_size, (rows, seq)).astype(np.int32)
  mask = np.ones((rows, seq), np.int32)
  rmask = np.zeros((rows, seq), np.int32)
  rmask[:, seq // 4:] = 1
  logp = np.asarray(update.make_logprob_fn(update.model_logits_fn(model))(base, tokens, mask))
  batch = LearnerBatch(tokens=tokens, mask=mask, response_mask=rmask,
                       old_logp=np.where(rmask > 0, logp, 0).astype(np.float32),
                       advantages=rng.normal(size=(rows,)).astype(np.float32)).check()
  out = {}
  for name, lcfg in (("full", None), (f"lora_r{rank}", lora_lib.LoraConfig(rank=rank))):
    learner = update.learner(model, update.UpdateConfig(lr=1e-5, lora=lcfg))
    state = {"s": learner.init(base, jax.random.PRNGKey(0))}
    key = jax.random.PRNGKey(1)

    def run():
      state["s"], m = learner.update(state["s"], batch, key, base)
      return m["policy_loss"]

    t = _time(run, repeats)
    out[name] = {"step_s": t, "tokens_per_s": rows * seq / t,
                 "state_bytes": lora_lib.count_bytes(state["s"])}
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
  p.add_argument("--rows", type=int, default=16)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--rank", type=int, default=8)
  p.add_argument("--sample-rows", type=int, default=16)
  p.add_argument("--cache", type=int, default=256)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--json", default=None)
  a = p.parse_args()
  load0 = os.getloadavg()
  model = models.Transformer(CFG)
  base = models.init_params(model, jax.random.PRNGKey(0))
  lcfg = lora_lib.LoraConfig(rank=a.rank)
  ad = lora_lib.init_adapters(CFG, lcfg, jax.random.PRNGKey(1))
  adapted = lora_lib.Adapted(base, ad, lcfg.scale)
  res = {"params": models.count_params(CFG), "rank": a.rank, "load_start": load0}
  res["sampling"] = sampling(model, base, adapted, a.sample_rows, a.cache, a.repeats)
  print("sampling:", json.dumps(res["sampling"]))
  res["update"] = update_rate(model, base, a.rows, a.seq, a.rank, a.repeats)
  print("update:", json.dumps(res["update"]))
  res["load_end"] = os.getloadavg()
  print(f"params {res['params'] / 1e6:.1f}M; load average start {load0}, end {res['load_end']}")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(res, f, indent=2)


if __name__ == "__main__":
  main()
