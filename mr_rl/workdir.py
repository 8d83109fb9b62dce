"""One run per workdir, and the same workdir on every process (`claim`).

A workdir holds one run's checkpoints, metrics and settings record; two runs writing it
interleave their metrics, checkpoint each other's steps and rewrite each other's settings.
`claim` takes an exclusive lock for the run's lifetime:

* Process 0 holds `flock` on `<workdir>/run.lock`, which records who holds it (host, pid,
  start time) so a second run fails at once naming the holder (`WorkdirBusyError`). The kernel
  frees the lock when the holder exits, however it exits; a lock left by a process that is
  gone (a network file system that kept a dead machine's lock) is taken over with
  `--break_lock` (`break_lock=True`), which replaces the lock file.
* A workdir URL (gs://, s3://, ...) cannot be locked: the run says so in its log and goes on.
* With several processes, process 0 writes a fresh random nonce into the lock file and every
  process reads it back from its own view of the workdir; if any process does not see it (each
  host was given a local path instead of a shared one), every process stops within seconds
  with `WorkdirNotSharedError` naming the processes, instead of waiting in the checkpointer
  for a directory created on another machine.

Claims nest: a pipeline claims its workdir and the runs it starts in subdirectories
(`mr_rl.pipelines`: the TAG probes, the demo's methods) are already covered.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import secrets
import socket
from typing import Callable, Iterator

import numpy as np

from mr_rl.errors import UserError

LOCK_NAME = "run.lock"

_held: dict[str, int] = {}  # realpath -> nesting depth of this process's claims


class WorkdirBusyError(UserError, RuntimeError):
  """Another run holds the workdir."""


class WorkdirNotSharedError(UserError, RuntimeError):
  """The processes of one job do not see the same workdir."""


class WorkdirNotADirectoryError(UserError, NotADirectoryError):
  """The workdir (or a directory above it) is a file, or cannot be made."""


def _is_url(path: str) -> bool:
  return "://" in path


def _covered(real: str) -> bool:
  return any(real == h or real.startswith(h.rstrip(os.sep) + os.sep) for h in _held)


def _holder_text(path: str) -> str:
  try:
    with open(path) as f:
      rec = json.loads(f.read() or "{}")
  except (OSError, ValueError):
    return "a process that left no record"
  return (f"pid {rec.get('pid', '?')} on host {rec.get('host', '?')}, started "
          f"{rec.get('started', '?')}")


def _locked(path: str) -> bool:
  """Whether a process holds `path`'s flock (probed with a lock taken and dropped at once)."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return False
  except OSError:
    return True
  finally:
    os.close(fd)


def _lock(workdir: str, break_lock: bool, nonce: str) -> int | None:
  """Process 0: flock `<workdir>/run.lock` and record the holder; returns the descriptor
  (None: the file system has no locks and `break_lock` said to go on without one)."""
  path = os.path.join(workdir, LOCK_NAME)
  parent = os.path.dirname(os.path.realpath(workdir))
  while not break_lock and parent != os.path.dirname(parent):  # a run holding an ancestor
    outer = os.path.join(parent, LOCK_NAME)
    if os.path.exists(outer) and _locked(outer):
      raise WorkdirBusyError(
          f"workdir {workdir} lies inside {parent}, which a run holds ({_holder_text(outer)}; "
          f"lock file {outer}): choose a workdir outside it")
    parent = os.path.dirname(parent)
  if break_lock and os.path.exists(path):
    os.unlink(path)  # a holder still alive keeps its lock on the unlinked file: the user's call
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    raise WorkdirBusyError(
        f"workdir {workdir} is in use by another run ({_holder_text(path)}; lock file {path}). "
        f"Two runs in one workdir overwrite each other's checkpoints and metrics: wait for it, "
        f"stop it, or choose another --workdir. If that process is gone and the lock remains "
        f"(a network file system can keep a dead machine's lock), pass --break_lock.") from None
  except OSError as e:
    os.close(fd)
    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
      if break_lock:
        _write_record(workdir, nonce)
        return None
      raise WorkdirBusyError(
          f"workdir {workdir}: its file system does not support locks ({e}); pass "
          f"--break_lock to run without the lock, making sure one run alone writes it") from None
    raise
  os.ftruncate(fd, 0)
  os.pwrite(fd, _record(nonce, locked=True).encode(), 0)
  os.fsync(fd)
  return fd


def _read_nonce(workdir: str) -> str:
  from etils import epath  # (orbax's path layer: local paths and bucket URLs alike)
  try:
    return json.loads(epath.Path(workdir, LOCK_NAME).read_text() or "{}").get("nonce", "")
  except (OSError, ValueError):
    return ""


def _record(nonce: str, locked: bool) -> str:
  """The lock file's JSON: who holds the workdir, since when, and process 0's nonce."""
  return json.dumps({
      "host": socket.gethostname(), "pid": os.getpid(), "nonce": nonce, "locked": locked,
      "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})


def _write_record(workdir: str, nonce: str) -> None:
  """The record without a lock (a bucket URL, or a file system without locks)."""
  from etils import epath
  epath.Path(workdir, LOCK_NAME).write_text(_record(nonce, locked=False))


def _agree(values: np.ndarray) -> np.ndarray:
  from mr_rl import distributed
  return np.asarray(distributed.allgather(values))


@contextlib.contextmanager
def claim(workdir: str, *, break_lock: bool = False,
          log: Callable[[str], None] | None = print) -> Iterator[str]:
  """Holds `workdir` for this run (module docstring) on every process of the job; nested
  claims of it or of a subdirectory are free. Creates the directory. Yields `workdir`."""
  import jax
  url = _is_url(workdir)
  real = workdir if url else os.path.realpath(workdir)
  if _covered(real):
    _held[real] = _held.get(real, 0) + 1
    try:
      yield workdir
    finally:
      _held[real] -= 1
      if not _held[real]:
        del _held[real]
    return
  primary, multi = jax.process_index() == 0, jax.process_count() > 1
  nonce, fd, error, created = secrets.token_hex(8), None, None, None
  if primary:
    try:
      if url:
        from etils import epath
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)
        _write_record(workdir, nonce)
        if log:
          log(f"workdir {workdir} is a URL: it cannot be locked; make sure one run alone "
              f"writes it")
      else:
        created = _make(workdir)
        fd = _lock(workdir, break_lock, nonce)
        if fd is None and log:
          log(f"workdir {workdir}: no file locks on its file system; running unlocked "
              f"(--break_lock)")
    except Exception as e:  # (told to the other processes before raising)
      error = e
  if multi:
    # process 0's outcome and nonce reach everyone; each then reads the nonce from its own
    # view of the workdir, and all learn who does not see it
    mine = np.frombuffer(bytes.fromhex(nonce), np.uint8).astype(np.int32)
    first = _agree(np.concatenate([[int(error is None)], mine]).astype(np.int32))[0]
    if not first[0]:
      if error is None:
        error = WorkdirBusyError(f"process 0 could not claim workdir {workdir} (its log says "
                                 f"why)")
    else:
      nonce = bytes(first[1:].astype(np.uint8)).hex()
      sees = _agree(np.asarray([int(_read_nonce(workdir) == nonce)], np.int32))[:, 0]
      if not sees.all():
        blind = [i for i, s in enumerate(sees) if not s]
        error = WorkdirNotSharedError(
            f"processes {blind} of {len(sees)} do not see workdir {workdir} as process 0 wrote "
            f"it: every process of a job needs the same workdir (a shared file system or a "
            f"bucket such as gs://...), not a local path on each host")
  if error is not None:
    if fd is not None:
      os.close(fd)
    _remove_unused(created, workdir)
    raise error
  _held[real] = 1
  try:
    yield workdir
  except BaseException:
    if fd is not None:
      os.close(fd)
      fd = None
    _remove_unused(created, workdir)  # a run refused at start-up leaves no workdir it made
    raise
  finally:
    _held.pop(real, None)
    if fd is not None:
      os.close(fd)  # (the lock file stays: its record says who held it last)


def _make(workdir: str) -> str | None:
  """Makes `workdir` (and its missing parents); returns the topmost directory it made (None:
  it existed). A file in its place is a `WorkdirNotADirectoryError` naming it."""
  top, d = None, os.path.abspath(workdir)
  while not os.path.lexists(d) and d != os.path.dirname(d):
    top, d = d, os.path.dirname(d)
  if os.path.lexists(d) and not os.path.isdir(d):
    raise WorkdirNotADirectoryError(
        f"--workdir {workdir}: {d} is a file, not a directory; give a directory (a new one is "
        f"made)")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise WorkdirNotADirectoryError(f"--workdir {workdir} cannot be made: {e.strerror or e} "
                                    f"({e.filename or workdir})") from None
  return top


def _remove_unused(created: str | None, workdir: str) -> None:
  """Removes the directories this claim made (`created`: the topmost) when the run wrote
  nothing in them but the lock file."""
  if created is None:
    return
  lock = os.path.join(os.path.abspath(workdir), LOCK_NAME)
  for d, _, files in os.walk(created):
    if any(os.path.join(d, f) != lock for f in files):
      return
  import shutil
  shutil.rmtree(created, ignore_errors=True)


def runs_under(path: str, max_depth: int = 3) -> list[str]:
  """The training runs (directories with a metrics.jsonl) below `path`, sorted: the runs of
  a demo workdir (`W/<task>/<method>`) or a TAG workdir's probes."""
  found = []
  base = path.rstrip(os.sep).count(os.sep)
  for d, subdirs, files in os.walk(path):
    if d.count(os.sep) - base >= max_depth:
      subdirs[:] = []
    if d != path and "metrics.jsonl" in files:
      found.append(d)
  return sorted(found)


def where_the_runs_are(path: str) -> str:
  """For an error about a directory that is not one run: where its runs are, if it holds any."""
  runs = runs_under(path) if os.path.isdir(path) else []
  if not runs:
    return ""
  shown = ", ".join(runs[:6]) + (f", ... ({len(runs)} in all)" if len(runs) > 6 else "")
  return (f"; {path} holds {len(runs)} runs in its subdirectories (a demo workdir has one per "
          f"task and method, W/<task>/<method>): {shown}. Give one of them")
