"""Linux interfaces of the code sandbox: namespaces, mounts, credentials, keyrings.

Stdlib only (ctypes). Part of the harness that runs inside the sandbox (the files of
``host.HARNESS_FILES``, run in order in one namespace; the syscall filter is ``seccomp.py``).

What each piece closes (docs/rewards.md "Code sandbox: threat model"):
  * ``make_user_namespace`` (one per fork server) and ``setup_namespaces`` (per run: network,
    pid, mount, IPC and UTS namespaces; a root of its own that shows only the system
    directories, read-only, with home directories and site-packages hidden; a minimal
    ``/dev`` and a private, capped devpts; no procfs; one private tmpfs writable).
  * ``drop_privileges``: uid/gid drop, no capabilities, ``no_new_privs``, a fresh empty
    session keyring.
"""

import ctypes
import errno
import os
import resource
import signal

if __name__ != "__main__":  # on the host; in the sandbox seccomp.py ran first in this namespace
  from mr_rl.rewards.sandbox.seccomp import ARCH, SYSCALLS

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
# Per run, inside the fork server's user namespace:
RUN_NAMESPACES = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 1, 2, 4, 8, 4096
MS_REC, MS_PRIVATE, MNT_DETACH = 16384, 1 << 18, 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, CAP_SETPCAP = 24, 47, 4, 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
NR_MOUNT_SETATTR = 442  # the same on every architecture (syscalls numbered from 424 on)
KEYCTL_JOIN_SESSION_KEYRING = 1

libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
  if ret != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path, text):
  with open(path, "w") as f:
    f.write(text)


def mount(src, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()
  _check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
         f"mount {target}")


def prctl(option, arg):
  _check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def close_fds_except(keep):
  fd = 3
  for k in sorted(set(keep)) + [1 << 20]:
    if k >= fd:
      os.closerange(fd, k)
      fd = k + 1


# ----------------------------------------------------------------------------- credentials
def join_fresh_session_keyring():
  """Replaces the inherited session keyring (the trainer's) by a new, empty, anonymous one.

  ENOSYS (no keyrings in the kernel) and EPERM (keyctl refused by a filter around us) mean
  that the program cannot reach a keyring either, so they are not errors.
  """
  nr = SYSCALLS.get(ARCH, {}).get("keyctl")
  if nr is None:
    raise OSError(errno.ENOSYS, f"no keyctl syscall number for {ARCH}")
  if libc.syscall(nr, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
    err = ctypes.get_errno()
    if err not in (errno.ENOSYS, errno.EPERM):
      raise OSError(err, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(err)}")


class _CapHeader(ctypes.Structure):
  _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
  _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
              ("inheritable", ctypes.c_uint32)]


def capability_sets():
  """This process's non-empty capability sets from /proc/self/status (for the probe)."""
  with open("/proc/self/status") as f:
    sets = {k: int(v, 16) for k, v in (line.split(":\t") for line in f if line.startswith("Cap"))}
  return {k: v for k, v in sets.items() if v}


def _effective_caps():
  data = (_CapData * 2)()
  _check(libc.capget(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data), "capget")
  return data[0].effective | (data[1].effective << 32)


def _drop_bounding_set():
  """Empties the bounding set where this process may (CAP_SETPCAP); without it, as an
  unprivileged caller with no namespace, no_new_privs keeps execve from using it anyway.
  (No /proc here: the supervisor shares its mount namespace with the zygote's new /proc.)"""
  if _effective_caps() & (1 << CAP_SETPCAP):
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) == 0:
      cap += 1
    if ctypes.get_errno() != errno.EINVAL:  # EINVAL: past the last capability
      raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")


def drop_capabilities():
  """Empties the ambient, effective, permitted and inheritable sets.

  Needed on top of the uid change: inside a user namespace whose root is unmapped, as here,
  ``setresuid`` keeps the capabilities the namespace gave its creator.
  """
  _check(libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0),
         "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
  data = (_CapData * 2)()
  _check(libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data), "capset")


def drop_privileges(cfg):
  """uid/gid drop (as root), no capabilities, no_new_privs, a fresh session keyring,
  non-dumpable."""
  _drop_bounding_set()  # first: setresuid clears CAP_SETPCAP outside a user namespace
  if cfg["drop"]:
    os.setgroups([])
    os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
    os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
  drop_capabilities()
  prctl(PR_SET_NO_NEW_PRIVS, 1)
  if ARCH in SYSCALLS:  # elsewhere the probe reports no seccomp and the run is refused
    join_fresh_session_keyring()
  # Credential changes clear both settings, so (re)set them afterwards.
  prctl(PR_SET_DUMPABLE, 0)
  prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def set_worker_limits(lim):
  for name, value in (("RLIMIT_AS", lim["memory_bytes"]), ("RLIMIT_NPROC", lim["max_processes"]),
                      ("RLIMIT_FSIZE", lim["max_file_bytes"]), ("RLIMIT_NOFILE", lim["max_open_files"]),
                      ("RLIMIT_CORE", 0), ("RLIMIT_RTPRIO", 0),  # no real-time scheduling
                      *slot_rlimits(lim)):
    resource.setrlimit(getattr(resource, name), (value, value))
  resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))


def slot_rlimits(lim):
  """(name, value) of the counts a slot's user namespace bounds: queued signals and POSIX
  timers (RLIMIT_SIGPENDING), POSIX message-queue bytes (RLIMIT_MSGQUEUE); never above
  the hard limit this process has."""
  if not lim:
    return ()
  out = []
  for name, key in (("RLIMIT_SIGPENDING", "max_pending_signals"),
                    ("RLIMIT_MSGQUEUE", "max_mq_bytes")):
    hard = resource.getrlimit(getattr(resource, name))[1]
    out.append((name, lim[key] if hard == resource.RLIM_INFINITY else min(lim[key], hard)))
  return tuple(out)


# ----------------------------------------------------------------------------- namespaces
def make_user_namespace(uid, gid, privileged, rlimits=()):
  """A new user namespace that maps ``uid`` and ``gid`` to themselves; returns an fd on it.

  A child creates it; the fd keeps it alive after the child exits. As root (``privileged``)
  the caller, still in the initial namespace, writes the maps: a process cannot map ids
  other than its own from inside. An unprivileged child maps its own ids (after denying
  setgroups, as the kernel requires). As root the child first becomes ``uid`` / ``gid``
  with ``rlimits`` ((name, value)): the kernel charges the namespace's signal, timer and
  message-queue counts to its creator's uid at every level up to the host's, bounded there
  by the creator's limits, so a namespace made by root drew on root's own pools (another
  slot's and the host's ``timer_create`` failed with EAGAIN, ``mq_open`` with EMFILE).
  """
  up_r, up_w = os.pipe()
  down_r, down_w = os.pipe()
  pid = os.fork()
  if pid == 0:
    status = 1
    try:
      os.close(up_r)
      os.close(down_w)
      if privileged:
        for name, value in rlimits:
          resource.setrlimit(getattr(resource, name), (value, value))
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
      _check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
      if not privileged:
        _write("/proc/self/setgroups", "deny")
        for name, text in (("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
          _write(f"/proc/self/{name}", text)
      os.write(up_w, b"x")
      os.read(down_r, 1)  # stay alive until the parent holds the namespace
      status = 0
    finally:
      os._exit(status)
  os.close(up_w)
  os.close(down_r)
  try:
    if os.read(up_r, 1) != b"x":
      raise OSError(errno.EPERM, "unshare(CLONE_NEWUSER) failed in the helper")
    if privileged:
      for name, text in (("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        _write(f"/proc/{pid}/{name}", text)
    return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
  finally:
    os.write(down_w, b"x")
    os.close(down_w)
    os.close(up_r)
    os.waitpid(pid, 0)


def _within(p, q):
  return p == q or p.startswith(q.rstrip("/") + "/")


def _outermost(paths):
  return sorted(p for p in set(paths) if not any(_within(p, q) and p != q for q in paths))


def plan_root(cfg):
  """What the run's root shows of the host, decided before the user namespace (inside
  which every unmapped owner reads as 65534).

  Returns (binds, links, covers, rebinds, inner): ``binds`` are the outermost host
  directories shown (``cfg["visible"]`` and the interpreter's prefixes ``cfg["expose"]``),
  ``links`` the top-level symlinks among ``cfg["visible"]`` (``/bin -> usr/bin``), ``covers``
  the hidden directories (``cfg["hide"]``) inside a bind, plus, when the uid is dropped, the
  first directory on an interpreter path that the sandbox uid cannot search; ``rebinds``
  the interpreter paths under a cover, shown again on top of it; ``inner`` the hidden
  directories inside those (site-packages), covered last.
  """
  links, dirs = {}, list(cfg["expose"])
  for path in cfg["visible"]:
    if os.path.islink(path):
      links[path] = os.readlink(path)
      dirs.append(os.path.realpath(path))
    else:
      dirs.append(path)
  binds = _outermost([d for d in dirs if os.path.isdir(d)])
  shown = lambda p: any(_within(p, b) for b in binds)
  hidden = [p for p in cfg.get("hide", ()) if os.path.isdir(p) and shown(p)]
  inner = [p for p in hidden if any(_within(p, e) for e in cfg["expose"])]
  covers = [p for p in hidden if p not in inner]
  for path in cfg["expose"] if cfg["drop"] else ():
    blocker = _traversable(path, cfg["uid"], cfg["gid"])
    if blocker is not None and shown(blocker) and blocker not in binds:
      covers.append(blocker)
  covers = _outermost(covers)
  rebinds = _outermost([e for e in cfg["expose"] if any(_within(e, c) for c in covers)])
  return binds, links, covers, rebinds, sorted(inner)


def _traversable(path, uid, gid):
  """None when every directory on ``path`` grants search (x) permission to uid/gid, else
  the first one that does not."""
  cur = "/"
  for part in [p for p in path.split("/") if p]:
    cur = os.path.join(cur, part)
    st = os.stat(cur)
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    if not st.st_mode & bit:
      return cur
  return None


class _MountAttr(ctypes.Structure):
  _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def make_tree_read_only(path="/"):
  """Every mount under ``path`` (in this mount namespace) read-only, in one call."""
  attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
  _check(libc.syscall(NR_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE, ctypes.byref(attr),
                       ctypes.sizeof(attr)), "mount_setattr (needs Linux >= 5.12)")


# The run's /dev: these nodes of the host (bound: a user namespace cannot make device nodes),
# links, devpts, and /dev/shm (the private tmpfs). A run has no /proc (see setup_namespaces),
# so the std* links name the files a stdin/stdout test runs with (harness.zygote) and there
# is no /dev/fd.
DEV_NODES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = {"stdin": "/tmp/.stdin", "stdout": "/tmp/.stdout", "stderr": "/tmp/.stderr",
             "ptmx": "pts/ptmx"}


def _build_root(new, plan, fds, owner, host_proc):
  """Fills the empty tmpfs ``new`` with the run's root (see ``setup_namespaces``)."""
  binds, links, covers, rebinds, inner = plan

  def bind(path):
    os.makedirs(new + path, exist_ok=True)
    mount(f"/proc/self/fd/{fds[path]}", new + path, None, MS_BIND | MS_REC)

  for path in binds:
    bind(path)
  for path, target in links.items():
    if not os.path.lexists(new + path):
      os.symlink(target, new + path)
  for path in covers:
    mount("tmpfs", new + path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,size=1m,uid={owner[0]},gid={owner[1]}")
  for path in rebinds:
    bind(path)
  for path in inner:
    mount("tmpfs", new + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555,size=4k")
  for path in ("/dev/pts", "/dev/shm", "/tmp", "/var/tmp", "/proc"):
    os.makedirs(new + path, exist_ok=True)
  for name in DEV_NODES:
    os.close(os.open(f"{new}/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o644))
    mount(f"/dev/{name}", f"{new}/dev/{name}", None, MS_BIND)
  for name, target in DEV_LINKS.items():
    os.symlink(target, f"{new}/dev/{name}")
  if host_proc:  # the probe's own procfs goes on top (the kernel mounts a new procfs only
    # where one is already fully visible); a run's /proc stays an empty directory
    mount(f"/proc/self/fd/{fds['/proc']}", new + "/proc", None, MS_BIND | MS_REC)


def setup_namespaces(cfg, userns_fd=None):
  """New namespaces and mounts for one run; returns the worker's working directory.

  As root ("root") and unprivileged ("user") alike: joins the user namespace ``userns_fd``
  (from ``make_user_namespace``: one per fork server, so each concurrent run has its own
  RLIMIT_NPROC count), then new network (no interface up), pid, mount, IPC (SysV and POSIX
  IPC objects die with the run) and UTS namespaces. The run's root is a new tmpfs
  (``pivot_root``; the host's tree is detached) that shows only ``cfg["visible"]`` (the system
  directories) and the interpreter, read-only, with ``cfg["hide"]`` (site-packages, where
  installed data sets live) covered: no host socket or FIFO (journald, D-Bus, lock files
  under /run, /var, /tmp, a checkout), no host device. ``/dev`` holds ``DEV_NODES``,
  ``DEV_LINKS`` and a private devpts instance of at most ``max_ptys`` terminals (every
  devpts draws on the kernel's one count, 4,096 less the host's 1,024 reserve); ``/tmp``
  (with ``/var/tmp`` and ``/dev/shm`` bound to it) is a private tmpfs of ``tmpfs_bytes``: the
  only place a run can write files, gone with its mount namespace. ``/proc`` is an empty
  directory: a procfs would show the kernel's machine-wide counters (``/proc/sys``, e.g. the
  pty count, ``/proc/meminfo``) and, through a process's own ``statm``, ``smaps`` and
  ``pagemap``, which pages of a shared file fault-around mapped, i.e. which are in the page
  cache (only the capability probe mounts one, to inspect itself).
  """
  ns = cfg["namespaces"]
  if not ns:
    return cfg["workdir"]
  plan = plan_root(cfg)
  binds, rebinds = plan[0], plan[3]
  _check(libc.setns(userns_fd, CLONE_NEWUSER), "setns(user namespace)")
  os.close(userns_fd)  # nothing forked from here on holds it
  _check(libc.unshare(RUN_NAMESPACES), "unshare")
  mount("none", "/", None, MS_REC | MS_PRIVATE)
  # Opened before /tmp is covered: the interpreter may live there.
  fds = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in set(binds + rebinds + ["/proc"])}
  owner = (cfg["uid"], cfg["gid"]) if ns == "root" else (os.getuid(), os.getgid())
  if ns == "root":  # kuid 0 is unmapped here, and an unmapped owner cannot create files
    libc.setfsgid(owner[1])
    libc.setfsuid(owner[0])
  new = "/tmp"  # the new root is mounted here, then pivoted to
  mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,size=1m,uid={owner[0]},gid={owner[1]}")
  _build_root(new, plan, fds, owner, host_proc=cfg["role"] == "probe")
  for fd in fds.values():
    os.close(fd)
  os.chdir(new)
  nr = SYSCALLS.get(ARCH, {}).get("pivot_root")
  if nr is None:
    raise OSError(errno.ENOSYS, f"no pivot_root syscall number for {ARCH}")
  _check(libc.syscall(nr, b".", b"."), "pivot_root")
  _check(libc.umount2(b".", MNT_DETACH), "umount the host's root")  # the old root, stacked on top
  os.chdir("/")
  make_tree_read_only("/")
  mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
        f"newinstance,ptmxmode=0666,mode=0600,max={cfg['max_ptys']}")
  mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={cfg['tmpfs_bytes']}")
  for extra in ("/var/tmp", "/dev/shm"):
    mount("/tmp", extra, None, MS_BIND)
  return "/tmp"
