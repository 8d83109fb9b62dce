"""Cgroups of the code sandbox: one memory cgroup and one CPU cgroup bound every process of a run.

Stdlib only. Part of the harness that runs inside the sandbox (``host.HARNESS_FILES``, run in
order in one namespace): the fork server enters cgroups of ``memory_bytes`` and ``cpus`` with
``cgroup_enter`` and waits for each run's processes to leave them. The host imports it to find
the hierarchies (``find_cgroup``), the tests to check that search.
"""

import errno
import os
import signal
import time

CGROUP_PARENT = "mr_rl_sandbox"


def _write(path, text):
  with open(path, "w") as f:
    f.write(text)


def _unescape(field):
  """A mountinfo path field: octal escapes of space, tab, newline and backslash undone."""
  for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
    field = field.replace(code, char)
  return field


def find_cgroup(controller, mountinfo="/proc/self/mountinfo", own="/proc/self/cgroup"):
  """Where sandbox cgroups with ``controller`` ("memory", "cpu") can go: ``(version,
  parent_dir)`` or ``(None, why)``.

  cgroup v2 (preferred): ``<mount>/mr_rl_sandbox``, a child of the root cgroup (a cgroup
  with processes cannot delegate controllers). cgroup v1: ``mr_rl_sandbox`` under this
  process's own cgroup of that hierarchy, so that sandboxes stay inside the limits imposed on it.
  """
  with open(own) as f:
    own_lines = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
  v1 = v2 = None
  with open(mountinfo) as f:
    for line in f:
      fields = line.split()
      sep = fields.index("-")
      root, point, fstype, opts = fields[3], _unescape(fields[4]), fields[sep + 1], fields[sep + 3]
      if fstype == "cgroup2" and v2 is None:
        try:
          with open(os.path.join(point, "cgroup.controllers")) as c:
            if controller in c.read().split():
              v2 = point
        except OSError:
          pass
      elif fstype == "cgroup" and controller in opts.split(",") and v1 is None:
        for _, controllers, path in own_lines:
          if controller in controllers.split(","):
            if root != "/" and path.startswith(root):
              path = path[len(root):]
            v1 = point + path.rstrip("/")
  if v2:
    return 2, os.path.join(v2, CGROUP_PARENT)
  if v1:
    return 1, os.path.join(v1, CGROUP_PARENT)
  return None, f"no cgroup v2 hierarchy with the {controller} controller and no cgroup v1 {controller} hierarchy"


def _enable(directory, controllers):
  with open(os.path.join(directory, "cgroup.subtree_control")) as f:
    missing = set(controllers) - set(f.read().split())
  if missing:
    _write(os.path.join(directory, "cgroup.subtree_control"), " ".join(f"+{c}" for c in sorted(missing)))


def cgroup_enter(spec, name):
  """Creates ``<parent>/<name>`` for each ``[version, parent, settings]`` of ``spec["dirs"]``
  (one per hierarchy: on cgroup v1 memory and cpu are two), writes its ``settings`` (file ->
  value; a name starting with "?" is written only where the file exists, e.g. swap
  accounting) and moves this process (root) into it; children inherit it at fork, with no
  migration cost.

  Returns ``[(path, origin)]``: ``origin`` is the cgroup left, for ``cgroup_leave``.
  """
  entered = []
  try:
    for version, parent, settings in spec["dirs"]:
      entered.append(_enter_one(version, parent, settings, name))
  except OSError:
    for path, origin in reversed(entered):
      cgroup_leave(path, origin)
    raise
  return entered


def _enter_one(version, parent, settings, name):
  if version == 2:
    with open("/proc/self/cgroup") as f:
      own = [line.strip()[3:] for line in f if line.startswith("0::")]
    origin = os.path.dirname(parent) + (own[0] if own and own[0] != "/" else "")
  else:
    origin = os.path.dirname(parent)
  try:
    os.mkdir(parent)
  except FileExistsError:
    pass
  if version == 2:
    controllers = {k.lstrip("?").split(".")[0] for k in settings}
    _enable(os.path.dirname(parent), controllers)
    _enable(parent, controllers)
  path = os.path.join(parent, name)
  os.mkdir(path)
  try:
    for key, value in settings.items():
      file = os.path.join(path, key.lstrip("?"))
      if not key.startswith("?") or os.path.exists(file):
        for line in value if isinstance(value, list) else [value]:  # a list: one write each
          _write(file, str(line))
    _write(os.path.join(path, "cgroup.procs"), "0")
  except OSError:
    os.rmdir(path)
    raise
  return path, origin


def cgroup_pids(path):
  with open(os.path.join(path, "cgroup.procs")) as f:
    return [int(p) for p in f.read().split()]


def cgroup_wait_empty(path, keep, timeout_s=5.0):
  """Waits until only ``keep`` is left in the cgroup, killing stragglers after half the time."""
  deadline = time.monotonic() + timeout_s
  killed = False
  while True:
    others = [p for p in cgroup_pids(path) if p != keep]
    if not others:
      return True
    if time.monotonic() > deadline:
      return False
    if not killed and time.monotonic() > deadline - timeout_s / 2:
      for p in others:
        try:
          os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
          pass
      killed = True
    time.sleep(0.0005)


def cgroup_leave(path, origin):
  """Moves this process back to ``origin`` and removes ``path`` (which must be empty)."""
  _write(os.path.join(origin, "cgroup.procs"), str(os.getpid()))
  for _ in range(200):
    try:
      os.rmdir(path)
      return
    except OSError as e:
      if e.errno != errno.EBUSY:
        raise
      time.sleep(0.005)
  os.rmdir(path)


def cgroup_sweep(spec):
  """Removes cgroups ``<parent>/{srv,probe}_<pid>`` of processes that no longer exist."""
  for _, parent, _ in spec["dirs"]:
    try:
      names = os.listdir(parent)
    except OSError:
      continue
    _sweep(parent, names)


def _sweep(parent, names):
  for name in names:
    kind, _, pid = name.partition("_")
    if kind in ("srv", "probe") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
      try:
        os.rmdir(os.path.join(parent, name))
      except OSError:
        pass
