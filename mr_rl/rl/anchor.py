"""TAG anchor election by per-token reverse-KL drift of single-channel probes (docs/methods.md §6).

For every channel k: train from pi_0 with single-channel GRPO (`rp_only`, primary = k) for T
steps, giving pi_{T,k}; measure on held-out prompts

    KLrev_k = E_x[ KL(pi_{T,k}(.|x) || pi_0(.|x)) ] / E_{x, y ~ pi_{T,k}}[|y|],

with the sequence KL estimated two ways on y ~ pi_{T,k}: the sampled log-ratio
`sum_t log pi_{T,k}(y_t) - log pi_0(y_t)` and the exact per-position full-vocabulary KL summed
over t. Forward drift uses y ~ pi_0 and KL(pi_0 || pi_{T,k}). The anchor is argmin_k KLrev_k;
the probe policies are discarded and joint training restarts from pi_0.

A probe whose channel never produced a reward (every sample NaN: failed or not applicable,
docs/methods.md §1) had no learning signal; its drift (only weight decay) would be the smallest and
say nothing about the channel, so such a channel (probe_reward NaN) is never elected, and
neither is one with a non-finite drift.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import distributed, models
from mr_rl.models import sharding
from mr_rl import rollout as rollout_lib
from mr_rl.rl import batch as batch_lib
from mr_rl.rl import update as update_lib
from mr_rl.rl.kl import exact_kl


@dataclasses.dataclass(frozen=True)
class Drift:
  channel: str
  rev_kl_per_token: float        # sampled log-ratio estimate, y ~ pi_{T,k}
  rev_kl_exact_per_token: float  # exact per-position KL summed, y ~ pi_{T,k}
  fwd_kl_per_token: float        # sampled estimate of KL(pi_0 || pi_{T,k}), y ~ pi_0
  fwd_kl_exact_per_token: float
  mean_len_probe: float
  mean_len_base: float
  probe_reward: float            # the probed channel's mean reward over the last probe steps
                                 # (NaN: every reward was NaN; never elected)


def probe_reward(step_means: Sequence[float]) -> float:
  """Mean of a probe's per-step channel means, ignoring NaN steps; NaN if all are NaN."""
  vals = np.asarray(step_means, np.float64)
  ok = vals[np.isfinite(vals)]
  return float(ok.mean()) if ok.size else float("nan")


def eligible(d: Drift, use_exact: bool = False) -> bool:
  """Whether channel `d` may be elected (finite drift, a defined probe reward)."""
  drift = d.rev_kl_exact_per_token if use_exact else d.rev_kl_per_token
  return bool(np.isfinite(drift) and np.isfinite(d.probe_reward))


def _seq_kl(model, p_params, q_params, tokens, mask, resp_mask, logp_p):
  """Per-sequence sampled and exact KL(p || q) on sequences drawn from p."""
  logits_p = models.logits(model, p_params, tokens, mask)[:, :-1]
  logits_q = models.logits(model, q_params, tokens, mask)[:, :-1]
  tgt = tokens[:, 1:]
  lq = jnp.take_along_axis(jax.nn.log_softmax(logits_q.astype(jnp.float32)), tgt[..., None],
                           -1)[..., 0]
  w = resp_mask[:, 1:].astype(jnp.float32)
  sampled = jnp.sum((logp_p[:, 1:] - lq) * w, -1)
  exact = jnp.sum(exact_kl(logits_p, logits_q) * w, -1)
  return sampled, exact


_seq_kl_jit = jax.jit(_seq_kl, static_argnums=0)


def drift_chunk_rows(micro_batch_rows: int, rows: int, multiple: int = 1) -> int:
  """Rows per drift forward: the policy step's micro-batch (`micro_batch_rows` = B*G / M, the
  size known to fit a chip), reduced to a divisor of `rows` so every chunk has one shape; on a
  mesh a multiple of its data-parallel size `multiple` (which must divide `rows`)."""
  if rows % multiple:
    raise ValueError(f"{rows} drift rows do not split over {multiple} data-parallel shards")
  return multiple * math.gcd(rows // multiple, max(1, micro_batch_rows // multiple))


def measure_drift(policy: rollout_lib.Policy, probe_params, base_params, examples, key, *,
                  sampling: rollout_lib.SamplingSettings, batch_prompts: int,
                  micro_batch_rows: int, turns=None) -> dict[str, float]:
  """Reverse and forward per-token drift of `probe_params` from `base_params`.

  Responses are sampled at temperature 1 (`sampling.group_size` per held-out prompt,
  `batch_prompts` prompts per sampler call) through the run's own `mr_rl.rollout` pieces
  (`policy`, the run's response budget and filters in `sampling`). The two policies' forwards
  run `drift_chunk_rows` rows at a time (full-vocabulary logits of a whole held-out batch do
  not fit a chip at paper scale), on the policy's mesh when it has one. On a mesh each call's
  prompts are rounded up, as evaluation does (`mr_rl.evaluation.evaluate`), so its rows split
  evenly over the data axes: the extra prompts repeat the call's own and their rows are
  dropped before the means. With `turns` (a multi-turn run's `TurnDraws`) the samples are
  trajectories and the drift is per token the policy wrote (observations are attended to,
  not counted).
  """
  out = {}
  B, samples = batch_prompts, sampling.group_size
  padded_B, dp = B, 1
  if policy.mesh is not None:
    dp = sharding.data_parallel_size(policy.mesh)
    step = dp // math.gcd(samples, dp)
    padded_B = -(-B // step) * step
  rows = drift_chunk_rows(micro_batch_rows, padded_B * samples, dp)
  sampling = dataclasses.replace(sampling, temperature=1.0)
  for direction, sample_params, other in (("rev", probe_params, base_params),
                                          ("fwd", base_params, probe_params)):
    sampled, exact, lens = [], [], []
    for i in range(0, len(examples) - B + 1, B):
      chunk = list(examples[i:i + B])
      chunk += [chunk[j % B] for j in range(padded_B - B)]
      if turns is None:
        ro = rollout_lib.rollout(policy, sample_params, chunk, jax.random.fold_in(key, i),
                                 sampling)
        batch = batch_lib.make_batch(ro, jnp.zeros(ro.lengths.shape, jnp.float32))
        lengths_BG = ro.lengths
      else:
        d = turns.sample(sample_params, chunk, jax.random.fold_in(key, i), samples, sampling)
        ro, lengths_BG = d.rollout, d.policy_mask_BGS.sum(-1)
        batch = batch_lib.make_batch(ro, jnp.zeros(ro.lengths.shape, jnp.float32),
                                     policy_mask_BGS=d.policy_mask_BGS)
      s, e = update_lib.chunked_forward(  # both policies' [rows, T, V] logits at a time
          lambda pq, *c: _seq_kl_jit(policy.model, *pq, *c), (sample_params, other),
          batch.tokens, batch.mask, batch.response_mask, batch.old_logp,
          num_chunks=padded_B * samples // rows, mesh=policy.mesh)
      real = B * samples  # rows b * samples + j: the padded prompts' rows come last
      sampled.append(distributed.to_host(s)[:real])
      exact.append(distributed.to_host(e)[:real])
      lens.append(np.asarray(lengths_BG)[:B].reshape(-1))
    if not lens:
      raise ValueError(f"need at least batch_prompts={B} held-out prompts, got {len(examples)}")
    mean_len = float(np.concatenate(lens).mean())
    out[f"{direction}_kl_per_token"] = float(np.concatenate(sampled).mean()) / mean_len
    out[f"{direction}_kl_exact_per_token"] = float(np.concatenate(exact).mean()) / mean_len
    out[f"mean_len_{'probe' if direction == 'rev' else 'base'}"] = mean_len
  return out


def elect(table: Sequence[Drift], use_exact: bool = False) -> int:
  """Index of the channel with the smallest per-token reverse drift among `eligible` ones.

  Raises:
    ValueError: empty table, or no channel is eligible (every probe reward NaN or drift
      non-finite).
  """
  if not table:
    raise ValueError("empty drift table")
  ok = [i for i, d in enumerate(table) if eligible(d, use_exact)]
  if not ok:
    raise ValueError("no channel can be elected anchor: every probe's rewards were all NaN or "
                     f"its drift is not finite: {[dataclasses.asdict(d) for d in table]}")
  vals = [d.rev_kl_exact_per_token if use_exact else d.rev_kl_per_token for d in table]
  return min(ok, key=lambda i: vals[i])


def write_table(table: Sequence[Drift], anchor: int, directory: str) -> None:
  """Drift table as drift.json and drift.md (anchor marked)."""
  os.makedirs(directory, exist_ok=True)
  rows = [dataclasses.asdict(d) for d in table]
  with open(os.path.join(directory, "drift.json"), "w") as f:
    json.dump({"anchor": table[anchor].channel, "channels": rows}, f, indent=1)
  base = min((d.rev_kl_per_token for d in table if eligible(d)), default=float("nan"))
  lines = ["| channel | KLrev/token | KLrev exact | ratio to min | KLfwd/token | KLfwd exact "
           "| len probe | probe reward |", "|---|---|---|---|---|---|---|---|"]
  for i, d in enumerate(table):
    mark = " (anchor)" if i == anchor else ("" if eligible(d) else " (not eligible)")
    ratio = d.rev_kl_per_token / base if base > 0 else float("nan")
    lines.append(f"| {d.channel}{mark} | {d.rev_kl_per_token:.4g} | "
                 f"{d.rev_kl_exact_per_token:.4g} | {ratio:.2f}x | {d.fwd_kl_per_token:.4g} | "
                 f"{d.fwd_kl_exact_per_token:.4g} | {d.mean_len_probe:.1f} | "
                 f"{d.probe_reward:.3f} |")
  with open(os.path.join(directory, "drift.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
