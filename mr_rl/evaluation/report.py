"""Evaluation results as JSON (lossless, with per-example records) and Markdown tables.

JSON is strict (no ``NaN`` literals): NaN is written as ``null`` and read back as NaN.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Mapping, Sequence

import numpy as np

from mr_rl.evaluation import summary as summary_lib
from mr_rl.evaluation.evaluator import EvalConfig, EvalResult

FORMAT = "mr_rl.evaluation/1"


def _nan_to_none(x):
  if isinstance(x, float) and math.isnan(x):
    return None
  if isinstance(x, (list, tuple)):
    return [_nan_to_none(v) for v in x]
  if isinstance(x, Mapping):
    return {k: _nan_to_none(v) for k, v in x.items()}
  return x


def _none_to_nan(x):
  if x is None:
    return float("nan")
  if isinstance(x, list):
    return [_none_to_nan(v) for v in x]
  return x


def to_dict(result: EvalResult) -> dict:
  """A JSON-ready dict: config, channels, groups and one record per example."""
  if not isinstance(result, EvalResult):
    raise TypeError(f"result must be an EvalResult, got {type(result).__name__}")
  records = []
  for i, uid in enumerate(result.uids):
    rec = {"uid": uid, "dataset": result.datasets[i],
           "rewards": result.r_BGK[i].astype(np.float64).tolist(),
           "lengths": result.lengths_BG[i].astype(int).tolist(),
           "truncated": result.truncated_BG[i].astype(bool).tolist()}
    if result.texts is not None:
      rec["texts"] = list(result.texts[i])
    records.append(rec)
  return _nan_to_none({
      "format": FORMAT, "config": dataclasses.asdict(result.config),
      "channels": list(result.channels), "wall_s": float(result.wall_s),
      "groups": {g: dict(row) for g, row in result.groups.items()}, "examples": records})


def from_dict(d: Mapping) -> EvalResult:
  """Inverse of `to_dict`."""
  if d.get("format") != FORMAT:
    raise ValueError(f"not an evaluation record (format {d.get('format')!r}, expected {FORMAT!r})")
  cfg = dict(d["config"])
  cfg["ks"] = tuple(cfg["ks"])
  recs = d["examples"]
  K = len(d["channels"])
  r = np.array([_none_to_nan(rec["rewards"]) for rec in recs], np.float32).reshape(
      len(recs), -1, K)
  has_texts = bool(recs) and "texts" in recs[0]
  return EvalResult(
      config=EvalConfig(**cfg), channels=tuple(d["channels"]),
      uids=tuple(rec["uid"] for rec in recs), datasets=tuple(rec["dataset"] for rec in recs),
      r_BGK=r, lengths_BG=np.array([rec["lengths"] for rec in recs], np.int32),
      truncated_BG=np.array([rec["truncated"] for rec in recs], bool),
      groups={g: {m: float(_none_to_nan(v)) for m, v in row.items()}
              for g, row in d["groups"].items()},
      texts=tuple(tuple(rec["texts"]) for rec in recs) if has_texts else None,
      wall_s=float(_none_to_nan(d["wall_s"])))


def to_json(result: EvalResult, path: str) -> str:
  """Writes `to_dict(result)` to ``path`` (parent folders created); returns the path."""
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  with open(path, "w") as f:
    json.dump(to_dict(result), f, indent=1, allow_nan=False)
  return path


def from_json(path: str) -> EvalResult:
  with open(path) as f:
    return from_dict(json.load(f))


# ------------------------------------------------------------------------------ markdown
def default_metrics(result: EvalResult) -> list[str]:
  """pass@k, channel means, joint rates, lengths, truncation, examples: in that order."""
  names, p = result.channels, result.primary
  return ([f"pass@{k}" for k in result.config.ks] + list(names)
          + [summary_lib.joint_key(names, p, j) for j in range(len(names)) if j != p]
          + ["length_mean", "length_median", "truncated_frac", "num_examples"])


def _fmt(metric: str, v: float) -> str:
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return "nan"
  if summary_lib.is_count(metric):
    return f"{v:.0f}"
  if metric.startswith("length_"):
    return f"{v:.1f}"
  return f"{v:.3f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def _check_metrics(result: EvalResult, metrics: Sequence[str], who: str) -> None:
  known = set(next(iter(result.groups.values())))
  bad = [m for m in metrics if m not in known]
  if bad:
    raise ValueError(f"metrics {bad} are not in {who}; available: {sorted(known)}")


def to_markdown(result: EvalResult, metrics: Sequence[str] | None = None) -> str:
  """A table with one row per data set (then ``macro`` and ``all``), metrics as columns."""
  if not isinstance(result, EvalResult):
    raise TypeError(f"result must be an EvalResult, got {type(result).__name__}")
  metrics = default_metrics(result) if metrics is None else list(metrics)
  _check_metrics(result, metrics, "the result")
  rows = [[g] + [_fmt(m, row[m]) for m in metrics] for g, row in result.groups.items()]
  return _table(["dataset"] + metrics, rows)


def compare_markdown(results: Mapping[str, EvalResult], metrics: Sequence[str] | None = None,
                     groups: Sequence[str] | None = None) -> str:
  """A method comparison table: one row per method, ``<group> <metric>`` columns.

  Args:
    results: ``{method name: EvalResult}``, all on the same channels and data sets.
    metrics: columns per group (default: `default_metrics` of the first result).
    groups: which groups (default: the only data set, or every data set and ``macro``).
  """
  if not results:
    raise ValueError("results is empty: nothing to compare")
  items = list(results.items())
  for name, res in items:
    if not isinstance(res, EvalResult):
      raise TypeError(f"results[{name!r}] must be an EvalResult, got {type(res).__name__}")
  first_name, first = items[0]
  for name, res in items[1:]:
    if res.channels != first.channels or tuple(res.groups) != tuple(first.groups):
      raise ValueError(f"results[{name!r}] has channels {res.channels} / groups "
                       f"{tuple(res.groups)}, unlike results[{first_name!r}] with "
                       f"{first.channels} / {tuple(first.groups)}")
  metrics = default_metrics(first) if metrics is None else list(metrics)
  for name, res in items:
    _check_metrics(res, metrics, f"results[{name!r}]")
  if groups is None:
    ds = first.dataset_names
    groups = list(ds) + ([summary_lib.MACRO] if len(ds) > 1 else [])
  groups = list(groups)
  bad = [g for g in groups if g not in first.groups]
  if bad:
    raise ValueError(f"groups {bad} are not in the results; available: {list(first.groups)}")
  one = len(groups) == 1
  header = ["method"] + [m if one else f"{g} {m}" for g in groups for m in metrics]
  rows = [[name] + [_fmt(m, res.groups[g][m]) for g in groups for m in metrics]
          for name, res in items]
  return _table(header, rows)
