"""Evaluation summaries from raw per-sample rewards (docs/methods.md §7-8).

Everything here is host-side NumPy on the arrays an evaluation produces:

* ``r_BGK``: rewards of B examples x G samples x K channels, NaN where a channel does not
  apply; a failed call scores its channel's failure value (the runner's convention,
  `mr_rl.rewards.runner`);
* ``lengths_BG``: generated tokens per sample as the sampler reports them (EOS included,
  the same count the length/brief channels see);
* ``truncated_BG``: the sample hit ``max_new_tokens`` without EOS.

A sample *succeeds* on a channel when its value is ``>= success_threshold`` (1.0 by
default: the binary channels of the papers score exactly 1 on success). NaN never succeeds.

Metrics of one group of examples (`group_metrics`), with their keys:

* ``pass@k``: unbiased pass@k (Chen et al. 2021; docs/methods.md §8) on the primary
  channel, ``c`` = successful samples out of ``n = G`` per example, averaged over examples.
  A NaN primary reward counts as a failed sample (it stays in ``n``).
* ``<channel>``: mean reward of the channel over its non-NaN samples (NaN if all are NaN);
  ``nan/<channel>``: how many of its samples were NaN.
* ``<primary>&<aux>``: joint rate, the share of all samples that succeed on both the
  primary and that auxiliary channel (TAG's "correct & brief/negative/fast"); a NaN in
  either channel counts as not joint (the denominator is every sample).
* ``length_mean``, ``length_median``, ``truncated_frac``, ``num_examples``, ``num_samples``.

Groups: one per data set (``Example.dataset``, in order of first appearance); with several
data sets also ``macro`` (the unweighted mean over data sets of every rate, as AMRP reports
its Acc./Fmt./Len. columns; counts are summed) and ``all`` (every example pooled).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from mr_rl.rl.pass_at_k import mean_pass_at_k

MACRO, ALL = "macro", "all"
COUNT_PREFIXES = ("num_", "nan/")


def success(r, threshold: float = 1.0) -> np.ndarray:
  """Boolean success mask: ``r >= threshold``, False on NaN."""
  r = np.asarray(r, np.float64)
  return np.where(np.isnan(r), False, r >= threshold)


def joint_key(names: Sequence[str], primary: int, aux: int) -> str:
  return f"{names[primary]}&{names[aux]}"


def is_count(metric: str) -> bool:
  return metric.startswith(COUNT_PREFIXES)


def _check_arrays(r_BGK, lengths_BG, truncated_BG, names, primary):
  r_BGK = np.asarray(r_BGK, np.float64)
  if r_BGK.ndim != 3:
    raise ValueError(f"r_BGK must be [examples, samples, channels], got shape {r_BGK.shape}")
  B, G, K = r_BGK.shape
  if B < 1 or G < 1:
    raise ValueError(f"r_BGK needs at least one example and one sample, got shape {r_BGK.shape}")
  if len(names) != K:
    raise ValueError(f"names has {len(names)} entries for K={K} reward channels")
  if not 0 <= primary < K:
    raise ValueError(f"primary={primary} is out of range for {K} channels {tuple(names)}")
  lengths_BG = np.asarray(lengths_BG)
  truncated_BG = np.asarray(truncated_BG, bool)
  for name, a in (("lengths_BG", lengths_BG), ("truncated_BG", truncated_BG)):
    if a.shape != (B, G):
      raise ValueError(f"{name} must have shape {(B, G)}, got {a.shape}")
  return r_BGK, lengths_BG, truncated_BG


def group_metrics(r_BGK, lengths_BG, truncated_BG, names: Sequence[str], primary: int,
                  ks: Sequence[int], success_threshold: float = 1.0) -> dict[str, float]:
  """The metrics of one group of examples (see the module docstring for the keys).

  Args:
    r_BGK: float [B, G, K] rewards, NaN = does not apply.
    lengths_BG: generated tokens per sample.
    truncated_BG: bool, sample hit the token budget.
    names: the K channel names.
    primary: index of the channel whose success defines pass@k and the joint rates.
    ks: the k of pass@k, each ``1 <= k <= G``.
    success_threshold: a sample succeeds on a channel when its reward is ``>=`` this.
  """
  r_BGK, lengths_BG, truncated_BG = _check_arrays(r_BGK, lengths_BG, truncated_BG, names,
                                                  primary)
  B, G, K = r_BGK.shape
  for k in ks:
    if not 1 <= k <= G:
      raise ValueError(f"ks={tuple(ks)} holds k={k} outside 1..n with n={G} samples per example")
  ok_BGK = success(r_BGK, success_threshold)
  c_B = ok_BGK[:, :, primary].sum(1)
  out: dict[str, float] = {"num_examples": float(B), "num_samples": float(B * G)}
  for k in ks:
    out[f"pass@{k}"] = float(mean_pass_at_k(np.full(B, G), c_B, int(k)))
  for j, name in enumerate(names):
    col = r_BGK[:, :, j]
    finite = ~np.isnan(col)
    out[name] = float(col[finite].mean()) if finite.any() else float("nan")
    out[f"nan/{name}"] = float((~finite).sum())
  for j in range(K):
    if j != primary:
      out[joint_key(names, primary, j)] = float((ok_BGK[:, :, primary] & ok_BGK[:, :, j]).mean())
  out["length_mean"] = float(lengths_BG.mean())
  out["length_median"] = float(np.median(lengths_BG))
  out["truncated_frac"] = float(truncated_BG.mean())
  return out


def macro_average(per_dataset: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
  """Unweighted mean over data sets of every rate; counts (``num_*``, ``nan/*``) are summed."""
  rows = list(per_dataset.values())
  out = {}
  for metric in rows[0]:
    vals = np.array([row[metric] for row in rows], np.float64)
    out[metric] = float(vals.sum()) if is_count(metric) else float(vals.mean())
  return out


def summarize(r_BGK, lengths_BG, truncated_BG, datasets: Sequence[str], names: Sequence[str],
              primary: int, ks: Sequence[int],
              success_threshold: float = 1.0) -> dict[str, dict[str, float]]:
  """Per-group metrics: one group per data set, plus ``macro`` and ``all`` when there are several.

  Args:
    datasets: the data set of each of the B examples (``Example.dataset``).
    Others: as in `group_metrics`.

  Returns:
    ``{group: {metric: value}}`` in order: data sets (first appearance), ``macro``, ``all``.
  """
  r_BGK, lengths_BG, truncated_BG = _check_arrays(r_BGK, lengths_BG, truncated_BG, names,
                                                  primary)
  datasets = [str(d) for d in datasets]
  if len(datasets) != r_BGK.shape[0]:
    raise ValueError(f"datasets has {len(datasets)} entries for {r_BGK.shape[0]} examples")
  for reserved in (MACRO, ALL):
    if reserved in datasets:
      raise ValueError(f"a data set may not be named {reserved!r} (reserved for the summary rows)")
  order = list(dict.fromkeys(datasets))
  ds_B = np.array(datasets, dtype=object)
  out = {}
  for d in order:
    sel = ds_B == d
    out[d] = group_metrics(r_BGK[sel], lengths_BG[sel], truncated_BG[sel], names, primary, ks,
                           success_threshold)
  if len(order) > 1:
    out[MACRO] = macro_average({d: out[d] for d in order})
    out[ALL] = group_metrics(r_BGK, lengths_BG, truncated_BG, names, primary, ks,
                             success_threshold)
  return out
