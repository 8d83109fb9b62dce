"""mr_rl.metrics JSON helpers: strict JSON out (no NaN / Infinity tokens), tolerant reads."""

import json
import math

import numpy as np
import pytest

from mr_rl import metrics as metrics_lib


def _strict_load(path):
  def refuse(token):
    raise ValueError(f"non-standard JSON token {token}")
  with open(path) as f:
    return json.load(f, parse_constant=refuse)


def test_write_json_is_strict_json(tmp_path):
  ev = {"eval/macro/accuracy": float("nan"), "eval/math500/accuracy": np.float32(0.5),
        "per_set": [1.0, float("inf"), -float("inf"), np.nan, None, "x", 3],
        "arr": np.array([0.25, np.nan]), "nested": {"n": np.int64(7), "t": (float("nan"),)}}
  path = str(tmp_path / "eval.json")
  with pytest.raises(ValueError):  # what json.dump would have written is not strict JSON
    json.dumps(ev, allow_nan=False, default=float)
  metrics_lib.write_json(path, ev)
  assert _strict_load(path) == {
      "eval/macro/accuracy": None, "eval/math500/accuracy": 0.5,
      "per_set": [1.0, None, None, None, None, "x", 3], "arr": [0.25, None],
      "nested": {"n": 7, "t": [None]}}
  assert metrics_lib.finite_json(math.nan) is None and metrics_lib.finite_json(2.0) == 2.0


def test_stage_timer_adds_up_each_stage():
  ticks = iter([0.0, 1.5, 2.0, 2.25, 3.0, 4.0])
  timer = metrics_lib.StageTimer({"rollout": 7.0}, clock=lambda: next(ticks))
  with timer("update"):
    pass
  with timer("rollout"):
    pass
  with pytest.raises(KeyError), timer("update"):  # a stage that raises still counts its time
    raise KeyError("x")
  assert timer.metrics() == {"time/rollout": 7.25, "time/update": 2.5}
  assert list(timer.metrics()) == ["time/rollout", "time/update"]


def test_a_resume_in_the_same_second_keeps_the_first_starts_tensorboard_events(tmp_path):
  """tensorboardX names an event file by the second and the host: a start and its resume in
  the same second wrote the same file, and the resume's replaced the first start's events."""
  import glob
  import struct
  from tensorboardX.proto import event_pb2
  for start, step in ((0, 0), (1, 1)):  # (well within one second)
    w = metrics_lib.MetricsWriter(str(tmp_path), resume_step=start)
    w.write(step, {"loss/policy": 0.5 + step})
    w.close()
  steps = set()
  for fn in glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*")):
    with open(fn, "rb") as f:
      while header := f.read(12):
        ev = event_pb2.Event()
        ev.ParseFromString(f.read(struct.unpack("<Q", header[:8])[0]))
        f.read(4)
        steps |= {ev.step for v in ev.summary.value if v.tag == "loss/policy"}
  assert steps == {0, 1}


def test_a_damaged_metrics_line_is_dropped_alone_on_resume(tmp_path, caplog):
  """A resume rewrites metrics.jsonl up to the restored step: a damaged line in the middle goes
  with a warning naming it, and the intact records after it stay (they were all dropped)."""
  import logging
  path = tmp_path / "metrics.jsonl"
  lines = [json.dumps({"step": i, "loss/policy": 0.1 * i}) for i in range(5)]
  lines[1] = lines[1][:9]  # step 1's line cut short
  path.write_text("\n".join(lines) + "\n")
  with caplog.at_level(logging.WARNING, logger="mr_rl.metrics"):
    metrics_lib.MetricsWriter(str(tmp_path), resume_step=5, tensorboard=False).close()
  assert [r["step"] for r in metrics_lib.read_jsonl(str(path))] == [0, 2, 3, 4]
  assert any(f"{path}: dropped line 2" in r.getMessage() for r in caplog.records), caplog.text
  assert not list(tmp_path.glob("metrics.jsonl.tmp*"))  # (written aside, then renamed)
