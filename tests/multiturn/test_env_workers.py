"""Environment steps in worker processes (mr_rl/multiturn/workers.py, `workers_kind="process"`)
against a policy that games its environment: a step that hangs, kills its worker (os._exit,
SIGKILL, a segfault), leaves a module global or a running process for later steps, fails only
its own trajectory, is never paid, and does not stall the others. Each test stops by itself:
the pool kills a step at its timeout, and an alarm bounds the whole test.

This module is imported by the workers' zygote (the environments live here), so it imports
nothing heavy at the top.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

import pytest

from mr_rl.multiturn import channels as mt_channels
from mr_rl.multiturn import workers
from mr_rl.multiturn.env import StepResult, Turn

LEAK = []  # a module global a step writes, to be read by a later step


class Hostile:
  """An environment whose step counts its calls (state across turns) and reports whether it
  saw a global an earlier step left ('leaked'); `attack` makes its step misbehave."""

  def __init__(self, attack=None, turns=3, pid_dir=None):
    self.attack, self.turns, self.pid_dir, self.steps = attack, turns, pid_dir, 0

  def reset(self, example):
    return [{"role": "user", "content": "Q:1+2="}]

  def step(self, turn):
    self.steps += 1
    if self.attack == "hang":
      time.sleep(3600)
    elif self.attack == "exit":
      os._exit(3)
    elif self.attack == "sigkill":
      os.kill(os.getpid(), signal.SIGKILL)
    elif self.attack == "segfault":
      ctypes.string_at(0)
    elif self.attack == "raise":
      raise RuntimeError("the tool broke")
    elif self.attack in ("linger", "linger_exit"):  # a process left to act after the step
      sleeper = subprocess.Popen(["sleep", "600"])
      with open(os.path.join(self.pid_dir, f"{sleeper.pid}.pid"), "w") as f:
        f.write(str(sleeper.pid))
      if self.attack == "linger_exit":
        os._exit(4)
    rewards = {"leaked": float(bool(LEAK)), "steps_seen": float(self.steps)}
    LEAK.append(os.getpid())
    if turn.index + 1 >= self.turns:
      return StepResult(rewards=rewards, done=True, info={"pid": os.getpid()})
    return StepResult(messages=[{"role": "tool", "content": str(turn.index)}], rewards=rewards,
                      info={"pid": os.getpid()})


class Unpicklable(Hostile):
  def __init__(self):
    super().__init__()
    self.callback = lambda: None


@pytest.fixture
def deadline():
  """Fails the test if it runs past 240 s (it never should: steps are killed at 1 s)."""
  def expired(*_):
    raise TimeoutError("the test ran past its 240 s deadline")
  old = signal.signal(signal.SIGALRM, expired)
  signal.alarm(240)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, old)


@pytest.fixture
def pool():
  p = workers.process_pool(2)
  workers.preload(p, [Hostile()])
  yield p
  p.close()


def _turn(i):
  return Turn(text="x", token_ids=(1,), index=i)


def _gone(pid):
  """The process has exited (or is a zombie no one reaped yet)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
  except FileNotFoundError:
    return True


def test_a_process_step_keeps_its_environment_state_and_nothing_else(pool, deadline):
  run = workers.StepRunner("process", 5.0, pool)
  env, first = run(Hostile(), _turn(0))
  env, second = run(env, _turn(1))
  # The environment's own state travels with it; each step runs in a fresh process that
  # never saw the global the previous step wrote.
  assert [first.rewards["steps_seen"], second.rewards["steps_seen"]] == [1.0, 2.0]
  assert first.rewards["leaked"] == second.rewards["leaked"] == 0.0
  assert first.info["pid"] != second.info["pid"] and first.info["pid"] != os.getpid()
  # On a thread the same environment does see it: the attack is real.
  LEAK.clear()
  thread = workers.StepRunner("thread", 5.0)
  _, a = thread(Hostile(), _turn(0))
  _, b = thread(Hostile(), _turn(0))
  assert (a.rewards["leaked"], b.rewards["leaked"]) == (0.0, 1.0)
  LEAK.clear()


@pytest.mark.parametrize("attack,error,match", [
    ("hang", workers.StepTimeout, "ran past 1 s .*killed"),
    ("exit", workers.StepWorkerError, r"died in the step \(exit code 3\)"),
    ("sigkill", workers.StepWorkerError, "SIGKILL"),
    ("segfault", workers.StepWorkerError, "SIGSEGV"),
    ("raise", RuntimeError, "the tool broke"),
])
def test_a_hostile_step_fails_alone_and_the_pool_goes_on(pool, deadline, attack, error, match):
  run = workers.StepRunner("process", 1.0, pool)
  t0 = time.monotonic()
  with pytest.raises(error, match=match):
    run(Hostile(attack), _turn(0))
  assert time.monotonic() - t0 < 30
  _, honest = run(Hostile(), _turn(0))  # a fresh worker replaced the dead one
  assert honest.rewards == {"leaked": 0.0, "steps_seen": 1.0}


@pytest.mark.parametrize("attack", ["linger", "linger_exit"])
def test_a_process_left_running_dies_with_its_worker(pool, deadline, tmp_path, attack):
  run = workers.StepRunner("process", 5.0, pool)
  if attack == "linger_exit":  # the worker exits at once, its child stays in its group
    with pytest.raises(workers.StepWorkerError, match="exit code 4"):
      run(Hostile(attack, pid_dir=str(tmp_path)), _turn(0))
  else:
    run(Hostile(attack, pid_dir=str(tmp_path)), _turn(0))
  (pid_file,) = tmp_path.iterdir()
  pid = int(pid_file.read_text())
  for _ in range(100):
    if _gone(pid):
      break
    time.sleep(0.05)
  assert _gone(pid)


def test_environments_that_do_not_pickle_are_refused_before_the_rollout():
  with pytest.raises(ValueError, match="environment 1 .*Unpicklable.* does not pickle"):
    workers.check_picklable([Hostile(), Unpicklable()])
  from mr_rl.multiturn import settings
  c = settings.default_config()
  c.env = f"{__name__}:Unpicklable"
  c.workers_kind = "process"
  with pytest.raises(ValueError, match="config.multiturn: .*does not pickle"):
    settings.from_config(c)
  c.env = f"{__name__}:Hostile"
  s = settings.from_config(c)
  assert s.rollout_options()["workers_kind"] == "process"


def test_hostile_trajectories_fail_alone_in_a_rollout(tiny_hf_pair, left_padded_prompts,
                                                      deadline, tmp_path):
  import jax
  from mr_rl.demo import task
  from mr_rl.multiturn import render as render_lib
  from mr_rl.multiturn import rollout as mt
  _, model, params = tiny_hf_pair("qwen3")
  tokens, mask = left_padded_prompts((7, 3, 12, 5), vocab=128, seed=0)
  render = render_lib.PlainRenderer(task.make_tokenizer(), template="={content};", marker="--")
  attack_of = {1: "hang", 2: "exit", 3: "sigkill", 4: "segfault", 6: "raise", 7: "linger"}
  envs = [Hostile(attack_of.get(n), pid_dir=str(tmp_path)) for n in range(8)]
  ro = mt.TurnRollout(model, slots=3, max_new_tokens=64, end_of_turn_ids=tuple(range(5, 128, 8)),
                      limits=mt.TurnLimits(max_turns=4, max_observation_tokens=8,
                                           step_timeout_s=1.0), workers=2,
                      workers_kind="process")
  try:
    trajs = ro.run(params, tokens, mask, envs, key=jax.random.PRNGKey(3), group_size=2,
                   render=render)
  finally:
    ro.close()
  status = {n: (t.status, t.error) for n, t in enumerate(trajs)}
  assert status[1][0] == "timeout" and "killed" in status[1][1], status
  assert status[2][0] == "error" and "exit code 3" in status[2][1], status
  assert status[3][0] == "error" and "SIGKILL" in status[3][1], status
  assert status[4][0] == "error" and "SIGSEGV" in status[4][1], status
  assert status[6][0] == "error" and "the tool broke" in status[6][1], status
  honest = [t for n, t in enumerate(trajs) if n in (0, 5, 7)]
  assert all(t.status in ("done", "budget", "max_turns") for t in honest), status
  assert any(t.turns > 1 for t in honest)
  for t in honest:  # the state of its own environment, no global from any other step
    assert [r["steps_seen"] for r in t.turn_rewards] == list(range(1, len(t.turn_rewards) + 1))
    assert t.rewards.get("leaked", 0.0) == 0.0
  # The failed trajectories are never paid: every channel scores the failure value.
  r = mt_channels.environment_scores(
      trajs, [mt_channels.EnvironmentChannel("steps_seen", reduce="sum", on_failure=-1.0)], 2)
  assert [r.reshape(-1)[n] for n in (1, 2, 3, 4, 6)] == [-1.0] * 5
  assert ro.last_stats.token_mismatches == 0
  for pid_file in tmp_path.iterdir():
    assert _gone(int(pid_file.read_text()))


def test_the_built_in_tools_run_in_a_worker(pool, deadline):
  from mr_rl.multiturn import builtin_tools, tools
  env = tools.ToolEnv([builtin_tools.calculator, builtin_tools.python])
  workers.preload(pool, [env])
  run = workers.StepRunner("process", 30.0, pool)
  call = lambda name, arg: Turn(text=tools.HermesFormat().render_call(name, arg), token_ids=(),
                                index=0)
  env, calc = run(env, call("calculator", {"expression": "7+5-9"}))
  env, code = run(env, call("python", {"code": "print(6 * 7)"}))
  assert calc.messages[0]["content"] == "3" and calc.rewards["tool_success"] == 1.0
  assert code.messages[0]["content"].strip() == "42", code
