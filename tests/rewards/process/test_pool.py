"""Tests for mr_rl.rewards.process.pool: our own worker processes.

Reward workers are forked by a `python -m mr_rl.rewards.process.worker` zygote, so they never
import the caller's `__main__`: reward functions work from unguarded scripts, stdin,
`python -c` and notebook cells. Timeouts kill only the overrunning call's worker.
"""

import concurrent.futures as cf
import os
import pathlib
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mr_rl.rewards.process import pool as pl

ROOT = str(pathlib.Path(__file__).resolve().parents[3])

# A caller's top-level code with no `if __name__ == "__main__":` guard. It must run once:
# the old forkserver pool re-ran it in every worker (or could not start at all from stdin).
UNGUARDED = textwrap.dedent(r"""
    import numpy as np
    import mr_rl.rewards.math as m
    from mr_rl.rewards.runner import RewardRunner
    print("top-level ran")
    print("accuracy", m.accuracy(r"\boxed{\frac{1}{2}}", "0.5"))
    r, metrics = RewardRunner(["accuracy", "negative"])(
        [[r"\boxed{\frac{1}{2}}", r"\boxed{-1}"]], [{"reference": "0.5"}], np.array([[3, 3]]))
    print("runner", r.tolist(), metrics["rewards/accuracy/errors"],
          metrics["rewards/negative/errors"])
""")
EXPECTED = ["top-level ran", "accuracy 1.0", "runner [[[1.0, 0.0], [0.0, 1.0]]] 0.0 0.0"]


def _env():
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
  return env


@pytest.mark.parametrize("how", ["script", "stdin", "dash_c"])
def test_rewards_work_from_any_caller(how, tmp_path):
  if how == "script":
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    cmd, stdin = [sys.executable, str(script)], None
  elif how == "stdin":
    cmd, stdin = [sys.executable, "-"], UNGUARDED
  else:
    cmd, stdin = [sys.executable, "-c", UNGUARDED], None
  out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=tmp_path,
                       env=_env(), timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.splitlines() == EXPECTED, out.stdout + out.stderr[-3000:]


def test_rewards_work_from_a_notebook_cell(tmp_path):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  nb = nbformat.v4.new_notebook()
  nb.cells = [nbformat.v4.new_code_cell(UNGUARDED)]
  client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  old = os.environ.get("PYTHONPATH")
  os.environ["PYTHONPATH"] = _env()["PYTHONPATH"]  # the kernel inherits the environment
  try:
    client.execute()
  finally:
    if old is None:
      del os.environ["PYTHONPATH"]
    else:
      os.environ["PYTHONPATH"] = old
  text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream")
  assert text.splitlines() == EXPECTED, nb.cells[0].outputs


# ------------------------------------------------------------------ pool behaviour
_STATE = {"init": None}


def _init(value):
  _STATE["init"] = value


def _get_init():
  return _STATE["init"], os.getpid()


def _sleep_then_pid(seconds):
  time.sleep(seconds)
  return os.getpid()


def _exit(code):
  os._exit(code)


def _kill_self():
  os.kill(os.getpid(), 11)


def _raise_value_error():
  raise ValueError("scorer broke on this input")


class _OddError(Exception):
  def __init__(self, a, b):  # pickles, but does not unpickle (args=('a b',))
    super().__init__(f"{a} {b}")


def _raise_odd():
  raise _OddError("x", "y")


def _unpicklable_result():
  return threading.Lock()


@pytest.fixture
def pool():
  p = pl.HardTimeoutPool(2, initializer=_init, initargs=("ready",), warmup_timeout_s=60)
  yield p
  p.close()


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_initializer_runs_in_every_worker(pool):
  with cf.ThreadPoolExecutor(2) as ex:
    got = list(ex.map(lambda _: pool.call(_sleep_then_pid, 0.3, timeout_s=30), range(2)))
  assert len(set(got)) == 2  # two workers served the two concurrent calls
  assert pool.call(_get_init, timeout_s=30)[0] == "ready"


def test_timeout_kills_only_its_own_worker(pool):
  with cf.ThreadPoolExecutor(2) as ex:
    slow = ex.submit(pool.call, time.sleep, 600, timeout_s=1.0)
    time.sleep(0.2)
    honest = ex.submit(pool.call, _sleep_then_pid, 2.0, timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(pl.RewardTimeoutError, match="sleep exceeded 1 s"):
      slow.result()
    assert time.monotonic() - t0 < 3.0
    honest_pid = honest.result()  # not disturbed by the other call's kill
  assert pool.restarts == 1
  assert pool.call(_sleep_then_pid, 0, timeout_s=30) == honest_pid  # the surviving worker


def test_worker_death_is_blamed_on_its_call_and_replaced(pool):
  with pytest.raises(pl.RewardWorkerError, match=r"died running _exit \(exit code 3\)"):
    pool.call(_exit, 3, timeout_s=30)
  with pytest.raises(pl.RewardWorkerError, match=r"died running _kill_self \(killed by signal "
                     r"11 \(SIGSEGV\)\)"):
    pool.call(_kill_self, timeout_s=30)
  assert pool.restarts == 2
  assert pool.call(_get_init, timeout_s=30)[0] == "ready"


def test_exceptions_keep_their_type_and_the_worker_traceback(pool):
  with pytest.raises(ValueError, match="scorer broke") as info:
    pool.call(_raise_value_error, timeout_s=30)
  assert "Traceback" in str(info.value.__cause__) and "_raise_value_error" in str(
      info.value.__cause__)
  with pytest.raises(RuntimeError, match=r"exception could not be sent back \(_OddError: x y\)"):
    pool.call(_raise_odd, timeout_s=30)
  with pytest.raises(RuntimeError, match="result could not be sent back"):
    pool.call(_unpicklable_result, timeout_s=30)
  assert pool.restarts == 0  # none of these killed a worker


def test_main_functions_and_lambdas_are_refused_before_sending(pool):
  def in_main():
    return 1
  in_main.__module__ = "__main__"
  in_main.__qualname__ = "in_main"
  with pytest.raises(pl.WorkerSetupError, match="in_main is defined in __main__"):
    pool.call(in_main, timeout_s=30)
  with pytest.raises(pl.WorkerSetupError, match="cannot send"):
    pool.call(lambda: 1, timeout_s=30)
  with pytest.raises(pickle.PicklingError, match="__main__"):
    pl.dumps_importable({"x": [in_main]})


def test_modules_added_to_sys_path_later_import_in_workers(pool, tmp_path, monkeypatch):
  pool.call(_sleep_then_pid, 0, timeout_s=30)  # a worker exists before the module does
  (tmp_path / "late_reward_mod.py").write_text("def score(x):\n  return x * 2\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import late_reward_mod  # pylint: disable=import-outside-toplevel
  assert pool.call(late_reward_mod.score, 21, timeout_s=30) == 42


def test_a_call_that_does_not_unpickle_in_the_worker_is_a_setup_error(pool, tmp_path,
                                                                      monkeypatch):
  (tmp_path / "vanishing_mod.py").write_text("def score():\n  return 1\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import vanishing_mod  # pylint: disable=import-outside-toplevel
  (tmp_path / "vanishing_mod.py").unlink()
  with pytest.raises(pl.WorkerSetupError, match="could not load the call to score"):
    pool.call(vanishing_mod.score, timeout_s=30)


def test_zygote_death_is_recovered_and_leaves_no_worker(pool):
  pid = pool.call(_sleep_then_pid, 0, timeout_s=30)
  pool._zygote._proc.kill()  # pylint: disable=protected-access
  pool._zygote._proc.wait()  # pylint: disable=protected-access
  deadline = time.monotonic() + 5
  while _alive(pid) and time.monotonic() < deadline:  # PR_SET_PDEATHSIG
    time.sleep(0.05)
  assert not _alive(pid)
  assert pool.call(_get_init, timeout_s=30)[0] == "ready"  # a new zygote, no error
  assert pool.restarts == 0


def test_close_leaves_no_process_behind():
  p = pl.HardTimeoutPool(2)
  with cf.ThreadPoolExecutor(2) as ex:
    pids = list(ex.map(lambda _: p.call(_sleep_then_pid, 0.3, timeout_s=30), range(2)))
  zygote = p._zygote._proc  # pylint: disable=protected-access
  p.close()
  assert zygote.returncode is not None
  assert not any(_alive(pid) for pid in pids)
  with pytest.raises(RuntimeError, match="closed"):
    p.call(os.getpid, timeout_s=30)


def test_bad_preload_and_initializer_fail_as_setup_errors():
  p = pl.HardTimeoutPool(1, preload=("no_such_module_xyz",))
  with pytest.raises(pl.WorkerSetupError, match="failed to start.*no_such_module_xyz"):
    p.call(os.getpid, timeout_s=30)
  p.close()
  p = pl.HardTimeoutPool(1, initializer=_raise_value_error)
  with pytest.raises(pl.WorkerSetupError, match="worker failed to start.*scorer broke"):
    p.call(os.getpid, timeout_s=30)
  p.close()
  with pytest.raises(pickle.PicklingError):
    pl.HardTimeoutPool(1, initializer=lambda: None)


def test_a_forked_child_gets_its_own_workers(tmp_path):
  # The child of os.fork must not talk to the parent's workers over the inherited sockets.
  script = tmp_path / "fork_after_use.py"
  script.write_text(textwrap.dedent(r"""
      import os
      import mr_rl.rewards.math as m
      from mr_rl.rewards.process import pool
      assert m.accuracy(r"\boxed{2}", "2") == 1.0
      parent_zygote = pool.shared_pool()._zygote._proc.pid
      r, w = os.pipe()
      pid = os.fork()
      if pid == 0:
        ok = [m.accuracy(r"\boxed{%d}" % i, str(i)) for i in range(20)] == [1.0] * 20
        child_zygote = pool.shared_pool()._zygote._proc.pid
        os.write(w, f"{ok} {child_zygote != parent_zygote}".encode())
        pool.shared_pool().close()
        os._exit(0)
      parent_ok = [m.accuracy(r"\boxed{%d}" % i, str(i + 1)) for i in range(20)] == [0.0] * 20
      os.waitpid(pid, 0)
      print("child", os.read(r, 100).decode(), "parent", parent_ok)
  """))
  out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       cwd=tmp_path, env=_env(), timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["child", "True", "True", "parent", "True"], out.stdout


# --------------------------------------------------------------- memory cap and recycling
_LEAKED = []


def _vm_data():
  with open("/proc/self/status") as f:
    return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmData:"))


def _leak(mib):
  """A reward that keeps what it allocates (24 MB per call took 2 workers to 1.9 GB)."""
  _LEAKED.append(b"\1" * (mib << 20))
  return os.getpid(), _vm_data()


def _allocate(mib):
  return len(b"\1" * (mib << 20))


def _hold(mib):
  _LEAKED.append(b"\1" * (mib << 20))


CAP = 512 << 20


def test_a_leaking_reward_is_recycled_before_it_grows_past_its_cap():
  pool = pl.HardTimeoutPool(2, max_worker_bytes=CAP, max_calls_per_worker=None)
  try:
    got = [pool.call(_leak, 24, timeout_s=30) for _ in range(40)]  # 960 MB leaked in all
  finally:
    pool.close()
  assert max(d for _, d in got) <= CAP // 2 + (24 << 20), [d >> 20 for _, d in got]
  assert pool.recycled >= 2 and len({p for p, _ in got}) in (pool.recycled, pool.recycled + 1)
  assert pool.restarts == 0  # replaced between calls: no call failed


def test_an_honest_reward_keeps_its_worker():
  pool = pl.HardTimeoutPool(2, max_worker_bytes=CAP)
  try:
    pids = {pool.call(_sleep_then_pid, 0, timeout_s=30) for _ in range(40)}
    assert pool.call(_allocate, 64, timeout_s=30) == 64 << 20  # freed again: kept
    assert len(pids) == 1 and pool.recycled == 0
  finally:
    pool.close()


def test_workers_are_replaced_after_max_calls():
  pool = pl.HardTimeoutPool(1, max_calls_per_worker=3, max_worker_bytes=None)
  try:
    pids = [pool.call(_sleep_then_pid, 0, timeout_s=30) for _ in range(7)]
  finally:
    pool.close()
  assert pids[0] == pids[2] != pids[3] == pids[5] != pids[6] and pool.recycled == 2


def _over_the_cap(response, example, num_tokens):
  del example, num_tokens
  return float(_allocate(1024 if response == "big" else 1) > 0)


def test_a_call_over_the_cap_fails_its_row_and_the_pool_goes_on():
  from mr_rl.rewards import runner as rr  # pylint: disable=import-outside-toplevel
  pool = pl.HardTimeoutPool(1, max_worker_bytes=CAP)
  try:
    runner = rr.RewardRunner([rr.RewardChannel("mem", _over_the_cap, "process", on_failure=0.0)],
                             pool=pool,
                             timeout_s=30, max_failure_share=1.0)
    r, metrics = runner([["big", "small"]], [{}], [[1, 1]])
    assert r[0, :, 0].tolist() == [0.0, 1.0] and metrics["rewards/mem/errors"] == 1
    assert "MemoryError" in runner.last_errors["mem"]
    assert runner([["small"]], [{}], [[1]])[0][0, 0, 0] == 1.0
  finally:
    pool.close()


def test_memory_limits_are_checked():
  for kw in ({"max_worker_bytes": 1 << 20}, {"max_worker_bytes": 1.5e9},
             {"max_calls_per_worker": 0}, {"max_calls_per_worker": True}):
    with pytest.raises(ValueError, match=next(iter(kw))):
      pl.HardTimeoutPool(1, **kw)
  small = pl.HardTimeoutPool(1, initializer=_hold, initargs=(40,),  # a fresh worker: > 32 MiB
                             max_worker_bytes=pl.MIN_WORKER_BYTES)
  try:
    with pytest.raises(pl.WorkerSetupError, match="already holds .* raise the cap"):
      small.call(os.getpid, timeout_s=30)
  finally:
    small.close()
