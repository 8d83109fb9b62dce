"""The demo driver: tasks x methods of multi-reward RL from one base policy, and the report.

For each task (a set of reward channels, the first one the task's correctness) every method
trains from the same base policy with the same data order and seed, then is evaluated by
sampling on held-out problems. `tag` first elects its anchor by single-channel probes
(mr_rl.rl.anchor) and records the drift table. Results:

  WORKDIR/report.json   {task: {method: {"accuracy", "aux_rate", "joint_rate", "mean_length",
                          per-channel rates, "seconds", "anchor" (tag), "trace" (per-step
                          rollout profile shares, channel means, AMRP weights)}},
                         "_meta": {...}, "_targets": [...]}
  WORKDIR/report.md     the same as Markdown tables, the drift tables and every target of
                        `mr_rl.demo.summary` with yes / no and its value
  WORKDIR/<task>_profiles.png   rollout profile shares over steps, one panel per method
  WORKDIR/<task>_weights.png    AMRP's channel weights over steps (tasks where AMRP ran)
  WORKDIR/<task>/<method>/metrics.jsonl   the per-step metrics of each run

Methods (`parse_method`): a base rule, optionally with modifiers joined by '_':

  rp_only, additive, weighted (0.9 primary / 0.1 auxiliaries), min, amrp, tag, dropout
  (Rubric Dropout, p = 0.5); `weighted_<w>` gives the auxiliaries weight w in all (primary
  1 - w: TAG Figure 6's sweep); `_gdpo` / `_ppo` swap GRPO for GDPO or PPO (AMRP Table 4);
  `_kl<beta>` adds the KL penalty beta (TAG Table 7's Additive+KL).
  e.g. `weighted_0.3`, `amrp_gdpo`, `additive_ppo`, `additive_kl0.01`.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from mr_rl import distributed, evaluation, pipelines, plots
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl import metrics as metrics_lib
from mr_rl.errors import ConfigError
from mr_rl.registry import PIPELINES

TASKS = {
    # task: (channels, auxiliary channels that define aux_rate)
    "brief": (("arith_acc", "arith_brief"), ("arith_brief",)),
    "negative": (("arith_acc", "arith_negative"), ("arith_negative",)),
    "acc_fmt_len": (("arith_acc", "arith_fmt", "arith_len"), ("arith_fmt", "arith_len")),
    # TAG Table 8: the compatible and the incompatible auxiliary at once.
    "brief_negative": (("arith_acc", "arith_brief", "arith_negative"),
                       ("arith_brief", "arith_negative")),
    # Multi-turn (configs/demo_tools.py): the calculator's call ran (mr_rl.multiturn.channels).
    "calculator": (("arith_acc", "tool_success", "arith_brief"), ("tool_success", "arith_brief")),
}
BASE_METHODS = ("rp_only", "additive", "weighted", "min", "amrp", "tag", "dropout")
TRACE_TAIL = 5  # "final" rollout shares are the mean over the last TRACE_TAIL steps


@dataclasses.dataclass(frozen=True)
class Method:
  """A parsed demo method name (see the module docstring)."""
  name: str
  base: str
  aux_weight: float | None = None   # weighted_<w>: total auxiliary weight
  advantage: str = "grpo"           # grpo | gdpo | ppo
  kl_coef: float = 0.0


def parse_method(name: str) -> Method:
  """`Method` of a demo method name; ValueError naming the bad part."""
  base = next((b for b in sorted(BASE_METHODS, key=len, reverse=True)
               if name == b or name.startswith(b + "_")), None)
  if base is None:
    raise ValueError(f"unknown demo method {name!r}; valid bases: {BASE_METHODS} (with "
                     "optional modifiers _gdpo, _ppo, _kl<beta>, weighted_<w>)")
  m = Method(name, base)
  for part in filter(None, name[len(base):].split("_")):
    if part in ("gdpo", "ppo"):
      if m.advantage != "grpo":
        raise ValueError(f"demo method {name!r}: more than one advantage modifier")
      m = dataclasses.replace(m, advantage=part)
    elif part.startswith("kl"):
      try:
        m = dataclasses.replace(m, kl_coef=float(part[2:]))
      except ValueError:
        raise ValueError(f"demo method {name!r}: bad KL coefficient {part!r}") from None
    elif base == "weighted" and m.aux_weight is None:
      try:
        w = float(part)
      except ValueError:
        raise ValueError(f"demo method {name!r}: unknown modifier {part!r}") from None
      if not 0.0 < w < 1.0:
        raise ValueError(f"demo method {name!r}: auxiliary weight must be in (0, 1), got {w}")
      m = dataclasses.replace(m, aux_weight=w)
    else:
      raise ValueError(f"demo method {name!r}: unknown modifier {part!r} (valid: gdpo, ppo, "
                       "kl<beta>, and a weight after weighted_)")
  if base == "tag" and (m.advantage != "grpo" or m.kl_coef):
    raise ValueError(f"demo method {name!r}: tag takes no modifiers")
  return m


def method_aggregator(method: str, num_channels: int):
  """(aggregator name, hyperparameters) of a demo method; tag is filled in after election."""
  m = parse_method(method)
  if m.base == "rp_only":
    return "rp_only", {"primary": 0}
  if m.base == "additive":
    return "additive", {}
  if m.base == "weighted":  # 1 - w on the primary, w shared by the auxiliaries
    w = 0.1 if m.aux_weight is None else m.aux_weight
    return "weighted", {"w": [1.0 - w] + [w / (num_channels - 1)] * (num_channels - 1)}
  if m.base == "min":
    return "min", {}
  if m.base == "amrp":
    return "amrp", {}
  if m.base == "dropout":
    return "rubric_dropout", {}
  raise ValueError(f"demo method {method!r} has no fixed aggregator (tag is elected)")


def method_settings(ts: settings_lib.RunSettings, method: str, demo_cfg=None):
  """The run settings of a non-TAG method on the task settings `ts`."""
  m = parse_method(method)
  name, hp = method_aggregator(method, len(ts.rewards.channels))
  s = dataclasses.replace(ts, aggregator=settings_lib.AggregatorSettings(name, hp),
                          advantage=m.advantage, advantage_hp={})
  update = s.update
  if m.kl_coef:
    update = dataclasses.replace(update, loss=dataclasses.replace(update.loss,
                                                                  kl_coef=m.kl_coef))
  if m.advantage == "ppo" and demo_cfg is not None:
    update = dataclasses.replace(update, value_lr=float(demo_cfg.ppo_value_lr))
  return dataclasses.replace(s, update=update)


def task_problems(demo_cfg, task: str) -> dict:
  """The problem-range options (`min_terms`, `max_terms`) `task` overrides in the data set's
  options: `demo.problems_for[task]` (e.g. the `negative` task draws only long chains)."""
  per_task = demo_cfg.get("problems_for") or {}
  opts = dict(per_task.get(task, {})) if hasattr(per_task, "get") else {}
  bad = sorted(set(opts) - {"min_terms", "max_terms"})
  if bad:
    raise ValueError(f"config.demo.problems_for.{task}: unknown option(s) {bad}; valid: "
                     "['max_terms', 'min_terms']")
  return {k: int(v) for k, v in opts.items()}


def task_settings(base: settings_lib.RunSettings, demo_cfg, task: str):
  """The run settings of `task`: its channels (with the demo's thresholds) and problems."""
  if task not in TASKS:
    raise ValueError(f"unknown demo task {task!r}; valid: {sorted(TASKS)}")
  channels, _ = TASKS[task]
  params = {"arith_brief": {"threshold": int(demo_cfg.brief_threshold)},
            "arith_len": {"full_until": int(demo_cfg.len_full_until),
                          "zero_at": int(demo_cfg.len_zero_at)}}
  rewards = dataclasses.replace(
      base.rewards, channels=channels, specs=channels, primary=0,
      params={k: v for k, v in params.items() if k in channels})
  data = dataclasses.replace(base.data, options={**dict(base.data.options),
                                                 **task_problems(demo_cfg, task)})
  return dataclasses.replace(base, pipeline="train", rewards=rewards, data=data)


def short(channel: str) -> str:
  return channel[len("arith_"):] if channel.startswith("arith_") else channel


def summarize(ev: dict, task: str) -> dict:
  channels, aux = TASKS[task]
  out = {"accuracy": ev["eval/arith_acc"],
         "aux_rate": float(np.mean([ev[f"eval/{a}"] for a in aux])),
         "joint_rate": float(np.mean([ev[f"eval/arith_acc&{a}"] for a in aux])),
         "mean_length": ev["eval/length_mean"]}
  out.update({f"rate/{c}": ev[f"eval/{c}"] for c in channels})
  out.update({f"joint/{a}": ev[f"eval/arith_acc&{a}"] for a in aux})
  return out


def trace(history: list[dict], channels) -> dict:
  """Per-step rollout statistics kept in the report: profile shares (short channel names,
  e.g. `acc=0,fmt=1,len=1`; 0 where a profile did not occur), channel means, AMRP weights."""
  prof_keys = sorted({k for h in history for k in h
                      if k.startswith("profile/") and k != "profile/nan"})
  def name(k):
    return ",".join(short(p) for p in k[len("profile/"):].split(","))
  out = {"step": [int(h["step"]) for h in history],
         "profiles": {name(k): [float(h.get(k, 0.0)) for h in history] for k in prof_keys},
         "reward": {short(c): [h.get(f"reward/{c}/mean") for h in history] for c in channels},
         "length": [h.get("response/length_mean") for h in history]}
  if history and all(f"weights/{c}" in h for h in history for c in channels):
    out["weights"] = {short(c): [float(h[f"weights/{c}"]) for h in history] for c in channels}
  return out


def task_methods(demo_cfg, task: str) -> list[str]:
  """The methods run on `task`: `demo.methods`, or `demo.methods_for[task]` where given."""
  per_task = demo_cfg.get("methods_for") or {}
  spec = per_task.get(task, demo_cfg.methods) if hasattr(per_task, "get") else demo_cfg.methods
  methods = [m.strip() for m in str(spec).split(",") if m.strip()]
  for m in methods:
    parse_method(m)  # unknown names fail before any training
  if len(set(methods)) != len(methods):
    raise ValueError(f"config.demo: task {task!r} lists a method twice: {methods}")
  return methods


# What configs/demo.py leaves in the fields the demo sets per task and method: a user's other
# value there would be replaced without a word, so it is refused.
_REPLACED = {"rewards.channels": "arith_acc", "rewards.primary": 0, "rewards.params": {},
             "aggregator.name": "additive", "aggregator.hp": {}, "advantage.name": "grpo"}


def refuse_replaced_fields(config) -> None:
  """ConfigError naming the fields the demo sets itself (each task's channels, each method's
  aggregator and advantage) where the config holds a value of the user's."""
  own = []
  for path, default in _REPLACED.items():
    section, field = path.split(".")
    value = config[section].get(field)
    value = value.to_dict() if hasattr(value, "to_dict") else value
    if value != default:
      own.append(f"config.{path}={value!r}")
  if own:
    tasks = "; ".join(f"{t}: {','.join(TASKS[t][0])}" for t in TASKS)
    raise ConfigError(
        f"the demo pipeline sets the reward channels per task ({tasks}) and the aggregator and "
        f"advantage per method (config.demo.methods, config.demo.methods_for), so "
        f"{', '.join(own)} would be replaced. To train your own channels on the demo's model "
        f"and data, add --config.pipeline=train; to choose the demo's tasks and methods, "
        f"--config.demo.tasks / --config.demo.methods")


@PIPELINES.register
def demo(config, workdir: str, log=print) -> dict:
  """The `demo` pipeline (`config.pipeline = "demo"`): every task x method, then the report."""
  log = log if distributed.is_primary() else (lambda *_: None)
  from mr_rl.demo import summary
  refuse_replaced_fields(config)
  base = settings_lib.from_config(config)
  demo_cfg = config.demo
  tasks = [t.strip() for t in demo_cfg.tasks.split(",") if t.strip()]
  for t in tasks:
    if t not in TASKS:
      raise ValueError(f"config.demo.tasks: unknown task {t!r}; valid: {sorted(TASKS)}")
  plan = {t: task_methods(demo_cfg, t) for t in tasks}
  for t in (demo_cfg.get("methods_for") or {}):
    if t not in tasks:
      raise ValueError(f"config.demo.methods_for names task {t!r}, which is not among "
                       f"config.demo.tasks {tasks}")
  for t in (demo_cfg.get("problems_for") or {}):  # a table of task definitions: all tasks
    if t not in TASKS:
      raise ValueError(f"config.demo.problems_for names task {t!r}; valid: {sorted(TASKS)}")
    task_problems(demo_cfg, t)  # bad problem ranges fail before any training
  os.makedirs(workdir, exist_ok=True)
  report, drift_tables = {}, {}
  t_start = time.time()
  comp = None
  for task in tasks:
    ts = task_settings(base, demo_cfg, task)
    # One build (model, base policy); each task gets its own reward runner, and its own
    # problems where its range differs from the previous task's.
    if comp is None:
      comp = train_lib.build(ts)
    else:
      previous_options = comp.settings.data.options
      comp = dataclasses.replace(comp, settings=ts, runner=train_lib.build_runner(ts))
      if ts.data.options != previous_options:
        train_ex, eval_ex = train_lib.load_examples(ts)
        comp = dataclasses.replace(comp, train_examples=train_ex, eval_examples=eval_ex)
    report[task], histories = {}, {}
    base_ev = evaluation.final_eval(comp.policy, comp.runner, ts, comp.eval_data,
                                    comp.base_params, turns=comp.turns)
    report[task]["base"] = summarize(base_ev, task)
    for method in plan[task]:
      t0 = time.time()
      if method == "tag":
        a, table = pipelines.elect_anchor(ts, comp, os.path.join(workdir, task, "tag"), log=log)
        drift_tables[task] = table
        ms = pipelines.tag_settings(ts, a)
      else:
        ms = method_settings(ts, method, demo_cfg)
      method_dir = os.path.join(workdir, task, method)
      res = train_lib.train(ms, method_dir, comp=comp, log=None)
      history = res.history
      if not history or history[0]["step"] != 0:  # resumed (a re-run): the whole run's steps
        distributed.barrier("demo-metrics")  # process 0 has written them
        history = metrics_lib.read_jsonl(os.path.join(method_dir, "metrics.jsonl"))
      ev = evaluation.final_eval(comp.policy, comp.runner, ms, comp.eval_data, res.params,
                                 turns=comp.turns)
      r = report[task][method] = summarize(ev, task)
      if method == "tag":
        r["anchor"] = ts.rewards.channels[a]
      r["trace"] = trace(history, ts.rewards.channels)
      r["seconds"] = time.time() - t0
      histories[method] = history
      log(f"[demo] {task:14s} {method:16s} acc {r['accuracy']:.3f} aux {r['aux_rate']:.3f} "
          f"joint {r['joint_rate']:.3f} len {r['mean_length']:.1f} ({r['seconds']:.0f}s)")
    if distributed.is_primary():
      figures(histories, workdir, task)
  report["_meta"] = {"seed": base.seed, "total_steps": base.total_steps,
                     "seconds": time.time() - t_start, "variant": demo_cfg.get("variant", "")}
  report["_targets"] = summary.target_rows(report)
  if distributed.is_primary():  # every process holds the same report; one writes it
    metrics_lib.write_json(os.path.join(workdir, "report.json"), report)  # strict: NaN as null
    with open(os.path.join(workdir, "report.md"), "w") as f:
      f.write(markdown(report, drift_tables))
    log(f"[demo] wrote {workdir}/report.json and report.md in {time.time() - t_start:.0f}s")
  return report


def figures(histories: dict, workdir: str, task: str) -> list[str]:
  """The task's figures with `mr_rl.plots`: WORKDIR/<task>_profiles.png (rollout profile
  shares over steps, one panel per method: AMRP Figure 2 (b)) and, where AMRP ran,
  WORKDIR/<task>_weights.png (its channel weights over steps: AMRP Figure 3 (a, b))."""
  out = []
  if histories:
    out.append(os.path.join(workdir, f"{task}_profiles.png"))
    plots.profile_shares(histories, out[-1], f"rollout reward profiles: {task}")
  amrp = {m: h for m, h in histories.items() if parse_method(m).base == "amrp"}
  if amrp:
    out.append(os.path.join(workdir, f"{task}_weights.png"))
    plots.channel_weights(amrp, out[-1], f"AMRP channel weights: {task}")
  return out


def markdown(report: dict, drift_tables: dict) -> str:
  from mr_rl.demo import summary
  lines = ["# mr_rl CPU demo", ""]
  for task, rows in report.items():
    if task.startswith("_"):
      continue
    aux = ", ".join(short(a) for a in TASKS[task][1])
    lines += [f"## {task}", "", f"Held-out evaluation (aux: {aux}; joint: correct and aux).", "",
              "| method | accuracy | aux rate | joint rate | mean length | run time |",
              "|---|---|---|---|---|---|"]
    for method, r in rows.items():
      name = method + (f" (anchor: {r['anchor']})" if "anchor" in r else "")
      secs = f"{r['seconds']:.0f} s" if "seconds" in r else ""
      lines.append(f"| {name} | {r['accuracy']:.3f} | {r['aux_rate']:.3f} | "
                   f"{r['joint_rate']:.3f} | {r['mean_length']:.1f} | {secs} |")
    if task in drift_tables:
      lines += ["", "Anchor election (per-token drift of single-channel probes):", "",
                "| channel | KLrev/token | KLrev exact | KLfwd/token | probe reward |",
                "|---|---|---|---|---|"]
      for d in drift_tables[task]:
        lines.append(f"| {d.channel} | {d.rev_kl_per_token:.4g} | "
                     f"{d.rev_kl_exact_per_token:.4g} | {d.fwd_kl_per_token:.4g} | "
                     f"{d.probe_reward:.3f} |")
    lines.append("")
  lines += ["## Targets", "", "| target | result |", "|---|---|"]
  for row in summary.target_rows(report):
    lines.append(f"| {row['target']} | {summary.cell(row)} |")
  meta = report.get("_meta", {})
  lines += ["", f"seed {meta.get('seed')}, {meta.get('total_steps')} steps per run, "
            f"{meta.get('seconds', 0):.0f} s in all."]
  return "\n".join(lines) + "\n"
