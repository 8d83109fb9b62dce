"""A run that cannot be corrupted or lost: a diverged update is never saved, resume skips a
checkpoint whose state is not finite (docs/runs.md)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mr_rl import checkpointing
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.rl import update as update_lib
from mr_rl.testing.runs import arith_config


def _diverge_at(monkeypatch, call: int):
  """The learner's `call`-th update (1-based) returns a state whose floats are all NaN: what a
  diverged step (an inf learning rate, an overflowing gradient) leaves, while the loss of that
  step, computed from the parameters before it, is still finite."""
  real, calls = update_lib.Learner.update, []

  def update(self, state, *args, **kwargs):
    state, metrics = real(self, state, *args, **kwargs)
    calls.append(1)
    if len(calls) == call:
      state = jax.tree.map(
          lambda x: x * jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    return state, metrics

  monkeypatch.setattr(update_lib.Learner, "update", update)


def test_a_diverged_update_is_not_saved_and_resume_skips_a_non_finite_checkpoint(
    base_policy, tmp_path, monkeypatch):
  c = arith_config(base_policy, 4)
  c.checkpoint_every = 1
  s = settings_lib.from_config(c)
  comp = train_lib.build(s)
  wd, ckpts = str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints")
  with monkeypatch.context() as m:
    _diverge_at(m, 3)
    with pytest.raises(checkpointing.NonFiniteStateError, match=r"after step 3 holds NaN"):
      train_lib.train(s, wd, comp=comp, log=None)
  # The last two finite checkpoints are kept; the NaN state evicted nothing.
  assert sorted(os.listdir(ckpts)) == ["1", "2"]

  # A checkpoint written without the check (an older mr_rl): the NaN state of step 3 is saved,
  # evicting 1, and the next step's loss stops the run.
  wd2 = str(tmp_path / "old")
  with monkeypatch.context() as m:
    _diverge_at(m, 3)
    m.setattr(checkpointing, "nonfinite_leaves", lambda tree: [])
    with pytest.raises(FloatingPointError, match="non-finite policy loss at step 3"):
      train_lib.train(s, wd2, comp=comp, log=None)
  assert sorted(os.listdir(os.path.join(wd2, "checkpoints"))) == ["2", "3"]
  # Resume skips it, naming it, and continues from step 2.
  logs = []
  res = train_lib.train(s, wd2, comp=comp, log=logs.append)
  assert any(l.startswith(f"skipping checkpoint {os.path.join(wd2, 'checkpoints', '3')}:")
             and "NaN or inf" in l for l in logs), logs
  assert any("resumed from" in l and "at step 2" in l for l in logs), logs
  assert [h["step"] for h in res.history] == [2, 3]
  assert all(np.isfinite(h["loss/policy"]) for h in res.history)


def test_a_run_of_the_demo_base_policy_resumes_and_exports_from_another_copy_of_mr_rl(
    tmp_path):
  """The demo's base policy lives inside the package: the run's settings record names it
  `<mr_rl>/demo/assets/base_policy`, so the workdir resumes (and exports) from another clone,
  whose absolute path differs (`mr_rl.package_paths`)."""
  import json
  import shutil
  import subprocess
  import sys
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  clone = tmp_path / "other_clone"
  for part in ("mr_rl", "configs"):
    shutil.copytree(os.path.join(repo, part), clone / part,
                    ignore=shutil.ignore_patterns("__pycache__"))
  wd = tmp_path / "wd"

  def main(root, steps):
    return subprocess.run(
        [sys.executable, "-m", "mr_rl.main", "--config=configs/demo.py:smoke", f"--workdir={wd}",
         "--config.pipeline=train", f"--config.total_steps={steps}",
         "--config.checkpoint_every=1", "--config.eval.num_prompts=4"],
        cwd=root, env=dict(os.environ, PYTHONPATH=str(root), JAX_PLATFORMS="cpu"),
        capture_output=True, text=True, timeout=600)

  first = main(repo, 1)
  assert first.returncode == 0, first.stderr[-3000:]
  record = json.loads((wd / "settings.json").read_text())
  assert record["model"]["path"] == "<mr_rl>/demo/assets/base_policy"
  second = main(clone, 2)  # the same run, from the other copy
  assert second.returncode == 0, second.stderr[-3000:]
  assert f"resumed from {wd}" in second.stdout
  out = subprocess.run([sys.executable, "-m", "mr_rl.export", f"--workdir={wd}",
                        f"--out={tmp_path / 'hf'}"], cwd=clone, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(clone), JAX_PLATFORMS="cpu"),
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  # a record written by an older mr_rl (the absolute path of its clone) compares equal too
  old = dict(record, model=dict(record["model"],
                                path="/elsewhere/clone/mr_rl/demo/assets/base_policy"))
  checkpointing.check_resume(old, record, str(wd))
  with pytest.raises(ValueError, match=r"model.path: '/elsewhere/base' -> '<mr_rl>/demo/"):
    checkpointing.check_resume(dict(record, model=dict(record["model"], path="/elsewhere/base")),
                               record, str(wd))
  older = {k: v for k, v in record.items() if k != "seed"}  # a field older versions lacked
  with pytest.raises(ValueError, match=r"did not record \(now\): seed=0; .* version that wrote"):
    checkpointing.check_resume(older, record, str(wd))
