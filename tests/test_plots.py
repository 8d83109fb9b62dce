"""`mr_rl.plots`: a run's figures from its metrics.jsonl (written by the trainer's
MetricsWriter), the lines carrying the logged values, the shortcut alarm shaded where it fired,
figures a run has no metrics for skipped, and the CLI."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from mr_rl import metrics as metrics_lib
from mr_rl import plots

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALARM_STEPS = (5, 6, 7, 10)


def _history(weights: bool = True, steps: int = 12) -> list[dict]:
  rng = np.random.default_rng(0)
  out = []
  for s in range(steps):
    m = {"reward/acc/mean": float(rng.random()), "reward/fmt/mean": float(rng.random()),
         "reward/acc/std": 0.1, "reward/scalar/mean": float(rng.random()),
         "policy/entropy": 2.0 - 0.1 * s, "response/length_mean": 10.0 + s,
         "alarm/shortcut": float(s in ALARM_STEPS),
         "profile/acc=0,fmt=1": 0.5, "profile/nan": 0.1}
    if s >= 3:  # a profile that appears only from step 3
      m["profile/acc=1,fmt=1"] = 0.4
    if s == 4:
      m["reward/fmt/mean"] = float("nan")  # every sample NaN: written as null
    if s % 2 == 0:  # kl_ref_every = 2
      m["kl_ref/k1"], m["kl_ref/k3"] = 0.01 * s, 0.02 * s
    if weights:
      m["weights/acc"], m["weights/fmt"] = 1.0 + 0.05 * s, 1.0 - 0.05 * s
    out.append({"step": s, **m})
  return out


def _write_run(workdir: str, history: list[dict]) -> None:
  w = metrics_lib.MetricsWriter(workdir, tensorboard=False)
  for h in history:
    w.write(h["step"], {k: v for k, v in h.items() if k != "step"})
  w.close()


def _line(ax, label):
  (line,) = [l for l in ax.get_lines() if l.get_label() == label]
  return list(line.get_xdata()), list(line.get_ydata())


def test_run_figures_carry_the_logged_values(tmp_path):
  wd = str(tmp_path / "run")
  hist = _history()
  _write_run(wd, hist)
  logged = plots.load_history(wd)
  assert plots.channels(logged) == ["acc", "fmt"]
  assert logged[4]["reward/fmt/mean"] is None  # NaN went to JSON as null

  ax = plots.channel_rewards({"run": logged}, str(tmp_path / "r.png")).axes[0]
  x, y = _line(ax, "fmt")
  assert x == list(range(12))
  assert math.isnan(y[4]) and y[:4] == [h["reward/fmt/mean"] for h in hist[:4]]
  assert _line(ax, "acc")[1] == [h["reward/acc/mean"] for h in hist]
  # the alarm: two shaded spans, steps 5-7 and 10
  assert plots.alarm_spans(logged) == [(5, 7), (10, 10)]
  spans = sorted((p.get_x(), p.get_x() + p.get_width()) for p in ax.patches)
  assert spans == [(4.5, 7.5), (9.5, 10.5)]

  ax = plots.kl_to_reference({"run": logged}, str(tmp_path / "k.png")).axes[0]
  assert _line(ax, "k3") == ([0, 2, 4, 6, 8, 10], [0.02 * s for s in (0, 2, 4, 6, 8, 10)])
  ax = plots.channel_weights({"run": logged}, str(tmp_path / "w.png")).axes[0]
  assert _line(ax, "fmt")[1] == pytest.approx([1.0 - 0.05 * s for s in range(12)])

  fig = plots.profile_shares({"a": logged, "b": logged[:6]}, str(tmp_path / "p.png"), "t")
  assert [a.get_title() for a in fig.axes[:2]] == ["a", "b"]
  ys = sorted(tuple(l.get_ydata()) for l in fig.axes[1].get_lines())
  assert ys == [(0.0, 0.0, 0.0, 0.4, 0.4, 0.4), (0.5,) * 6]  # absent profile = share 0, no nan
  assert fig.get_suptitle() == "t"


def test_plot_run_writes_every_figure_and_skips_missing_metrics(tmp_path):
  wd, plain = str(tmp_path / "amrp"), str(tmp_path / "additive")
  _write_run(wd, _history())
  _write_run(plain, [{k: v for k, v in h.items() if not k.startswith("kl_ref/")}
                     for h in _history(weights=False)])
  names = ["rewards.png", "scalar_reward.png", "weights.png", "profiles.png", "kl_ref.png",
           "entropy.png", "response_length.png"]
  paths = plots.plot_run(wd)
  assert paths == [os.path.join(wd, "plots", n) for n in names]
  for p in paths:
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(p) > 5000
  lines = []
  paths = plots.plot_run(plain, str(tmp_path / "out"), log=lines.append)
  assert [os.path.basename(p) for p in paths] == [n for n in names
                                                  if n not in ("weights.png", "kl_ref.png")]
  assert "skipped weights.png: the run logged no weights/* metrics" in lines
  assert "skipped kl_ref.png: the run logged no kl_ref/* metrics" in lines
  assert "shortcut alarm fired at steps 5-7, 10" in lines
  with pytest.raises(ValueError, match="no weights/<channel> metrics"):
    plots.channel_weights({"additive": plots.load_history(plain)}, str(tmp_path / "w.png"))


def test_missing_run_fails_naming_the_workdir(tmp_path):
  with pytest.raises(FileNotFoundError, match="no metrics.jsonl in .*training run"):
    plots.plot_run(str(tmp_path))


def test_a_truncated_last_line_is_skipped_with_a_warning(tmp_path, caplog):
  wd = str(tmp_path / "run")
  _write_run(wd, _history(steps=5))
  with open(os.path.join(wd, "metrics.jsonl"), "a") as f:
    f.write('{"step": 5, "reward/acc/me')  # the writer was killed mid-line
  with caplog.at_level("WARNING"):
    history = plots.load_history(wd)
  assert [h["step"] for h in history] == [0, 1, 2, 3, 4]
  assert "metrics.jsonl: skipped its last line 6, which is truncated" in caplog.text
  assert plots.plot_run(wd, str(tmp_path / "f"), log=None)  # and plots it
  out = subprocess.run([sys.executable, "-m", "mr_rl.plots", wd, "--out", str(tmp_path / "g")],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert out.returncode == 0, out.stderr


def test_a_corrupt_line_inside_names_file_and_line(tmp_path):
  wd = str(tmp_path / "run")
  _write_run(wd, _history(steps=3))
  path = os.path.join(wd, "metrics.jsonl")
  lines = open(path).read().splitlines()
  lines[1] = lines[1][:20]
  open(path, "w").write("\n".join(lines) + "\n")
  with pytest.raises(ValueError, match=rf"^{path} line 2 is not valid JSON"):
    plots.load_history(wd)


def test_cli(tmp_path):
  wd = str(tmp_path / "run")
  _write_run(wd, _history())
  out = subprocess.run([sys.executable, "-m", "mr_rl.plots", wd, "--out", str(tmp_path / "f")],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert out.returncode == 0, out.stderr
  assert sorted(os.listdir(tmp_path / "f")) == sorted(
      ["rewards.png", "scalar_reward.png", "weights.png", "profiles.png", "kl_ref.png",
       "entropy.png", "response_length.png"])
  assert "shortcut alarm fired at steps 5-7, 10" in out.stdout


def test_the_cli_on_a_directory_of_runs_is_one_fatal_line_naming_them(tmp_path):
  """The demo's top directory (W/<task>/<method>) was a 14-line traceback."""
  for method in ("tag", "additive"):
    _write_run(str(tmp_path / "demo" / "arith" / method), _history(steps=2))
  out = subprocess.run([sys.executable, "-m", "mr_rl.plots", str(tmp_path / "demo")],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) == 1, out.stderr
  assert lines[0].startswith(f"FATAL NotARunError: no metrics.jsonl in '{tmp_path / 'demo'}'")
  assert "holds 2 runs in its subdirectories" in lines[0] and \
      str(tmp_path / "demo" / "arith" / "tag") in lines[0], lines[0]
