r"""What the policy update executes against what its real tokens need (issue 25 item 5).

For a GRPO-shaped rollout (B 8 prompts x G 8 responses, prompts of 8-12 tokens left-padded to
P 16, responses of lognormal lengths cut at S 48, as in `benchmarks/rl_step.py`), the trainer's
learner batch is built by `mr_rl.rl.batch.make_batch` (trimmed columns, or packed rows) and the
jitted policy step of `mr_rl.rl.update.learner` is compiled for it. Reported per variant:

* `per mb`: the FLOPs of the step's gradient program on one micro-batch,
  `compiled.cost_analysis()['flops']` (forward and backward of the clipped surrogate; XLA
  counts 2 per multiply-add and 1 per elementwise op);
* `executed`: the FLOPs of one compiled step (M micro-batches, clip and AdamW). XLA's cost
  analysis counts the body of the micro-batch `scan` (a while loop) once, so with M > 1 the
  step's count is its compiled count plus (M - 1) x `per mb`;
* `3x fwd real`: 3 x the forward FLOPs on the real tokens, per row (prompt p, response r)
  `forward_flops(p + r - 1 positions, LM head on r)` of `benchmarks/rl_step.py` (2 x body
  matmul weights per position, 2 d V per logit, causal attention);
* `ratio` = executed / 3x fwd real (the issue's goal: <= 1.15), `fill` = real positions /
  N x T of the batch, the step's median wall time (state donated, as in training) and its
  compile time, and the first step's loss and gradient norm (equal across variants up to
  float rounding: the same rollout).

  python benchmarks/update_flops.py                 # demo and 20m, every variant
  python benchmarks/update_flops.py --sizes demo --repeats 3 --json /tmp/flops.json

Timings on a shared CPU scale with its load, printed with the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from mr_rl import models  # noqa: E402
from mr_rl.rl import batch as batch_lib  # noqa: E402
from mr_rl.rl import update  # noqa: E402
from mr_rl.rl.losses import PolicyLossConfig, token_weights  # noqa: E402
from mr_rl.rollout import Rollout  # noqa: E402
import report  # noqa: E402
from rl_step import DEMO_POLICY, forward_flops  # noqa: E402

B, G, P, S = 8, 8, 16, 48
SIZES = ("demo", "20m")
# variant -> (pack, num_micro_batches, packed row counts per octave, LM head on every column).
# "pack-old" is packing with the row buckets it had before issue 25 (`size_bucket`: two per
# octave); "trim-head" the trimmed batch with the LM head over every column (before issue 25
# item 5: `response_start` None), "trim" runs it over the response window only.
VARIANTS = {"trim": (False, 1, None, False), "trim-head": (False, 1, None, True),
            "trim-M2": (False, 2, None, False), "pack-old": (True, 1, 2, False),
            "pack": (True, 1, batch_lib.PACKED_ROWS_PER_OCTAVE, False),
            "pack-M2": (True, 2, batch_lib.PACKED_ROWS_PER_OCTAVE, False)}


def model_of(size: str):
  """(Transformer, params) of a size: the demo's base policy, or the 20m random Qwen3 layout
  of `benchmarks/rl_step.py` (d 512, 6 layers, 8 / 4 heads of 64, d_ff 1664, vocab 24)."""
  if size == "demo":
    return models.load_pretrained(DEMO_POLICY)
  if size == "20m":
    cfg = models.ModelConfig(family="qwen3", vocab_size=24, d_model=512, n_layers=6, n_heads=8,
                             n_kv_heads=4, head_dim=64, d_ff=1664, max_seq_len=128)
    model = models.Transformer(cfg)
    return model, models.init_params(model, jax.random.PRNGKey(0))
  raise ValueError(f"unknown size {size!r}; one of {SIZES}")


def shape_of(cfg: models.ModelConfig) -> dict:
  """The sizes `rl_step.forward_flops` reads."""
  return dict(d=cfg.d_model, layers=cfg.n_layers, heads=cfg.n_heads, kv_heads=cfg.n_kv_heads,
              head_dim=cfg.head_dim, d_ff=cfg.d_ff, vocab=cfg.vocab_size)


def synthetic_rollout(vocab: int, seed: int = 0, mean_len: float = 22.0) -> Rollout:
  """A B x G rollout with prompts of 8-12 tokens and lognormal response lengths (mean about
  `mean_len`, cut at S: about 10% truncated at 22), EOS-free random tokens."""
  rng = np.random.default_rng(seed)
  p_len = rng.integers(8, 13, size=B)
  r_len = np.clip(np.round(rng.lognormal(np.log(mean_len) - 0.18, 0.6, size=(B, G))), 1, S)
  r_len = r_len.astype(np.int64)
  p_tok = rng.integers(1, vocab, size=(B, P)).astype(np.int32)
  p_mask = (np.arange(P)[None] >= P - p_len[:, None]).astype(np.int32)
  p_tok *= p_mask
  mask = (np.arange(S)[None, None] < r_len[..., None]).astype(np.int32)
  tokens = rng.integers(1, vocab, size=(B, G, S)).astype(np.int32) * mask
  logprobs = np.where(mask > 0, -rng.exponential(1.0, size=(B, G, S)), 0.0).astype(np.float32)
  return Rollout(prompt_tokens=p_tok, prompt_mask=p_mask, tokens=tokens, logprobs=logprobs,
                 mask=mask, lengths=r_len, truncated=r_len >= S,
                 texts=[[""] * G for _ in range(B)], owned=np.ones((B, G), bool))


def needed_flops(shape: dict, ro: Rollout) -> float:
  """3 x forward FLOPs on the real tokens: per row, p + r - 1 positions fed in, logits on r."""
  p = ro.prompt_mask.sum(1)
  return float(sum(3 * forward_flops(shape, int(p[b]) + int(r) - 1, int(r))
                   for b in range(B) for r in ro.lengths[b]))


def _flops(compiled) -> float:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost["flops"])


def measure(model, params, ro: Rollout, pack: bool, num_micro: int, repeats: int,
            rows_per_octave: int | None = None, full_head: bool = False) -> dict:
  """Builds the variant's learner batch and step; returns its FLOP counts and step time."""
  loss = PolicyLossConfig(eps_low=0.2, eps_high=0.28, loss_agg="token-mean")
  cfg = update.UpdateConfig(loss=loss, num_micro_batches=num_micro, lr=2e-4, weight_decay=0.0,
                            pack=pack)
  adv = np.random.default_rng(1).standard_normal((B, G)).astype(np.float32)
  spec = batch_lib.PackSpec("token-mean", None, num_micro) if pack else None
  default_octave = batch_lib.PACKED_ROWS_PER_OCTAVE
  try:  # the A/B of the packed row buckets: the module's constant, set for this one call
    batch_lib.PACKED_ROWS_PER_OCTAVE = rows_per_octave or default_octave
    batch = batch_lib.make_batch(ro, adv, pack=spec)
  finally:
    batch_lib.PACKED_ROWS_PER_OCTAVE = default_octave
  if full_head:
    batch = batch.replace(response_start=None)
  batch = jax.tree.map(jnp.asarray, batch)
  lrn = update.learner(model, cfg)
  state = lrn.init(params, jax.random.PRNGKey(0))
  rng = jax.random.PRNGKey(1)
  t0 = time.perf_counter()
  compiled = lrn.step.lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - t0
  compiled_flops = _flops(compiled)
  # One micro-batch's gradient program (what the step's scan runs M times).
  n = batch.shape[0] // num_micro
  mb = jax.tree.map(lambda x: x[::num_micro], batch)
  assert mb.shape[0] == n
  if mb.weights is None:  # the step's weights: over the whole batch, before the split
    mb = mb.replace(weights=token_weights(batch.response_mask, "token-mean")[::num_micro],
                    metric_weights=token_weights(batch.response_mask, "token-mean")[::num_micro])
  full_logits = update.model_logits_fn(model)  # full fine-tuning: no dropout row keys
  grad_fn = update.policy_grad_fn(lambda params, keys, *rows, **kw: full_logits(params, *rows, **kw),
                                  cfg.loss)
  per_mb = _flops(jax.jit(grad_fn).lower(state.params, mb, None).compile())
  times, first = [], None
  for _ in range(repeats + 1):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch, rng)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
    first = first or metrics
  executed = compiled_flops + (num_micro - 1) * per_mb  # the scan body is counted once
  N, T = batch.shape
  real = int(np.asarray(batch.mask).sum())
  return dict(rows=N, columns=T, response_start=batch.response_start, real_positions=real,
              fill=real / (N * T),
              executed_flops=executed, micro_batch_flops=per_mb, num_micro_batches=num_micro,
              compile_s=compile_s, step_s=statistics.median(times[1:]),
              policy_loss=float(first["policy_loss"]), grad_norm=float(first["grad_norm"]))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--sizes", default=",".join(SIZES))
  ap.add_argument("--variants", default=",".join(VARIANTS))
  ap.add_argument("--repeats", type=int, default=3, help="timed steps per variant (median)")
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  out = dict(load_avg_start=report.load_avg(), sizes={})
  print(f"load average {out['load_avg_start']}", flush=True)
  hdr = (f"{'size':5s} {'variant':8s} {'N x T':>8s} {'fill':>5s} {'executed':>9s} "
         f"{'per mb':>8s} {'3x fwd real':>11s} {'ratio':>6s} {'step ms':>8s} {'compile':>7s} "
         f"{'loss':>10s} {'grad norm':>9s}")
  for size in args.sizes.split(","):
    model, params = model_of(size)
    shape = shape_of(model.config)
    ro = synthetic_rollout(model.config.vocab_size)
    need = needed_flops(shape, ro)
    rows = {}
    print(hdr, flush=True)
    for name in args.variants.split(","):
      pack, m, octave, full_head = VARIANTS[name]
      r = measure(model, params, ro, pack, m, args.repeats, octave, full_head)
      r.update(needed_flops=need, ratio=r["executed_flops"] / need)
      rows[name] = r
      print(f"{size:5s} {name:8s} {r['rows']:>3d} x {r['columns']:<3d} {r['fill']:5.2f} "
            f"{r['executed_flops'] / 1e9:8.2f}G {r['micro_batch_flops'] / 1e9:7.2f}G "
            f"{need / 1e9:10.2f}G {r['ratio']:6.3f} {1e3 * r['step_s']:8.1f} "
            f"{r['compile_s']:6.1f}s "
            f"{r['policy_loss']:10.6f} {r['grad_norm']:9.6f}", flush=True)
    out["sizes"][size] = dict(params=int(models.count_params(model.config)),
                              real_tokens=int(ro.prompt_mask.sum() * G + ro.lengths.sum()),
                              response_tokens=int(ro.lengths.sum()), variants=rows)
  out["load_avg_end"] = report.load_avg()
  print(f"load average at the end {out['load_avg_end']}", flush=True)
  report.write_json(out, args.json, indent=2)


if __name__ == "__main__":
  main()
