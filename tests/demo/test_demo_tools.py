"""The multi-turn demo (`configs/demo_tools.py`): its smoke variant end to end through the demo
pipeline (multi-turn probes, anchor election, training, evaluation, report and targets), the
calculator warm start's transcripts, and the config's argument checks."""

import json
import os

import numpy as np
import pytest

from mr_rl import config_lib, pipelines
from mr_rl.demo import calculator, styles, summary, task, warmstart

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(arg):
  return config_lib.load_config_module(os.path.join(REPO, "configs", "demo_tools.py")
                                       ).get_config(arg)


def test_demo_tools_smoke_writes_report(tmp_path):
  wd = str(tmp_path)
  report = pipelines.run(_config("smoke"), wd)
  saved = json.load(open(os.path.join(wd, "report.json")))
  assert list(k for k in saved if not k.startswith("_")) == ["calculator"]
  assert saved["calculator"].keys() == {"base", "tag"}
  for row in saved["calculator"].values():
    assert 0.0 <= row["joint_rate"] <= row["accuracy"] <= 1.0
    assert 0.0 <= row["rate/tool_success"] <= 1.0 and row["mean_length"] > 0
  tag = saved["calculator"]["tag"]
  assert tag["anchor"] in ("arith_acc", "tool_success", "arith_brief")
  assert tag["trace"]["step"] == [0, 1]
  np.testing.assert_allclose(np.sum(list(tag["trace"]["profiles"].values()), axis=0), 1.0,
                             atol=1e-6)
  drift = json.load(open(os.path.join(wd, "calculator", "tag", "drift.json")))
  assert [c["channel"] for c in drift["channels"]] == ["arith_acc", "tool_success",
                                                       "arith_brief"]
  # Only the multi-turn targets are shown for a report of the calculator task alone.
  shown = [r["target"] for r in saved["_targets"]]
  assert shown == [name for name, _ in summary.TOOL_TARGETS]
  assert report["calculator"]["tag"]["anchor"] == tag["anchor"]
  metrics = [json.loads(line) for line in open(os.path.join(wd, "calculator", "tag",
                                                             "metrics.jsonl"))]
  assert all(m["multiturn/token_mismatches"] == 0 for m in metrics)
  assert all("reward/tool_success/mean" in m for m in metrics)


def test_calculator_transcripts_mask_the_observations():
  tok = task.make_tokenizer()
  p = task.Problem((7, 5, 9, 3), ("+", "-", "+"))
  ids, mask = calculator.tool_transcript(p.prompt, p.solution("tool"), tok)
  assert tok.decode(ids, skip_special_tokens=False) == "<r>7+5-9+3</r>=6;<a>6</a>"
  assert [tok.decode([i]) for i, m in zip(ids, mask) if not m] == ["=", "6", ";"]
  ids, mask = calculator.tool_transcript(p.prompt, p.solution("concise"), tok)
  assert tok.decode([i for i, m in zip(ids, mask) if not m]) == "=;"  # not arithmetic
  assert styles.response_style(p.solution("tool")) == "tool"
  # The base recipe draws no tool targets (its shipped checkpoint stays reproducible).
  assert warmstart.RECIPE.p_tool == 0.0 and not warmstart.RECIPE.calculator
  made = json.load(open(os.path.join(os.path.dirname(task.__file__), "assets",
                                     "calculator_policy", "warmstart.json")))
  made.pop("final_loss")
  assert made == {k: getattr(warmstart.CALCULATOR_RECIPE, k) for k in made}


def test_demo_tools_arguments():
  assert _config("seed=3").seed == 3
  with pytest.raises(ValueError, match="unknown arguments"):
    _config("full")
