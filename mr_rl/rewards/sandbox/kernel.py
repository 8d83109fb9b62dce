"""Linux interfaces of the code sandbox: namespaces, mounts, credentials, keyrings, seccomp.

Stdlib only (ctypes). Part of the harness that runs inside the sandbox (the files of
``host.HARNESS_FILES``, run in order in one namespace); the host imports it for the
architecture's syscall table, and the tests to check the syscall tables.

What each piece closes (BUILD_NOTES.md "Code sandbox: threat model"):
  * ``make_user_namespace`` (one per fork server) and ``setup_namespaces`` (per run: network,
    pid, mount, IPC and UTS namespaces; every host mount read-only, home directories,
    site-packages and ``/sys/fs/cgroup`` hidden, a private devpts, one private tmpfs
    writable).
  * ``drop_privileges``: uid/gid drop, no capabilities, ``no_new_privs``, a fresh empty
    session keyring.
  * ``seccomp_filter`` / ``install_seccomp``: refuses what a test program never needs.
"""

import ctypes
import errno
import os
import resource
import signal
import struct

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NS_FLAGS = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
                  | CLONE_NEWPID | CLONE_NEWNET)
# Per run, inside the fork server's user namespace:
RUN_NAMESPACES = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 1, 2, 4, 8, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, CAP_SETPCAP = 24, 47, 4, 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SECCOMP_MODE_FILTER = 2
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
NR_MOUNT_SETATTR = 442  # the same on every architecture (syscalls numbered from 424 on)
KEYCTL_JOIN_SESSION_KEYRING = 1
ARCH = os.uname().machine

# Syscall numbers: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h
# (aarch64) of Linux 6.x; tests/test_rewards_code_isolation.py checks them against libseccomp.
SYSCALLS = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "keyctl": 250, "add_key": 248, "request_key": 249, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "quotactl": 179, "syslog": 103,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "fanotify_init": 300,
        "pidfd_getfd": 438, "mincore": 27, "move_pages": 279, "migrate_pages": 256,
        "lookup_dcookie": 212, "vhangup": 153, "settimeofday": 164, "clock_settime": 227,
        "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170, "setdomainname": 171,
        "iopl": 172, "ioperm": 173, "flock": 73, "inotify_init": 253, "inotify_init1": 294,
        "inotify_add_watch": 254, "cachestat": 451, "preadv2": 327, "pwritev2": 328,
        "clone": 56, "clone3": 435, "ioctl": 16, "fcntl": 72},
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "keyctl": 219, "add_key": 217, "request_key": 218, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 104,
        "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "swapon": 224, "swapoff": 225, "reboot": 142, "acct": 89, "quotactl": 60, "syslog": 116,
        "name_to_handle_at": 264, "open_by_handle_at": 265, "fanotify_init": 262,
        "pidfd_getfd": 438, "mincore": 232, "move_pages": 239, "migrate_pages": 238,
        "lookup_dcookie": 18, "vhangup": 58, "settimeofday": 170, "clock_settime": 112,
        "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161, "setdomainname": 162,
        "flock": 32, "inotify_init1": 26, "inotify_add_watch": 27, "cachestat": 451,
        "preadv2": 286, "pwritev2": 287,
        "clone": 220, "clone3": 435, "ioctl": 29, "fcntl": 25},
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Refused with EPERM: debugging other processes, keyrings, mounts and namespaces, kernel
# attack surface (bpf, perf, userfaultfd, io_uring), system administration, page-cache
# probes (mincore, cachestat, preadv2 with RWF_NOWAIT), and signals between concurrent runs through the read-only host files they share
# (flock, inotify; fcntl F_NOTIFY below).
DENIED = tuple(n for n in SYSCALLS["x86_64"] if n not in ("clone", "clone3", "ioctl", "fcntl"))
TIOCSTI = 0x5412  # ioctl that pushes input into a terminal
F_NOTIFY = 1026  # fcntl: directory change (and access) notification
_BPF_LD_ABS, _BPF_JEQ, _BPF_JGE, _BPF_JSET, _BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _X32_BIT = 0x7FFF0000, 0x00050000, 0x40000000

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


# ----------------------------------------------------------------------------- seccomp
def seccomp_filter(arch=ARCH):
  """The syscall filter as ``struct sock_filter[]`` bytes, or None for an arch without a table.

  Allows everything except: ``DENIED`` (EPERM); ``clone`` with a namespace flag (EPERM);
  ``clone3`` (ENOSYS, so libc falls back to ``clone``, whose flags the filter can see);
  ``ioctl(TIOCSTI)``, ``fcntl(F_NOTIFY)``; any other ABI (i386, x32) on this machine (EPERM).
  """
  nr = SYSCALLS.get(arch)
  if nr is None:
    return None
  deny = _RET_ERRNO | errno.EPERM
  prog = []
  ins = lambda code, k, jt=0, jf=0: prog.append((code, jt, jf, k))
  ins(_BPF_LD_ABS, 4)  # seccomp_data.arch
  ins(_BPF_JEQ, AUDIT_ARCH[arch], 1, 0)
  ins(_BPF_RET, deny)
  ins(_BPF_LD_ABS, 0)  # seccomp_data.nr
  if arch == "x86_64":
    ins(_BPF_JGE, _X32_BIT, 0, 1)
    ins(_BPF_RET, deny)
  for name in DENIED:
    if name in nr:
      ins(_BPF_JEQ, nr[name], 0, 1)
      ins(_BPF_RET, deny)
  ins(_BPF_JEQ, nr["clone3"], 0, 1)
  ins(_BPF_RET, _RET_ERRNO | errno.ENOSYS)
  ins(_BPF_JEQ, nr["clone"], 0, 4)
  ins(_BPF_LD_ABS, 16)  # low half of args[0] (little endian): the clone flags
  ins(_BPF_JSET, CLONE_NS_FLAGS, 0, 1)
  ins(_BPF_RET, deny)
  ins(_BPF_RET, _RET_ALLOW)
  for name, request in (("ioctl", TIOCSTI), ("fcntl", F_NOTIFY)):
    ins(_BPF_JEQ, nr[name], 0, 4)
    ins(_BPF_LD_ABS, 24)  # low half of args[1]: the request / command
    ins(_BPF_JEQ, request, 0, 1)
    ins(_BPF_RET, deny)
    ins(_BPF_RET, _RET_ALLOW)
  ins(_BPF_RET, _RET_ALLOW)
  return b"".join(struct.pack("=HBBI", *i) for i in prog)


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
  """Sets no_new_privs and installs ``program`` (from ``seccomp_filter``) on this process."""
  buf = ctypes.create_string_buffer(program, len(program))
  fprog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
  prctl(PR_SET_NO_NEW_PRIVS, 1)
  mode = ctypes.c_ulong(SECCOMP_MODE_FILTER)
  _check(libc.prctl(PR_SET_SECCOMP, mode, ctypes.byref(fprog), 0, 0), "seccomp")


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
                      ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
  resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))


# ----------------------------------------------------------------------------- namespaces
def make_user_namespace(uid, gid, privileged):
  """A new user namespace that maps ``uid`` and ``gid`` to themselves; returns an fd on it.

  A child creates it; the fd keeps it alive after the child exits. As root (``privileged``)
  the caller, still in the initial namespace, writes the maps: a process cannot map ids
  other than its own from inside. An unprivileged child maps its own ids (after denying
  setgroups, as the kernel requires).
  """
  up_r, up_w = os.pipe()
  down_r, down_w = os.pipe()
  pid = os.fork()
  if pid == 0:
    status = 1
    try:
      os.close(up_r)
      os.close(down_w)
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


def _plan_covers(cfg):
  """Which host directories to hide under an empty tmpfs, which interpreter directories to
  bind back into them, and which hidden directories lie inside those (site-packages).

  Decided before the user namespace, inside which every unmapped owner reads as 65534.
  Returns (covers, exposed, inner): covers are ``cfg["hide"]`` (outside the interpreter)
  plus, when the uid is dropped, the first directory on an interpreter path that the
  sandbox uid cannot search (e.g. ``/root`` above pyenv).
  """
  within = lambda p, q: p == q or p.startswith(q.rstrip("/") + "/")
  hidden = [p for p in cfg.get("hide", ()) if os.path.isdir(p)]
  inner = [p for p in hidden if any(within(p, e) for e in cfg["expose"])]
  covers = [p for p in hidden if p not in inner]
  exposed = []
  for path in sorted(cfg["expose"]):
    if any(within(path, e) for e in exposed):
      continue
    blocker = next((c for c in covers if within(path, c)), None)
    if blocker is None and cfg["drop"]:
      blocker = _traversable(path, cfg["uid"], cfg["gid"])
    if blocker is not None:
      exposed.append(path)
      covers.append(blocker)
  covers = sorted(set(covers))
  covers = [c for c in covers if not any(within(c, o) and c != o for o in covers)]
  return covers, exposed, inner


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


def setup_namespaces(cfg, userns_fd=None):
  """New namespaces and mounts for one run; returns the worker's working directory.

  As root ("root") and unprivileged ("user") alike: joins the user namespace ``userns_fd``
  (from ``make_user_namespace``: one per fork server, so each concurrent run has its own
  RLIMIT_NPROC count), then new network (no interface up), pid, mount, IPC (SysV and POSIX
  IPC objects die with the run) and UTS namespaces. ``cfg["hide"]`` (home directories, the
  interpreter's site-packages, where installed data sets live) and ``/sys/fs/cgroup`` are
  covered by empty tmpfs, every mount of the host is made read-only, pseudo-terminals come
  from a private devpts instance, and ``/tmp`` (with ``/var/tmp`` and ``/dev/shm`` bound to
  it) is a private tmpfs of ``tmpfs_bytes``: the only place a run can write files, gone
  with its mount namespace.
  """
  ns = cfg["namespaces"]
  if not ns:
    return cfg["workdir"]
  covers, exposed, inner = _plan_covers(cfg)
  _check(libc.setns(userns_fd, CLONE_NEWUSER), "setns(user namespace)")
  os.close(userns_fd)  # nothing forked from here on holds it
  _check(libc.unshare(RUN_NAMESPACES), "unshare")
  mount("none", "/", None, MS_REC | MS_PRIVATE)
  # Cover each hidden directory with an empty tmpfs and bind the interpreter back into it
  # (from an fd opened before it was covered); then hide its site-packages.
  fds = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in exposed]
  owner = (cfg["uid"], cfg["gid"]) if ns == "root" else (os.getuid(), os.getgid())
  if exposed and ns == "root":  # kuid 0 is unmapped here, and an unmapped owner cannot create files
    libc.setfsgid(owner[1])
    libc.setfsuid(owner[0])
  for cover in covers:  # read-only below, like every mount
    mount("tmpfs", cover, "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=0755,size=1m,uid={owner[0]},gid={owner[1]}")
  for path, fd in fds:
    os.makedirs(path, exist_ok=True)
    mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    os.close(fd)
  for path in inner:
    mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555,size=4k")
  make_tree_read_only("/")
  if os.path.isdir("/sys/fs/cgroup"):
    mount("tmpfs", "/sys/fs/cgroup", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
          "mode=0555,size=4k")
  if os.path.isdir("/dev/pts"):  # the host's pseudo-terminals would let concurrent runs talk
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0600")
    mount("/dev/pts/ptmx", "/dev/ptmx", None, MS_BIND)
  mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={cfg['tmpfs_bytes']}")
  for extra in ("/var/tmp", "/dev/shm"):
    if os.path.isdir(extra):
      mount("/tmp", extra, None, MS_BIND)
  return "/tmp"
