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
  from mr_rl.demo import summary  # the multi-seed summary reads real reports (no rp_only: n/a)
  targets = {t["target"]: t["mean"] for t in summary.check_targets([saved])}
  assert targets["negative: additive aux rate >= 0.8"][0] in (True, False)
  assert targets["negative: TAG accuracy >= 0.9x RP-only"] == (None, None)


def test_demo_config_rejects_unknown_argument():
  with pytest.raises(ValueError, match="unknown arguments"):
    _demo_config("smoke,fast")


def _report(seed, rp, add_acc, add_neg, tag, amrp, static):
  row = lambda acc, aux=0.5: {"accuracy": acc, "aux_rate": aux, "mean_length": 20.0}
  return {"negative": {"rp_only": row(rp), "additive": row(add_acc, add_neg), "tag": row(tag)},
          "acc_fmt_len": {"rp_only": row(rp), "additive": row(static), "amrp": row(amrp),
                          "tag": row(tag)},
          "_meta": {"seed": seed}}


def test_demo_summary_targets_per_seed_and_mean(tmp_path):
  from mr_rl.demo import summary
  reports = [_report(0, 0.4, 0.1, 0.9, 0.38, 0.20, 0.18),     # every target met
             _report(1, 0.4, 0.3, 0.7, 0.30, 0.15, 0.18)]     # none met
  for i, r in enumerate(reports):
    os.makedirs(tmp_path / f"s{i}")
    json.dump(r, open(tmp_path / f"s{i}" / "report.json", "w"))
  md = summary.main([str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "s.md")])
  assert open(tmp_path / "s.md").read() == md
  res = {t["target"]: t for t in summary.check_targets(reports)}
  neg_rate = res["negative: additive aux rate >= 0.8"]
  assert [c[0] for c in neg_rate["per_seed"]] == [True, False]
  assert neg_rate["mean"] == (True, pytest.approx(0.8))
  ratio = res["negative: additive accuracy <= 0.5x RP-only"]
  assert ratio["per_seed"][0] == (True, pytest.approx(0.25))
  assert ratio["mean"] == (True, pytest.approx(0.5))           # 0.2 / 0.4
  tag = res["negative: TAG accuracy >= 0.9x RP-only"]
  assert [c[0] for c in tag["per_seed"]] == [True, False] and tag["mean"][0] is False  # 0.85x
  amrp = res["acc_fmt_len: AMRP accuracy - static (additive) > 0"]
  assert amrp["per_seed"][0] == (True, pytest.approx(0.02)) and amrp["mean"][0] is False
  assert res["brief: TAG accuracy >= 0.9x RP-only"]["mean"] == (None, None)  # no brief task
  assert "| additive | 0.200 +- 0.141 | 0.800 +- 0.141 | 20.000 +- 0.000 |" in md
  assert "n/a" in md and "NO (0.85)" in md


def test_demo_summary_rejects_missing_or_mismatched_reports(tmp_path):
  from mr_rl.demo import summary
  with pytest.raises(FileNotFoundError, match="no demo report"):
    summary.load_report(str(tmp_path))
  a, b = _report(0, 0.4, 0.1, 0.9, 0.38, 0.2, 0.18), {"brief": {}, "_meta": {"seed": 1}}
  json.dump(a, open(tmp_path / "a.json", "w"))
  json.dump(b, open(tmp_path / "b.json", "w"))
  with pytest.raises(ValueError, match="different tasks"):
    summary.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
