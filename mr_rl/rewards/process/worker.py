"""Reward worker processes: ``python -m mr_rl.rewards.process.worker FD`` (docs/methods.md §7).

``pool.HardTimeoutPool`` starts this module as a fresh interpreter (a *zygote*) with one end
of a Unix socket pair as FD. The zygote never imports the caller's ``__main__``: it imports
only this module, the preload modules it is sent and, in the workers, whatever the calls sent
to them unpickle (functions are pickled by reference, so they must live in importable
modules). Workers are forked from the zygote, so they start in milliseconds with the preload
modules (math-verify's parser caches) already in memory.

Protocol (every message is an 8-byte big-endian length and a pickle):

* parent -> zygote: ``{"sys_path", "cwd", "preload"}`` once, answered ``("ready", pid)`` or
  ``("error", traceback)``; then ``("spawn", None)`` carrying a socket FD (SCM_RIGHTS),
  answered ``("spawned", pid)``: a worker forked on that socket; ``("kill", pid)``, answered
  ``("killed", wait_status | None)``: the worker's process group is SIGKILLed and reaped.
  EOF (the parent closed or died): every worker is killed and the zygote exits.
* parent -> worker: ``("setup", sys_path, cwd, imports, initializers_pickle, max_bytes)``
  once (``max_bytes``: the worker's RLIMIT_DATA, or None), answered
  ``("ready", None)`` or ``("error", traceback)``; then ``(sys_path | None, call_pickle)``
  per call, answered ``("ok", value)``, ``("raise", exception, traceback)`` or
  ``("load_error", traceback)`` (the call did not unpickle here). EOF: the worker exits.

Only the zygote forks (it is single-threaded), each worker leads its own process group (so a
kill also takes its children) and dies with the zygote (PR_SET_PDEATHSIG on Linux). SIGINT is
ignored: the parent owns Ctrl-C and closes the pool.
"""

from __future__ import annotations

import gc
import importlib
import os
import pickle
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any, Sequence

_HEADER = struct.Struct("!Q")
_PR_SET_PDEATHSIG = 1


# ------------------------------------------------------------------------- framing
def send_msg(sock: socket.socket, obj: Any, fds: Sequence[int] = ()) -> None:
  """Sends one pickled message (and `fds` as SCM_RIGHTS with its first bytes)."""
  data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
  buf = _HEADER.pack(len(data)) + data
  sock.settimeout(None)
  sent = socket.send_fds(sock, [buf], list(fds)) if fds else 0
  if sent < len(buf):
    sock.sendall(memoryview(buf)[sent:])


def _recv_into(sock: socket.socket, view: memoryview, deadline: float | None) -> None:
  if deadline is None:
    sock.settimeout(None)
  while len(view):
    if deadline is not None:
      left = deadline - time.monotonic()
      if left <= 0:
        raise TimeoutError("no reply before the deadline")
      sock.settimeout(left)
    n = sock.recv_into(view)
    if n == 0:
      raise EOFError("the peer closed the connection")
    view = view[n:]


def recv_msg(sock: socket.socket, deadline: float | None = None,
             max_fds: int = 0) -> tuple[Any, list[int]]:
  """Receives one message; returns (unpickled object, received fds).

  Raises:
    EOFError: the peer closed the socket (died).
    TimeoutError: `deadline` (time.monotonic) passed first.
  """
  header = bytearray(_HEADER.size)
  fds: list[int] = []
  view = memoryview(header)
  if max_fds:
    sock.settimeout(None)
    first, fds, _, _ = socket.recv_fds(sock, _HEADER.size, max_fds)
    if not first:
      raise EOFError("the peer closed the connection")
    view[:len(first)] = first
    view = view[len(first):]
  _recv_into(sock, view, deadline)
  body = bytearray(_HEADER.unpack(header)[0])
  _recv_into(sock, memoryview(body), deadline)
  return pickle.loads(body), fds


def recv_raw(sock: socket.socket, deadline: float | None = None) -> bytes:
  """Receives one message without unpickling it (a worker's reply)."""
  header = bytearray(_HEADER.size)
  _recv_into(sock, memoryview(header), deadline)
  body = bytearray(_HEADER.unpack(header)[0])
  _recv_into(sock, memoryview(body), deadline)
  return bytes(body)


# -------------------------------------------------------------------------- worker
def _set_path(sys_path: Sequence[str]) -> None:
  sys.path[:] = list(sys_path)
  importlib.invalidate_caches()


def _reply(sock: socket.socket, out: tuple) -> None:
  """Sends `out`; an unpicklable value or exception is replaced by a RuntimeError."""
  try:
    data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
    if out[0] == "raise":
      pickle.loads(data)  # exceptions with custom __init__ may pickle but not unpickle
  except Exception as e:  # pylint: disable=broad-except
    what = "exception" if out[0] == "raise" else "result"
    detail = f"{type(out[1]).__qualname__}: {out[1]}" if out[0] == "raise" else repr(e)
    out = ("raise", RuntimeError(f"the reward call's {what} could not be sent back "
                                 f"({detail})"), out[2] if out[0] == "raise" else "")
    data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
  sock.settimeout(None)
  sock.sendall(_HEADER.pack(len(data)) + data)


def _cap_data(max_bytes: int | None) -> None:
  """RLIMIT_DATA = ``max_bytes``: past it, an allocation fails (MemoryError) instead of
  growing the worker. Refused when the worker already holds more than half of it."""
  if max_bytes is None:
    return
  import resource  # pylint: disable=import-outside-toplevel
  with open("/proc/self/status") as f:
    held = next((int(l.split()[1]) * 1024 for l in f if l.startswith("VmData:")), 0)
  if held > max_bytes // 2:
    raise MemoryError(f"a fresh worker already holds {held >> 20} MiB of data, more than half "
                      f"of max_worker_bytes ({max_bytes >> 20} MiB): raise the cap")
  resource.setrlimit(resource.RLIMIT_DATA, (max_bytes, max_bytes))


def _serve_calls(sock: socket.socket) -> None:
  (_, sys_path, cwd, imports, inits_pickle, max_bytes), _ = recv_msg(sock)
  try:
    os.chdir(cwd)
    _set_path(sys_path)
    for module in imports:
      importlib.import_module(module)
    for fn, args in pickle.loads(inits_pickle):
      fn(*args)
    if sys.platform.startswith("linux"):
      _cap_data(max_bytes)
  except BaseException:  # pylint: disable=broad-except
    send_msg(sock, ("error", traceback.format_exc()))
    return
  send_msg(sock, ("ready", None))
  while True:
    try:
      (sys_path, call), _ = recv_msg(sock)
    except (EOFError, OSError):
      return
    if sys_path is not None:
      _set_path(sys_path)
    try:
      fn, args = pickle.loads(call)
    except BaseException:  # pylint: disable=broad-except
      _reply(sock, ("load_error", traceback.format_exc()))
      continue
    try:
      out = ("ok", fn(*args))
    except BaseException as e:  # pylint: disable=broad-except
      out = ("raise", e, traceback.format_exc())
    _reply(sock, out)


def _worker_main(fd: int, zygote_pid: int, prctl: Any) -> int:
  if prctl is not None:
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  if os.getppid() != zygote_pid:  # the zygote died before prctl took effect
    return 1
  sock = socket.socket(fileno=fd)
  sock.settimeout(None)
  _serve_calls(sock)
  return 0


# -------------------------------------------------------------------------- zygote
def _kill(pid: int, children: set[int], exited: dict[int, int]) -> int | None:
  """SIGKILLs worker `pid`'s process group and reaps the worker. A worker that exited
  already may have left children in its group (a process started by a call): they are
  killed too."""
  if pid in exited:
    try:
      os.killpg(pid, signal.SIGKILL)
    except OSError:  # no process left in the group
      pass
    return exited.pop(pid)
  if pid not in children:
    return None
  try:
    os.killpg(pid, signal.SIGKILL)
  except OSError:
    os.kill(pid, signal.SIGKILL)
  children.discard(pid)
  return os.waitpid(pid, 0)[1]


def _reap(children: set[int], exited: dict[int, int]) -> None:
  for pid in list(children):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
      children.discard(pid)
      exited[pid] = status


def _prctl() -> Any:
  if not sys.platform.startswith("linux"):
    return None
  import ctypes  # pylint: disable=import-outside-toplevel
  try:
    return ctypes.CDLL(None, use_errno=True).prctl
  except (OSError, AttributeError):
    return None


def main(argv: Sequence[str] | None = None) -> int:
  """Zygote: preload, then fork a worker per "spawn" until the parent closes the socket."""
  argv = sys.argv[1:] if argv is None else argv
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  ctrl = socket.socket(fileno=int(argv[0]))
  setup, _ = recv_msg(ctrl)
  try:
    os.chdir(setup["cwd"])
    _set_path(setup["sys_path"])
    for module in setup["preload"]:
      importlib.import_module(module)
  except BaseException:  # pylint: disable=broad-except
    send_msg(ctrl, ("error", traceback.format_exc()))
    return 1
  prctl, me = _prctl(), os.getpid()
  gc.freeze()  # preloaded objects stay out of the workers' collections: no copy-on-write storm
  send_msg(ctrl, ("ready", me))
  children: set[int] = set()
  exited: dict[int, int] = {}
  while True:
    try:
      (cmd, arg), fds = recv_msg(ctrl, max_fds=1)
    except (EOFError, OSError):
      break
    _reap(children, exited)
    if cmd == "spawn":
      pid = os.fork()
      if pid == 0:  # the worker
        code = 70
        try:
          os.setpgid(0, 0)
          ctrl.close()
          code = _worker_main(fds[0], me, prctl)
        finally:
          os._exit(code)  # pylint: disable=protected-access
      try:
        os.setpgid(pid, pid)
      except OSError:  # the child already did it (or already exited)
        pass
      os.close(fds[0])
      children.add(pid)
      send_msg(ctrl, ("spawned", pid))
    elif cmd == "kill":
      send_msg(ctrl, ("killed", _kill(arg, children, exited)))
    else:
      send_msg(ctrl, ("error", f"unknown command {cmd!r}"))
  for pid in list(children):
    _kill(pid, children, exited)
  return 0


if __name__ == "__main__":
  sys.exit(main())
