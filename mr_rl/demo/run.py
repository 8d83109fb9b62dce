"""The demo driver: tasks x methods of multi-reward GRPO from one base policy, and the report.

For each task (a set of reward channels, the first one the task's correctness) every method
trains from the same base policy with the same data order and seed, then is evaluated by
sampling on held-out problems. `tag` first elects its anchor by single-channel probes
(mr_rl.rl.anchor) and records the drift table. Results:

  WORKDIR/report.json   {task: {method: {"accuracy", "aux_rate", "joint_rate", "mean_length",
                          per-channel rates, "anchor" (tag)}}}
  WORKDIR/report.md     the same as Markdown tables, with the drift tables
  WORKDIR/<task>_profiles.png   reward-profile shares over training steps, one panel per method
  WORKDIR/<task>/<method>/metrics.jsonl   the per-step metrics of each run
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np

from mr_rl import evaluation, pipelines, plots, settings as settings_lib, train as train_lib

TASKS = {
    # task: (channels, auxiliary channels that define aux_rate)
    "brief": (("arith_acc", "arith_brief"), ("arith_brief",)),
    "negative": (("arith_acc", "arith_negative"), ("arith_negative",)),
    "acc_fmt_len": (("arith_acc", "arith_fmt", "arith_len"), ("arith_fmt", "arith_len")),
}
METHODS = ("rp_only", "additive", "weighted", "min", "amrp", "tag")


def method_aggregator(method: str, num_channels: int):
  """(aggregator name, hyperparameters) of a demo method; tag is filled in after election."""
  if method == "rp_only":
    return "rp_only", {"primary": 0}
  if method == "additive":
    return "additive", {}
  if method == "weighted":  # 0.9 on the primary, 0.1 shared by the auxiliaries
    aux = 0.1 / (num_channels - 1)
    return "weighted", {"w": [0.9] + [aux] * (num_channels - 1)}
  if method == "min":
    return "min", {}
  if method == "amrp":
    return "amrp", {}
  raise ValueError(f"unknown demo method {method!r}; valid: {METHODS}")


def task_settings(base: settings_lib.RunSettings, demo_cfg, task: str):
  if task not in TASKS:
    raise ValueError(f"unknown demo task {task!r}; valid: {sorted(TASKS)}")
  channels, _ = TASKS[task]
  params = {"arith_brief": {"threshold": int(demo_cfg.brief_threshold)},
            "arith_len": {"full_until": int(demo_cfg.len_full_until),
                          "zero_at": int(demo_cfg.len_zero_at)}}
  rewards = dataclasses.replace(
      base.rewards, channels=channels, specs=channels, primary=0,
      params={k: v for k, v in params.items() if k in channels})
  return dataclasses.replace(base, pipeline="train", rewards=rewards)


def summarize(ev: dict, task: str) -> dict:
  channels, aux = TASKS[task]
  out = {"accuracy": ev["eval/arith_acc"],
         "aux_rate": float(np.mean([ev[f"eval/{a}"] for a in aux])),
         "joint_rate": float(np.mean([ev[f"eval/arith_acc&{a}"] for a in aux])),
         "mean_length": ev["eval/length_mean"]}
  out.update({f"rate/{c}": ev[f"eval/{c}"] for c in channels})
  return out


@pipelines.PIPELINES.register
def demo(config, workdir: str, log=print) -> dict:
  """The `demo` pipeline (`config.pipeline = "demo"`): every task x method, then the report."""
  base = settings_lib.from_config(config)
  demo = config.demo
  tasks = [t.strip() for t in demo.tasks.split(",") if t.strip()]
  methods = [m.strip() for m in demo.methods.split(",") if m.strip()]
  for m in methods:
    if m not in METHODS:
      raise ValueError(f"config.demo.methods: unknown method {m!r}; valid: {METHODS}")
  os.makedirs(workdir, exist_ok=True)
  report, drift_tables, histories = {}, {}, {}
  t_start = time.time()
  comp = None
  for task in tasks:
    ts = task_settings(base, demo, task)
    # One build (model, data, base policy); each task gets its own reward runner.
    comp = (train_lib.build(ts) if comp is None else
            dataclasses.replace(comp, settings=ts, runner=train_lib.build_runner(ts)))
    report[task], histories[task] = {}, {}
    base_ev = evaluation.final_eval(comp, comp.base_params)
    report[task]["base"] = summarize(base_ev, task)
    for method in methods:
      t0 = time.time()
      if method == "tag":
        a, table = pipelines.elect_anchor(ts, comp, os.path.join(workdir, task, "tag"), log=log)
        drift_tables[task] = table
        ms = pipelines.tag_settings(ts, a)
      else:
        name, hp = method_aggregator(method, len(ts.rewards.channels))
        ms = dataclasses.replace(ts, aggregator=settings_lib.AggregatorSettings(name, hp))
      res = train_lib.train(ms, os.path.join(workdir, task, method), comp=comp, log=None)
      ev = evaluation.final_eval(dataclasses.replace(comp, settings=ms), res.params)
      report[task][method] = summarize(ev, task)
      if method == "tag":
        report[task][method]["anchor"] = ts.rewards.channels[a]
      histories[task][method] = res.history
      r = report[task][method]
      log(f"[demo] {task:12s} {method:9s} acc {r['accuracy']:.3f} aux {r['aux_rate']:.3f} "
          f"joint {r['joint_rate']:.3f} len {r['mean_length']:.1f} ({time.time() - t0:.0f}s)")
    plots.profile_shares(histories[task], os.path.join(workdir, f"{task}_profiles.png"),
                         f"reward profiles: {task}")
  report["_meta"] = {"seed": base.seed, "total_steps": base.total_steps,
                     "seconds": time.time() - t_start}
  with open(os.path.join(workdir, "report.json"), "w") as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(workdir, "report.md"), "w") as f:
    f.write(markdown(report, drift_tables))
  log(f"[demo] wrote {workdir}/report.json and report.md in {time.time() - t_start:.0f}s")
  return report


def markdown(report: dict, drift_tables: dict) -> str:
  lines = ["# mr_rl CPU demo", ""]
  for task, rows in report.items():
    if task.startswith("_"):
      continue
    lines += [f"## {task}", "", "| method | accuracy | aux rate | joint rate | mean length |",
              "|---|---|---|---|---|"]
    for method, r in rows.items():
      name = method + (f" (anchor: {r['anchor']})" if "anchor" in r else "")
      lines.append(f"| {name} | {r['accuracy']:.3f} | {r['aux_rate']:.3f} | "
                   f"{r['joint_rate']:.3f} | {r['mean_length']:.1f} |")
    if task in drift_tables:
      lines += ["", "Anchor election (per-token drift of single-channel probes):", "",
                "| channel | KLrev/token | KLrev exact | KLfwd/token | probe reward |",
                "|---|---|---|---|---|"]
      for d in drift_tables[task]:
        lines.append(f"| {d.channel} | {d.rev_kl_per_token:.4g} | "
                     f"{d.rev_kl_exact_per_token:.4g} | {d.fwd_kl_per_token:.4g} | "
                     f"{d.probe_reward:.3f} |")
    lines.append("")
  meta = report.get("_meta", {})
  lines.append(f"seed {meta.get('seed')}, {meta.get('total_steps')} steps per run, "
               f"{meta.get('seconds', 0):.0f} s in all.")
  return "\n".join(lines) + "\n"

