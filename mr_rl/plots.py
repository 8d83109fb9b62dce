r"""Figures of a training run from its per-step metrics (`WORKDIR/metrics.jsonl`).

    python -m mr_rl.plots WORKDIR [--out DIR]     # PNGs in DIR (default WORKDIR/plots)

Every function below reads a run's per-step history: a list of metric dicts as the trainer
writes them (`metrics.jsonl` rows, `TrainResult.history`), each with its `step` and the
trainer's metric names:

  reward/<ch>/mean, reward/scalar/mean   per-channel and aggregated (scalar) reward means
  weights/<ch>                           aggregator channel weights (AMRP, DRBO, Lagrangian, ...)
  profile/<ch>=0|1,...                   share of rollouts per binary reward profile (AMRP Fig. 2)
  kl_ref/k1, kl_ref/k3                   KL to the reference pi_0 (k1, k3 of docs/methods.md §5)
  policy/entropy, response/length_mean
  alarm/shortcut                         1 at steps where the shortcut alarm fired

The history-level functions take `histories: {run name: history}` and draw one panel per run
(so the demo compares methods side by side with the same code, `mr_rl.demo.run`); each saves
the PNG at `path` and returns the `matplotlib.figure.Figure`. Per-step panels shade the steps
where `alarm/shortcut` fired. Figures are drawn without pyplot (no global state, no display
backend), so they work in scripts, tests and notebooks alike.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Callable, Mapping, Sequence

from mr_rl import metrics as metrics_lib
from mr_rl import workdir as workdir_lib
from mr_rl.errors import DamagedFileError, UserError

History = Sequence[Mapping[str, object]]
ALARM_COLOR = "tab:red"
_CHANNEL_MEAN = re.compile(r"^reward/(.+)/mean$")


# ------------------------------------------------------------------------------ reading
def load_history(workdir: str) -> list[dict]:
  """The per-step metrics of the run in `workdir` (its `metrics.jsonl`)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise NotARunError(f"no metrics.jsonl in {workdir!r}: give the workdir of a training "
                       f"run (python -m mr_rl.main ... --workdir=WORKDIR)"
                       f"{workdir_lib.where_the_runs_are(workdir)}")
  try:
    history = metrics_lib.read_jsonl(path)
  except ValueError as e:  # a damaged line inside (a torn last line is skipped)
    raise DamagedFileError(str(e)) from None
  if not history:
    raise DamagedFileError(f"{path} has no steps yet")
  return history


class NotARunError(UserError, FileNotFoundError):
  """A directory that holds no training run's metrics (perhaps runs below it)."""


def channels(history: History) -> list[str]:
  """The reward channels of a history (`reward/<ch>/mean` keys, without `scalar`), in order."""
  out = []
  for h in history:
    for k in h:
      m = _CHANNEL_MEAN.match(k)
      if m and m.group(1) != "scalar" and m.group(1) not in out:
        out.append(m.group(1))
  return out


def _value(h: Mapping, key: str) -> float:
  v = h.get(key)
  return float("nan") if v is None else float(v)


def _series(history: History, key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of the steps that logged `key` (NaN for a logged null)."""
  pts = [(int(h["step"]), _value(h, key)) for h in history if key in h]
  return [p[0] for p in pts], [p[1] for p in pts]


def alarm_spans(history: History) -> list[tuple[int, int]]:
  """Runs of consecutive steps where `alarm/shortcut` fired, as (first, last) steps."""
  spans: list[list[int]] = []
  for h in history:
    if _value(h, "alarm/shortcut") > 0:
      s = int(h["step"])
      if spans and spans[-1][1] == s - 1:
        spans[-1][1] = s
      else:
        spans.append([s, s])
  return [(a, b) for a, b in spans]


# ------------------------------------------------------------------------------ drawing
def _colormap():
  import matplotlib
  return matplotlib.colormaps["tab10"]


def _figure(n: int, width: float = 3.2, height: float = 3.2, sharey: bool = True):
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width * n, height))
  axes = fig.subplots(1, n, sharey=sharey, squeeze=False)[0]
  return fig, axes


def _mark_alarm(ax, history: History) -> bool:
  """Shades the steps where the shortcut alarm fired; True if it fired at all."""
  spans = alarm_spans(history)
  for a, b in spans:
    ax.axvspan(a - 0.5, b + 0.5, color=ALARM_COLOR, alpha=0.15, lw=0)
  return bool(spans)


def lines(histories: Mapping[str, History], keys: Callable[[History], Sequence[str]], path: str,
          title: str, ylabel: str, label: Callable[[str], str] = lambda k: k):
  """One panel per run; in each, a line per metric key (`keys(history)`), alarm steps shaded.

  A key keeps its colour across panels; steps that did not log a key are left out of its line
  (e.g. `kl_ref/*` with `kl_ref_every` > 1).
  """
  from matplotlib.lines import Line2D
  from matplotlib.patches import Patch
  runs = list(histories)
  if not runs:
    raise ValueError(f"{title}: no runs to plot")
  all_keys: list[str] = []
  for r in runs:
    all_keys += [k for k in keys(histories[r]) if k not in all_keys]
  cmap = _colormap()
  colors = {k: cmap(i % 10) for i, k in enumerate(all_keys)}
  fig, axes = _figure(len(runs), width=5.0 if len(runs) == 1 else 3.2)
  alarm = False
  for ax, r in zip(axes, runs):
    hist = histories[r]
    for k in keys(hist):
      steps, vals = _series(hist, k)
      ax.plot(steps, vals, color=colors[k], lw=1.2, marker="." if len(steps) < 30 else None,
              label=label(k))
    alarm |= _mark_alarm(ax, hist)
    if len(runs) > 1:
      ax.set_title(r)
    ax.set_xlabel("step")
  axes[0].set_ylabel(ylabel)
  handles = [Line2D([], [], color=colors[k]) for k in all_keys]
  names = [label(k) for k in all_keys]
  if alarm:
    handles.append(Patch(color=ALARM_COLOR, alpha=0.15))
    names.append("shortcut alarm")
  fig.legend(handles, names, loc="lower center", ncol=min(4, max(1, len(names))), fontsize=7)
  fig.suptitle(title)
  fig.tight_layout(rect=(0, 0.08 + 0.04 * (len(names) // 4), 1, 1))
  fig.savefig(path, dpi=80)
  return fig


def channel_rewards(histories: Mapping[str, History], path: str, title: str = "reward per channel"):
  """Per-channel reward means `reward/<ch>/mean` over steps (NaN-aware batch means)."""
  return lines(histories, lambda h: [f"reward/{c}/mean" for c in channels(h)], path, title,
               "mean reward", label=lambda k: k.split("/")[1])


def scalar_reward(histories: Mapping[str, History], path: str,
                  title: str = "aggregated (scalar) reward"):
  """The aggregator's scalar reward mean `reward/scalar/mean` over steps."""
  return lines(histories, lambda h: ["reward/scalar/mean"], path, title, "mean R",
               label=lambda k: "R")


def channel_weights(histories: Mapping[str, History], path: str,
                    title: str = "aggregator channel weights"):
  """The aggregator's channel weights `weights/<ch>` over steps (AMRP, DRBO, Lagrangian, ...).

  Raises:
    ValueError: no run logged weights (e.g. the additive aggregator).
  """
  def keys(h):
    return [k for c in channels(h) for k in [f"weights/{c}"] if any(k in x for x in h)]
  if not any(keys(h) for h in histories.values()):
    raise ValueError(f"{title}: no weights/<channel> metrics in these runs (their aggregator "
                     "logs no channel weights)")
  return lines(histories, keys, path, title, "weight", label=lambda k: k.split("/", 1)[1])


def kl_to_reference(histories: Mapping[str, History], path: str,
                    title: str = "KL to the reference policy"):
  """Per-token KL(pi || pi_ref) estimates `kl_ref/k1`, `kl_ref/k3` over steps."""
  return lines(histories, lambda h: [k for k in ("kl_ref/k1", "kl_ref/k3")
                                     if any(k in x for x in h)],
               path, title, "KL per response token", label=lambda k: k.split("/")[1])


def entropy(histories: Mapping[str, History], path: str, title: str = "policy entropy"):
  """The policy's mean token entropy `policy/entropy` over steps."""
  return lines(histories, lambda h: ["policy/entropy"], path, title, "entropy (nats / token)",
               label=lambda k: "entropy")


def response_length(histories: Mapping[str, History], path: str,
                    title: str = "response length"):
  """The mean sampled response length `response/length_mean` (tokens) over steps."""
  return lines(histories, lambda h: ["response/length_mean"], path, title, "tokens",
               label=lambda k: "mean length")


def profile_shares(histories: Mapping[str, History], path: str, title: str):
  """One panel per run: the share of each reward profile over steps (AMRP, Figure 2).

  Profiles are the `profile/<ch>=0|1,...` keys (`metrics.profile_distribution`; a profile that
  did not occur at a step has share 0 there), one colour per profile across panels;
  `profile/nan` (samples with a NaN channel) is left out.
  """
  from matplotlib.lines import Line2D
  runs = list(histories)
  keys = sorted({k for hist in histories.values() for h in hist for k in h
                 if k.startswith("profile/") and k != "profile/nan"})
  cmap = _colormap()
  colors = {k: cmap(i % 10) for i, k in enumerate(keys)}
  fig, axes = _figure(len(runs))
  for ax, run in zip(axes, runs):
    hist = histories[run]
    steps = [h["step"] for h in hist]
    for k in keys:
      ax.plot(steps, [h.get(k, 0.0) for h in hist], color=colors[k], lw=1.2)
    ax.set_title(run)
    ax.set_xlabel("step")
  axes[0].set_ylabel("share of rollouts")
  handles = [Line2D([], [], color=colors[k]) for k in keys]
  fig.legend(handles, [k[len("profile/"):] for k in keys], loc="lower center",
             ncol=min(4, max(1, len(keys))), fontsize=7)
  fig.suptitle(title)
  fig.tight_layout(rect=(0, 0.08 + 0.04 * (len(keys) // 4), 1, 1))
  fig.savefig(path, dpi=80)
  return fig


# ------------------------------------------------------------------------------ one run
# (file name, function); _NEEDS: the metric prefix a run must have logged for the figure.
_RUN_FIGURES = (
    ("rewards.png", channel_rewards),
    ("scalar_reward.png", scalar_reward),
    ("weights.png", channel_weights),
    ("profiles.png", profile_shares),
    ("kl_ref.png", kl_to_reference),
    ("entropy.png", entropy),
    ("response_length.png", response_length),
)
_NEEDS = {"weights.png": "weights/", "profiles.png": "profile/", "kl_ref.png": "kl_ref/",
          "entropy.png": "policy/entropy", "response_length.png": "response/length_mean",
          "scalar_reward.png": "reward/scalar/mean"}


def plot_run(workdir: str, out_dir: str | None = None, log=None) -> list[str]:
  """Writes the PNGs of one training run; returns their paths.

  `rewards.png` (per-channel means), `scalar_reward.png`, `weights.png` (aggregators that log
  channel weights), `profiles.png` (reward-profile shares), `kl_ref.png`, `entropy.png`,
  `response_length.png`; every per-step figure but the profile shares shades the steps where
  the shortcut alarm fired. A figure whose metrics the run never logged is skipped (and
  reported through `log`).

  Args:
    workdir: the run's workdir (its `metrics.jsonl`).
    out_dir: where to write (default `workdir/plots`).
    log: optional callable for one line per skipped figure.
  """
  history = load_history(workdir)
  out_dir = os.path.join(workdir, "plots") if out_dir is None else out_dir
  os.makedirs(out_dir, exist_ok=True)
  name = os.path.basename(os.path.normpath(workdir))
  logged = {k for h in history for k in h}
  written = []
  for fn_name, fn in _RUN_FIGURES:
    need = _NEEDS.get(fn_name)
    if need and not any(k.startswith(need) for k in logged):
      if log:
        log(f"skipped {fn_name}: the run logged no {need}* metrics")
      continue
    path = os.path.join(out_dir, fn_name)
    if fn is profile_shares:
      fn({name: history}, path, f"reward profiles: {name}")
    else:
      fn({name: history}, path)
    written.append(path)
  spans = alarm_spans(history)
  if log and spans:
    log("shortcut alarm fired at steps " +
        ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans))
  return written


def main(argv: Sequence[str] | None = None) -> list[str]:
  p = argparse.ArgumentParser(prog="python -m mr_rl.plots", description=__doc__.split("\n\n")[0])
  p.add_argument("workdir", help="a training run's workdir (with metrics.jsonl)")
  p.add_argument("--out", default=None, help="output directory (default WORKDIR/plots)")
  a = p.parse_args(argv)
  try:
    paths = plot_run(a.workdir, a.out, log=print)
  except UserError as e:  # its message says what to fix (mr_rl.errors)
    print(f"FATAL {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    sys.exit(1)
  for path in paths:
    print(path)
  return paths


if __name__ == "__main__":
  main()
