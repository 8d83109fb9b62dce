"""Summarise demo reports of several seeds, and check them against the demo's targets.

    python -m mr_rl.demo.summary /tmp/demo_s0 /tmp/demo_s1 /tmp/demo_s2 --out summary.md

Each argument is a demo WORKDIR (or its report.json). Writes a Markdown table of
mean +- standard deviation (ddof = 1) over seeds of accuracy, aux rate and mean length per
task and method, and the targets of the demo issue, per seed and for the seed means:

  * negative:    additive reaches an aux (negative-answer) rate >= 0.8,
                 with accuracy <= 0.5x RP-only;
  * every task:  TAG keeps accuracy >= 0.9x RP-only;
  * acc_fmt_len: AMRP's accuracy beats static weighting (AMRP's "static" is the mean-one
                 equal-weight sum, i.e. the `additive` method).

A target whose methods or task are missing from a report is `n/a`, never a pass.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Callable, Mapping, Sequence

import numpy as np

Report = Mapping[str, Mapping[str, Mapping[str, float]]]
_METRICS = (("accuracy", "accuracy"), ("aux_rate", "aux rate"), ("mean_length", "mean length"))


def load_report(path: str) -> Report:
  """report.json of a demo WORKDIR (or the file itself)."""
  if os.path.isdir(path):
    path = os.path.join(path, "report.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no demo report at {path} (run python -m mr_rl.main "
                            "--config=configs/demo.py --workdir=DIR first)")
  with open(path) as f:
    return json.load(f)


def _get(report: Report, task: str, method: str, key: str):
  row = report.get(task, {}).get(method)
  return None if row is None or key not in row else float(row[key])


def _ratio_check(task, method, ref, op, bound) -> Callable[[Report], tuple]:
  def check(report):
    a, b = _get(report, task, method, "accuracy"), _get(report, task, ref, "accuracy")
    if a is None or b is None or b == 0:
      return None, None
    r = a / b
    return (r >= bound if op == ">=" else r <= bound), r
  return check


def _value_check(task, method, key, bound) -> Callable[[Report], tuple]:
  def check(report):
    v = _get(report, task, method, key)
    return (None, None) if v is None else (v >= bound, v)
  return check


def _beats_check(task, method, other) -> Callable[[Report], tuple]:
  def check(report):
    a, b = _get(report, task, method, "accuracy"), _get(report, task, other, "accuracy")
    return (None, None) if a is None or b is None else (a > b, a - b)
  return check


TARGETS = (
    ("negative: additive aux rate >= 0.8", _value_check("negative", "additive", "aux_rate", 0.8)),
    ("negative: additive accuracy <= 0.5x RP-only",
     _ratio_check("negative", "additive", "rp_only", "<=", 0.5)),
    ("brief: TAG accuracy >= 0.9x RP-only", _ratio_check("brief", "tag", "rp_only", ">=", 0.9)),
    ("negative: TAG accuracy >= 0.9x RP-only",
     _ratio_check("negative", "tag", "rp_only", ">=", 0.9)),
    ("acc_fmt_len: TAG accuracy >= 0.9x RP-only",
     _ratio_check("acc_fmt_len", "tag", "rp_only", ">=", 0.9)),
    ("acc_fmt_len: AMRP accuracy - static (additive) > 0",
     _beats_check("acc_fmt_len", "amrp", "additive")),
)


def mean_report(reports: Sequence[Report]) -> dict:
  """The seed mean of every numeric field present in all reports."""
  out: dict = {}
  for task in reports[0]:
    if task.startswith("_"):
      continue
    for method, row in reports[0][task].items():
      for key, v in row.items():
        vals = [_get(r, task, method, key) for r in reports] if isinstance(v, (int, float)) else []
        if vals and all(x is not None for x in vals):
          out.setdefault(task, {}).setdefault(method, {})[key] = float(np.mean(vals))
  return out


def check_targets(reports: Sequence[Report]) -> list[dict]:
  """[{target, per_seed: [(passed|None, value|None)], mean: (passed|None, value|None)}]."""
  mean = mean_report(reports)
  return [{"target": name, "per_seed": [fn(r) for r in reports], "mean": fn(mean)}
          for name, fn in TARGETS]


def _fmt_check(res, difference: bool = False) -> str:
  passed, value = res
  if passed is None:
    return "n/a"
  shown = f"{value:+.3f}" if difference else f"{value:.2f}"  # differences keep their sign
  return f"{'yes' if passed else 'NO'} ({shown})"


def _mean_sd(vals) -> str:
  if len(vals) == 1:
    return f"{vals[0]:.3f}"
  return f"{np.mean(vals):.3f} +- {np.std(vals, ddof=1):.3f}"


def to_markdown(reports: Sequence[Report], names: Sequence[str]) -> str:
  """Per-task mean +- sd tables and the target table."""
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
  lines += ["## Targets", "", "| target | " + " | ".join(f"seed {s}" for s in seeds) +
            " | seed mean |", "|---|" + "---|" * (len(seeds) + 1)]
  for res in check_targets(reports):
    diff = res["target"].endswith("> 0")
    lines.append(f"| {res['target']} | " +
                 " | ".join(_fmt_check(c, diff) for c in res["per_seed"]) +
                 f" | {_fmt_check(res['mean'], diff)} |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> str:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
