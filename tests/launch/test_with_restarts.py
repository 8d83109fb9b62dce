"""launch/with_restarts.sh (issue 24, preemption): a run that exits with status 75
(`mr_rl.train.PREEMPTED_EXIT_CODE`, checkpointed at a step boundary after SIGTERM) is run again,
at most `MR_RL_MAX_RESTARTS` times; any other status ends it; a SIGTERM sent to the script goes
to the run and is not followed by a restart. `launch/run_tpu.sh` and `launch/gpu_node.sh` run
`python -m mr_rl.main` through it. The run here is a small script that counts its starts in a
file; that the same command resumes a preempted training run is
`tests/test_train.py::test_sigterm_saves_the_step_and_the_resumed_run_equals_an_uninterrupted_one`.
"""

import os
import signal
import subprocess
import sys
import time

from mr_rl import train as train_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "launch", "with_restarts.sh")
# Exits with the status listed for its n-th start (the last one for later starts).
_RUN = """
import os, sys, time
count, statuses = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
n = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(n + 1))
if statuses[min(n, len(statuses) - 1)] < 0:  # wait to be signalled
  time.sleep(60)
sys.exit(statuses[min(n, len(statuses) - 1)])
"""


def _launch(tmp_path, statuses, **env):
  run = tmp_path / "run.py"
  run.write_text(_RUN)
  count = tmp_path / "count"
  return count, subprocess.Popen(
      ["bash", SCRIPT, sys.executable, str(run), str(count), statuses],
      env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_launcher_restarts_on_the_trainers_preempted_status():
  assert f'"$status" -ne {train_lib.PREEMPTED_EXIT_CODE} ]' in open(SCRIPT).read()


def test_preempted_runs_restart_and_other_statuses_end_it(tmp_path):
  for sub, statuses, env, want_status, want_starts in (
      ("twice", "75,75,0", {}, 0, 3),            # preempted twice, then finished
      ("fails", "75,3", {}, 3, 2),               # a real failure is not retried
      ("capped", "75", {"MR_RL_MAX_RESTARTS": "2"}, 75, 3)):  # at most 2 restarts
    d = tmp_path / sub
    d.mkdir()
    count, proc = _launch(d, statuses, **env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == want_status, (sub, err)
    assert int(count.read_text()) == want_starts, (sub, err)
    assert err.count("preempted (status 75): running it again") == want_starts - 1, (sub, err)


def test_a_sigterm_to_the_launcher_stops_the_run_for_good(tmp_path):
  """The run waits (status list "-1"); SIGTERM to the launcher reaches it (Python dies by the
  signal) and the launcher does not start it again."""
  count, proc = _launch(tmp_path, "-1")
  deadline = time.time() + 30
  while not count.exists() and time.time() < deadline:
    time.sleep(0.05)
  assert count.exists()
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=60)
  assert proc.returncode == 128 + signal.SIGTERM or proc.returncode == -signal.SIGTERM
  assert int(count.read_text()) == 1
