"""The demo's targets, and the summary of demo reports of several seeds against them.

    python -m mr_rl.demo.summary /tmp/demo_s0 /tmp/demo_s1 /tmp/demo_s2 --out summary.md

Each argument is a demo WORKDIR (or its report.json). Writes a Markdown table of
mean +- standard deviation (ddof = 1) over seeds of accuracy, aux rate, joint rate and mean
length per task and method, and every target below per seed, with how many seeds pass
(targets are per seed: a seed mean can hide a failing seed).

Targets of the default demo, each on held-out evaluations unless it says rollouts:

  * negative:    additive's negative-answer rate >= 0.8 and accuracy <= 0.5x RP-only;
                 TAG's accuracy >= 0.9x RP-only;
  * brief:       additive's accuracy <= 0.6x RP-only; TAG's accuracy >= 0.95x RP-only, its
                 mean response length <= 0.75x RP-only's (the TAG paper: 33-44% shorter at
                 the same accuracy) and its correct-and-brief rate >= RP-only's + 0.05;
  * acc_fmt_len: under static equal weights (`additive`; AMRP's "static" is the mean-one
                 equal-weight sum, the same up to scale) the shortcut profile (acc 0, fmt 1,
                 len 1) is the most common rollout profile at some training step; AMRP's
                 accuracy >= static's + 0.05; AMRP's final share of rollouts with the profile
                 (1, 1, 1) (mean of the last `run.TRACE_TAIL` steps) > static's;
  * every task:  TAG's election picks the primary channel `arith_acc`;
  * RP-only's accuracy > the base policy's, in every task where it ran.

Checks of the `full` variant's paper claims, where its methods ran: AMRP + GDPO / + PPO
accuracy >= the static rule's with the same estimator + 0.05 (AMRP: "remains effective with
GDPO and PPO"); Additive+KL collapses at beta 0.01 (negative rate >= 0.8) and stalls at
beta 1 (accuracy and negative rate within 0.05 of the base policy's) (TAG Table 7); on
correct + brief + negative additive and Rubric Dropout take both shortcuts (negative and brief
rates >= 0.8) while TAG keeps >= 0.8x RP-only accuracy, a negative rate <= RP-only's + 0.05
and a brief rate >= RP-only's + 0.05 (TAG Table 8); static down-weighting 0.5 -> 0.1 only
delays the collapse: every weight ends with a rollout negative share >= 0.5, reached later
for smaller weights (TAG Figure 6).

A target whose methods or task are missing from a report is `n/a`, never a pass.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Callable, Mapping, Sequence

import numpy as np

Report = Mapping[str, Mapping[str, Mapping]]
Result = tuple  # (passed: bool | None, value: float | None[, text: str])
_METRICS = (("accuracy", "accuracy"), ("aux_rate", "aux rate"), ("joint_rate", "joint rate"),
            ("mean_length", "mean length"))
SHORTCUT = "acc=0,fmt=1,len=1"
FULL_PROFILE = "acc=1,fmt=1,len=1"
TAIL = 5  # = run.TRACE_TAIL (not imported: summary reads reports without the trainer)


def load_report(path: str) -> Report:
  """report.json of a demo WORKDIR (or the file itself)."""
  if os.path.isdir(path):
    path = os.path.join(path, "report.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no demo report at {path} (run python -m mr_rl.main "
                            "--config=configs/demo.py --workdir=DIR first)")
  with open(path) as f:
    return json.load(f)


def _row(report: Report, task: str, method: str):
  return report.get(task, {}).get(method)


def _get(report: Report, task: str, method: str, key: str):
  row = _row(report, task, method)
  return None if row is None or row.get(key) is None else float(row[key])


NA = (None, None)


def ratio(task, method, ref, op, bound, key="accuracy") -> Callable[[Report], Result]:
  """`method`'s `key` / `ref`'s, compared with `bound` (op '>=' or '<=')."""
  def check(report):
    a, b = _get(report, task, method, key), _get(report, task, ref, key)
    if a is None or b is None or b == 0:
      return NA
    r = a / b
    return (r >= bound if op == ">=" else r <= bound), r
  return check


def value(task, method, key, op, bound, label=None) -> Callable[[Report], Result]:
  """`method`'s `key` compared with `bound`; `label` names the value in the shown text."""
  def check(report):
    v = _get(report, task, method, key)
    if v is None:
      return NA
    passed = v >= bound if op == ">=" else v <= bound
    return (passed, v) if label is None else (passed, v, f"{label} {v:.2f}")
  return check


def difference(task, method, ref, key, bound, strict=False, op=">="):
  """`method`'s `key` minus `ref`'s compared with `bound` (op '>=' or '<='; > with strict)."""
  def check(report):
    a, b = _get(report, task, method, key), _get(report, task, ref, key)
    if a is None or b is None:
      return NA
    d = a - b
    if op == "<=":
      return d <= bound, d
    return (d > bound if strict else d >= bound), d
  return check


def _trace(report, task, method):
  row = _row(report, task, method)
  return None if row is None else row.get("trace")


def shortcut_mode(task, method, profile=SHORTCUT) -> Callable[[Report], Result]:
  """`profile` is the most common rollout profile (strictly) at some step of `method`."""
  def check(report):
    tr = _trace(report, task, method)
    if tr is None or not tr.get("step"):
      return NA
    profs = tr["profiles"]
    shares = np.array([profs[p] for p in profs])            # [profiles, steps]
    if profile not in profs:
      return False, 0.0, "never seen"
    i = list(profs).index(profile)
    others = np.delete(shares, i, axis=0)
    top = others.max(axis=0) if len(others) else np.zeros(shares.shape[1])
    mode_steps = np.flatnonzero(shares[i] > top)
    peak = float(shares[i].max())
    if not len(mode_steps):
      return False, peak, f"never the mode (peak share {peak:.2f})"
    first = tr["step"][mode_steps[0]]
    return True, peak, (f"mode at {len(mode_steps)} of {len(tr['step'])} steps, first at step "
                        f"{first} (peak share {peak:.2f})")
  return check


def final_share(report, task, method, profile):
  tr = _trace(report, task, method)
  if tr is None or not tr.get("step"):
    return None
  return float(np.mean(tr["profiles"].get(profile, [0.0] * len(tr["step"]))[-TAIL:]))


def final_share_above(task, method, ref, profile=FULL_PROFILE) -> Callable[[Report], Result]:
  def check(report):
    a, b = final_share(report, task, method, profile), final_share(report, task, ref, profile)
    if a is None or b is None:
      return NA
    return a > b, a - b, f"{a:.2f} vs {b:.2f}"
  return check


def anchor_is(task, channel="arith_acc") -> Callable[[Report], Result]:
  def check(report):
    row = _row(report, task, "tag")
    if row is None or "anchor" not in row:
      return NA
    return row["anchor"] == channel, None, row["anchor"]
  return check


def rp_only_beats_base() -> Callable[[Report], Result]:
  """RP-only's accuracy > the base policy's in every task where RP-only ran (tasks draw their
  own problem ranges, so each task's RP-only is its own run); the value is the smallest gain."""
  def check(report):
    gains = {task: _get(report, task, "rp_only", "accuracy") - _get(report, task, "base",
                                                                      "accuracy")
             for task in report if not task.startswith("_")
             and _get(report, task, "rp_only", "accuracy") is not None
             and _get(report, task, "base", "accuracy") is not None}
    if not gains:
      return NA
    worst = min(gains.values())
    return worst > 0.0, worst, ", ".join(f"{t} {g:+.3f}" for t, g in sorted(gains.items()))
  return check


def best_of_difference(task, methods, ref, key, margin) -> Callable[[Report], Result]:
  """The best of `methods` on `key` minus `ref`'s >= margin (n/a unless all ran)."""
  def check(report):
    vals = [_get(report, task, m, key) for m in methods]
    b = _get(report, task, ref, key)
    if b is None or any(v is None for v in vals):
      return NA
    best = max(vals)
    return best - b >= margin, best - b, f"{max(zip(vals, methods))[1]} {best:.3f} vs {b:.3f}"
  return check


def _all(*checks) -> Callable[[Report], Result]:
  """Passes when every check passes; n/a if any is n/a; the value is the first check's."""
  def check(report):
    res = [c(report) for c in checks]
    if any(r[0] is None for r in res):
      return NA
    text = "; ".join(_text(r) for r in res)
    return all(r[0] for r in res), res[0][1], text
  return check


def stalls(task, method, tol=0.05) -> Callable[[Report], Result]:
  """Accuracy and aux rate stay within `tol` of the base policy's."""
  def check(report):
    vals = [(_get(report, task, method, k), _get(report, task, "base", k))
            for k in ("accuracy", "aux_rate")]
    if any(a is None or b is None for a, b in vals):
      return NA
    d = [a - b for a, b in vals]
    return (all(abs(x) <= tol for x in d), d[0],
            f"accuracy {d[0]:+.3f}, aux rate {d[1]:+.3f} vs base")
  return check


def onset(report, task, method, channel="negative", level=0.5):
  """First training step whose rollout share of `channel` reaches `level` (None: never)."""
  tr = _trace(report, task, method)
  if tr is None:
    return None, False
  means = tr["reward"].get(channel, [])
  hit = [s for s, m in zip(tr["step"], means) if m is not None and m >= level]
  return (hit[0] if hit else None), True


def delayed_collapse(task, methods, channel="negative", level=0.5):
  """Every method reaches the rollout share `level`; later for later-listed methods."""
  def check(report):
    got = [onset(report, task, m, channel, level) for m in methods]
    if not all(ok for _, ok in got):
      return NA
    steps = [s for s, _ in got]
    text = ", ".join(f"{m}: {'never' if s is None else f'step {s}'}" for m, s in zip(methods, steps))
    reached = all(s is not None for s in steps)
    ordered = reached and all(a <= b for a, b in zip(steps, steps[1:]))
    return reached and ordered, None, text
  return check


TARGETS = (
    ("negative: additive negative rate >= 0.8", value("negative", "additive", "aux_rate", ">=", 0.8)),
    ("negative: additive accuracy <= 0.5x RP-only",
     ratio("negative", "additive", "rp_only", "<=", 0.5)),
    ("negative: TAG accuracy >= 0.9x RP-only", ratio("negative", "tag", "rp_only", ">=", 0.9)),
    ("brief: additive accuracy <= 0.6x RP-only", ratio("brief", "additive", "rp_only", "<=", 0.6)),
    ("brief: TAG accuracy >= 0.95x RP-only", ratio("brief", "tag", "rp_only", ">=", 0.95)),
    ("brief: TAG mean length <= 0.75x RP-only",
     ratio("brief", "tag", "rp_only", "<=", 0.75, key="mean_length")),
    ("brief: TAG correct&brief - RP-only's >= +0.05",
     difference("brief", "tag", "rp_only", "joint_rate", 0.05)),
    ("acc_fmt_len: static rollouts' most common profile is (0,1,1) at some step",
     shortcut_mode("acc_fmt_len", "additive")),
    ("acc_fmt_len: AMRP accuracy - static >= +0.05",
     difference("acc_fmt_len", "amrp", "additive", "accuracy", 0.05)),
    ("acc_fmt_len: AMRP final (1,1,1) rollout share > static's",
     final_share_above("acc_fmt_len", "amrp", "additive")),
    ("brief: TAG elects arith_acc", anchor_is("brief")),
    ("negative: TAG elects arith_acc", anchor_is("negative")),
    ("acc_fmt_len: TAG elects arith_acc", anchor_is("acc_fmt_len")),
    ("RP-only accuracy - base > 0 in every task", rp_only_beats_base()),
)

# The multi-turn demo (configs/demo_tools.py: arithmetic with a calculator the policy calls),
# shown where its task ran: multi-reward RL (correctness, the call ran, brevity) raises
# accuracy, through calls that run, and the gated and adaptive rules keep up with additive.
TOOL_TARGETS = (
    ("calculator: TAG accuracy - base >= +0.10",
     difference("calculator", "tag", "base", "accuracy", 0.10)),
    ("calculator: AMRP accuracy - base >= +0.10",
     difference("calculator", "amrp", "base", "accuracy", 0.10)),
    ("calculator: TAG calls that ran - base >= +0.10",
     difference("calculator", "tag", "base", "rate/tool_success", 0.10)),
    ("calculator: best of TAG, AMRP accuracy - additive >= 0",
     best_of_difference("calculator", ("tag", "amrp"), "additive", "accuracy", 0.0)),
    ("calculator: TAG elects arith_acc", anchor_is("calculator")),
)

FULL_CHECKS = (
    ("acc_fmt_len: AMRP+GDPO accuracy - static GDPO >= +0.05",
     difference("acc_fmt_len", "amrp_gdpo", "additive_gdpo", "accuracy", 0.05)),
    ("acc_fmt_len: AMRP+PPO accuracy - static PPO >= +0.05",
     difference("acc_fmt_len", "amrp_ppo", "additive_ppo", "accuracy", 0.05)),
    ("negative: Additive+KL beta 0.01 negative rate >= 0.8",
     value("negative", "additive_kl0.01", "aux_rate", ">=", 0.8)),
    ("negative: Additive+KL beta 1 stalls (within 0.05 of base)",
     stalls("negative", "additive_kl1")),
    ("brief_negative: additive takes both shortcuts (rates >= 0.8)",
     _all(value("brief_negative", "additive", "rate/arith_negative", ">=", 0.8, "negative"),
          value("brief_negative", "additive", "rate/arith_brief", ">=", 0.8, "brief"))),
    ("brief_negative: Rubric Dropout takes both shortcuts (rates >= 0.8)",
     _all(value("brief_negative", "dropout", "rate/arith_negative", ">=", 0.8, "negative"),
          value("brief_negative", "dropout", "rate/arith_brief", ">=", 0.8, "brief"))),
    ("brief_negative: TAG accuracy >= 0.8x RP-only",
     ratio("brief_negative", "tag", "rp_only", ">=", 0.8)),
    ("brief_negative: TAG negative rate - RP-only's <= +0.05",
     difference("brief_negative", "tag", "rp_only", "rate/arith_negative", 0.05, op="<=")),
    ("brief_negative: TAG brief rate - RP-only's >= +0.05",
     difference("brief_negative", "tag", "rp_only", "rate/arith_brief", 0.05)),
    ("brief_negative: TAG elects arith_acc", anchor_is("brief_negative")),
    ("negative: down-weighting 0.5 -> 0.1 delays, not prevents (rollout negative >= 0.5)",
     delayed_collapse("negative", ("weighted_0.5", "weighted_0.3", "weighted_0.1"))),
)


def _text(res) -> str:
  passed, v = res[0], res[1]
  if len(res) > 2:
    return res[2]
  return "" if v is None else f"{v:.3f}"


def _target_row(name, fn, report: Report, is_full: bool) -> dict:
  res = fn(report)
  return {"target": name, "passed": res[0], "value": res[1],
          "text": res[2] if len(res) > 2 else None, "full": is_full}


def target_rows(report: Report, full: bool | None = None) -> list[dict]:
  """[{target, passed, value, text, full}] of one report: the default targets, and the `full`
  checks whose methods ran (all of them with full=True)."""
  single_turn = any(t in report for t in ("brief", "negative", "acc_fmt_len", "brief_negative"))
  rows = [_target_row(name, fn, report, False) for name, fn in TARGETS
          if single_turn or "calculator" not in report]
  rows += [row for row in (_target_row(name, fn, report, False) for name, fn in TOOL_TARGETS)
           if row["passed"] is not None or "calculator" in report]
  for name, fn in FULL_CHECKS:
    row = _target_row(name, fn, report, True)
    if full or row["passed"] is not None:
      rows.append(row)
  return rows


def cell(row) -> str:
  """A target row as shown in the tables: `yes (value)`, `NO (value)` or `n/a`."""
  if row["passed"] is None:
    return "n/a"
  word = "yes" if row["passed"] else "NO"
  if row.get("text"):
    return f"{word} ({row['text']})"
  v = row["value"]
  if v is None:
    return word
  diff = "- " in row["target"] or row["target"].endswith("> 0")
  return f"{word} ({v:+.3f})" if diff else f"{word} ({v:.2f})"


def mean_report(reports: Sequence[Report]) -> dict:
  """The seed mean of every numeric field present in all reports."""
  out: dict = {}
  for task in reports[0]:
    if task.startswith("_"):
      continue
    for method, row in reports[0][task].items():
      for key, v in row.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
          continue
        vals = [_get(r, task, method, key) for r in reports]
        if all(x is not None for x in vals):
          out.setdefault(task, {}).setdefault(method, {})[key] = float(np.mean(vals))
  return out


def check_targets(reports: Sequence[Report]) -> list[dict]:
  """[{target, per_seed: [row of `target_rows`], passes, seeds}] over the reports: every
  default target, and each `full` check that applies to at least one report."""
  per = [{row["target"]: row for row in target_rows(r, full=True)} for r in reports]
  shown = {row["target"] for r in reports for row in target_rows(r)}
  out = []
  for name in per[0] if per else ():
    if name not in shown:
      continue
    cells = [rows[name] for rows in per]
    out.append({"target": name, "per_seed": cells,
                "passes": sum(c["passed"] is True for c in cells),
                "seeds": sum(c["passed"] is not None for c in cells)})
  return out


def _mean_sd(vals) -> str:
  if len(vals) == 1:
    return f"{vals[0]:.3f}"
  return f"{np.mean(vals):.3f} +- {np.std(vals, ddof=1):.3f}"


def to_markdown(reports: Sequence[Report], names: Sequence[str]) -> str:
  """Per-task mean +- sd tables and the per-seed target table."""
  seeds = [str(r.get("_meta", {}).get("seed", n)) for r, n in zip(reports, names)]
  lines = [f"# Demo over {len(reports)} seed(s): {', '.join(seeds)}", ""]
  for task in [t for t in reports[0] if not t.startswith("_")]:
    lines += [f"## {task}", "", "| method | " + " | ".join(h for _, h in _METRICS) + " |",
              "|---|" + "---|" * len(_METRICS)]
    for method in reports[0][task]:
      cells = []
      for key, _ in _METRICS:
        vals = [_get(r, task, method, key) for r in reports]
        cells.append("n/a" if any(v is None for v in vals) else _mean_sd(vals))
      lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines.append("")
  lines += ["## Targets (per seed)", "", "| target | " + " | ".join(f"seed {s}" for s in seeds) +
            " | seeds passing |", "|---|" + "---|" * (len(seeds) + 1)]
  for res in check_targets(reports):
    lines.append(f"| {res['target']} | " + " | ".join(cell(c) for c in res["per_seed"]) +
                 f" | {res['passes']}/{res['seeds']} |")
  secs = [r.get("_meta", {}).get("seconds") for r in reports]
  if all(s is not None for s in secs):
    lines += ["", "Run time per seed: " + ", ".join(f"{s:.0f} s" for s in secs) + "."]
  return "\n".join(lines) + "\n"


def main(argv=None) -> str:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("reports", nargs="+", help="demo WORKDIRs or report.json files")
  p.add_argument("--out", default=None, help="write the Markdown here (default: stdout only)")
  a = p.parse_args(argv)
  reports = [load_report(x) for x in a.reports]
  tasks = [sorted(t for t in r if not t.startswith("_")) for r in reports]
  if any(t != tasks[0] for t in tasks):
    raise ValueError(f"the reports cover different tasks: {tasks}")
  md = to_markdown(reports, [os.path.basename(os.path.normpath(x)) for x in a.reports])
  print(md)
  if a.out:
    with open(a.out, "w") as f:
      f.write(md)
  return md


if __name__ == "__main__":
  main()
