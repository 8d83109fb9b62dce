"""Per-slot host uids of the code sandbox (host side).

The kernel keeps some counts per host uid, whatever the namespaces: descriptors in flight over
Unix sockets (bounded by the sender's RLIMIT_NOFILE, per uid), pipe buffer pages
(``fs.pipe-user-pages-soft``: past it every new pipe of the uid gets 2 pages), epoll watches,
SHM_LOCK'ed memory. When every run ran as uid 65534, one run holding 506 descriptors in flight
made a concurrent run's descriptor passing fail ("Too many references"), and one holding 1,125
pipes shrank a concurrent run's new pipes to 8 KiB (a 16 KiB round trip hung). So each fork
server - one concurrent run - runs its runs as a host uid of its own from
``SandboxConfig.uid_range``, claimed machine-wide for the server's lifetime with an exclusive
``flock`` on ``<lock dir>/<uid>.lock`` (another trainer, or another process of this one,
skips a held uid). The lock directory is root's (``/run/mr_rl_sandbox_uids``, or under the
temp dir where there is no ``/run``); per-slot uids need root, as the uid drop does.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile

from mr_rl.rewards.sandbox.spec import SandboxError

LOCK_DIR_NAME = "mr_rl_sandbox_uids"


def lock_dir() -> str:
  """The directory of the uid locks: root's, mode 0700 (created if missing)."""
  base = "/run" if os.path.isdir("/run") else tempfile.gettempdir()
  path = os.path.join(base, LOCK_DIR_NAME)
  try:
    os.mkdir(path, 0o700)
  except FileExistsError:
    pass
  st = os.lstat(path)
  if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
    raise SandboxError(f"{path} must be a directory of uid {os.geteuid()} writable by no one "
                       f"else (per-slot sandbox uid locks); found mode {oct(st.st_mode)}, uid "
                       f"{st.st_uid}")
  return path


class UidLease:
  """A claimed uid; held until ``release`` (or this process and its forks close the fd)."""

  def __init__(self, uid: int, fd: int):
    self.uid, self._fd = uid, fd

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


def claim(first: int, count: int) -> UidLease:
  """The first uid of ``[first, first + count)`` no other process holds.

  Raises:
    SandboxError: every uid of the range is held (more concurrent slots than uids).
  """
  d = lock_dir()
  for uid in range(first, first + count):
    fd = os.open(os.path.join(d, f"{uid}.lock"),
                 os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      continue
    return UidLease(uid, fd)
  raise SandboxError(f"every uid of SandboxConfig.uid_range ({first}..{first + count - 1}) is "
                     f"held by a running sandbox slot: widen the range or run fewer at once")
