"""The sandbox against a policy that draws on what the whole machine shares (issue 33 items 1-4).

Each attack runs for real beside an honest control: pseudo-terminals (one kernel count for
every devpts instance), per-uid kernel accounting (descriptors in flight over Unix sockets,
pipe pages), the page cache as an oracle across runs, and an interpreter a run cannot find
when the trainer runs from a virtual environment.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from mr_rl.rewards import sandbox

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="per-slot uids and the full sandbox need root")
RELAXED = {"require_privilege_drop": False, "memory_limit": "per-process", "cpus": None,
           "io_bps": None, "io_iops": None}


def _config(**kw):
  return sandbox.SandboxConfig(**({} if ROOT else RELAXED), **kw)


# ------------------------------------------------------------- the interpreter (item 4)
_REEXEC = textwrap.dedent("""
    import multiprocessing, os, subprocess, sys
    def f():
      out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True,
                           text=True, check=True).stdout.strip()
      ctx = multiprocessing.get_context("spawn")
      with ctx.Pool(2) as pool:
        got = pool.map(abs, [-1, -2, 3])
      p = ctx.Process(target=os.getpid)
      p.start()
      p.join()
      return [out, got, p.exitcode, os.path.exists(sys.executable)]
    """)


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory):
  """A fresh virtual environment's interpreter, as `python -m venv` makes it (a symlink)."""
  d = tmp_path_factory.mktemp("venv")
  base = getattr(sys, "_base_executable", sys.executable)
  subprocess.run([base, "-m", "venv", "--without-pip", str(d)], check=True, timeout=120)
  return str(d / "bin" / "python")


def test_a_program_that_starts_python_passes_when_the_trainer_runs_from_a_venv(venv_python):
  tests = sandbox.CodeTests.call("f", [[]], [["42", [1, 2, 3], 0, True]])
  for python in (sys.executable, venv_python):
    r = sandbox.run(_REEXEC, tests, timeout_s=30, config=_config(python=python))
    assert r.passed, (python, r.error)


def _run_both(a, b, tests_a, tests_b, config, timeout_s=10.0):
  """Runs programs a and b at once (two slots); returns both results."""
  import concurrent.futures as cf  # pylint: disable=import-outside-toplevel
  with cf.ThreadPoolExecutor(2) as ex:
    fa = ex.submit(sandbox.run, a, tests_a, timeout_s=timeout_s, config=config)
    fb = ex.submit(sandbox.run, b, tests_b, timeout_s=timeout_s, config=config)
    return fa.result(), fb.result()


def _got(result):
  """The value a failed call test returned (from its error text)."""
  import ast  # pylint: disable=import-outside-toplevel
  assert result.error and "got " in result.error, result
  return ast.literal_eval(result.error.rsplit("got ", 1)[1])


# -------------------------------------------------------------- pseudo-terminals (item 1)
_PTY_HOG = textwrap.dedent("""
    import os, time
    def f(want, hold_s):
      held = []
      try:
        for _ in range(want):
          held.append(os.openpty())
      except OSError:
        pass
      time.sleep(hold_s)
      return len(held)
    """)
_PTY_HONEST = textwrap.dedent("""
    import os, time
    def nr():
      try:
        with open("/proc/sys/kernel/pty/nr") as f:
          return int(f.read())
      except OSError:
        return None
    def f(want, hold_s):
      before = nr()
      time.sleep(0.6)  # the other run holds its terminals now
      after = nr()
      master, slave = os.openpty()
      os.write(master, b"ping\\n")
      echo = os.read(slave, 64)
      return [echo == b"ping\\n", None if before is None else after - before]
    """)


def test_a_run_cannot_take_the_machines_terminals_nor_count_anothers():
  cfg = _config()
  hog, honest = _run_both(_PTY_HOG, _PTY_HONEST, sandbox.CodeTests.call("f", [[200, 1.5]], [-1]),
                          sandbox.CodeTests.call("f", [[0, 0]], [[True, None]]), cfg)
  held = _got(hog)
  assert held <= cfg.max_ptys, held  # its own devpts holds at most max_ptys
  assert honest.passed, honest.error  # a terminal of its own, and no count of the other's


# ------------------------------------------------------- per-uid kernel accounting (item 2)
_INFLIGHT_HOG = textwrap.dedent("""
    import array, os, socket, time
    def f(hold_s):
      a, b = socket.socketpair()
      fd = os.open("/dev/null", os.O_RDONLY)
      sent = 0
      try:
        while sent < 4096:  # never received: in flight, counted against the sender's uid
          socket.send_fds(a, [b"x"], [fd] * 253)
          sent += 253
      except OSError as e:
        pass
      time.sleep(hold_s)
      return sent
    """)
_PIPE_HOG = textwrap.dedent("""
    import os, time
    def f(hold_s):
      kids = []
      for _ in range(9):  # 9 x 125 pipes, 16 pages each: past the uid's 16,384-page soft limit
        pid = os.fork()
        if pid == 0:
          try:
            held = [os.pipe() for _ in range(125)]
          except OSError:
            pass
          time.sleep(hold_s)
          os._exit(0)
        kids.append(pid)
      time.sleep(hold_s)
      return len(kids)
    """)
_HONEST_IPC = textwrap.dedent("""
    import fcntl, os, socket, time
    def f(hold_s):
      time.sleep(0.7)  # the other run holds its descriptors / pipes now
      a, b = socket.socketpair()
      try:
        socket.send_fds(a, [b"x"], [0])
        _, fds, _, _ = socket.recv_fds(b, 16, 1)
        passed = len(fds) == 1
      except OSError as e:
        passed = str(e)
      r, w = os.pipe()
      size = fcntl.fcntl(w, 1032)  # F_GETPIPE_SZ
      os.set_blocking(w, False)
      n = os.write(w, b"x" * 16384)  # a 16 KiB round trip (hung before: 2 pages)
      return [passed, size, n]
    """)


@needs_root
@pytest.mark.parametrize("hog", ["inflight", "pipes"])
def test_a_run_cannot_drain_a_per_uid_pool_of_a_concurrent_run(hog):
  src = {"inflight": _INFLIGHT_HOG, "pipes": _PIPE_HOG}[hog]
  attack, honest = _run_both(src, _HONEST_IPC, sandbox.CodeTests.call("f", [[2.0]], [-1]),
                             sandbox.CodeTests.call("f", [[0]], [[True, 65536, 16384]]), _config())
  assert _got(attack) > 0, attack.error  # it did hold what it could
  assert honest.passed, honest.error


# ----------------------------------------------------------- the page cache (item 3)
PAGES = 32
SECRET = [3, 9, 17, 27]  # odd pages an earlier run loads; the even ones are probe sacrifices
_MAP = """
import ctypes, os, resource, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.munmap.argtypes = libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
def mapped(fd, first, n):  # PROT_READ, MAP_SHARED, MADV_RANDOM: a fault reads no neighbour
  addr = libc.mmap(None, n * 4096, 1, 1, fd, first * 4096)
  libc.madvise(addr, n * 4096, 1)
  return addr
def touch(addr):
  return ctypes.c_char.from_address(addr).value
"""
_WRITER = _MAP + textwrap.dedent("""
    def f(path, pages):
      fd = os.open(path, os.O_RDONLY)
      for p in pages:
        touch(mapped(fd, p, 1))
      return 0
    """)
_READER = _MAP + textwrap.dedent("""
    def statm_shared():
      with open("/proc/self/statm") as f:
        return int(f.read().split()[2])
    def present(addr):
      with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // 4096 * 8)
        return bool(struct.unpack("Q", f.read(8))[0] >> 63)
    def probe(fd, k, how):
      # Map pages k-1 and k, touch k-1: fault-around maps k as well iff k is in the page cache.
      addr = mapped(fd, k - 1, 2)
      try:
        before = statm_shared() if how == "statm" else None
        touch(addr)
        return statm_shared() - before == 2 if how == "statm" else present(addr + 4096)
      finally:
        libc.munmap(addr, 2 * 4096)
    def f(path, pages, how):
      out = {}
      if how == "pagemap":  # its /proc/self/pagemap is readable once it is dumpable
        out["set_dumpable"] = libc.prctl(4, 1, 0, 0, 0) == 0
      try:
        out["getrusage"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
      except OSError as e:
        out["getrusage"] = e.errno
      fd = os.open(path, os.O_RDONLY)
      found = []
      for k in range(1, pages, 2):
        try:
          if probe(fd, k, how):
            found.append(k)
        except OSError as e:
          out["error"] = f"{type(e).__name__}: {e.errno}"
          break
      out["found"] = found
      return out
    """)


def _evict(path):
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
  finally:
    os.close(fd)


def _cached_pages(path):
  """The pages of ``path`` in the page cache (host side, mincore: it loads nothing)."""
  import ctypes  # pylint: disable=import-outside-toplevel
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mmap.restype = ctypes.c_void_p
  libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                        ctypes.c_int, ctypes.c_long]
  libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
  libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
  fd = os.open(path, os.O_RDONLY)
  try:
    addr = libc.mmap(None, PAGES * 4096, 1, 1, fd, 0)
    vec = ctypes.create_string_buffer(PAGES)
    assert libc.mincore(addr, PAGES * 4096, vec) == 0
    libc.munmap(addr, PAGES * 4096)
    return [p for p in range(PAGES) if vec.raw[p] & 1]
  finally:
    os.close(fd)


@pytest.fixture
def shared_file(host_dir):  # tests/rewards/sandbox/conftest.py
  path = os.path.join(host_dir, "shared.bin")
  with open(path, "wb") as f:
    f.write(os.urandom(PAGES * 4096))
  os.chmod(path, 0o644)
  return host_dir, path


@pytest.mark.parametrize("how", ["pagemap", "statm"])
def test_a_later_run_cannot_read_which_pages_an_earlier_run_loaded(shared_file, how):
  d, path = shared_file
  cfg = _config(visible_paths=sandbox.SandboxConfig().visible_paths + (d,))
  _evict(path)
  if _cached_pages(path):
    pytest.skip("this filesystem keeps the file cached (fadvise DONTNEED had no effect)")
  w = sandbox.run(_WRITER, sandbox.CodeTests.call("f", [[path, SECRET]], [0]), config=cfg)
  assert w.passed, w.error
  assert _cached_pages(path) == SECRET  # the secret is in the cache, nothing else
  r = sandbox.run(_READER, sandbox.CodeTests.call("f", [[path, PAGES, how]], [None]), config=cfg)
  out = _got(r)
  assert out["found"] != SECRET, out  # the oracle: exact before
  assert out["found"] == [] and "error" in out and out["getrusage"] == 1, out  # EPERM
  assert out.get("set_dumpable") in (None, False), out


def test_a_program_without_proc_still_reads_dev_stdin_and_writes_dev_stdout():
  """The honest side of having no /proc: /dev/stdin and /dev/stdout name the test's files."""
  src = textwrap.dedent("""
      import os, sys
      data = open("/dev/stdin").read().split()
      with open("/dev/stdout", "w") as out:
        out.write(str(sum(map(int, data))) + "\\n")
      """)
  r = sandbox.run(src, sandbox.CodeTests.stdio([("1 2 3\n", "6\n"), ("40 2\n", "42\n")]),
                  config=_config())
  assert r.passed, r.error
