"""Reward calls and the daemon threads that run them (`mr_rl.rewards.runner`).

A `Call` is one reward evaluation (one response and channel, or one batched call); a
`ThreadWorkers` pool runs calls as they are submitted, so a caller may submit the calls of a
batch at different times (rows scored as the rollout finishes them) and wait once at the end.

Timeouts (docs/rewards.md "Scoring as rows finish"): a call's `timeout_s` counts from the moment a
worker thread starts it, not from its submission, so time spent queued behind other calls or
waiting for the rest of a rollout never counts against it. A "thread" call that ran longer than
`timeout_s` is a timeout even when it returned before anyone looked (the verdict does not depend
on when the caller waits); one still running past its budget is abandoned (its thread cannot be
killed) and a fresh thread takes its place, by `wait` or by `expire`, whichever looks first.
"process" calls are timed and killed by the `HardTimeoutPool` itself. Shared work a "thread"
call does in steps (a verifier's forward passes) asks `check_deadline()` between steps, so an
abandoned call stops at its next step instead of holding a shared model (and its lock).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, Callable, Sequence

from mr_rl.rewards.channels import RewardChannel
from mr_rl.rewards.process.pool import HardTimeoutPool, RewardTimeoutError


_CURRENT = threading.local()  # .deadline: time.monotonic() by which this thread's call is due


def check_deadline() -> None:
  """Raises `RewardTimeoutError` when the "thread" call running on this thread is past its
  timeout (abandoned, or about to be); a no-op outside a runner call."""
  deadline = getattr(_CURRENT, "deadline", None)
  if deadline is not None and time.monotonic() > deadline:
    raise RewardTimeoutError("the reward call is past its timeout: stopped between steps")


class Call:
  """One reward evaluation, filled in by a worker thread.

  ``index`` is (b, g) for a per-sample call, None for a batched call, whose ``rows`` are
  the (b, g) it scores, in order.
  """

  __slots__ = ("channel", "k", "args", "index", "rows", "t0", "done", "abandoned", "value",
               "error", "timed_out")

  def __init__(self, channel: RewardChannel, k: int, args: tuple[Any, ...],
               index: tuple[int, int] | None, rows: Sequence[tuple[int, int]] = ()):
    self.channel, self.k, self.args, self.index = channel, k, args, index
    self.rows = [index] if index is not None else list(rows)
    self.t0: float | None = None
    self.done = self.abandoned = self.timed_out = False
    self.value: Any = None
    self.error: BaseException | None = None


class ThreadWorkers:
  """Daemon threads that run `Call`s; a thread abandoned on timeout is replaced."""

  def __init__(self, num_threads: int, pool_getter: Callable[[], HardTimeoutPool],
               timeout_s: float):
    self._queue: queue.PriorityQueue = queue.PriorityQueue()  # (priority, order, call)
    self._order = itertools.count()
    self._cond = threading.Condition()
    self._pool_getter = pool_getter
    self._timeout_s = timeout_s
    for _ in range(num_threads):
      self._spawn()

  def _spawn(self) -> None:
    threading.Thread(target=self._loop, daemon=True, name="reward-worker").start()

  def _loop(self) -> None:
    while True:
      _, _, call = self._queue.get()
      with self._cond:
        call.t0 = time.monotonic()
      _CURRENT.deadline = call.t0 + self._timeout_s
      try:
        if call.channel.kind == "process":
          value = self._pool_getter().call(call.channel.fn, *call.args, timeout_s=self._timeout_s)
        else:
          value = call.channel.fn(*call.args)
        error = None
      except BaseException as e:  # pylint: disable=broad-except
        value, error = None, e
      _CURRENT.deadline = None
      with self._cond:
        if call.abandoned:
          return  # a replacement thread already took over this slot
        if (error is None and call.channel.kind == "thread"
            and time.monotonic() - call.t0 > self._timeout_s):  # late: a timeout all the same
          value, error = None, self._timeout_error(call)
        call.value, call.error, call.done = value, error, True
        call.timed_out = isinstance(error, TimeoutError)
        self._cond.notify_all()

  def _timeout_error(self, call: Call) -> RewardTimeoutError:
    return RewardTimeoutError(f"{call.channel.name} exceeded {self._timeout_s:g} s")

  def submit(self, call: Call, first: bool = False) -> None:
    """Queues `call` (FIFO; `first`: ahead of every call queued without it)."""
    self._queue.put((0 if first else 1, next(self._order), call))

  def expire(self, calls: Sequence[Call]) -> list[Call]:
    """Abandons the "thread" calls of `calls` that have run past the timeout (each one's
    thread replaced); returns the calls not done yet. Does not block."""
    now, pending = time.monotonic(), []
    with self._cond:
      for c in calls:
        if c.done:
          continue
        if c.channel.kind == "thread" and c.t0 is not None and now - c.t0 > self._timeout_s:
          c.abandoned = c.done = c.timed_out = True
          c.error = self._timeout_error(c)
          self._spawn()
          continue
        pending.append(c)
    return pending

  def wait(self, calls: Sequence[Call]) -> None:
    """Blocks until every call is done or (thread kind) abandoned after its timeout."""
    pending = self.expire(calls)
    while pending:
      with self._cond:  # `done` is set under this lock: no finish is missed
        if not any(c.done for c in pending):
          self._cond.wait(timeout=0.05)
      pending = self.expire(pending)
