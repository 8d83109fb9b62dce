"""The embedded CPU demo (`configs/demo.py:smoke`) runs end to end through `mr_rl.main`'s
pipeline and writes the report, the drift table of TAG's election and the profile plots."""

import json
import os

import pytest

from mr_rl import pipelines
from mr_rl.demo import task

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo_config(arg):
  import importlib.util
  spec = importlib.util.spec_from_file_location("demo_cfg", os.path.join(REPO, "configs", "demo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


def test_shipped_base_policy_is_a_loadable_hf_checkpoint():
  cfg = _demo_config("smoke")
  from transformers import AutoConfig, AutoTokenizer
  hf = AutoConfig.from_pretrained(cfg.model.path)
  assert hf.model_type == "qwen3"
  tok = AutoTokenizer.from_pretrained(cfg.model.path)
  p = task.sample_problems(__import__("numpy").random.default_rng(0), 1)[0]
  ids = tok(p.prompt + p.solution(), add_special_tokens=False)["input_ids"]
  assert tok.decode(ids) == p.prompt + p.solution()


def test_demo_smoke_writes_report(tmp_path):
  cfg = _demo_config("smoke")
  wd = str(tmp_path)
  report = pipelines.run(cfg, wd)
  with open(os.path.join(wd, "report.json")) as f:
    saved = json.load(f)
  assert saved["negative"].keys() == {"base", "additive", "tag"}
  for method, row in saved["negative"].items():
    for key in ("accuracy", "aux_rate", "joint_rate", "mean_length"):
      assert 0.0 <= row[key] or key == "mean_length", (method, key)
    assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["aux_rate"] <= 1.0
    assert row["mean_length"] > 0
  assert saved["negative"]["tag"]["anchor"] in ("arith_acc", "arith_negative")
  assert report["negative"]["tag"] == saved["negative"]["tag"]
  md = open(os.path.join(wd, "report.md")).read()
  assert "| additive |" in md and "anchor" in md
  assert os.path.getsize(os.path.join(wd, "negative_profiles.png")) > 1000
  drift = json.load(open(os.path.join(wd, "negative", "tag", "drift.json")))
  assert [c["channel"] for c in drift["channels"]] == ["arith_acc", "arith_negative"]
  assert os.path.exists(os.path.join(wd, "negative", "additive", "metrics.jsonl"))


def test_demo_config_rejects_unknown_argument():
  with pytest.raises(ValueError, match="unknown arguments"):
    _demo_config("smoke,fast")
