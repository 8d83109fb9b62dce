"""Per-step metrics: the reward-profile summaries, the shortcut alarm, and the writers.

`WORKDIR/metrics.jsonl` holds one JSON object per step (keys `step`, `loss/...`,
`reward/...`, `weights/...`, `profile/...`, `time/...`, ...); the same scalars go to
TensorBoard (`WORKDIR/tb`). On resume the JSONL is cut back to the restored step, so a
resumed run's file equals an uninterrupted run's.
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Mapping, Sequence

import numpy as np


def channel_summaries(r_BGK: np.ndarray, names: Sequence[str]) -> dict[str, float]:
  """Per-channel NaN-aware mean/std and the share of NaN (failed or not applicable)."""
  out = {}
  for k, name in enumerate(names):
    col = r_BGK[..., k].reshape(-1)
    ok = col[~np.isnan(col)]
    out[f"reward/{name}/mean"] = float(ok.mean()) if ok.size else float("nan")
    out[f"reward/{name}/std"] = float(ok.std()) if ok.size else float("nan")
    out[f"reward/{name}/nan_frac"] = float(1.0 - ok.size / max(col.size, 1))
  return out


def profile_distribution(r_BGK: np.ndarray, names: Sequence[str]) -> dict[str, float]:
  """Share of samples per binary reward profile, e.g. `profile/acc=0,fmt=1,len=1`.

  A channel's bit is 1 iff it is fully satisfied (r >= 1), so soft channels such as AMRP's length
  reward count as 1 only at full reward, as in AMRP's shortcut ratio SR (the share of
  `(acc, fmt, len) = (0, 1, 1)`). Samples with a NaN channel are counted under `profile/nan`.
  """
  flat = r_BGK.reshape(-1, r_BGK.shape[-1])
  bad = np.isnan(flat).any(axis=1)
  bits = (flat[~bad] >= 1.0).astype(int)
  counts = collections.Counter(tuple(row) for row in bits)
  n = flat.shape[0]
  out = {"profile/nan": float(bad.sum() / n)}
  for combo, c in counts.items():
    out["profile/" + ",".join(f"{names[k]}={v}" for k, v in enumerate(combo))] = c / n
  return out


class ShortcutAlarm:
  """Flags steps where the scalar reward rises while the primary channel falls.

  Over the last `window` steps it fits least-squares slopes to the scalar reward mean and
  to the primary channel mean; the alarm is on when the first is > `tol` and the second
  < -`tol` (per step). Its history is part of the checkpoint.
  """

  def __init__(self, window: int, tol: float = 1e-3):
    self.window, self.tol = int(window), float(tol)
    self.scalar: list[float] = []
    self.primary: list[float] = []

  def update(self, scalar_mean: float, primary_mean: float) -> dict[str, float]:
    self.scalar = (self.scalar + [float(scalar_mean)])[-self.window:]
    self.primary = (self.primary + [float(primary_mean)])[-self.window:]
    if len(self.scalar) < self.window:
      return {"alarm/shortcut": 0.0}
    x = np.arange(self.window, dtype=np.float64)
    s_slope = float(np.polyfit(x, np.nan_to_num(self.scalar), 1)[0])
    p_slope = float(np.polyfit(x, np.nan_to_num(self.primary), 1)[0])
    on = s_slope > self.tol and p_slope < -self.tol
    return {"alarm/shortcut": float(on), "alarm/scalar_slope": s_slope,
            "alarm/primary_slope": p_slope}

  def state(self) -> dict:
    return {"scalar": list(self.scalar), "primary": list(self.primary)}

  def restore(self, state: Mapping) -> None:
    self.scalar = [float(v) for v in state.get("scalar", [])]
    self.primary = [float(v) for v in state.get("primary", [])]


def _jsonable(v):
  v = float(v) if np.ndim(v) == 0 else [float(x) for x in np.ravel(v)]
  if isinstance(v, float) and not math.isfinite(v):
    return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
  return v


class MetricsWriter:
  """Appends per-step metrics to WORKDIR/metrics.jsonl and TensorBoard."""

  def __init__(self, workdir: str, resume_step: int = 0, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    kept = []
    if os.path.exists(self.path):  # drop lines past the restored step (crash after logging)
      with open(self.path) as f:
        for line in f:
          line = line.strip()
          if not line:
            continue
          try:
            rec = json.loads(line)
          except json.JSONDecodeError:
            break  # a torn last line from a killed run
          if rec.get("step", -1) < resume_step:
            kept.append(line)
    with open(self.path, "w") as f:
      f.writelines(l + "\n" for l in kept)
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    rec = {"step": int(step)}
    rec.update({k: _jsonable(v) for k, v in sorted(metrics.items())})
    with open(self.path, "a") as f:
      f.write(json.dumps(rec) + "\n")
      f.flush()
      os.fsync(f.fileno())
    if self._tb is not None:
      for k, v in rec.items():
        if k != "step" and isinstance(v, float):  # TensorBoard tags allow no '=' or ','
          self._tb.add_scalar(k.replace("=", "").replace(",", "_"), v, step)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


def console_line(step: int, total: int, m: Mapping[str, float], names: Sequence[str]) -> str:
  parts = [f"step {step + 1}/{total}"]
  if "reward/scalar/mean" in m:
    parts.append(f"R {m['reward/scalar/mean']:.3f}")
  parts += [f"{n} {m.get(f'reward/{n}/mean', float('nan')):.3f}" for n in names]
  for key, label in (("response/length_mean", "len"), ("loss/policy", "loss"),
                     ("policy/entropy", "ent")):
    if key in m:
      parts.append(f"{label} {m[key]:.3f}")
  t = [m.get(f"time/{s}", 0.0) for s in ("rollout", "reward", "update")]
  parts.append("t %.2f/%.2f/%.2fs" % tuple(t))
  if m.get("alarm/shortcut"):
    parts.append("SHORTCUT ALARM")
  return " | ".join(parts)
