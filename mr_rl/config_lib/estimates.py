"""Device-hour estimates of paper runs from the trainer's padded shapes (see configs/README.md)."""

from __future__ import annotations

import dataclasses

from mr_rl import settings as settings_lib
from mr_rl.config_lib.paper import MODELS


@dataclasses.dataclass(frozen=True)
class Chip:
  peak_flops: float   # dense bf16 FLOP/s
  hbm_bw: float       # bytes/s
  hbm_bytes: float


CHIPS = {
    "v5p": Chip(459e12, 2.765e12, 95e9), "v4": Chip(275e12, 1.2e12, 32e9),
    "v5e": Chip(197e12, 0.819e12, 16e9), "v6e": Chip(918e12, 1.64e12, 32e9),
    "a100": Chip(312e12, 2.0e12, 80e9), "h100": Chip(989e12, 3.35e12, 80e9),
    "h200": Chip(989e12, 4.8e12, 141e9),
}
MFU = 0.4            # model-FLOP utilisation of the policy step and the reference pass
DECODE_BW_EFF = 0.7  # share of HBM bandwidth the decode loop reaches


def model_sizes(preset) -> dict[str, float]:
  """Active matmul parameters per token, total parameters, KV bytes per token (fp32).

  `preset`: a preset name or a `ModelConfig` (e.g. read from a checkpoint's config.json).
  """
  from mr_rl import models
  m = models.get_preset(preset) if isinstance(preset, str) else preset
  attn = m.d_model * (m.n_heads + 2 * m.n_kv_heads) * m.head_dim + m.n_heads * m.head_dim * m.d_model
  if m.num_experts:
    mlp_active = 3 * m.d_model * m.moe_d_ff * m.num_experts_per_tok + m.d_model * m.num_experts
    mlp_total = 3 * m.d_model * m.moe_d_ff * m.num_experts + m.d_model * m.num_experts
  else:
    mlp_active = mlp_total = 3 * m.d_model * m.d_ff
  head = m.vocab_size * m.d_model
  active = m.n_layers * (attn + mlp_active) + head
  total = m.n_layers * (attn + mlp_total) + head * (1 if m.tie_embeddings else 2)
  kv = m.n_layers * 2 * m.n_kv_heads * m.head_dim * 4
  attn_width = m.n_layers * m.n_heads * m.head_dim
  return dict(active=active, total=total, kv_bytes_per_token=kv, attn_width=attn_width)


def estimate_device_hours(preset, *, steps: int, rows: int, prompt_len: int,
                          new_tokens: int, chip: str = "v5p", critic: bool = False,
                          remat: bool = False) -> float:
  """Chip-hours of `steps` GRPO steps of `rows` = B*G sequences (the trainer's padded shapes).

  Per step (P = max_prompt_len, N = max_new_tokens, T = P + N, all rows padded to them):
    * rollout, memory-bound: N decode steps (the batch runs until its longest row ends; with
      256 rows some row nearly always hits the cap), each reading the fp32 params and the KV
      cache of all rows (average context P + N/2) at DECODE_BW_EFF of HBM bandwidth, or the
      decode FLOPs at MFU if that is slower;
    * reference log-probs (2 FLOPs/param/token, the trainer computes them every step for the
      KL metric) + policy step (6 FLOPs/param/token), plus attention 4 T^2 width per row per
      pass (x4 for fwd+bwd+ref), over rows * T tokens at MFU.
  With `critic` (PPO) the critic's forward for the values and its update add the same train
  FLOPs again. With `remat` (ModelConfig.remat) the policy step recomputes its forward in the
  backward: 8 FLOPs/param/token and x5 attention instead of 6 and x4. Chip-hours do not depend on the slice size in this model (both terms scale with 1/chips).
  Not counted: reward evaluation (math-verify / sandbox / NLI / reward model, on the host),
  evaluation runs, checkpointing, compilation.
  """
  c = CHIPS[chip]
  s = model_sizes(preset)
  T = prompt_len + new_tokens
  param_bytes = 4 * s["total"]
  kv_read = rows * (prompt_len + new_tokens / 2) * s["kv_bytes_per_token"]
  decode_mem = new_tokens * (param_bytes + kv_read) / (c.hbm_bw * DECODE_BW_EFF)
  decode_flops = 2 * s["active"] * rows * T / (c.peak_flops * MFU)
  passes = 5 if remat else 4  # reference + policy forward, backward (2), remat's forward
  train_flops = rows * (2 * passes * s["active"] * T + 4 * passes * T * T * s["attn_width"])
  if critic:
    train_flops *= 2
  per_step = max(decode_mem, decode_flops) + train_flops / (c.peak_flops * MFU)
  return steps * per_step / 3600


def run_hours(model, settings, chip: str = "v5p") -> float:
  """Chip-hours of one run of resolved `settings` (`mr_rl.settings.RunSettings`) with `model`
  (a preset name or `ModelConfig`): its training steps, plus TAG's single-channel probes
  when `settings.pipeline == 'tag'` (`estimate_device_hours` for each)."""
  s = settings
  kw = dict(prompt_len=s.data.max_prompt_len, new_tokens=s.rollout.max_new_tokens, chip=chip)
  hours = estimate_device_hours(model, steps=s.total_steps,
                                rows=s.data.batch_prompts * s.rollout.group_size,
                                critic=s.advantage == "ppo", remat=s.model.remat, **kw)
  if s.pipeline == "tag":
    hours += s.num_channels * estimate_device_hours(
        model, steps=s.anchor.probe_steps,
        rows=s.anchor.probe_batch_prompts * s.rollout.group_size, remat=s.model.remat, **kw)
  return hours


def paper_preset(hub_id: str) -> str | None:
  """The preset of one of the papers' models by its hub id (None if it is not one)."""
  return next((m.preset for m in MODELS.values() if m.hub == hub_id), None)


def estimate_config(c, chip: str = "v5p") -> float:
  """Chip-hours of a paper config (a ConfigDict; training + TAG probes, `run_hours`)."""
  preset = paper_preset(c.model.path)
  if preset is None:
    raise ValueError(f"config.model.path={c.model.path!r} is not one of the papers' models")
  return run_hours(preset, settings_lib.from_config(c), chip)
