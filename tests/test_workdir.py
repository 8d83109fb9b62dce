"""One run per workdir, the same workdir on every process, and a bounded exit on SIGTERM
(`mr_rl.workdir`, `mr_rl.preemption`)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mr_rl import metrics as metrics_lib
from mr_rl import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, PYTHONUNBUFFERED="1")

_CFG_FILE = textwrap.dedent("""
    from mr_rl.testing.runs import arith_config as _config

    def get_config(arg=None):
      c = _config({base!r}, 6)
      c.checkpoint_every = 1
      return c
""")

_HOLDER = textwrap.dedent("""
    import sys, time
    from mr_rl import workdir
    with workdir.claim(sys.argv[1], log=None):
      print("held", flush=True)
      time.sleep(600)
""")


def _hold(tmp_path, wd):
  """A process holding `wd`'s claim, once it says so."""
  script = tmp_path / "holder.py"
  script.write_text(_HOLDER)
  proc = subprocess.Popen([sys.executable, str(script), str(wd)], env=ENV,
                          stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_second_run_on_a_busy_workdir_stops_at_once_and_the_first_run_is_whole(
    base_policy, tmp_path):
  """Two `mr_rl.main` runs on one workdir: the second stops before writing anything, naming
  the first run's pid; the first (stopped by SIGTERM afterwards) has each step logged and
  checkpointed once."""
  cfg = tmp_path / "cfg.py"
  cfg.write_text(_CFG_FILE.format(base=base_policy))
  wd = tmp_path / "wd"
  cmd = [sys.executable, "-m", "mr_rl.main", f"--config={cfg}", f"--workdir={wd}"]
  first = subprocess.Popen(cmd + ["--config.total_steps=10000"], cwd=REPO, env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 600
  while time.time() < deadline and first.poll() is None and not (wd / "metrics.jsonl").exists():
    time.sleep(0.2)
  assert first.poll() is None, first.stderr.read()[-3000:]
  second = subprocess.run(cmd + ["--config.seed=7"], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=300)
  assert second.returncode != 0
  assert second.stderr.startswith("FATAL WorkdirBusyError: ") and \
      f"pid {first.pid} " in second.stderr, second.stderr[-3000:]
  first.send_signal(signal.SIGTERM)
  assert first.wait(timeout=600) == 75, first.stderr.read()[-3000:]
  err = first.stderr.read()  # third-party INFO logging (orbax, jax) is off by default
  assert not [line for line in err.splitlines() if re.match(r"I\d{4} ", line)], err[-3000:]
  steps = [r["step"] for r in metrics_lib.read_jsonl(str(wd / "metrics.jsonl"))]
  saved = sorted(int(d) for d in os.listdir(wd / "checkpoints") if d.isdigit())
  assert steps == list(range(len(steps))) and saved[-1] == len(steps), (steps, saved)
  assert json.loads((wd / "settings.json").read_text())["seed"] == 0  # the first run's


def test_the_lock_goes_with_its_holder_and_break_lock_takes_it_over(tmp_path):
  wd = tmp_path / "wd"
  holder = _hold(tmp_path, wd)
  try:
    with pytest.raises(workdir_lib.WorkdirBusyError, match=f"pid {holder.pid} on host"):
      with workdir_lib.claim(str(wd), log=None):
        pass
    with pytest.raises(workdir_lib.WorkdirBusyError, match="lies inside"):  # inside a held one
      with workdir_lib.claim(str(wd / "math" / "tag"), log=None):
        pass
    with workdir_lib.claim(str(wd), break_lock=True, log=None):  # the user's call
      with workdir_lib.claim(str(wd / "probe"), log=None):  # nested claims are free
        pass
  finally:
    holder.kill()
    holder.wait()
  holder = _hold(tmp_path, wd)  # a killed holder's lock is gone with it
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  with workdir_lib.claim(str(wd), log=None):
    assert (wd / workdir_lib.LOCK_NAME).exists()


def test_processes_given_different_workdirs_stop_within_seconds_naming_the_problem(
    base_policy, tmp_path):
  """The first mistake on a pod: each host given a local path. Both processes of
  `mr_rl.main --multihost` stop at start-up (no checkpointer wait), naming the processes that do
  not see process 0's workdir."""
  sys.path.insert(0, os.path.join(REPO, "launch"))
  import local_multiprocess  # launch/local_multiprocess.py
  cfg = tmp_path / "cfg.py"
  cfg.write_text(_CFG_FILE.format(base=base_policy))
  command = lambda i, port: [
      sys.executable, "-m", "mr_rl.main", f"--config={cfg}", f"--workdir={tmp_path}/wd{i}",
      "--multihost", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
      f"--process_id={i}"]
  t0 = time.monotonic()
  rcs = local_multiprocess.launch(2, 1, command, str(tmp_path / "logs"), timeout_s=300,
                                  env=ENV)
  took = time.monotonic() - t0
  logs = [(tmp_path / "logs" / f"process-{i}.log").read_text() for i in range(2)]
  assert all(rc not in (0, -9) for rc in rcs), (rcs, logs)
  for log in logs:
    assert "WorkdirNotSharedError: processes [1] of 2 do not see workdir" in log, log[-3000:]
  assert not (tmp_path / "wd0" / "checkpoints").exists()
  print(f"both stopped after {took:.1f} s (start-up included)")


_SLEEPER = textwrap.dedent("""
    import sys, time
    from mr_rl import preemption
    with preemption.Preemption(term_timeout_s=float(sys.argv[1]),
                               stall_timeout_s=float(sys.argv[2])) as p:
      p.saved(4)
      print("ready", flush=True)
      time.sleep(120)  # a step that never ends (a peer that never answers)
    print("left the step", flush=True)
""")


@pytest.mark.parametrize("why", ["sigterm", "stall"])
def test_a_run_stuck_inside_a_step_exits_in_bounded_time(tmp_path, why):
  """A SIGTERM the run cannot act on (its step never ends) ends the process after
  `term_timeout_s` with the preemption status, naming the last checkpoint; with
  `stall_timeout_s`, a step that never ends does so unasked."""
  script = tmp_path / "sleeper.py"
  script.write_text(_SLEEPER)
  term, stall = ("2", "0") if why == "sigterm" else ("0", "3")
  proc = subprocess.Popen([sys.executable, str(script), term, stall], env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "ready"
  t0 = time.monotonic()
  if why == "sigterm":
    proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=60)
  took = time.monotonic() - t0
  assert proc.returncode == (75 if why == "sigterm" else 1), (out, err)
  assert "left the step" not in out and "up to step 4" in err, err
  assert took > 1.5, took  # (the timeout was waited for; communicate bounds it above)


def test_a_file_as_workdir_is_one_fatal_line_and_a_refused_run_leaves_no_workdir(
    base_policy, tmp_path):
  """A file given as --workdir was a 25-line FileExistsError; a run refused at start-up (here
  by its settings, after the claim) left the workdir it made, holding a run.lock."""
  cfg = tmp_path / "cfg.py"
  cfg.write_text(_CFG_FILE.format(base=base_policy))
  main = lambda wd, *a: subprocess.run(
      [sys.executable, "-m", "mr_rl.main", f"--config={cfg}", f"--workdir={wd}", *a], cwd=REPO,
      env=ENV, capture_output=True, text=True, timeout=300)
  afile = tmp_path / "notes.txt"
  afile.write_text("mine")
  for wd in (afile, afile / "run"):
    p = main(wd)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"FATAL WorkdirNotADirectoryError: --workdir {wd}: {afile} is a file, not a directory; "
        "give a directory (a new one is made)"], p.stderr[-3000:]
  assert afile.read_text() == "mine"
  p = main(tmp_path / "new" / "run", "--config.rollout.temperature=0")
  assert p.returncode == 1 and p.stderr.strip().startswith(
      "FATAL ConfigError: config.rollout.temperature=0"), p.stderr[-3000:]
  assert not (tmp_path / "new").exists()
  (tmp_path / "mine").mkdir()  # a directory the user made stays, and what the run wrote does
  p = main(tmp_path / "mine", "--config.rollout.temperature=0")
  assert p.returncode == 1 and (tmp_path / "mine").is_dir()
