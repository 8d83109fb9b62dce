"""Where environment steps run (docs/multiturn.md): on host threads or in worker processes.

`StepRunner(kind, timeout_s, pool)(env, turn)` runs one step of a trajectory's environment
and returns (the environment after the step, its `StepResult`); the rollout calls it on its
host threads (`mr_rl.multiturn.rollout`).

* "thread": the step runs in the calling thread, on the environment object itself. A step past
  the timeout cannot be stopped: the rollout fails its trajectory and abandons the thread.
* "process": the step runs in a fresh worker process of a `HardTimeoutPool` (the reward
  channels' pool, `mr_rl.rewards.process.pool`: workers forked from a zygote that imported
  the environments' modules). The environment goes there pickled, with its state, and comes
  back with the state the step left: a trajectory's steps all see its one environment, while
  no worker serves two steps, so nothing a step leaves in its process (module globals,
  patched modules, threads, child processes: the worker's process group is killed after the
  step) reaches another trajectory, or even the same one except through its environment. A
  step past the timeout has its worker killed (`StepTimeout`); a worker that dies (a crash,
  `os._exit`, a signal) or cannot run the step raises `StepWorkerError`. Environments must
  pickle (`check_picklable`; classes in importable modules, not `__main__`).
"""

from __future__ import annotations

import pickle
from typing import Any, Sequence

from mr_rl.multiturn.env import StepResult, Turn
from mr_rl.rewards.process.pickling import dumps_importable
from mr_rl.rewards.process.pool import (HardTimeoutPool, RewardTimeoutError, RewardWorkerError,
                                        WorkerSetupError)

KINDS = ("thread", "process")


class StepTimeout(TimeoutError):
  """An environment step ran past its timeout (in a process: its worker was killed)."""


class StepWorkerError(RuntimeError):
  """The worker process of an environment step died, or could not run the step."""


def step_in_worker(env: Any, turn: Turn) -> tuple[Any, StepResult]:
  """What a worker process runs: one step, and the environment with the state it left."""
  return env, env.step(turn)


def check_picklable(envs: Sequence[Any]) -> None:
  """Raises ValueError unless every environment pickles for a worker process."""
  for n, env in enumerate(envs):
    try:
      dumps_importable(env)
    except pickle.PicklingError as e:
      raise ValueError(f"workers_kind='process' sends each environment to a worker process, "
                       f"pickled; environment {n} ({type(env).__qualname__}) does not pickle: "
                       f"{e}") from e


def process_pool(workers: int) -> HardTimeoutPool:
  """A pool for environment steps: `workers` processes, each serving one step."""
  pool = HardTimeoutPool(max_workers=workers, max_calls_per_worker=1)
  pool.add_setup(preload=[__name__])
  return pool


def preload(pool: HardTimeoutPool, envs: Sequence[Any]) -> None:
  """Has the pool's zygote (or, once it runs, each new worker) import the environments'
  modules, so a worker forks with them loaded instead of importing them per step."""
  pool.add_setup(preload=sorted({type(e).__module__ for e in envs} - {"__main__"}))


class StepRunner:
  """Runs environment steps of one kind (module docstring).

  Args:
    kind: "thread" or "process".
    timeout_s: the step timeout (enforced here for "process"; by the rollout for "thread").
    pool: the `process_pool` ("process" only).
  """

  def __init__(self, kind: str, timeout_s: float, pool: HardTimeoutPool | None = None):
    if kind not in KINDS:
      raise ValueError(f"workers_kind must be one of {KINDS}, got {kind!r}")
    if (kind == "process") != (pool is not None):
      raise ValueError("a pool is given with workers_kind='process' and only then")
    self.kind, self.timeout_s, self._pool = kind, float(timeout_s), pool

  @property
  def kills_on_timeout(self) -> bool:
    """Whether a step past the timeout ends by itself (its process killed), so the rollout
    need not abandon it."""
    return self.kind == "process"

  def __call__(self, env: Any, turn: Turn) -> tuple[Any, StepResult]:
    if self._pool is None:
      result = env.step(turn)
    else:
      try:
        env, result = self._pool.call(step_in_worker, env, turn, timeout_s=self.timeout_s)
      except RewardTimeoutError:
        raise StepTimeout(f"environment step ran past {self.timeout_s:g} s (its worker process "
                          "was killed)") from None
      except WorkerSetupError as e:
        raise StepWorkerError(f"the environment step could not run in a worker process: "
                              f"{e}") from e
      except RewardWorkerError as e:
        raise StepWorkerError(f"the environment's worker process died in the step "
                              f"({e.how or 'exit unknown'})") from e
    if not isinstance(result, StepResult):
      raise TypeError(f"step returned a {type(result).__name__}, not a StepResult")
    return env, result
