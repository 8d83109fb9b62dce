"""Process pool with hard wall-clock timeouts for heavy / untrusted reward code.

math-verify guards parse/verify with ``signal.alarm`` (main thread only) and sympy can hang
inside C code where no signal helps, so reward code that may hang runs in worker processes
that are killed when a call overruns (docs/methods.md §7; used by ``mr_rl.rewards.math``
and the "process" channels of ``mr_rl.rewards.runner``).

The workers are our own processes, not ``multiprocessing``'s: a zygote started as
``python -m mr_rl.rewards.process.worker`` (so they never import the caller's ``__main__``: reward
functions work from unguarded scripts, stdin, ``python -c`` and notebooks) forks them on
request and they talk to the pool over Unix sockets. The pool knows no client: a client
module passes what its workers need (``preload`` modules, an ``initializer``) to
``HardTimeoutPool`` or, for the process-wide pool, ``shared_pool().add_setup``.
"""

from __future__ import annotations

import atexit
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Callable, Sequence

from mr_rl.rewards.process import worker as _worker
from mr_rl.rewards.process.pickling import dumps_importable  # re-exported

# Directory that holds the `mr_rl` package this module belongs to: the zygote starts there,
# so `python -m mr_rl.rewards.process.worker` imports this very copy of the package.
_PACKAGE_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))


DEFAULT_MAX_CALLS_PER_WORKER = 1000
DEFAULT_MAX_WORKER_BYTES = 2 << 30  # a worker with math-verify loaded holds ~0.15-0.3 GiB
MIN_WORKER_BYTES = 64 << 20


class RewardTimeoutError(TimeoutError):
  """A reward call exceeded its wall-clock budget."""


class RewardWorkerError(RuntimeError):
  """A reward worker process died while running a call (`how`: its exit, e.g. 'killed by
  signal 11 (SIGSEGV)'; '' where not known)."""

  how = ""


class WorkerSetupError(RewardWorkerError):
  """The workers could not start, or a call could not be sent to / loaded by one.

  Not about the call's inputs: a preload module or initializer that fails, a function or
  argument that does not pickle or does not unpickle in the worker (defined in
  ``__main__``, a lambda, a module that is not importable there).
  """


class _RemoteTraceback(Exception):
  """The worker-side traceback, attached as ``__cause__`` of a re-raised exception."""

  def __init__(self, tb: str):
    super().__init__(tb)
    self.tb = tb

  def __str__(self) -> str:
    return self.tb


def _last_line(tb: str) -> str:
  """The exception line of a formatted traceback."""
  lines = tb.strip().splitlines()
  return lines[-1] if lines else "?"


def _describe(status: int | None) -> str:
  if status is None:
    return "exit status unknown"
  code = os.waitstatus_to_exitcode(status)
  if code < 0:
    import signal  # pylint: disable=import-outside-toplevel
    return f"killed by signal {-code} ({signal.Signals(-code).name})"
  return f"exit code {code}"


class _ZygoteDied(Exception):
  pass


class _Zygote:
  """The ``python -m mr_rl.rewards.process.worker`` process that forks the workers."""

  def __init__(self, preload: Sequence[str], timeout_s: float):
    self.preload = tuple(preload)
    self._lock = threading.Lock()
    ours, theirs = socket.socketpair()
    try:
      self._proc = subprocess.Popen(
          [sys.executable, "-m", "mr_rl.rewards.process.worker", str(theirs.fileno())],
          cwd=_PACKAGE_ROOT, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
    except OSError as e:
      ours.close()
      raise WorkerSetupError(f"worker pool failed to start: {e!r}") from e
    finally:
      theirs.close()
    self._sock = ours
    try:
      _worker.send_msg(ours, {"sys_path": list(sys.path), "cwd": os.getcwd(),
                              "preload": list(self.preload)})
      (status, detail), _ = _worker.recv_msg(ours, time.monotonic() + timeout_s)
    except (OSError, EOFError, TimeoutError) as e:
      self.close()
      raise WorkerSetupError(f"worker pool failed to start: {e!r}") from e
    if status != "ready":
      self.close()
      raise WorkerSetupError(f"worker pool failed to start: {_last_line(detail)} (preload "
                             f"{list(self.preload)})\n{detail}")

  def alive(self) -> bool:
    return self._proc.poll() is None

  def _request(self, cmd: str, arg: Any, fds: Sequence[int] = (), timeout_s: float = 60.0):
    with self._lock:
      try:
        _worker.send_msg(self._sock, (cmd, arg), fds)
        reply, _ = _worker.recv_msg(self._sock, time.monotonic() + timeout_s)
      except (OSError, EOFError, TimeoutError) as e:
        raise _ZygoteDied(repr(e)) from e
    return reply

  def spawn(self) -> tuple[socket.socket, int]:
    """A new worker: (our end of its socket, its pid)."""
    ours, theirs = socket.socketpair()
    try:
      status, pid = self._request("spawn", None, fds=(theirs.fileno(),))
    except _ZygoteDied:
      ours.close()
      raise
    finally:
      theirs.close()
    if status != "spawned":
      ours.close()
      raise WorkerSetupError(f"worker zygote refused to spawn: {pid}")
    return ours, pid

  def kill(self, pid: int) -> int | None:
    """SIGKILLs worker `pid` (and its process group); its wait status, None if unknown."""
    if not self.alive():
      return None  # its workers died with it (PR_SET_PDEATHSIG)
    try:
      return self._request("kill", pid)[1]
    except _ZygoteDied:
      return None

  def close(self) -> None:
    self._sock.close()  # EOF: the zygote kills its workers and exits
    try:
      self._proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()


class _Worker:
  __slots__ = ("zygote", "sock", "pid", "sys_path", "calls")

  def __init__(self, zygote: _Zygote, sock: socket.socket, pid: int):
    self.zygote, self.sock, self.pid = zygote, sock, pid
    self.sys_path: tuple[str, ...] = ()
    self.calls = 0


def data_bytes(pid: int) -> int | None:
  """Process ``pid``'s data size (``VmData``: private writable memory, what RLIMIT_DATA
  bounds), or None where /proc does not say."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmData:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError):
    pass
  return None


class HardTimeoutPool:
  """Worker processes whose calls have a hard wall-clock timeout.

  ``call`` takes an idle worker (or starts one, at most ``max_workers``; waiting for a worker
  never eats into a call's budget), sends it ``fn(*args)`` and waits ``timeout_s``. A call that
  overruns gets its own worker killed (nothing else is disturbed) and a worker that dies is
  blamed on exactly the call it was running; replacements fork from the zygote in
  milliseconds. The caller's current ``sys.path`` goes with every call whose worker has not
  seen it, so functions of modules added to the path later still import. Thread-safe; a
  process forked from the caller (``os.fork``, multiprocessing's "fork") starts its own
  zygote instead of sharing the parent's workers.

  Workers are bounded and recycled, so a reward that leaks cannot grow without bound: each
  worker's data size (private writable memory) is capped at ``max_worker_bytes``
  (RLIMIT_DATA: an allocation past it fails, so the call raises ``MemoryError`` or its worker
  dies, and either way the call fails: the runner scores the channel's failure value), and a
  worker is replaced after ``max_calls_per_worker`` calls or after a call that leaves it above
  half of ``max_worker_bytes`` (``recycled`` counts these).

  Args:
    max_workers: number of worker processes.
    initializer: picklable function run once in every worker (per-process state).
    initargs: its arguments.
    preload: modules the zygote imports once, so workers fork with them loaded.
    warmup_timeout_s: limit on starting the zygote and on starting one worker.
    max_calls_per_worker: calls after which a worker is replaced (None: never).
    max_worker_bytes: data-size cap of each worker (None: no cap, no memory recycling).
  """

  _MAX_ZYGOTE_RETRIES = 3

  def __init__(self, max_workers: int, initializer: Callable[..., None] | None = None,
               initargs: tuple[Any, ...] = (), preload: Sequence[str] = (),
               warmup_timeout_s: float = 120.0,
               max_calls_per_worker: int | None = DEFAULT_MAX_CALLS_PER_WORKER,
               max_worker_bytes: int | None = DEFAULT_MAX_WORKER_BYTES):
    if not isinstance(max_workers, int) or max_workers < 1:
      raise ValueError(f"max_workers must be a positive int, got {max_workers!r}")
    if warmup_timeout_s <= 0:
      raise ValueError(f"warmup_timeout_s must be > 0, got {warmup_timeout_s}")
    self.max_workers = max_workers
    self.max_calls_per_worker: int | None = None
    self.max_worker_bytes: int | None = None
    self.set_limits(max_calls_per_worker, max_worker_bytes)
    self.recycled = 0  # workers replaced after max_calls_per_worker calls or above the memory mark
    self._warmup_timeout_s = float(warmup_timeout_s)
    self._preload: list[str] = []
    self._inits: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
    self._cv = threading.Condition()
    self._idle: list[_Worker] = []
    self._count = 0  # live workers, idle or busy
    self._zygote: _Zygote | None = None
    self._zlock = threading.Lock()
    self._closed = False
    self.restarts = 0  # workers killed after a timeout or a crash
    self.add_setup(preload, initializer, initargs)
    _POOLS.add(self)

  def set_limits(self, max_calls_per_worker: int | None,
                 max_worker_bytes: int | None) -> None:
    """Sets the recycling rule and the memory cap (see the class docstring); workers started
    from now on get the new cap, every worker the new recycling rule."""
    for name, v, lo in (("max_calls_per_worker", max_calls_per_worker, 1),
                        ("max_worker_bytes", max_worker_bytes, MIN_WORKER_BYTES)):
      if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
        raise ValueError(f"{name} must be None or an int >= {lo}, got {v!r}")
    self.max_calls_per_worker, self.max_worker_bytes = max_calls_per_worker, max_worker_bytes

  def _forget_after_fork(self) -> None:
    """In a child made by ``os.fork``: the zygote and workers are the parent's; start afresh."""
    self._cv, self._zlock = threading.Condition(), threading.Lock()
    for worker in self._idle:
      worker.sock.close()  # our copy only: the parent's connection stays open
    if self._zygote is not None:
      self._zygote._sock.close()  # pylint: disable=protected-access
    self._idle, self._count, self._zygote = [], 0, None

  def add_setup(self, preload: Sequence[str] = (),
                initializer: Callable[..., None] | None = None,
                initargs: tuple[Any, ...] = ()) -> None:
    """Adds preload modules / an initializer for the workers (idempotent).

    Modules added after the zygote started are imported by every new worker instead.

    Raises:
      pickle.PicklingError: the initializer cannot be sent to a worker.
    """
    if isinstance(preload, str):
      raise TypeError(f"preload must be a sequence of module names, got {preload!r}")
    if initializer is not None:
      dumps_importable((initializer, tuple(initargs)))
    with self._cv:
      self._preload.extend(m for m in preload if m not in self._preload)
      if initializer is not None and (initializer, tuple(initargs)) not in self._inits:
        self._inits.append((initializer, tuple(initargs)))

  # ------------------------------------------------------------------------ workers
  def _get_zygote(self) -> _Zygote:
    with self._zlock:
      if self._closed:
        raise RuntimeError("HardTimeoutPool is closed")
      z = self._zygote
      if z is None or not z.alive():
        if z is not None:
          z.close()
        with self._cv:
          preload = tuple(self._preload)
        self._zygote = z = _Zygote(preload, self._warmup_timeout_s)
      return z

  def _spawn(self) -> _Worker:
    for _ in range(self._MAX_ZYGOTE_RETRIES):
      z = self._get_zygote()
      try:
        sock, pid = z.spawn()
      except _ZygoteDied:
        continue  # _get_zygote starts a new one
      worker = _Worker(z, sock, pid)
      with self._cv:
        imports = [m for m in self._preload if m not in z.preload]
        inits = dumps_importable(list(self._inits))
      worker.sys_path = tuple(sys.path)
      try:
        _worker.send_msg(sock, ("setup", list(worker.sys_path), os.getcwd(), imports, inits,
                                self.max_worker_bytes))
        (status, detail), _ = _worker.recv_msg(sock, time.monotonic() + self._warmup_timeout_s)
      except (OSError, EOFError, TimeoutError) as e:
        self._discard(worker)
        if not z.alive():
          continue
        raise WorkerSetupError(f"a reward worker failed to start: {e!r}") from e
      if status != "ready":
        self._discard(worker)
        raise WorkerSetupError(f"a reward worker failed to start: {_last_line(detail)} (imports "
                               f"{imports}, initializers {[f for f, _ in self._inits]})\n"
                               f"{detail}")
      return worker
    raise WorkerSetupError(f"the worker zygote died {self._MAX_ZYGOTE_RETRIES} times in a row")

  def _discard(self, worker: _Worker) -> int | None:
    """Kills `worker` (its process group); returns its wait status (None if unknown)."""
    status = worker.zygote.kill(worker.pid)  # before the socket closes: an idle worker exits
    worker.sock.close()  # at EOF, and its group would outlive it until the kill came
    return status

  def _acquire(self) -> _Worker:
    with self._cv:
      while True:
        if self._closed:
          raise RuntimeError("HardTimeoutPool is closed")
        if self._idle:
          return self._idle.pop()
        if self._count < self.max_workers:
          self._count += 1
          break
        self._cv.wait()
    try:
      return self._spawn()
    except BaseException:
      with self._cv:
        self._count -= 1
        self._cv.notify()
      raise

  def _release(self, worker: _Worker, healthy: bool) -> None:
    with self._cv:
      if healthy and not self._closed:
        self._idle.append(worker)
      else:
        self._count -= 1
        worker.sock.close()
      self._cv.notify()

  # --------------------------------------------------------------------------- calls
  def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
    """Runs ``fn(*args)`` in a worker; returns its result or re-raises its exception.

    Raises:
      RewardTimeoutError: the call ran longer than ``timeout_s`` seconds (its worker is
        killed).
      RewardWorkerError: the worker died running this call.
      WorkerSetupError: the workers cannot start, or the call cannot be sent to or loaded
        in a worker.
      Whatever ``fn`` raised, with the worker's traceback as ``__cause__``.
    """
    if not timeout_s or timeout_s <= 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", fn)
    try:
      payload = dumps_importable((fn, args))
    except pickle.PicklingError as e:
      raise WorkerSetupError(f"cannot send {name} to a reward worker: {e}") from e
    for _ in range(self._MAX_ZYGOTE_RETRIES):
      worker = self._acquire()
      healthy = False
      try:
        path = tuple(sys.path)
        _worker.send_msg(worker.sock, (None if path == worker.sys_path else list(path), payload))
        worker.sys_path = path
        reply = _worker.recv_raw(worker.sock, time.monotonic() + timeout_s)
        healthy = not self._recycle(worker)
      except TimeoutError:
        self._discard(worker)
        with self._cv:
          self.restarts += 1
        raise RewardTimeoutError(f"{name!s} exceeded {timeout_s:g} s") from None
      except (OSError, EOFError) as e:
        status = self._discard(worker)
        if not worker.zygote.alive():
          continue  # the zygote (and with it this worker) died: not this call's doing
        with self._cv:
          self.restarts += 1
        err = RewardWorkerError(f"reward worker died running {name!s} ({_describe(status)})")
        err.how = _describe(status)
        raise err from e
      finally:
        self._release(worker, healthy)
      return self._unpack(reply, name)
    raise RewardWorkerError(f"the worker zygote died {self._MAX_ZYGOTE_RETRIES} times during "
                            f"a call to {name!s}")

  def _recycle(self, worker: _Worker) -> bool:
    """After a call: replaces ``worker`` (killed now) when it has served its calls or is above
    half of its memory cap; returns whether it did."""
    worker.calls += 1
    limit, cap = self.max_calls_per_worker, self.max_worker_bytes
    used = data_bytes(worker.pid) if cap is not None else None
    if not ((limit is not None and worker.calls >= limit)
            or (used is not None and used > cap // 2)):
      return False
    self._discard(worker)
    with self._cv:
      self.recycled += 1
    return True

  @staticmethod
  def _unpack(reply: bytes, name: Any) -> Any:
    try:
      kind, *rest = pickle.loads(reply)
    except Exception as e:  # pylint: disable=broad-except
      raise RewardWorkerError(f"the reply of {name!s} could not be read: {e!r}") from e
    if kind == "ok":
      return rest[0]
    if kind == "raise":
      exc, tb = rest
      raise exc from _RemoteTraceback(tb)
    raise WorkerSetupError(f"a reward worker could not load the call to {name!s}: "
                           f"{_last_line(rest[0])}") from _RemoteTraceback(rest[0])

  def close(self) -> None:
    """Kills every worker and the zygote; later calls raise RuntimeError."""
    with self._zlock:
      with self._cv:
        self._closed = True
        idle, self._idle = self._idle, []
        self._cv.notify_all()
      for worker in idle:
        worker.sock.close()
      if self._zygote is not None:
        self._zygote.close()
        self._zygote = None


_POOLS: weakref.WeakSet[HardTimeoutPool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
  for p in list(_POOLS):
    p._forget_after_fork()  # pylint: disable=protected-access


os.register_at_fork(after_in_child=_after_fork_in_child)

_SHARED_POOL: HardTimeoutPool | None = None
_SHARED_POOL_LOCK = threading.Lock()


def shared_pool() -> HardTimeoutPool:
  """The process-wide pool for math-verify and other ``"process"`` channels.

  ``min(4, cpu_count)`` workers, created (as an object; no process runs before the first
  call) on first use and killed at interpreter exit. Client modules register what their
  workers need with ``shared_pool().add_setup(...)`` when imported.
  """
  global _SHARED_POOL
  with _SHARED_POOL_LOCK:
    if _SHARED_POOL is None:
      _SHARED_POOL = HardTimeoutPool(max_workers=min(4, os.cpu_count() or 1))
      atexit.register(_SHARED_POOL.close)
    return _SHARED_POOL
