"""End-to-end trainer tests: resume equals an uninterrupted run, SIGKILL recovery, start-up errors.

They run the real pipeline (sampler, reward runner, aggregator, advantages, jitted update,
orbax) on the demo's arithmetic task with a tiny base policy made by the warm-start script.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from mr_rl import metrics as metrics_lib
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.testing.runs import arith_config as _config
from mr_rl.testing.runs import assert_same_metrics as _assert_same_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_resume_reproduces_uninterrupted_run(base_policy, tmp_path):
  s3 = settings_lib.from_config(_config(base_policy, 3))
  s6 = settings_lib.from_config(_config(base_policy, 6))
  comp = train_lib.build(s6)
  resumed, straight = str(tmp_path / "resumed"), str(tmp_path / "straight")
  train_lib.train(s3, resumed, comp=comp, log=None)
  assert sorted(os.listdir(os.path.join(resumed, "checkpoints"))) == ["3"]
  res = train_lib.train(s6, resumed, comp=comp, log=None)
  assert [h["step"] for h in res.history] == [3, 4, 5]  # only the new steps ran
  train_lib.train(s6, straight, comp=comp, log=None)
  a = metrics_lib.read_jsonl(os.path.join(resumed, "metrics.jsonl"))
  b = metrics_lib.read_jsonl(os.path.join(straight, "metrics.jsonl"))
  assert len(a) == 6
  _assert_same_metrics(a, b)
  # The metrics carry what the issue lists.
  keys = set(a[-1])
  for k in ("loss/policy", "reward/arith_acc/mean", "reward/scalar/mean", "weights/arith_acc",
            "frac_zero_std/scalar", "frac_zero_std/arith_acc", "response/length_mean",
            "kl_ref/k3", "policy/entropy", "time/rollout", "time/reward", "time/update",
            "alarm/shortcut"):
    assert k in keys, k
  assert any(k.startswith("profile/arith_acc=") for k in keys)
  # AMRP's state went through the checkpoint: weights at the resumed step match.
  assert a[3]["weights/arith_acc"] == b[3]["weights/arith_acc"]


_CFG_FILE = textwrap.dedent("""
    from mr_rl.testing.runs import arith_config as _config

    def get_config(arg=None):
      c = _config({base!r}, 6)
      c.checkpoint_every = 1
      return c
""")


def test_sigkill_mid_run_resumes_without_loss(base_policy, tmp_path):
  cfg = tmp_path / "cfg.py"
  cfg.write_text(_CFG_FILE.format(base=base_policy))
  wd = tmp_path / "wd"
  cmd = [sys.executable, "-m", "mr_rl.main", f"--config={cfg}", f"--workdir={wd}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  ckpt_dir = wd / "checkpoints"
  deadline = time.time() + 600
  while time.time() < deadline and proc.poll() is None:
    done = [d for d in os.listdir(ckpt_dir) if d.isdigit()] if ckpt_dir.exists() else []
    if any(int(d) >= 2 for d in done):
      break
    time.sleep(0.2)
  assert proc.poll() is None, "the run finished before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_lines = metrics_lib.read_jsonl(str(wd / "metrics.jsonl"))
  assert 2 <= len(killed_lines) < 6
  subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
  resumed = metrics_lib.read_jsonl(str(wd / "metrics.jsonl"))
  # Reference: the same 6 steps uninterrupted, in this process.
  s = settings_lib.from_config(_config(base_policy, 6))
  ref_dir = str(tmp_path / "ref")
  s = dataclasses.replace(s, checkpoint_every=0)
  train_lib.train(s, ref_dir, log=None)
  _assert_same_metrics(resumed, metrics_lib.read_jsonl(os.path.join(ref_dir, "metrics.jsonl")),
                       rtol=1e-5)
  with open(wd / "eval.json") as f:
    assert "eval/arith_acc" in json.load(f)


@pytest.mark.parametrize("field,value,needle", [
    ("aggregator.name", "bogus", "aggregator.name='bogus' is not valid"),
    ("advantage.name", "bogus", "advantage.name='bogus' is not valid"),
    ("rewards.channels", "arith_acc,bogus", "rewards.channels='bogus' is not valid"),
    ("pipeline", "bogus", "pipeline='bogus' is not valid"),
])
def test_unknown_names_fail_at_start_up(base_policy, field, value, needle):
  c = _config(base_policy, 1)
  section, _, name = field.rpartition(".")
  (c[section] if section else c)[name] = value
  with pytest.raises(ValueError) as e:
    settings_lib.from_config(c)
  assert needle in str(e.value) and "choose one of" in str(e.value)


def test_unknown_aggregator_hyperparameter_and_model_preset(base_policy):
  c = _config(base_policy, 1)
  c.aggregator.hp.bogus = 1.0
  with pytest.raises(ValueError, match="bogus"):
    settings_lib.from_config(c)
  c = _config(base_policy, 1)
  c.model.path = ""
  c.model.preset = "not_a_model"
  with pytest.raises(ValueError, match="model.preset='not_a_model' is not valid"):
    settings_lib.from_config(c)


def test_cli_rejects_unknown_config_field(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "mr_rl.main", "--config=configs/demo.py:smoke",
       f"--workdir={tmp_path}", "--config.no_such_field=1"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  assert "no_such_field" in out.stderr


def test_ppo_trains_a_critic_through_the_trainer(base_policy, tmp_path):
  c = _config(base_policy, 2, aggregator="amrp")
  c.advantage.name = "ppo"
  c.advantage.gamma = 1.0
  c.advantage.lam = 0.95
  c.checkpoint_every = 0
  res = train_lib.train(settings_lib.from_config(c), str(tmp_path), log=None)
  last = res.history[-1]
  assert np.isfinite(last["loss/policy"]) and np.isfinite(last["update/vf_loss"])
  assert "update/value_grad_norm" in last and last["update/value_grad_norm"] > 0
  with pytest.raises(ValueError, match="PPO takes gamma and lam"):
    c.advantage.bogus = 1.0
    settings_lib.from_config(c)


def test_own_reward_by_import_path_through_the_trainer(base_policy, tmp_path, monkeypatch):
  """config.rewards.channels takes 'module:function': validated at start-up,
  named after the function, parameters from rewards.params.<name>, trained with."""
  (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
      def concise(response, example, num_tokens, max_tokens=10):
        return float(num_tokens <= max_tokens)

      def wrong(response):
        return 1.0
  """))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH",
                                                                                  "")]))
  c = _config(base_policy, 2, aggregator="additive")
  c.checkpoint_every = 0
  c.rewards.channels = "arith_acc,my_rewards:concise"
  c.rewards.params = {"concise": {"max_tokens": 12}}
  s = settings_lib.from_config(c)
  assert s.rewards.channels == ("arith_acc", "concise")
  assert s.rewards.specs == ("arith_acc", "my_rewards:concise")
  res = train_lib.train(s, None, log=None)
  for h in res.history:
    assert 0.0 <= h["reward/concise/mean"] <= 1.0 and h["reward_runner/concise/errors"] == 0
  # The reward really is the function's with the configured parameter.
  assert train_lib.build_runner(s).channels[1].fn("x", {}, 12) == 1.0
  for channels, needle in (("arith_acc,my_rewards:wrong", "wrong"),
                           ("arith_acc,no_such_module_xyz:concise", "no_such_module_xyz")):
    bad = _config(base_policy, 1)
    bad.rewards.channels = channels
    with pytest.raises(ValueError, match=needle):
      settings_lib.from_config(bad)


def test_failure_guard_settings(base_policy):
  c = _config(base_policy, 1)
  s = settings_lib.from_config(c)
  runner = train_lib.build_runner(s)
  assert (s.rewards.max_failure_share, s.rewards.failure_patience) == (0.5, 3)
  assert (runner.max_failure_share, runner.failure_patience) == (0.5, 3)
  for field, value, needle in (("max_failure_share", 1.5, r"max_failure_share must be in \[0, 1\]"),
                               ("failure_patience", 0, "failure_patience must be > 0")):
    bad = _config(base_policy, 1)
    bad.rewards[field] = value
    with pytest.raises(ValueError, match=needle):
      settings_lib.from_config(bad)
