"""What `mr_rl.main` runs, by `config.pipeline`, from the `PIPELINES` registry.

* `train`: `mr_rl.train.train`, then the final evaluation (`mr_rl.evaluation.final_eval`)
  written to WORKDIR/eval.json (and, with `config.export.hf_at_end`, the trained policy as a
  transformers checkpoint in WORKDIR/hf, `mr_rl.export`).
* `tag`: probe every channel from pi_0 (single-channel GRPO for `anchor.probe_steps` steps),
  measure per-token reverse/forward KL drift on held-out prompts, elect the anchor
  (argmin reverse drift), write WORKDIR/drift.{json,md}, then train TAG (`anchor`, `lam`)
  from pi_0 in the same WORKDIR. A re-run reuses a finished election (drift.json).
* more from plugin modules (`config.plugins`), e.g. `demo` from `mr_rl.demo.run`.

Every pipeline is `fn(config, workdir)`, registered with `@PIPELINES.register`.
`dry_run(config)` (`mr_rl.main --dry_run`) resolves the settings and estimates the compute of
a run without loading weights or data.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax

from mr_rl import evaluation
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.registry import Registry, import_plugins
from mr_rl.rl import anchor as anchor_lib

PIPELINES = Registry("pipeline")


def run(config, workdir: str):
  """Imports `config.plugins`, then runs the pipeline `config.pipeline`."""
  import_plugins(config.get("plugins", ""))
  return PIPELINES.get(config.pipeline)(config, workdir)


@PIPELINES.register
def train(config, workdir: str):
  """One training run and its final evaluation."""
  return run_train(settings_lib.from_config(config), workdir)


@PIPELINES.register
def tag(config, workdir: str):
  """TAG: elect the anchor by probe drift, then train TAG on it."""
  return run_tag(settings_lib.from_config(config), workdir)


def run_train(s, workdir: str, comp=None):
  """Trains, writes WORKDIR/hf/ when `config.export.hf_at_end`, then the final evaluation."""
  comp = train_lib.build(s) if comp is None else comp
  res = train_lib.train(s, workdir, comp=comp)
  if s.export.hf_at_end:
    from mr_rl import export as export_lib
    from mr_rl.models import hf_io
    out = export_lib.write_hf(comp.model, res.params, os.path.join(workdir, "hf"),
                              hf_io.resolve_path(s.model.path))
    print(f"wrote the trained policy to {out} (transformers / vLLM checkpoint)")
  ev = evaluation.final_eval(dataclasses.replace(comp, settings=s), res.params)
  with open(os.path.join(workdir, "eval.json"), "w") as f:
    json.dump(ev, f, indent=1)
  print(json.dumps(ev, indent=1))
  return res, ev


def probe_settings(s, k: int):
  """Single-channel GRPO on channel k from pi_0 (no checkpoints, no periodic eval)."""
  return dataclasses.replace(
      s, pipeline="train", total_steps=s.anchor.probe_steps, checkpoint_every=0,
      aggregator=settings_lib.AggregatorSettings("rp_only", {"primary": k}),
      data=dataclasses.replace(s.data, batch_prompts=s.anchor.probe_batch_prompts),
      eval=dataclasses.replace(s.eval, every=0))


def elect_anchor(s, comp, directory: str | None, log=print) -> tuple[int, list]:
  """Probes each channel, measures drift, writes the drift table; returns (anchor, table)."""
  if directory and os.path.exists(os.path.join(directory, "drift.json")):
    with open(os.path.join(directory, "drift.json")) as f:
      saved = json.load(f)
    table = [anchor_lib.Drift(**row) for row in saved["channels"]]
    names = [d.channel for d in table]
    if names == list(s.rewards.channels):
      if log:
        log(f"reusing the anchor election in {directory}: {saved['anchor']}")
      return names.index(saved["anchor"]), table
  held_out = list(comp.eval_examples[-s.anchor.held_out_prompts:])
  table = []
  for k, name in enumerate(s.rewards.channels):
    ps = probe_settings(s, k)
    res = train_lib.train(ps, None, comp=comp, log=None)
    tail = [h[f"reward/{name}/mean"] for h in res.history[-max(1, len(res.history) // 5):]]
    d = anchor_lib.measure_drift(
        dataclasses.replace(comp, settings=s), res.params, comp.base_params, held_out,
        jax.random.fold_in(jax.random.PRNGKey(s.seed), 5_000_000 + k),
        samples=s.anchor.samples_per_prompt)
    table.append(anchor_lib.Drift(channel=name, probe_reward=anchor_lib.probe_reward(tail), **d))
    if log:
      log(f"probe {name}: KLrev/token {d['rev_kl_per_token']:.4g} "
          f"(exact {d['rev_kl_exact_per_token']:.4g}), KLfwd/token {d['fwd_kl_per_token']:.4g}, "
          f"probe reward {table[-1].probe_reward:.3f}")
  a = anchor_lib.elect(table)
  if directory:
    anchor_lib.write_table(table, a, directory)
  if log:
    log(f"elected anchor: {s.rewards.channels[a]}")
  return a, table


def tag_settings(s, anchor: int):
  return dataclasses.replace(
      s, pipeline="train",
      aggregator=settings_lib.AggregatorSettings("tag", {"anchor": anchor, "lam": s.anchor.lam}))


def run_tag(s, workdir: str, comp=None):
  comp = train_lib.build(s) if comp is None else comp
  a, _ = elect_anchor(s, comp, workdir)
  return run_train(tag_settings(s, a), workdir, comp=comp)


# ------------------------------------------------------------------------------ dry run
def _model_config(s):
  """The run's ModelConfig without loading weights: its preset, the config.json of a local
  checkpoint, or the paper preset of a paper model's hub id; None if none is at hand."""
  from mr_rl import models
  from mr_rl.models import hf_io
  if s.model.preset:
    return models.get_preset(s.model.preset), f"preset {s.model.preset}"
  if os.path.isdir(s.model.path):
    hf = hf_io._read_config(s.model.path)  # pylint: disable=protected-access
    return hf_io.config_from_hf(hf), f"{s.model.path}/config.json"
  from mr_rl.config_lib.paper import MODELS
  preset = next((m.preset for m in MODELS.values() if m.hub == s.model.path), None)
  if preset:
    return models.get_preset(preset), f"preset {preset} (the papers' {s.model.path})"
  return None, f"{s.model.path!r} is neither a local checkpoint nor one of the papers' models"


def dry_run(config) -> str:
  """The resolved settings (as WORKDIR/settings.json would hold them) and the compute estimate
  of one run (`mr_rl.config_lib.estimates`: rollout, reference and policy step; TAG adds its
  probes); loads no weights and no data."""
  from mr_rl import metrics as metrics_lib
  from mr_rl.config_lib import estimates
  import_plugins(config.get("plugins", ""))
  s = settings_lib.from_config(config)
  lines = ["resolved settings:", json.dumps(metrics_lib.settings_dict(s), indent=1)]
  cfg, source = _model_config(s)
  rows = s.data.batch_prompts * s.rollout.group_size
  lines.append(f"run: pipeline {s.pipeline}, {s.total_steps} steps x {rows} rollouts "
               f"(B={s.data.batch_prompts} x G={s.rollout.group_size}), prompts <= "
               f"{s.data.max_prompt_len} + responses <= {s.rollout.max_new_tokens} tokens")
  if cfg is None:
    lines.append(f"compute estimate: unavailable ({source}; give --config.model.path=DIR)")
    return "\n".join(lines)
  sizes = estimates.model_sizes(cfg)
  kw = dict(prompt_len=s.data.max_prompt_len, new_tokens=s.rollout.max_new_tokens)
  per_chip = {}
  for chip in estimates.CHIPS:
    h = estimates.estimate_device_hours(cfg, steps=s.total_steps, rows=rows, chip=chip,
                                        critic=s.advantage == "ppo", **kw)
    if s.pipeline == "tag":
      h += s.num_channels * estimates.estimate_device_hours(
          cfg, steps=s.anchor.probe_steps,
          rows=s.anchor.probe_batch_prompts * s.rollout.group_size, chip=chip, **kw)
    per_chip[chip] = h
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
