"""Host side of the code sandbox: the fork server, one run's I/O, the probe launcher.

Used by ``runs`` and ``capabilities`` (see the package docstring for the design); the code
that runs inside the sandbox is ``HARNESS_FILES``, ending with ``harness.py``.
"""

from __future__ import annotations

import contextlib
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

from mr_rl.rewards.sandbox.spec import SandboxError  # re-exported: callers import it from here

# The harness is six stdlib-only files run in order in one namespace (wire format, syscall
# filter, kernel interfaces, cgroups, the supervisor's checker, process roles). Each is compiled once
# here; the sandbox gets the marshalled code objects on its command line (no file to swap, no 50 ms
# compile per run; one argument per file, as Linux caps one argument at 128 KiB).
HARNESS_FILES = tuple(Path(__file__).with_name(n) for n in (
    "wire.py", "seccomp.py", "kernel.py", "cgroups.py", "check.py", "harness.py"))
_HARNESS_CODE = tuple(marshal.dumps(compile(p.read_text(), str(p), "exec")).hex()
                      for p in HARNESS_FILES)
_BOOT = ("import marshal,sys\n"
         "for _c in [sys.argv.pop(1) for _ in range(%d)]: exec(marshal.loads(bytes.fromhex(_c)))"
         % len(HARNESS_FILES))
_BOOT_SRC = ("import sys\n"
             "for _s in [sys.argv.pop(1) for _ in range(%d)]:\n"
             "  exec(compile(_s, '<sandbox>', 'exec'))"
             % len(HARNESS_FILES))


def rmtree(path):
  def retry(func, p, _):
    os.chmod(os.path.dirname(p), stat.S_IRWXU)
    if os.path.isdir(p) and not os.path.islink(p):
      os.chmod(p, stat.S_IRWXU)
    func(p)
  shutil.rmtree(path, onerror=retry)


def _boot_args(python):
  if os.path.realpath(python) == os.path.realpath(sys.executable):
    return [_BOOT, *_HARNESS_CODE]
  # Another interpreter cannot load this one's marshalled code: the sources instead.
  return [_BOOT_SRC, *(p.read_text() for p in HARNESS_FILES)]


def scrubbed_env(home):
  return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
          "HOME": home, "TMPDIR": home}


def launch(config, cfg, stdin_bytes, wall_s, workdir, home):
  """Starts the harness directly (the capability probe); returns (stdout, stderr, timed_out, wall s)."""
  t0 = time.perf_counter()
  proc = subprocess.Popen([config.python, "-I", "-S", "-c", *_boot_args(config.python), json.dumps(cfg)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=workdir, env=scrubbed_env(home), start_new_session=True, close_fds=True)
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


class ForkServer:
  """A harness process that forks one supervisor per run (``fork_server`` in the harness).

  Saves the interpreter start-up and imports of every run. It holds no job data: a run's
  job goes from here straight to its own supervisor's stdin. Servers are pooled per
  (process, interpreter, cgroup spec) and each serves one run at a time (``acquire``), so
  a server's memory cgroup bounds exactly one run; a forked trainer gets its own. A server
  exits when this end of its socket closes.

  Before a run, a server waits until the previous run's processes are gone (about 2 ms of
  teardown). ``acquire`` hides that wait: it hands out the server idle longest, and starts
  one more server when the only idle one was released less than ``FRESH_S`` ago, so a pool
  settles at one server more than its concurrent users.
  """
  FRESH_S = 0.05
  _idle: dict = {}  # key -> [(release time, server)], oldest first
  _lock = threading.Lock()

  @classmethod
  @contextlib.contextmanager
  def acquire(cls, python, cgroup=None, ids=None, uid_range=None):
    """An idle server for ``python`` whose runs go into a cgroup made from ``cgroup``
    (``capabilities.cgroup_spec``, or None for no cgroup) and, in namespace modes, a
    user namespace mapping ``ids`` (uid, gid), with the uid a slot of its own from
    ``uid_range`` (first, count) when given (``uids.claim``); started if none is idle."""
    key = (os.getpid(), python, json.dumps(cgroup, sort_keys=True), ids, uid_range)
    with cls._lock:
      idle = cls._idle.setdefault(key, [])
      for _, dead in [(t, s) for t, s in idle if s.proc.poll() is not None]:
        dead.release()
      idle[:] = [(t, s) for t, s in idle if s.proc.poll() is None]
      server = None
      if idle and (len(idle) > 1 or time.monotonic() - idle[0][0] > cls.FRESH_S):
        server = idle.pop(0)[1]
    server = server or cls(python, cgroup, uid_range)
    try:
      yield server
    finally:
      if server.proc.poll() is None:
        with cls._lock:
          cls._idle.setdefault(key, []).append((time.monotonic(), server))
      else:
        server.release()

  @classmethod
  def get(cls, python, cgroup=None, ids=None, uid_range=None):
    """Some live idle server of this pool (for tests that kill one), or None."""
    with cls._lock:
      key = (os.getpid(), python, json.dumps(cgroup, sort_keys=True), ids, uid_range)
      for _, server in cls._idle.get(key, []):
        if server.proc.poll() is None:
          return server
    return None

  def __init__(self, python, cgroup=None, uid_range=None):
    # The slot's own host uid (None: the config's one uid), claimed before the server starts.
    from mr_rl.rewards.sandbox import uids  # pylint: disable=import-outside-toplevel
    self._lease = uids.claim(*uid_range) if uid_range else None
    self.uid = self._lease.uid if self._lease else None
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    cfg = {"role": "server", "fd": theirs.fileno(), "cgroup": cgroup}
    try:
      self.proc = subprocess.Popen(
          [python, "-I", "-S", "-c", *_boot_args(python), json.dumps(cfg)],
          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
          pass_fds=[theirs.fileno()], cwd="/", env=scrubbed_env("/"), start_new_session=True)
    except BaseException:
      mine.close()
      self.release()
      raise
    finally:
      theirs.close()
    self.sock = mine

  def release(self):
    """Gives up the slot's uid (the server has exited: its runs' processes died with it)."""
    if self._lease is not None:
      self._lease.release()
      self._lease = None

  def spawn(self, cfg, env, cwd):
    """Returns (pid, stdin write fd, stdout read fd, stderr read fd) of a new supervisor."""
    (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
    try:
      socket.send_fds(self.sock, [json.dumps({"cfg": cfg, "env": env, "cwd": cwd}).encode()],
                      [in_r, out_w, err_w])
      reply = self.sock.recv(64)
    except OSError:
      reply = b""
    finally:
      for fd in (in_r, out_w, err_w):
        os.close(fd)
    if not reply.isdigit() or int(reply) <= 0:
      for fd in (in_w, out_r, err_r):
        os.close(fd)
      self.proc.kill()
      why = ("the previous run's processes did not exit" if reply == b"0" else "it died")
      raise SandboxError(f"the sandbox fork server failed ({why}); the next run starts a new one")
    return int(reply), in_w, out_r, err_r


def exchange(pid, in_w, out_r, err_r, data, wall_s, max_out=1 << 20):
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
