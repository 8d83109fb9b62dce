"""`python -m mr_rl.main --dry_run`: a run's resolved settings and compute estimate, without
loading weights or data, and without writing anything (the `config.setup` hooks, which build
assets such as runlocal's, run only when a run starts)."""

from __future__ import annotations

import json
import os

from mr_rl import metrics as metrics_lib
from mr_rl import models
from mr_rl import settings as settings_lib
from mr_rl import startup
from mr_rl.config_lib import estimates
from mr_rl.models import hf_io
from mr_rl.registry import import_plugins


def model_config(s, setup: str = ""):
  """(the run's `ModelConfig` without loading weights, where it comes from): its preset, the
  config.json of a local checkpoint, or the paper preset of a paper model's hub id; (None,
  why) if none is at hand (`setup`: the config's setup hooks, which may build the checkpoint
  when the run starts)."""
  if s.model.preset:
    return models.get_preset(s.model.preset), f"preset {s.model.preset}"
  if os.path.isdir(s.model.path):
    return hf_io.config_from_hf(hf_io.read_config(s.model.path)), f"{s.model.path}/config.json"
  preset = estimates.paper_preset(s.model.path)
  if preset:
    return models.get_preset(preset), f"preset {preset} (the papers' {s.model.path})"
  if setup.strip():
    return None, (f"{s.model.path!r} is not built yet: config.setup ({setup}) builds it when "
                  "the run starts, a dry run writes nothing")
  return None, f"{s.model.path!r} is neither a local checkpoint nor one of the papers' models"


def dry_run(config) -> str:
  """The resolved settings (as WORKDIR/settings.json would hold them) and the compute estimate
  of one run (`estimates.run_hours`: rollout, reference and policy step; TAG adds its
  probes); loads no weights and no data."""
  import_plugins(config.get("plugins", ""))
  s = settings_lib.from_config(config)
  lines = ["resolved settings:", json.dumps(metrics_lib.settings_dict(s), indent=1)]
  cfg, source = model_config(s, str(config.get("setup", "")))
  if cfg is not None:  # what start-up refuses (mr_rl.startup), without weights or data
    startup.check_positions(s, cfg.max_seq_len, source)
  n = startup.local_rows(s.data.path)  # (the rows before the loader's filters)
  if n is not None:
    startup.check_rows(s, n, f"data file {s.data.path!r}")
  if not s.asynchrony.sampler_devices:
    import jax
    startup.check_devices(s, jax.device_count())
  rows = s.data.batch_prompts * s.rollout.group_size
  lines.append(f"run: pipeline {s.pipeline}, {s.total_steps} steps x {rows} rollouts "
               f"(B={s.data.batch_prompts} x G={s.rollout.group_size}), prompts <= "
               f"{s.data.max_prompt_len} + responses <= {s.rollout.max_new_tokens} tokens")
  if cfg is None:
    lines.append(f"compute estimate: unavailable ({source}; give --config.model.path=DIR)")
    return "\n".join(lines)
  sizes = estimates.model_sizes(cfg)
  per_chip = {chip: estimates.run_hours(cfg, s, chip) for chip in estimates.CHIPS}
  lines.append(f"model: {source}: {sizes['total'] / 1e6:.1f}M parameters "
               f"({sizes['active'] / 1e6:.1f}M active per token)")
  lines.append("compute estimate" + (" (training + TAG probes)" if s.pipeline == "tag" else "")
               + ": " + ", ".join(f"{chip} {h:.3g}" for chip, h in per_chip.items())
               + " chip-hours (rollout, reference and policy step at the padded shapes; "
               "rewards, evaluation and compilation not counted)")
  if s.pipeline not in ("train", "tag"):
    lines.append(f"(that is one training run of these settings; the {s.pipeline!r} pipeline "
                 "may run several)")
  return "\n".join(lines)
