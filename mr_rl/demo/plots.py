"""The demo's figures, from the per-step traces in its report (`run.trace`).

* `<task>_profiles.png`: one panel per method, the share of each binary reward profile among
  the training rollouts over steps (AMRP paper Figure 2 (b) / 3 (c, d) view; the shortcut
  profile of `acc_fmt_len` is `acc=0,fmt=1,len=1`). Each profile keeps one colour across
  panels.
* `<task>_weights.png`: AMRP's channel weights over steps, one panel per AMRP run of the task
  (`amrp`, `amrp_gdpo`, `amrp_ppo`), as in AMRP Figure 3 (a, b).
"""

from __future__ import annotations

import os


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def profile_figure(rows: dict, path: str, title: str) -> bool:
  """Profile shares over steps, one panel per method with a trace; False if none has one."""
  runs = {m: r["trace"] for m, r in rows.items() if r.get("trace", {}).get("step")}
  if not runs:
    return False
  plt = _plt()
  keys = sorted({k for tr in runs.values() for k in tr["profiles"]})
  colors = {k: plt.cm.tab10(i % 10) for i, k in enumerate(keys)}
  n = len(runs)
  cols = min(n, 4)
  nrows = -(-n // cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 2.8 * nrows + 0.8), sharey=True,
                           squeeze=False)
  for ax, (method, tr) in zip(axes.flat, runs.items()):
    for k in keys:
      ys = tr["profiles"].get(k)
      if ys is not None:
        ax.plot(tr["step"], ys, color=colors[k], lw=1.6 if k.startswith("acc=1") else 1.0)
    ax.set_title(method, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylim(0, 1)
  for ax in list(axes.flat)[n:]:
    ax.set_visible(False)
  for r in range(nrows):
    axes[r][0].set_ylabel("share of rollouts", fontsize=8)
  handles = [plt.Line2D([], [], color=colors[k]) for k in keys]
  ncol = min(4, max(1, len(keys)))
  fig.legend(handles, keys, loc="lower center", ncol=ncol, fontsize=7)
  fig.suptitle(f"rollout reward profiles: {title}", fontsize=10)
  legend_rows = -(-len(keys) // ncol)
  fig.tight_layout(rect=(0, min(0.4, 0.05 * legend_rows / nrows + 0.03), 1, 1))
  fig.savefig(path, dpi=80)
  plt.close(fig)
  return True


def weights_figure(rows: dict, path: str, title: str) -> bool:
  """AMRP's channel weights over steps, one panel per AMRP run; False if none ran."""
  runs = {m: r["trace"] for m, r in rows.items()
          if m.startswith("amrp") and "weights" in r.get("trace", {})}
  if not runs:
    return False
  plt = _plt()
  fig, axes = plt.subplots(1, len(runs), figsize=(3.6 * len(runs), 3.0), sharey=True,
                           squeeze=False)
  for ax, (method, tr) in zip(axes[0], runs.items()):
    for i, (ch, w) in enumerate(tr["weights"].items()):
      ax.plot(tr["step"], w, color=plt.cm.tab10(i), label=ch)
    ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
    ax.set_title(method, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.legend(fontsize=7)
  axes[0][0].set_ylabel("weight (mean one)", fontsize=8)
  fig.suptitle(f"AMRP channel weights: {title}", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)
  return True


def task_figures(rows: dict, workdir: str, task: str) -> list[str]:
  """Writes the task's figures into `workdir`; returns the paths written."""
  out = []
  p = os.path.join(workdir, f"{task}_profiles.png")
  if profile_figure(rows, p, task):
    out.append(p)
  p = os.path.join(workdir, f"{task}_weights.png")
  if weights_figure(rows, p, task):
    out.append(p)
  return out
