"""The trainer as a multi-process JAX program: 2 processes x 4 CPU devices on localhost (gloo
collectives) against 1 process x 8 devices, scenario by scenario (tests/multihost_worker.py):
a run stopped after 2 steps and resumed to 3 with its final evaluation, DAPO dynamic sampling
with refill, PPO, the TAG pipeline (probes, election, training). Rewards and reward profiles
must be equal exactly, losses to 1e-5 relative, and every process must see the same values.
A reward that fails on one process only must stop both within a bounded time.

Traffic stays on 127.0.0.1; every subprocess has a timeout.
"""

import json
import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "launch"))
import local_multiprocess  # noqa: E402  (launch/local_multiprocess.py)
SCENARIOS = ("train_resume", "dynamic", "ppo", "demo_smoke")
TIMEOUT_S = 900


def _launch(out, base_policy, n, devices, scenarios, timeout=TIMEOUT_S):
  """Runs `n` worker processes with `devices` CPU devices each; returns their (rc, output)."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, HERE,
                                                     os.environ.get("PYTHONPATH", "")]))
  command = lambda i, port: [sys.executable, os.path.join(HERE, "multihost_worker.py"), out,
                             base_policy, str(n), str(i), str(port), ",".join(scenarios)]
  rcs = local_multiprocess.launch(n, devices, command, out, timeout, env)
  logs = [open(os.path.join(out, f"process-{i}.log")).read() for i in range(n)]
  return rcs, logs


@pytest.fixture(scope="module")
def runs(base_policy, tmp_path_factory):
  """{scenario: {"multi": [result of process 0, 1], "single": result}}."""
  root = tmp_path_factory.mktemp("multihost")
  results = {}
  for name, n, devices in (("multi", 2, 4), ("single", 1, 8)):
    out = str(root / name)
    os.makedirs(out)
    t0 = time.monotonic()
    rcs, logs = _launch(out, base_policy, n, devices, SCENARIOS)
    assert rcs == [0] * n, "\n".join(log[-6000:] for log in logs)
    results[name] = {"seconds": time.monotonic() - t0}
    for sc in SCENARIOS:
      per = [json.load(open(os.path.join(out, sc, f"result-{i}.json"))) for i in range(n)]
      results[name][sc] = per
  print(f"multi-process timing: 2 x 4 {results['multi']['seconds']:.0f} s, "
        f"1 x 8 {results['single']['seconds']:.0f} s")
  return results


def _same_history(a, b, what):
  """Rewards, profiles and what is decided from them exactly; losses to 1e-5 relative."""
  assert [h["step"] for h in a] == [h["step"] for h in b], what
  for x, y in zip(a, b):
    assert set(x) == set(y), (what, sorted(set(x) ^ set(y)))
    for k in x:
      if k.startswith(("time/", "reward_runner/seconds")):
        continue
      if k.startswith(("reward/", "profile/", "dynamic/", "batch/", "response/", "weights/",
                       "frac_zero_std/", "alarm/", "reward_runner/")):
        assert x[k] == y[k] or (x[k] != x[k] and y[k] != y[k]), (what, x["step"], k, x[k], y[k])
      else:
        np.testing.assert_allclose(x[k], y[k], rtol=1e-5, atol=1e-7,
                                   err_msg=f"{what} step {x['step']} {k}")


def _strip(result):
  """A worker's result without wall-clock timings (NaN as a string, so equal results compare
  equal)."""
  if isinstance(result, float) and result != result:
    return "nan"
  if isinstance(result, dict):
    return {k: _strip(v) for k, v in result.items()
            if not k.startswith("time/") and k not in ("reward_runner/seconds", "seconds")}
  if isinstance(result, list):
    return [_strip(v) for v in result]
  return result


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_two_processes_equal_one(runs, scenario):
  multi, single = runs["multi"][scenario], runs["single"][scenario][0]
  assert multi[0]["devices"] == multi[1]["devices"] == single["devices"] == 8
  # Every process holds the same results (one decision for all) ...
  assert _strip(multi[0]) == _strip(multi[1])
  # ... and 2 x 4 equals 1 x 8: rewards, profiles and decisions exactly, losses to 1e-5.
  if "history" in single:
    _same_history(multi[0]["history"], single["history"], scenario)
    rewards = [h[k] for h in single["history"] for k in h if k.startswith("reward/arith")]
    assert len(set(rewards)) > 3, rewards  # the rewards vary: the comparison means something
  if "eval" in single:
    for k, v in single["eval"].items():
      np.testing.assert_allclose(multi[0]["eval"][k], v, rtol=1e-6, err_msg=k)
  if "report" in single:
    a, b = _strip(multi[0]["report"]), _strip(single["report"])
    for task in ("negative",):
      for method in ("base", "additive", "tag"):
        for k, v in b[task][method].items():
          if isinstance(v, float):
            np.testing.assert_allclose(a[task][method][k], v, rtol=1e-6, err_msg=(method, k))
          else:
            assert a[task][method][k] == v, (method, k)
    assert a["_targets"] == b["_targets"]


def test_train_resume_writes_once_and_resumes(runs):
  """Process 0 alone writes metrics.jsonl (process 1 reads none); the resumed run has steps
  0-2, equal to the one-process run's."""
  multi = runs["multi"]["train_resume"]
  assert [h["step"] for h in multi[0]["history"]] == [0, 1, 2]
  assert multi[1]["history"] == multi[0]["history"]  # the same file, written once


def test_a_reward_failing_on_one_process_stops_both(base_policy, tmp_path):
  t0 = time.monotonic()
  rcs, logs = _launch(str(tmp_path), base_policy, 2, 4, ["fail_one"], timeout=300)
  elapsed = time.monotonic() - t0
  assert rcs[0] != 0 and rcs[1] != 0, (rcs, [log[-3000:] for log in logs])
  assert "cannot run on process 1" in logs[1], logs[1][-3000:]
  assert elapsed < 240, elapsed


def test_streamed_rewards_are_scored_where_rows_are_owned(base_policy, tmp_path):
  """Continuous engine, 2 processes x 4 devices: rows scored as they finish are scored once,
  by the process that owns them, exactly the calls of scoring after the rollout; the gathered
  rewards and runner metrics are the same on both processes and in both modes."""
  rcs, logs = _launch(str(tmp_path), base_policy, 2, 4, ["stream"], timeout=600)
  assert rcs == [0, 0], "\n".join(log[-4000:] for log in logs)
  res = [json.load(open(os.path.join(str(tmp_path), "stream", f"result-{i}.json")))
         for i in range(2)]
  owned = np.array([r["owned"] for r in res])
  assert (owned.sum(0) == 1).all() and owned[0].sum() == owned[1].sum() == 8
  for r in res:  # each process evaluated exactly its own rows, once each, in both modes
    assert r["stream_calls"] == r["after_calls"] == r["owned_calls"]
    assert len(r["owned_calls"]) == 8
  for r in res:
    np.testing.assert_array_equal(np.array(r["r_stream"]), np.array(res[0]["r_after"]))
    assert r["m_stream"] == r["m_after"] == res[0]["m_after"]
