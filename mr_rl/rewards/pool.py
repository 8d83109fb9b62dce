"""Process pool with hard wall-clock timeouts for heavy / untrusted reward code.

math-verify guards parse/verify with ``signal.alarm`` (main thread only) and
sympy can hang inside C code where no signal helps, so reward code that may
hang runs in worker processes that are killed when a call overruns
(METHODS.md section 7; used by ``mr_rl.rewards.math`` and the "process"
channels of ``mr_rl.rewards.runner``).
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import multiprocessing
import os
import threading
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence


class RewardTimeoutError(TimeoutError):
  """A reward call exceeded its wall-clock budget."""


class RewardWorkerError(RuntimeError):
  """A reward worker process died or the pool could not be (re)started."""


_WORKER_BARRIER = None


def _pool_worker_init(barrier, initializer, initargs):
  global _WORKER_BARRIER
  _WORKER_BARRIER = barrier
  if initializer is not None:
    initializer(*initargs)


def _pool_warmup(timeout_s: float) -> int:
  # Every worker blocks here until all have started, so after warm-up each
  # worker has finished its initializer and no call pays for start-up.
  _WORKER_BARRIER.wait(timeout_s)
  return os.getpid()


class HardTimeoutPool:
  """Persistent process pool whose calls have a hard wall-clock timeout.

  ``call`` waits for a free worker slot (at most ``max_workers`` calls are in
  flight, so queueing never eats into a call's budget), runs ``fn(*args)`` in a
  worker and waits ``timeout_s``. On timeout all workers are killed (a
  ``ProcessPoolExecutor`` cannot kill just one) and the pool is recreated
  lazily; calls of other threads that were in flight on the killed pool are
  retried on the new one. Thread-safe.

  Args:
    max_workers: number of worker processes.
    initializer: picklable function run once in every worker.
    initargs: its arguments.
    preload: modules the forkserver imports once, so new workers fork with
      them already loaded (only used with the forkserver context).
    mp_context: multiprocessing start method, "forkserver" or "spawn" ("fork"
      is refused: the trainer process runs JAX threads).
    warmup_timeout_s: limit on starting the workers.
  """

  _MAX_VICTIM_RETRIES = 10

  def __init__(self, max_workers: int, initializer: Callable[..., None] | None = None,
               initargs: tuple[Any, ...] = (), preload: Sequence[str] = (),
               mp_context: str = "forkserver", warmup_timeout_s: float = 120.0):
    if not isinstance(max_workers, int) or max_workers < 1:
      raise ValueError(f"max_workers must be a positive int, got {max_workers!r}")
    if mp_context not in ("forkserver", "spawn"):
      raise ValueError(f"mp_context must be 'forkserver' or 'spawn', got {mp_context!r}")
    if warmup_timeout_s <= 0:
      raise ValueError(f"warmup_timeout_s must be > 0, got {warmup_timeout_s}")
    self.max_workers = max_workers
    self._initializer = initializer
    self._initargs = tuple(initargs)
    self._ctx = multiprocessing.get_context(mp_context)
    if mp_context == "forkserver" and preload:
      self._ctx.set_forkserver_preload(list(preload))  # no effect once the server runs
    self._warmup_timeout_s = float(warmup_timeout_s)
    self._slot_cv = threading.Condition()
    self._in_flight = 0
    self._solo = False
    self._timeout_kills: set[int] = set()
    self._lock = threading.Lock()
    self._executor: cf.ProcessPoolExecutor | None = None
    self._generation = 0
    self._closed = False
    self.restarts = 0  # pools killed after a timeout or crash

  def _ensure(self) -> tuple[cf.ProcessPoolExecutor, int]:
    with self._lock:
      if self._closed:
        raise RuntimeError("HardTimeoutPool is closed")
      if self._executor is None:
        barrier = self._ctx.Barrier(self.max_workers)
        executor = cf.ProcessPoolExecutor(
            self.max_workers, mp_context=self._ctx, initializer=_pool_worker_init,
            initargs=(barrier, self._initializer, self._initargs))
        futures = [executor.submit(_pool_warmup, self._warmup_timeout_s)
                   for _ in range(self.max_workers)]
        try:
          for f in futures:
            f.result(timeout=self._warmup_timeout_s)
        except Exception as e:  # start-up failed: leave no half-started pool.
          self._kill(executor)
          raise RewardWorkerError(f"worker pool failed to start: {e!r}") from e
        self._executor = executor
      return self._executor, self._generation

  @staticmethod
  def _kill(executor: cf.ProcessPoolExecutor) -> None:
    # `_processes` is private but stable (CPython 3.8-3.13); it is the only way
    # to stop a worker stuck in C code (e.g. a sympy bignum power).
    for proc in list((executor._processes or {}).values()):  # pylint: disable=protected-access
      try:
        proc.kill()
      except Exception:  # pylint: disable=broad-except
        pass
    executor.shutdown(wait=False, cancel_futures=True)

  def _reset(self, generation: int, timed_out: bool = False) -> None:
    """Kills the pool of `generation` unless another thread already did."""
    with self._lock:
      if self._generation != generation or self._executor is None:
        return
      if timed_out:
        self._timeout_kills.add(generation)
      self._kill(self._executor)
      self._executor = None
      self._generation += 1
      self.restarts += 1

  def _acquire(self, solo: bool) -> None:
    with self._slot_cv:
      if solo:
        self._slot_cv.wait_for(lambda: not self._solo)
        self._solo = True
        self._slot_cv.wait_for(lambda: self._in_flight == 0)
      else:
        self._slot_cv.wait_for(lambda: not self._solo and self._in_flight < self.max_workers)
      self._in_flight += 1

  def _release(self, solo: bool) -> None:
    with self._slot_cv:
      self._in_flight -= 1
      if solo:
        self._solo = False
      self._slot_cv.notify_all()

  def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
    """Runs ``fn(*args)`` in a worker; returns its result or re-raises its exception.

    A call whose pool was killed because of another call's timeout is retried.
    A call whose worker crashed is retried once alone on a fresh pool (so a
    crash is blamed on the right call); a second crash raises.

    Raises:
      RewardTimeoutError: the call ran longer than ``timeout_s`` seconds.
      RewardWorkerError: the worker crashed on this call, or the pool cannot start.
    """
    if not timeout_s or timeout_s <= 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    solo = False
    for _ in range(self._MAX_VICTIM_RETRIES):
      alone = solo
      self._acquire(alone)
      try:
        executor, generation = self._ensure()
        try:
          future = executor.submit(fn, *args)
        except (BrokenProcessPool, RuntimeError):
          self._reset(generation)  # found broken before our task ran: not our fault
          continue
        try:
          return future.result(timeout=timeout_s)
        except cf.TimeoutError:
          self._reset(generation, timed_out=True)
          raise RewardTimeoutError(
              f"{getattr(fn, '__name__', fn)!s} exceeded {timeout_s:g} s") from None
        except (BrokenProcessPool, cf.CancelledError) as e:
          if generation in self._timeout_kills:
            continue  # killed for another call's timeout
          self._reset(generation)
          if solo:
            raise RewardWorkerError(f"worker crashed on this call: {e!r}") from e
          solo = True
      finally:
        self._release(alone)
    raise RewardWorkerError(f"pool was killed {self._MAX_VICTIM_RETRIES} times during this call")

  def close(self) -> None:
    with self._lock:
      self._closed = True
      if self._executor is not None:
        self._kill(self._executor)
        self._executor = None


_SHARED_POOL: HardTimeoutPool | None = None
_SHARED_POOL_LOCK = threading.Lock()


def shared_pool() -> HardTimeoutPool:
  """The process-wide pool for math-verify and other ``"process"`` channels.

  ``min(4, cpu_count)`` forkserver workers with math-verify preloaded; created
  on first use, killed at interpreter exit.
  """
  global _SHARED_POOL
  with _SHARED_POOL_LOCK:
    if _SHARED_POOL is None:
      _SHARED_POOL = HardTimeoutPool(
          max_workers=min(4, os.cpu_count() or 1),
          initializer=_math_worker_init,
          preload=("mr_rl.rewards._forkserver_preload", "mr_rl.rewards.math_channels"))
      atexit.register(_SHARED_POOL.close)
    return _SHARED_POOL


def _math_worker_init() -> None:
  from mr_rl.rewards import math as math_rewards  # pylint: disable=import-outside-toplevel
  math_rewards.worker_init()
