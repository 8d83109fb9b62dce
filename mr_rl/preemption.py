"""Stopping a run at a step boundary on SIGTERM (`mr_rl.train.train`; `mr_rl.main` exits with
`PREEMPTED_EXIT_CODE` and the launch scripts run the same command again to resume)."""

from __future__ import annotations

import signal as os_signal
import threading

import jax


PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: run the same command again to resume


class Preempted(Exception):
  """The run was asked to stop (SIGTERM) and saved a checkpoint at a step boundary;
  `mr_rl.main` exits with `PREEMPTED_EXIT_CODE`, and the launch scripts run it again."""


class Preemption:
  """SIGTERM (a spot / preemptible VM, a Kubernetes eviction) -> save at the next step boundary.

  With one process a SIGTERM handler sets a flag (installed while training, the previous
  handler restored after). With several, jax's preemption sync point tells every process at
  the same step that one of them got the signal (`reached_preemption_sync_point`), so all save
  the same step.
  """

  def __init__(self):
    self._flag = False
    self._previous = None
    self._multi = jax.process_count() > 1
    if not self._multi and threading.current_thread() is threading.main_thread():
      self._previous = os_signal.signal(os_signal.SIGTERM, self._handle)
    # (a context manager: the previous handler comes back however training ends)

  def _handle(self, signum, frame):
    del signum, frame
    self._flag = True

  def reached(self, step: int) -> bool:
    """Whether to save and stop after `step` (the same answer on every process)."""
    if self._multi:
      from jax.experimental import multihost_utils
      return bool(multihost_utils.reached_preemption_sync_point(step))
    return self._flag

  def __enter__(self) -> "Preemption":
    return self

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      os_signal.signal(os_signal.SIGTERM, self._previous)
      self._previous = None
