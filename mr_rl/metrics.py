"""Per-step metrics: the reward-profile summaries, the shortcut alarm, the writers, the console.

`WORKDIR/metrics.jsonl` holds one JSON object per step (keys `step`, `loss/...`,
`reward/...`, `weights/...`, `profile/...`, `time/...`, ...); the same scalars go to
TensorBoard (`WORKDIR/tb`) and, with `config.logging.wandb_project`, to Weights & Biases under
the same names (`tag`). On resume the JSONL is cut back to the restored step, so a resumed
run's file equals an uninterrupted run's, and W&B continues the run of the same workdir (its
id is kept in `WORKDIR/wandb_run_id`). The run's resolved settings are written to
`WORKDIR/settings.json` (read by `mr_rl.export`; W&B's run config).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from mr_rl import package_paths

_LOG = logging.getLogger(__name__)


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


# Names of the update step's metrics in the log (others become `update/<name>`).
UPDATE_NAMES = {"policy_loss": "loss/policy", "pg_loss": "loss/pg", "entropy": "policy/entropy",
                "kl": "loss/kl", "mismatch_abs": "mismatch/abs_logp_diff",
                "mismatch_k3": "mismatch/k3", "tis_weight_mean": "mismatch/tis_weight_mean",
                "tis_clip_frac": "mismatch/tis_clip_frac"}


def step_metrics(names: Sequence[str], r_BGK, R_BG, agg_metrics: Mapping, update_metrics: Mapping,
                 reward_metrics: Mapping, lengths_BG, truncated_BG) -> dict[str, float]:
  """One training step's scalars: per-channel rewards and profiles, the scalar reward, the
  aggregator's weights and metrics, the update's metrics (`UPDATE_NAMES`), the reward
  runner's counters (`reward_runner/...`) and response lengths (host values)."""
  m = channel_summaries(r_BGK, names)
  m.update(profile_distribution(r_BGK, names))
  R = np.asarray(R_BG)
  m["reward/scalar/mean"] = float(np.nanmean(R)) if np.isfinite(R).any() else float("nan")
  m["reward/scalar/std"] = float(np.nanstd(R)) if np.isfinite(R).any() else float("nan")
  if "weights" in agg_metrics:
    for k, n in enumerate(names):
      m[f"weights/{n}"] = float(agg_metrics["weights"][k])
  m["frac_zero_std/scalar"] = float(agg_metrics["frac_zero_std"])
  for k, n in enumerate(names):
    m[f"frac_zero_std/{n}"] = float(agg_metrics["frac_zero_std_channels"][k])
  for k, v in agg_metrics.items():
    if k not in ("weights", "frac_zero_std", "frac_zero_std_channels") and np.ndim(v) == 0:
      m[f"aggregator/{k}"] = float(v)
  for k, v in update_metrics.items():
    if np.ndim(v) == 0:
      m[UPDATE_NAMES.get(k, f"update/{k}")] = float(v)
  m.update({k.replace("rewards/", "reward_runner/"): float(v) for k, v in reward_metrics.items()})
  m["response/length_mean"] = float(np.mean(lengths_BG))
  m["response/truncated_frac"] = float(np.mean(truncated_BG))
  return m


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


def tag(key: str) -> str:
  """The TensorBoard / W&B name of a metric (those tags allow no '=' or ',')."""
  return key.replace("=", "").replace(",", "_")


def settings_dict(settings) -> dict:
  """A run's resolved settings (`mr_rl.settings.RunSettings`) as plain JSON values, a
  `model.path` inside the mr_rl package written relative to it (`mr_rl.package_paths`), so
  the record does not name the clone the run started from."""
  d = json.loads(json.dumps(dataclasses.asdict(settings), default=repr))
  if isinstance(d.get("model"), dict) and "path" in d["model"]:
    d["model"]["path"] = package_paths.portable(d["model"]["path"])
  return d


SETTINGS_FILE = "settings.json"
WANDB_ID_FILE = "wandb_run_id"


class WandbWriter:
  """The per-step scalars to a Weights & Biases run (`config.logging`).

  The run's files go to WORKDIR/wandb; its id is kept in WORKDIR/wandb_run_id, so running the
  same workdir again (a resume) continues the same W&B run (`resume="allow"`). Steps that a
  killed run logged after its last checkpoint are re-run on resume; W&B keeps the first value
  of a step it has seen (it drops non-increasing steps), metrics.jsonl the re-run's.
  """

  def __init__(self, workdir: str, logging, config: Mapping[str, Any]):
    try:
      import wandb
    except ImportError as e:
      raise ImportError("config.logging.wandb_project is set but wandb is not installed: "
                        "pip install -e '.[wandb]'") from e
    id_path = os.path.join(workdir, WANDB_ID_FILE)
    run_id = None  # a new run: W&B draws the id
    if os.path.exists(id_path):
      with open(id_path) as f:
        run_id = f.read().strip() or None
    self.run = wandb.init(
        project=logging.wandb_project, entity=logging.wandb_entity or None,
        name=logging.wandb_name or os.path.basename(os.path.normpath(workdir)),
        mode=logging.wandb_mode or None, dir=workdir, id=run_id, resume="allow",
        config=dict(config))
    with open(id_path, "w") as f:
      f.write(self.run.id + "\n")

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    self.run.log(dict(scalars), step=int(step))

  def close(self) -> None:
    self.run.finish()


class MetricsWriter:
  """Appends per-step metrics to WORKDIR/metrics.jsonl, TensorBoard and (optionally) W&B.

  Args:
    workdir: the run's directory.
    resume_step: the restored step; metrics.jsonl lines of later steps are dropped.
    tensorboard: write WORKDIR/tb.
    settings: the run's `RunSettings`: written to WORKDIR/settings.json (on a resume to
      WORKDIR/settings.resume-<step>.json, keeping the first), and with
      `settings.logging.wandb_project` a W&B run is opened with them as its config.
  """

  def __init__(self, workdir: str, resume_step: int = 0, tensorboard: bool = True,
               settings=None):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    kept = []
    if os.path.exists(self.path):  # drop lines past the restored step (crash after logging)
      with open(self.path) as f:
        for i, line in enumerate(f, 1):
          line = line.strip()
          if not line:
            continue
          try:
            rec = json.loads(line)
          except json.JSONDecodeError as e:  # one damaged (or torn last) line: it alone goes
            _LOG.warning("%s: dropped line %d, which is not valid JSON (column %d: %s): %.80r",
                         self.path, i, e.colno, e.msg, line)
            continue
          if not isinstance(rec, dict):
            _LOG.warning("%s: dropped line %d, which is not a record: %.80r", self.path, i, line)
            continue
          if rec.get("step", -1) < resume_step:
            kept.append(line)
    tmp = f"{self.path}.tmp.{os.getpid()}"  # the rewrite is atomic: a kill keeps the old file
    with open(tmp, "w") as f:
      f.writelines(l + "\n" for l in kept)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self.path)
    self._tb = self._wandb = None
    if settings is not None:
      config = settings_dict(settings)
      # The first start writes settings.json; each resume keeps it and writes its own
      # settings.resume-<step>.json next to it.
      name = SETTINGS_FILE
      if resume_step and os.path.exists(os.path.join(workdir, SETTINGS_FILE)):
        name = f"settings.resume-{int(resume_step)}.json"
      with open(os.path.join(workdir, name), "w") as f:
        json.dump(config, f, indent=1)
      if settings.logging.wandb_project:
        self._wandb = WandbWriter(workdir, settings.logging, config)
    if tensorboard:
      from tensorboardX import SummaryWriter
      # tensorboardX names its file by the second and host only: a resume started within the
      # same second would replace the first start's events, so each start's name is its own.
      self._tb = SummaryWriter(os.path.join(workdir, "tb"),
                               filename_suffix=f".{os.getpid()}.from-step-{int(resume_step)}")

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    rec = {"step": int(step)}
    rec.update({k: _jsonable(v) for k, v in sorted(metrics.items())})
    with open(self.path, "a") as f:
      f.write(json.dumps(rec) + "\n")
      f.flush()
      os.fsync(f.fileno())
    scalars = {tag(k): v for k, v in rec.items() if k != "step" and isinstance(v, float)}
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, step)
    if self._wandb is not None:
      self._wandb.write(step, scalars)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close()


def read_jsonl(path: str) -> list[dict]:
  """The records of a JSON-lines file (blank lines skipped). A last line that does not parse
  is a record torn by a killed writer: skipped with a warning. Any other line that does not
  parse is a ValueError naming the file and the line."""
  with open(path) as f:
    lines = [(i, l) for i, l in enumerate(f, 1) if l.strip()]
  out = []
  for n, (i, line) in enumerate(lines):
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError as e:
      if n == len(lines) - 1:
        _LOG.warning("%s: skipped its last line %d, which is truncated (%s): %.80r", path, i,
                     e.msg, line)
        break
      raise ValueError(f"{path} line {i} is not valid JSON (column {e.colno}: {e.msg}): "
                       f"{line[:120]!r}") from e
  return out


def finite_json(x: Any) -> Any:
  """`x` (nested dicts / lists / tuples of numbers, numpy scalars and arrays, str, None) with
  every non-finite float as None, so `json.dump(..., allow_nan=False)` writes strict JSON
  (Python's default writes NaN / Infinity, which other JSON readers reject)."""
  if isinstance(x, Mapping):
    return {k: finite_json(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [finite_json(v) for v in x]
  if isinstance(x, np.ndarray):
    return finite_json(x.tolist())
  if isinstance(x, np.generic):
    x = x.item()
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def write_json(path: str, obj: Any, indent: int = 1) -> None:
  """Writes `obj` to `path` as strict JSON (non-finite floats as null, `finite_json`)."""
  with open(path, "w") as f:
    json.dump(finite_json(obj), f, indent=indent, allow_nan=False)


class StageTimer:
  """Wall-clock seconds of a step's named stages: each `with timer("update"): ...` adds the
  block's time to `seconds["update"]`; `metrics()` names them `time/<stage>`.

  Args:
    seconds: stages timed elsewhere (e.g. a draw's `rollout` / `reward`, measured where it
      ran), which the timer's blocks add to.
    clock: seconds now (`time.perf_counter`).
  """

  def __init__(self, seconds: Mapping[str, float] | None = None,
               clock: Callable[[], float] = time.perf_counter):
    self.seconds: dict[str, float] = dict(seconds or {})
    self.clock = clock

  @contextlib.contextmanager
  def __call__(self, stage: str):
    t0 = self.clock()
    try:
      yield
    finally:
      self.seconds[stage] = self.seconds.get(stage, 0.0) + self.clock() - t0

  def metrics(self) -> dict[str, float]:
    """{`time/<stage>`: seconds}, in the order the stages were first timed."""
    return {f"time/{k}": float(v) for k, v in self.seconds.items()}


class ETA:
  """Remaining wall-clock time of a run from the time its steps have taken.

  `update(step)` is called when a step has finished. The first step of a process (compiles
  included) is timed from construction and sets the estimate until a second step has run;
  from then on the rate is the mean over the steps after the first, so compile time does not
  inflate the estimate.
  """

  def __init__(self, total: int, clock: Callable[[], float] = time.monotonic):
    self.total, self.clock = int(total), clock
    self._t0 = clock()
    self._first: tuple[int, float] | None = None  # (step, time it finished)

  def update(self, step: int) -> float:
    """Seconds left after `step` (0-based) has finished."""
    now = self.clock()
    if self._first is None:
      self._first = (int(step), now)
      per_step = now - self._t0
    else:
      per_step = (now - self._first[1]) / max(int(step) - self._first[0], 1)
    return max(self.total - int(step) - 1, 0) * per_step


def format_duration(seconds: float) -> str:
  """'42s', '3m05s', '2h07m'."""
  s = int(round(max(seconds, 0.0)))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def console_line(step: int, total: int, m: Mapping[str, float], names: Sequence[str],
                 eta_s: float | None = None) -> str:
  """One line per logged step: rewards, length, loss, entropy, timings, the alarm, the ETA."""
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
  if eta_s is not None:
    parts.append(f"ETA {format_duration(eta_s)}")
  return " | ".join(parts)
