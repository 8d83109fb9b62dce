"""What `mr_rl.main` runs, by `config.pipeline`, from the `PIPELINES` registry.

* `train`: `mr_rl.train.train`, then the final evaluation (`mr_rl.evaluation.final_eval`)
  written to WORKDIR/eval.json (and, with `config.export.hf_at_end`, the trained policy as a
  transformers checkpoint in WORKDIR/hf, `mr_rl.export`).
* `tag`: probe every channel from pi_0 (single-channel GRPO for `anchor.probe_steps` steps),
  measure per-token reverse/forward KL drift on held-out prompts, elect the anchor
  (argmin reverse drift), write WORKDIR/drift.{json,md}, then train TAG (`anchor`, `lam`)
  from pi_0 in the same WORKDIR. A re-run reuses a finished election (drift.json).
* more from plugin modules (`config.plugins`), e.g. `demo` from `mr_rl.demo.run`.

Every pipeline is `fn(config, workdir)`, registered with `@PIPELINES.register`
(`mr_rl.registry.PIPELINES`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax

from mr_rl import distributed, evaluation
from mr_rl import metrics as metrics_lib
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl import workdir as workdir_lib
from mr_rl.registry import PIPELINES, import_plugins, run_setup
from mr_rl.rl import anchor as anchor_lib


def run(config, workdir: str, *, break_lock: bool = False):
  """Imports `config.plugins`, calls the `config.setup` hooks (they build what the run needs,
  e.g. runlocal's tiny assets), then runs the pipeline `config.pipeline` with `workdir`
  claimed for it (`mr_rl.workdir.claim`; `break_lock` takes over a lock left behind)."""
  import_plugins(config.get("plugins", ""))
  run_setup(config)
  with workdir_lib.claim(workdir, break_lock=break_lock,
                         log=print if distributed.is_primary() else None):
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
                              hf_io.resolve_path(s.model.path), settings=s)
    if distributed.is_primary():
      print(f"wrote the trained policy to {out} (transformers / vLLM checkpoint)")
  ev = evaluation.final_eval(comp.policy, comp.runner, s, comp.eval_data, res.params,
                             turns=comp.turns)
  if distributed.is_primary():  # every process holds the same evaluation; one writes it
    metrics_lib.write_json(os.path.join(workdir, "eval.json"), ev)
    print(json.dumps(metrics_lib.finite_json(ev), indent=1))
  return res, ev


def probe_settings(s, k: int):
  """Single-channel GRPO on channel k from pi_0 (no checkpoints, no periodic eval; synchronous
  rollouts, max_staleness 0, on the run's devices)."""
  return dataclasses.replace(
      s, pipeline="train", total_steps=s.anchor.probe_steps, checkpoint_every=0,
      aggregator=settings_lib.AggregatorSettings("rp_only", {"primary": k}),
      data=dataclasses.replace(s.data, batch_prompts=s.anchor.probe_batch_prompts),
      eval=dataclasses.replace(s.eval, every=0),
      asynchrony=dataclasses.replace(s.asynchrony, max_staleness=0))  # probes stay synchronous


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
        comp.policy, res.params, comp.base_params, held_out,
        jax.random.fold_in(jax.random.PRNGKey(s.seed), 5_000_000 + k),
        sampling=dataclasses.replace(s.rollout, group_size=s.anchor.samples_per_prompt),
        batch_prompts=s.data.batch_prompts,
        micro_batch_rows=s.data.batch_prompts * s.rollout.group_size // s.update.num_micro_batches,
        turns=comp.turns)
    table.append(anchor_lib.Drift(channel=name, probe_reward=anchor_lib.probe_reward(tail), **d))
    if log:
      log(f"probe {name}: KLrev/token {d['rev_kl_per_token']:.4g} "
          f"(exact {d['rev_kl_exact_per_token']:.4g}), KLfwd/token {d['fwd_kl_per_token']:.4g}, "
          f"probe reward {table[-1].probe_reward:.3f}")
  a = anchor_lib.elect(table)
  if directory and distributed.is_primary():
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
