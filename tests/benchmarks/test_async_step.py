"""benchmarks/async_step.py run for real on the tiny test policy: both modes train with the
sandbox reward (every canonical solution passes), s=1 consumes groups one update old, and the
timeline model is fed by the measured s=0 components."""

from __future__ import annotations

import json

import pytest

BENCH = "async_step"  # the `bench` fixture (tests/benchmarks/conftest.py)


def test_async_step_benchmark_runs_both_modes(bench, base_policy, tmp_path):
  out = str(tmp_path / "res.json")
  res = bench.main(["--policy", base_policy, "--rounds", "1", "--steps", "4", "--skip", "1",
                    "--prompts", "2", "--group", "2", "--tokens", "8", "--pod", "4",
                    "--json", out])
  assert json.load(open(out))["ratio"] == pytest.approx(res["ratio"])
  for mode in ("s=0", "s=1"):
    m = res["modes"][mode]
    assert len(m["step_times"]) == 2 and all(t > 0 for t in m["step_times"])
    assert m["rollout_s"] > 0 and m["update_s"] > 0
  assert res["modes"]["s=0"]["reward_s"] > 0  # the sandbox's tail after the rollout
  assert "reward_wait_s" in res["modes"]["s=1"]
  assert set(res["model"]) == {"one_set", "split 1+3", "split 2+2", "split 3+1"}
  one = res["model"]["one_set"]
  assert one["s=1"] > one["s=0"] > 0  # the scoring tail hidden at s = 1
