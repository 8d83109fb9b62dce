"""Stopping a run at a step boundary on SIGTERM, in bounded time (`mr_rl.train.train`;
`mr_rl.main` exits with `PREEMPTED_EXIT_CODE` and the launch scripts run the same command
again to resume).

A SIGTERM sets a flag; at each step boundary the processes agree on the flags (one small
allgather: any process's signal stops all of them at the same step), save that step and stop.
A run that cannot reach a step boundary (a peer stuck in I/O or stopped, a collective waiting
on a process that is gone) would ignore the signal; a watchdog thread bounds it: `term_timeout_s`
seconds after the signal the process prints why and exits with `PREEMPTED_EXIT_CODE`, the last
checkpoint that finished kept (orbax writes a step to a temporary directory and renames it, so
an interrupted save leaves no step behind). The watchdog learns of the signal through
`signal.set_wakeup_fd`, which the interpreter writes from the signal handler's C part even
while the main thread is blocked inside a device call. With `stall_timeout_s` it also ends a
run in which no step finished for that long (a hung peer that nobody signals).

`mr_rl.main`'s --term_timeout_s and --stall_timeout_s set the defaults (`configure`).
"""

from __future__ import annotations

import os
import select
import signal as os_signal
import socket
import sys
import threading
import time

import numpy as np

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: run the same command again to resume
STALLED_EXIT_CODE = 1

_defaults = {"term_timeout_s": 120.0, "stall_timeout_s": 0.0}


def configure(term_timeout_s: float | None = None, stall_timeout_s: float | None = None):
  """Sets the process's defaults for `Preemption` (0 = no limit)."""
  for k, v in (("term_timeout_s", term_timeout_s), ("stall_timeout_s", stall_timeout_s)):
    if v is not None:
      if v < 0:
        raise ValueError(f"--{k} must be >= 0 (0 = no limit), got {v}")
      _defaults[k] = float(v)


class Preempted(Exception):
  """The run was asked to stop (SIGTERM) and saved a checkpoint at a step boundary;
  `mr_rl.main` exits with `PREEMPTED_EXIT_CODE`, and the launch scripts run it again."""


class Preemption:
  """SIGTERM (a spot / preemptible VM, a Kubernetes eviction) -> save at the next step boundary
  on every process, or exit within `term_timeout_s` (module docstring). A context manager: the
  previous handler comes back however training ends. Off the main thread (where Python cannot
  install handlers) it only answers `reached` from the other processes."""

  def __init__(self, term_timeout_s: float | None = None,
               stall_timeout_s: float | None = None):
    import jax
    self._flag = False
    self._multi = jax.process_count() > 1
    self.term_timeout_s = _defaults["term_timeout_s"] if term_timeout_s is None \
        else term_timeout_s
    self.stall_timeout_s = _defaults["stall_timeout_s"] if stall_timeout_s is None \
        else stall_timeout_s
    self._installed = threading.current_thread() is threading.main_thread()
    self._done = threading.Event()
    self._beat = time.monotonic()
    self._step = None
    self._term_at = None
    self._previous = self._previous_fd = self._pipe = None
    self._thread = None
    if self._installed:
      self._previous = os_signal.signal(os_signal.SIGTERM, self._handle)
      r, w = os.pipe()
      os.set_blocking(w, False)
      self._pipe = (r, w)
      self._previous_fd = os_signal.set_wakeup_fd(w, warn_on_full_buffer=False)
      self._thread = threading.Thread(target=self._watch, name="mr_rl-preemption-watchdog",
                                      daemon=True)
      self._thread.start()

  def _handle(self, signum, frame):
    del signum, frame
    self._flag = True

  def _exit(self, why: str, code: int) -> None:
    saved = "none" if self._step is None else f"the last finished one, up to step {self._step}"
    print(f"mr_rl [{socket.gethostname()} pid {os.getpid()}]: {why}; exiting with status "
          f"{code} (checkpoints kept: {saved})", file=sys.stderr, flush=True)
    os._exit(code)

  def _watch(self) -> None:
    """The watchdog thread: notices SIGTERM through the wakeup pipe, then bounds the exit."""
    r = self._pipe[0]
    while not self._done.is_set():
      now = time.monotonic()
      waits = [1.0]
      if self._term_at is not None and self.term_timeout_s:
        if now - self._term_at >= self.term_timeout_s:
          self._exit(f"SIGTERM {self.term_timeout_s:g} s ago and the run has not reached a step "
                     f"boundary (a peer process stuck or gone?)", PREEMPTED_EXIT_CODE)
        waits.append(self._term_at + self.term_timeout_s - now)
      if self.stall_timeout_s:
        if now - self._beat >= self.stall_timeout_s:
          self._exit(f"no step finished for {self.stall_timeout_s:g} s (--stall_timeout_s; a "
                     f"peer process stuck?)", STALLED_EXIT_CODE)
        waits.append(self._beat + self.stall_timeout_s - now)
      ready, _, _ = select.select([r], [], [], max(0.01, min(waits)))
      if ready:
        data = os.read(r, 64)
        if int(os_signal.SIGTERM) in data and self._term_at is None:
          self._term_at = time.monotonic()
          self._flag = True  # (the Python handler runs only once the main thread is back)

  def reached(self, step: int) -> bool:
    """Whether to save and stop after `step` (the same answer on every process: they agree on
    the flags here, so every process calls this at every step boundary)."""
    self._beat = time.monotonic()
    if self._multi:
      from mr_rl import distributed
      flags = distributed.allgather(np.asarray([int(self._flag)], np.int32))
      return bool(np.asarray(flags).any())
    return self._flag

  def saved(self, step: int) -> None:
    """Records that the checkpoint of `step` finished (named if the watchdog ends the run)."""
    self._step = step

  def __enter__(self) -> "Preemption":
    return self

  def __exit__(self, *exc) -> None:
    self._done.set()
    if self._installed:
      self._installed = False
      os_signal.set_wakeup_fd(self._previous_fd)
      # (None: a handler installed outside Python, e.g. jax's own notifier; the default then)
      previous = os_signal.SIG_DFL if self._previous is None else self._previous
      os_signal.signal(os_signal.SIGTERM, previous)
      os.write(self._pipe[1], b"\0")  # wakes the watchdog, which sees `_done` and returns
      self._thread.join()
      for fd in self._pipe:
        os.close(fd)
