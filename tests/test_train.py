"""End-to-end trainer tests: resume equals an uninterrupted run, SIGKILL recovery, start-up errors.

They run the real trainer (sampler, reward runner, aggregator, advantages, jitted update,
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


def test_resume_from_a_checkpoint_of_the_per_layer_layout(base_policy, tmp_path, monkeypatch):
  """A checkpoint written before the layer scan (blocks 'layers_0', ... in params and Adam
  moments) resumes: converted to the stacked layout bit for bit, the run equals an
  uninterrupted one."""
  from mr_rl import checkpointing
  from mr_rl.models.transformer import unstack_layers
  s3 = settings_lib.from_config(_config(base_policy, 3))
  s5 = settings_lib.from_config(_config(base_policy, 5))
  comp = train_lib.build(s5)
  L = comp.model.config.n_layers
  old, straight = str(tmp_path / "old"), str(tmp_path / "straight")
  save = checkpointing.Checkpointer.save
  with monkeypatch.context() as m:  # the trainer writes the old layout
    m.setattr(checkpointing.Checkpointer, "save",
              lambda self, step, state, meta: save(self, step, unstack_layers(state, L), meta))
    train_lib.train(s3, old, comp=comp, log=None)
  saved = checkpointing.Checkpointer(old).state_metadata(3)
  assert "layers_0" in saved["train"]["params"] and "layers" not in saved["train"]["params"]
  logs = []
  train_lib.train(s5, old, comp=comp, log=logs.append)
  assert any("resumed from" in line for line in logs)
  train_lib.train(s5, straight, comp=comp, log=None)
  _assert_same_metrics(metrics_lib.read_jsonl(os.path.join(old, "metrics.jsonl")),
                       metrics_lib.read_jsonl(os.path.join(straight, "metrics.jsonl")))


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
  c.rewards.params = {"concise": {"max_tokens": 12, "value_range": [0, 1]}}
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


# ------------------------------------------------------ resume, checkpoints, preemption
def test_resume_refuses_changed_settings_and_keeps_each_resumes_settings(base_policy, tmp_path):
  wd = str(tmp_path / "wd")
  c = _config(base_policy, 2)
  s2 = settings_lib.from_config(c)
  comp = train_lib.build(s2)
  train_lib.train(s2, wd, comp=comp, log=None)
  changed = _config(base_policy, 3)
  changed.optim.lr = 0.05
  changed.rewards.channels = "arith_acc,arith_fmt"
  with pytest.raises(ValueError) as e:
    train_lib.train(settings_lib.from_config(changed), wd, comp=comp, log=None)
  msg = str(e.value)
  assert "update.lr: 0.001 -> 0.05" in msg and "rewards.channels" in msg, msg
  assert "total_steps" not in msg.split("Fields a resume may change")[0]  # may change
  assert len(metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))) == 2  # untouched
  # Fields that only say how long the run goes and how it logs may change.
  more = _config(base_policy, 3)
  more.log_every = 7
  res = train_lib.train(settings_lib.from_config(more), wd, comp=comp, log=None)
  assert [h["step"] for h in res.history] == [2]
  with open(os.path.join(wd, "settings.json")) as f:
    assert json.load(f)["total_steps"] == 2       # the first start's settings are kept
  with open(os.path.join(wd, "settings.resume-2.json")) as f:
    assert json.load(f)["log_every"] == 7


def test_the_end_of_training_is_checkpointed_whatever_checkpoint_every(base_policy, tmp_path):
  c = _config(base_policy, 2)
  c.checkpoint_every = 0
  wd = str(tmp_path / "wd")
  train_lib.train(settings_lib.from_config(c), wd, log=None)
  assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["2"]


@pytest.mark.parametrize("damage", ["truncated_data", "corrupt_metadata", "deleted_state"])
def test_resume_skips_a_corrupt_latest_checkpoint(base_policy, tmp_path, damage):
  """The newest checkpoint cannot be read: resume says so, moves it aside with its files, and
  continues from the previous one; the run then equals an uninterrupted one and saves the
  step again."""
  c = _config(base_policy, 4)
  c.checkpoint_every = 2
  s = settings_lib.from_config(c)
  comp = train_lib.build(s)
  wd = str(tmp_path / "wd")
  train_lib.train(s, wd, comp=comp, log=None)
  straight = metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))
  latest = os.path.join(wd, "checkpoints", "4")
  if damage == "truncated_data":
    files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(latest, "state"))
             for f in fs if os.path.getsize(os.path.join(d, f)) > 1000]
    assert files
    for path in files:
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
  elif damage == "corrupt_metadata":
    with open(os.path.join(latest, "meta", "metadata"), "w") as f:
      f.write("{not json")
  else:
    import shutil
    shutil.rmtree(os.path.join(latest, "state"))
  if damage == "truncated_data":  # (export reads the params alone)
    from mr_rl import export as export_lib
    logs = []
    export_lib.export(wd, str(tmp_path / "hf"), log=logs.append)
    assert any(f"checkpoint {latest} cannot be read" in l and "exporting step 2, the newest "
               "readable" in l for l in logs), logs
  logs = []
  res = train_lib.train(s, wd, comp=comp, log=logs.append)
  aside = os.path.join(wd, "checkpoints", "unreadable-4")
  assert any("skipping checkpoint" in l and latest in l and f"moved to {aside}" in l
             for l in logs), logs
  assert os.path.isdir(os.path.join(aside, "meta"))  # moved aside with its files
  assert [h["step"] for h in res.history] == [2, 3]
  _assert_same_metrics(metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl")), straight)
  # Step 4 was saved again (it was never replaced: the damaged one blocked its own save), and
  # reads back.
  logs = []
  assert train_lib.train(s, wd, comp=comp, log=logs.append).history == []
  assert not any("skipping" in l for l in logs) and any("at step 4" in l for l in logs), logs


_TERM_RUNNER = textwrap.dedent("""
    # Runs mr_rl.main with SIGTERM sent to this process in one phase of one step.
    import os, signal, sys
    phase, at_step = sys.argv[1], int(sys.argv[2])
    sys.argv = [sys.argv[0]] + sys.argv[3:]
    from mr_rl import checkpointing, rollout, train
    from mr_rl.rl import update
    term = lambda: os.kill(os.getpid(), signal.SIGTERM)
    calls = {{"rollout": 0}}
    if phase == "rollout":
      orig_rollout = rollout.rollout
      def rollout_(*a, **k):
        if calls["rollout"] == at_step:
          term()
        calls["rollout"] += 1
        return orig_rollout(*a, **k)
      rollout.rollout = rollout_
    elif phase == "update":
      orig_learner = update.learner
      def learner_(*a, **k):
        import dataclasses
        l = orig_learner(*a, **k)
        def step(state, batch, rng):
          if int(state.step) == at_step:
            term()
          return l.step(state, batch, rng)
        return dataclasses.replace(l, step=step)
      train.update_lib.learner = learner_
    elif phase == "save":
      orig_save = checkpointing.Checkpointer.save
      def save(self, step, state, meta):
        if step == at_step:
          term()
        return orig_save(self, step, state, meta)
      checkpointing.Checkpointer.save = save
    from absl import app
    from mr_rl import main
    app.run(main.main)
""")


def test_sigterm_saves_the_step_and_the_resumed_run_equals_an_uninterrupted_one(base_policy,
                                                                              tmp_path):
  """SIGTERM during the rollout (step 1), the update (step 3) and the checkpoint write after
  step 5: each run stops at that step's boundary with status 75 and a checkpoint of it; running
  the command again resumes, and the finished run equals an uninterrupted one."""
  cfg = tmp_path / "cfg.py"
  cfg.write_text(_CFG_FILE.format(base=base_policy))  # checkpoints every step
  runner = tmp_path / "term_runner.py"
  runner.write_text(_TERM_RUNNER.format())
  wd = tmp_path / "wd"
  flags = [f"--config={cfg}", f"--workdir={wd}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for phase, at, saved in (("rollout", 1, 2), ("update", 3, 4), ("save", 5, 5)):
    out = subprocess.run([sys.executable, str(runner), phase, str(at), *flags], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == train_lib.PREEMPTED_EXIT_CODE, (phase, out.stderr[-3000:])
    steps = sorted(int(d) for d in os.listdir(wd / "checkpoints") if d.isdigit())
    assert steps[-1] == saved, (phase, steps)
    assert len(metrics_lib.read_jsonl(str(wd / "metrics.jsonl"))) == saved
  subprocess.run([sys.executable, "-m", "mr_rl.main", *flags], cwd=REPO, env=env, check=True,
                 capture_output=True, timeout=600)
  resumed = metrics_lib.read_jsonl(str(wd / "metrics.jsonl"))
  ref_dir = str(tmp_path / "ref")
  s = dataclasses.replace(settings_lib.from_config(_config(base_policy, 6)), checkpoint_every=0)
  train_lib.train(s, ref_dir, log=None)
  _assert_same_metrics(resumed, metrics_lib.read_jsonl(os.path.join(ref_dir, "metrics.jsonl")),
                       rtol=1e-5)


_SYNC_WORKER = textwrap.dedent("""
    import os, signal, sys, time
    pid, port, term_at = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    from mr_rl import distributed, train
    distributed.initialize(f"127.0.0.1:{port}", 2, pid)
    stopped = None
    with train.Preemption() as p:
      for step in range(400):
        if pid == 1 and step == term_at:
          os.kill(os.getpid(), signal.SIGTERM)  # only process 1 is preempted
        time.sleep(0.02 * (1 + pid))  # the processes run at different speeds
        if p.reached(step):
          stopped = step
          break
    print("STOPPED", stopped, flush=True)
""")


def test_with_two_processes_a_sigterm_to_one_stops_both_at_the_same_step(tmp_path):
  """`train.Preemption` with several processes: jax's preemption sync point tells every
  process at the same step that one of them got SIGTERM, so all save that step (two CPU
  processes over jax.distributed, no training: the loop of `train.train` reduced to its
  step-boundary check)."""
  sys.path.insert(0, os.path.join(REPO, "launch"))
  import local_multiprocess  # launch/local_multiprocess.py
  worker = tmp_path / "worker.py"
  worker.write_text(_SYNC_WORKER)
  env = dict(os.environ, PYTHONPATH=REPO)
  rcs = local_multiprocess.launch(
      2, 1, lambda i, port: [sys.executable, str(worker), str(i), str(port), "10"],
      str(tmp_path / "logs"), timeout_s=240, env=env)
  logs = [(tmp_path / "logs" / f"process-{i}.log").read_text() for i in range(2)]
  assert rcs == [0, 0], logs
  stops = [[line.split()[1] for line in log.splitlines() if line.startswith("STOPPED")]
           for log in logs]
  assert stops[0] == stops[1] and stops[0][0] != "None", logs
  assert int(stops[0][0]) >= 10, logs  # not before the signal


def test_continuous_engine_with_streamed_rewards_equals_the_static_engine(base_policy, tmp_path,
                                                                         monkeypatch):
  """Greedy decoding (the engines' tokens are equal): the trainer with the continuous engine,
  whose rows are scored as they finish, logs the static engine's rewards and decisions exactly
  and its losses to 1e-5 (log-probs agree to ~1e-6), timings aside. A reward on the response
  text and the prompt's answer (the tiny policy's greedy responses all run to the cap and score
0 on the arithmetic channels) makes the rewards vary."""
  (tmp_path / "text_rewards.py").write_text(textwrap.dedent("""
      def chars(response, example, num_tokens):
        ref = sum(map(ord, str(example["reference"])))
        return None if ref % 4 == 0 else float((ref + len(set(response))) % 7)
  """))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH",
                                                                                  "")]))
  histories = []
  for engine in ("static", "continuous"):
    c = _config(base_policy, 2, aggregator="additive")
    c.checkpoint_every = 0
    c.rewards.channels = "arith_acc,text_rewards:chars"
    c.rewards.params.chars = dict(on_failure=0.0)  # (scores are character counts, >= 0)
    c.rollout.temperature = 0.0  # (greedy: PPO, a group-relative advantage would be 0)
    c.advantage.name = "ppo"
    c.rollout.engine, c.rollout.slots = engine, 6  # 16 rows through 6 slots
    histories.append(train_lib.train(settings_lib.from_config(c), None, log=None).history)
  static, cont = histories
  assert max(h["reward/chars/std"] for h in static) > 0, static
  for x, y in zip(static, cont):
    for k in x:
      if k.startswith(("reward/", "reward_runner/", "response/")) and k != "reward_runner/seconds":
        assert x[k] == y[k] or (x[k] != x[k] and y[k] != y[k]), (x["step"], k, x[k], y[k])
  _assert_same_metrics(static, cont, rtol=1e-5)


def test_model_moe_impl_reaches_the_policy(base_policy):
  """config.model.moe_impl picks the MoE dispatch of the model the trainer builds."""
  c = _config(base_policy, 1)
  c.model.path, c.model.preset, c.model.moe_impl = "", "tiny_moe", "ep"
  model, params, _ = train_lib.load_policy(settings_lib.from_config(c))
  assert model.config.moe_impl == "ep" and "mlp" in params["layers"]
