"""Host side of the code sandbox: the fork server, one run's I/O, the probe launcher.

Private to ``mr_rl.rewards.code`` (see its docstring for the design); the code
that runs inside the sandbox is ``_sandbox_harness.py``.
"""

from __future__ import annotations

import json
import marshal
import os
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

_HARNESS_PATH = Path(__file__).with_name("_sandbox_harness.py")
# Compiled once here; the sandbox gets the marshalled code object on its command
# line (no file to swap, no 50 ms compile per run).
_HARNESS_CODE = marshal.dumps(compile(_HARNESS_PATH.read_text(), str(_HARNESS_PATH), "exec")).hex()
_BOOT = "import marshal,sys;exec(marshal.loads(bytes.fromhex(sys.argv.pop(1))))"


class SandboxError(RuntimeError):
  """The sandbox could not be set up as required (not a verdict on a program)."""


def _rmtree(path):
  def retry(func, p, _):
    os.chmod(os.path.dirname(p), stat.S_IRWXU)
    if os.path.isdir(p) and not os.path.islink(p):
      os.chmod(p, stat.S_IRWXU)
    func(p)
  shutil.rmtree(path, onerror=retry)


def _boot_args(python):
  if os.path.realpath(python) == os.path.realpath(sys.executable):
    return [_BOOT, _HARNESS_CODE]
  return [_HARNESS_PATH.read_text()]  # another interpreter cannot load this one's marshalled code


def _env(home):
  return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
          "HOME": home, "TMPDIR": home}


def _launch(config, cfg, stdin_bytes, wall_s, workdir, home):
  """Starts the harness directly (the capability probe); returns (stdout, stderr, timed_out, wall s)."""
  t0 = time.perf_counter()
  proc = subprocess.Popen([config.python, "-I", "-S", "-c", *_boot_args(config.python), json.dumps(cfg)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=workdir, env=_env(home), start_new_session=True, close_fds=True)
  timed_out = False
  try:
    out, err = proc.communicate(stdin_bytes, timeout=wall_s)
  except subprocess.TimeoutExpired:
    timed_out = True
  finally:
    try:
      os.killpg(proc.pid, signal.SIGKILL)  # the whole run: supervisor, zygote, workers
    except (ProcessLookupError, PermissionError):
      pass
  if timed_out:
    out, err = proc.communicate()
  proc.wait()
  return out, err, timed_out, time.perf_counter() - t0


class _ForkServer:
  """A harness process that forks one supervisor per run (``fork_server`` in the harness).

  Saves the interpreter start-up and imports of every run. It holds no job
  data: a run's job goes from here straight to its own supervisor's stdin.
  One server per interpreter and per process (a forked trainer gets its own);
  it exits when this end of its socket closes.
  """
  _servers: dict = {}
  _servers_lock = threading.Lock()

  @classmethod
  def get(cls, python):
    with cls._servers_lock:
      key = (os.getpid(), python)
      server = cls._servers.get(key)
      if server is None or server.proc.poll() is not None:
        server = cls._servers[key] = cls(python)
      return server

  def __init__(self, python):
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    cfg = {"role": "server", "fd": theirs.fileno()}
    self.proc = subprocess.Popen([python, "-I", "-S", "-c", *_boot_args(python), json.dumps(cfg)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, pass_fds=[theirs.fileno()], cwd="/",
                                 env=_env("/"), start_new_session=True)
    theirs.close()
    self.sock = mine
    self.lock = threading.Lock()

  def spawn(self, cfg, env, cwd):
    """Returns (pid, stdin write fd, stdout read fd, stderr read fd) of a new supervisor."""
    (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
    try:
      with self.lock:
        socket.send_fds(self.sock, [json.dumps({"cfg": cfg, "env": env, "cwd": cwd}).encode()],
                        [in_r, out_w, err_w])
        reply = self.sock.recv(64)
    except OSError as e:
      reply = b""
      self.proc.kill()
    finally:
      for fd in (in_r, out_w, err_w):
        os.close(fd)
    if not reply:
      for fd in (in_w, out_r, err_r):
        os.close(fd)
      raise SandboxError("the sandbox fork server died; the next run starts a new one")
    return int(reply), in_w, out_r, err_r


def _exchange(pid, in_w, out_r, err_r, data, wall_s, max_out=1 << 20):
  """Writes ``data`` to the supervisor, reads its stdout/stderr to EOF or the deadline.

  Always kills the supervisor's process group (session) before returning.
  Returns (stdout, stderr, timed_out, wall seconds).
  """
  t0 = time.perf_counter()
  deadline = time.monotonic() + wall_s
  out, err, timed_out, pos = [], [], False, 0
  view = memoryview(data)
  sel = selectors.DefaultSelector()
  os.set_blocking(in_w, False)
  sel.register(in_w, selectors.EVENT_WRITE)
  sel.register(out_r, selectors.EVENT_READ, out)
  sel.register(err_r, selectors.EVENT_READ, err)
  readers = 2
  try:
    while readers:
      left = deadline - time.monotonic()
      events = sel.select(left) if left > 0 else []
      if not events:
        timed_out = True
        break
      for key, _ in events:
        if key.fd == in_w:
          try:
            pos += os.write(in_w, view[pos:pos + (1 << 16)])
          except BrokenPipeError:
            pos = len(data)
          if pos >= len(data):
            sel.unregister(in_w)
            os.close(in_w)
            in_w = None
        else:
          chunk = os.read(key.fd, 1 << 16)
          if not chunk:
            sel.unregister(key.fd)
            readers -= 1
          elif sum(map(len, key.data)) < max_out:
            key.data.append(chunk)
  finally:
    sel.close()
    for sig_target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
      try:
        sig_target()
      except (ProcessLookupError, PermissionError):
        pass
    for fd in (in_w, out_r, err_r):
      if fd is not None:
        os.close(fd)
  return b"".join(out), b"".join(err), timed_out, time.perf_counter() - t0
