"""The code sandbox's syscall filter: syscall tables, what is refused, the BPF program.

Stdlib only. Part of the harness that runs inside the sandbox (``host.HARNESS_FILES``, run in
order in one namespace: ``kernel.py`` uses ``ARCH``, ``SYSCALLS`` and ``install_seccomp``); the
host imports it for the tests, which check the tables against libseccomp. docs/rewards.md
"Machine-wide pools the sandbox shares" lists, for every syscall that draws on a machine-wide
pool or locks a shared object, whether it is refused here, namespaced or bounded.
"""

import ctypes
import errno
import os
import struct

ARCH = os.uname().machine
CLONE_NS_FLAGS = 0x20000 | 0x2000000 | 0x4000000 | 0x8000000 | 0x10000000 | 0x20000000 | 0x40000000
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, SECCOMP_MODE_FILTER = 22, 38, 2

# Syscall numbers: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h
# (aarch64) of Linux 6.x; tests/rewards/sandbox/test_isolation.py checks them against libseccomp.
_NUMBERS = {  # name: (x86_64, aarch64); None where that architecture has no such syscall
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kcmp": (312, 272), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "unshare": (272, 97), "setns": (308, 268), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "bpf": (321, 280), "perf_event_open": (298, 241),
    "userfaultfd": (323, 282), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89),
    "quotactl": (179, 60), "syslog": (103, 116), "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265), "fanotify_init": (300, 262), "fanotify_mark": (301, 263),
    "pidfd_getfd": (438, 438), "mincore": (27, 232), "move_pages": (279, 239),
    "migrate_pages": (256, 238), "lookup_dcookie": (212, 18), "vhangup": (153, 58),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266),
    "adjtimex": (159, 171), "sethostname": (170, 161), "setdomainname": (171, 162),
    "iopl": (172, None), "ioperm": (173, None), "flock": (73, 32), "inotify_init": (253, None),
    "inotify_init1": (294, 26), "inotify_add_watch": (254, 27), "cachestat": (451, 451),
    "preadv2": (327, 286), "pwritev2": (328, 287), "io_setup": (206, 0), "io_destroy": (207, 1),
    "io_submit": (209, 2), "io_cancel": (210, 3), "io_getevents": (208, 4),
    "io_pgetevents": (333, 292), "memfd_secret": (447, 447), "sync": (162, 81),
    "syncfs": (306, 267), "fadvise64": (221, 223), "readahead": (187, 213), "clone": (56, 220),
    "clone3": (435, 435), "ioctl": (16, 29), "fcntl": (72, 25), "mmap": (9, 222),
    "memfd_create": (319, 279), "shmget": (29, 194), "socket": (41, 198), "socketpair": (53, 199),
    "futex": (202, 98), "futex_waitv": (449, 449), "futex_wake": (454, 454),
    "futex_wait": (455, 455), "futex_requeue": (456, 456), "getrusage": (98, 165),
    "sysinfo": (99, 179), "wait4": (61, 260), "waitid": (247, 95), "prctl": (157, 167),
}
SYSCALLS = {arch: {n: nrs[i] for n, nrs in _NUMBERS.items() if nrs[i] is not None}
            for i, arch in enumerate(("x86_64", "aarch64"))}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Refused only for some arguments (the index of the argument, then the rule):
#   "set": refused when any of these bits is set; "eq": refused for these values;
#   "only": refused for any value but these; "nonzero": a pointer, refused unless NULL.
ARG_RULES = (
    ("clone", 0, "set", (CLONE_NS_FLAGS,)),  # new namespaces
    ("ioctl", 1, "eq", (0x5412,)),  # TIOCSTI: pushes input into a terminal
    # Locks and notifications on files, which concurrent runs share (the read-only host files):
    # record locks (F_GETLK, F_SETLK, F_SETLKW; their 32-bit numbers; the F_OFD_* variants) also
    # stall host writers, leases (F_SETLEASE, F_GETLEASE), F_NOTIFY; F_SETPIPE_SZ grows pipe
    # buffers, which draw on a per-uid pool that every run (uid 65534) shares.
    ("fcntl", 1, "eq", (5, 6, 7, 12, 13, 14, 36, 37, 38, 1024, 1025, 1026, 1031)),
    ("mmap", 3, "set", (0x40000,)),  # MAP_HUGETLB: the machine's huge page pool
    ("memfd_create", 1, "set", (0x4,)),  # MFD_HUGETLB
    ("shmget", 2, "set", (0o4000,)),  # SHM_HUGETLB
    # Address families: AF_UNIX, AF_INET, AF_INET6, all scoped by the network namespace but
    # for pathname sockets (which the run's mounts do not show); not AF_VSOCK (the
    # hypervisor), AF_ALG (kernel crypto), nor AF_NETLINK: its buffers are not charged to the
    # memory cgroup (64 sockets queued 508 MiB under a 128 MiB limit); glibc's getaddrinfo
    # does without it (AI_ADDRCONFIG then assumes both IPv4 and IPv6).
    ("socket", 0, "only", (1, 2, 10)),
    ("socketpair", 0, "only", (1, 2, 10)),
    # Resource usage of children (ru_maxrss, ru_minflt, ru_majflt count the pages fault-around
    # mapped: which pages of a shared file are cached): waits pass NULL for it (waitpid).
    ("wait4", 3, "nonzero", ()),
    ("waitid", 4, "nonzero", ()),
    ("prctl", 0, "eq", (4,)),  # PR_SET_DUMPABLE: a dumpable process reads its own pagemap
)
# Futexes: a shared (non-private) futex on a page of a file is keyed by the file's inode, so
# two runs that map the same read-only host file (a library, /etc/passwd) could wait and wake
# each other. Without FUTEX_PRIVATE_FLAG, the waits (FUTEX_WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2,
# TRYLOCK_PI, WAIT_REQUEUE_PI) fail with EAGAIN, which callers treat as "the word changed, look
# again" (glibc's process-shared semaphores, mutexes and pthread_join then spin instead of
# sleeping: correct, but a timed wait no longer times out), and every other command (wakes,
# requeues) with EINVAL, which glibc's wake ignores. The futex2 calls (futex_waitv's flags are
# in memory, out of the filter's sight) get ENOSYS, like clone3: glibc 2.36 does not use them.
FUTEX_PRIVATE_FLAG, FUTEX_CMD_MASK = 128, 0x7F
FUTEX_WAITS = (0, 9, 6, 13, 8, 11)  # WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2, TRYLOCK_PI, WAIT_REQUEUE_PI
FUTEX2 = ("futex_waitv", "futex_wake", "futex_wait", "futex_requeue")
_WITH_ARGS = {rule[0] for rule in ARG_RULES} | {"clone3", "futex"} | set(FUTEX2)
# Refused with EPERM whatever the arguments: debugging other processes, keyrings, mounts and
# namespaces, kernel attack surface (bpf, perf, userfaultfd, io_uring), system administration,
# page-cache probes and pressure on shared files (mincore, cachestat, preadv2 with RWF_NOWAIT,
# fadvise, readahead, sync, syncfs, getrusage: ru_maxrss and the fault counts show what
# fault-around mapped), machine-wide pools (Linux AIO against fs.aio-max-nr, memfd_secret's
# unmapped pages), machine-wide counters (sysinfo: free, shared and buffer memory, which a
# concurrent run moves by writing its /tmp), and signals between concurrent runs through the
# read-only host files they share (flock, inotify, fanotify).
DENIED = tuple(n for n in SYSCALLS["x86_64"] if n not in _WITH_ARGS)
_BPF_LD_ABS, _BPF_JEQ, _BPF_JGE, _BPF_JSET, _BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
_BPF_AND_K = 0x54
_RET_ALLOW, _RET_ERRNO, _X32_BIT = 0x7FFF0000, 0x00050000, 0x40000000


def seccomp_filter(arch=ARCH):
  """The syscall filter as ``struct sock_filter[]`` bytes, or None for an arch without a table.

  Allows everything except: ``DENIED`` (EPERM); ``ARG_RULES`` (EPERM); ``clone3`` (ENOSYS, so
  libc falls back to ``clone``, whose flags the filter can see); ``futex`` without
  ``FUTEX_PRIVATE_FLAG`` (waits EAGAIN, other commands EINVAL) and the futex2 calls (ENOSYS);
  any other ABI (i386, x32) on this machine (EPERM).
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
  for name in ("clone3",) + FUTEX2:
    ins(_BPF_JEQ, nr[name], 0, 1)
    ins(_BPF_RET, _RET_ERRNO | errno.ENOSYS)
  ins(_BPF_JEQ, nr["futex"], 0, 2 * len(FUTEX_WAITS) + 5)
  ins(_BPF_LD_ABS, 16 + 8 * 1)  # futex_op, the low half
  ins(_BPF_JSET, FUTEX_PRIVATE_FLAG, 0, 1)
  ins(_BPF_RET, _RET_ALLOW)  # private: keyed by this process's address space
  ins(_BPF_AND_K, FUTEX_CMD_MASK)
  for cmd in FUTEX_WAITS:
    ins(_BPF_JEQ, cmd, 0, 1)
    ins(_BPF_RET, _RET_ERRNO | errno.EAGAIN)
  ins(_BPF_RET, _RET_ERRNO | errno.EINVAL)
  for name, arg, rule, values in ARG_RULES:
    if rule == "nonzero":  # a pointer: refused unless NULL (both halves zero)
      ins(_BPF_JEQ, nr[name], 0, 6)
      ins(_BPF_LD_ABS, 16 + 8 * arg)  # low half
      ins(_BPF_JSET, 0xFFFFFFFF, 3, 0)
      ins(_BPF_LD_ABS, 16 + 8 * arg + 4)  # high half
      ins(_BPF_JSET, 0xFFFFFFFF, 1, 0)
      ins(_BPF_RET, _RET_ALLOW)
      ins(_BPF_RET, deny)
      continue
    ins(_BPF_JEQ, nr[name], 0, 2 * len(values) + 2)
    ins(_BPF_LD_ABS, 16 + 8 * arg)  # the low half of the argument (little endian)
    hit, miss = (_RET_ALLOW, deny) if rule == "only" else (deny, _RET_ALLOW)
    for value in values:
      ins(_BPF_JSET if rule == "set" else _BPF_JEQ, value, 0, 1)
      ins(_BPF_RET, hit)
    ins(_BPF_RET, miss)
  ins(_BPF_RET, _RET_ALLOW)
  return b"".join(struct.pack("=HBBI", *i) for i in prog)


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
  """Sets no_new_privs and installs ``program`` (from ``seccomp_filter``) on this process."""
  libc = ctypes.CDLL(None, use_errno=True)
  buf = ctypes.create_string_buffer(program, len(program))
  fprog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
  for option, arg in ((PR_SET_NO_NEW_PRIVS, 1), (PR_SET_SECCOMP, SECCOMP_MODE_FILTER)):
    extra = ctypes.byref(fprog) if option == PR_SET_SECCOMP else 0
    if libc.prctl(option, ctypes.c_ulong(arg), extra, 0, 0) != 0:
      err = ctypes.get_errno()
      raise OSError(err, f"prctl({option}): {os.strerror(err)}")
