"""A directory written whole or not at all: built in a sibling, renamed into place when complete.

`staged(out, keep)` gives the writer `<out>.incomplete-export.<host>.<pid>` to fill; when the
block ends normally that directory becomes `out` by a rename (on the same file system, so no
reader ever sees a half-written `out`). An exception removes it and leaves `out` as it was; a
killed process leaves it under its `incomplete-export` name, never under `out`.

Replacing a non-empty `out`: the entries of the old `out` that the new one lacks and that
`keep(name)` accepts (a user's own notes) are copied in, then the old `out` is renamed to
`<out>.replaced-export.<host>.<pid>`, the new one renamed onto `out`, and the old one deleted.
A process killed between those two renames leaves no `out`: the earlier directory is under
its `replaced-export` name, the new, complete one under its `incomplete-export` name.

Leftovers of a process of this host that no longer runs are removed when the next `staged`
for the same `out` starts (an `incomplete-export` always; a `replaced-export` only when `out`
exists, i.e. the swap had finished), and each removal is logged; leftovers of a live process
or of another host are left alone, with a log line naming them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
from typing import Callable, Iterator

INCOMPLETE, REPLACED = "incomplete-export", "replaced-export"
_LEFTOVER = re.compile(rf"\.({INCOMPLETE}|{REPLACED})\.(?P<host>.+)\.(?P<pid>\d+)$")


def _host() -> str:
  return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def sibling(out: str, kind: str) -> str:
  """`<out>.<kind>.<host>.<pid>`: this process's staging (`INCOMPLETE`) or set-aside
  (`REPLACED`) directory for `out`."""
  return f"{out}.{kind}.{_host()}.{os.getpid()}"


def _runs(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


def leftovers(out: str) -> list[str]:
  """The `incomplete-export` / `replaced-export` siblings of `out`, sorted."""
  parent, name = os.path.split(os.path.abspath(out))
  if not os.path.isdir(parent):
    return []
  return sorted(os.path.join(parent, n) for n in os.listdir(parent)
                if n.startswith(name + ".") and _LEFTOVER.fullmatch(n[len(name):]))


def clean_leftovers(out: str, log: Callable[[str], None] | None = print) -> None:
  """Removes the leftovers of `out` that stopped processes of this host left (module
  docstring); logs each one removed or kept."""
  log = log or (lambda _: None)
  out = os.path.abspath(out)
  for path in leftovers(out):
    m = _LEFTOVER.fullmatch(path[len(out):])
    kind, host, pid = m.group(1), m.group("host"), int(m.group("pid"))
    mine = host == _host() and (pid == os.getpid() or not _runs(pid))
    if not mine:
      log(f"left {path} alone: written by process {pid} on {host}, which may still run "
          f"(an export stopped midway is never under {out})")
    elif kind == REPLACED and not os.path.exists(out):
      log(f"kept {path}: it holds the earlier {out}, set aside by process {pid}, which stopped "
          f"before renaming its new export onto {out}; rename it back or delete it")
    else:
      what = "an incomplete export" if kind == INCOMPLETE else "the earlier export it replaced"
      shutil.rmtree(path)
      log(f"removed {path}: {what}, left by process {pid} of this host, which no longer runs")


def _carry(old: str, new: str, keep: Callable[[str], bool]) -> None:
  for name in os.listdir(old):
    src, dst = os.path.join(old, name), os.path.join(new, name)
    if os.path.lexists(dst) or not keep(name):
      continue
    if os.path.isdir(src) and not os.path.islink(src):
      shutil.copytree(src, dst, symlinks=True)
    else:
      shutil.copy2(src, dst, follow_symlinks=False)


def publish(staging: str, out: str, keep: Callable[[str], bool]) -> None:
  """Renames the complete `staging` onto `out` (module docstring)."""
  if os.path.isdir(out) and os.listdir(out):
    _carry(out, staging, keep)
    aside = sibling(out, REPLACED)
    os.rename(out, aside)
    try:
      os.rename(staging, out)
    except BaseException:
      os.rename(aside, out)
      raise
    shutil.rmtree(aside)
  else:  # no `out`, or an empty directory, which rename(2) replaces
    os.replace(staging, out)


@contextlib.contextmanager
def staged(out: str, keep: Callable[[str], bool] = lambda name: True,
           log: Callable[[str], None] | None = print) -> Iterator[str]:
  """Yields the directory to write `out` into; renames it onto `out` when the block ends
  normally, removes it when the block raises (module docstring).

  Args:
    out: the directory to write (a symlink to a directory: its target is replaced).
    keep: which entries of an existing `out` the new one takes over (when it lacks them).
    log: callable for the lines about leftovers of stopped processes, or None.
  """
  out = os.path.realpath(out)
  clean_leftovers(out, log)
  staging = sibling(out, INCOMPLETE)
  os.makedirs(os.path.dirname(out), exist_ok=True)
  os.mkdir(staging)
  try:
    yield staging
  except BaseException as e:
    shutil.rmtree(staging, ignore_errors=True)
    if hasattr(e, "add_note"):  # Python >= 3.11
      e.add_note(f"{out} is as it was before: the incomplete {staging} was removed")
    raise
  try:
    publish(staging, out, keep)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)  # (gone once renamed onto `out`)
    raise
