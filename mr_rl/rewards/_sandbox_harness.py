"""Sandbox harness for ``mr_rl.rewards.code`` (runs inside the sandbox, stdlib only).

``code.py`` starts this code with ``python -I -S -c`` (as a marshalled code
object, so no file on disk can be swapped under a run), once as a FORK SERVER
that forks one supervisor per run (``fork_server``) and once per machine as a
capability probe (``probe``). Three processes take part in a run:

* the SUPERVISOR (S, this process): sets up namespaces and mounts as root, forks
  the zygote, drops privileges, THEN reads the job (program, tests, expected
  outputs, nonce) from fd 0, runs the checks and writes one JSON verdict to fd 1.
  S never executes candidate code: for HumanEval it executes the data set's
  trusted ``check`` with ``candidate`` bound to a remote stub.
* the ZYGOTE (Z): forked before the job was read, so its memory holds no test
  data; pid 1 of a fresh pid namespace when available. It never executes
  candidate code either; it forks one WORKER per execution, and after each one
  kills every other process of the namespace.
* the WORKER (W): drops to hard rlimits and executes the candidate. For call /
  HumanEval tests it answers remote calls over a pipe; for stdin/stdout tests it
  runs the program once per test with files as fd 0/1/2.

Evidence of success is produced only in S, from plain data (JSON) sent by W:
W can return values, never verdicts, so exits, monkeypatching, printed markers
or objects with a rigged ``__eq__`` cannot pass. See ``code.py`` for the API.
"""

import ctypes
import json
import os
import resource
import select
import signal
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_MOVE, MS_REC, MS_PRIVATE = 8192, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
MNT_DETACH = 2
MAX_DEPTH = 100
TAGS = ("__tuple__", "__set__", "__frozenset__", "__dict__", "__bytes__", "__complex__",
        "__bigint__", "__float__", "__opaque__")

_libc = ctypes.CDLL(None, use_errno=True)


class Abort(BaseException):
  """Infrastructure failure inside a check (timeout, dead worker, bad message).

  A BaseException so that a test's ``except Exception`` cannot swallow it.
  """


class Opaque:
  """Stands for a value of a type the codec does not carry; equal only to itself."""

  def __init__(self, type_name):
    self.type_name = type_name

  def __repr__(self):
    return f"<opaque {self.type_name}>"


class CandidateError(Exception):
  """The candidate raised an exception that is not a builtin exception type."""


# ----------------------------------------------------------------------------- codec
def encode(x, depth=0):
  """Python value -> JSON-able tagged data (W side; subclasses become base types)."""
  if depth > MAX_DEPTH:
    raise ValueError("value nested too deeply")
  if x is None or x is True or x is False:
    return x
  d = depth + 1
  if isinstance(x, int):
    v = int.__int__(x)
    return {"__bigint__": format(v, "x")} if v.bit_length() > 4000 else v
  if isinstance(x, float):
    v = float.__float__(x)
    return v if v == v and v not in (float("inf"), float("-inf")) else {"__float__": repr(v)}
  if isinstance(x, str):
    return str.__str__(x)
  if isinstance(x, list):
    return [encode(e, d) for e in list.__iter__(x)]
  if isinstance(x, tuple):
    return {"__tuple__": [encode(e, d) for e in tuple.__iter__(x)]}
  if isinstance(x, dict):
    return {"__dict__": [[encode(k, d), encode(v, d)] for k, v in dict.items(x)]}
  if isinstance(x, frozenset):
    return {"__frozenset__": [encode(e, d) for e in frozenset.__iter__(x)]}
  if isinstance(x, set):
    return {"__set__": [encode(e, d) for e in set.__iter__(x)]}
  if isinstance(x, (bytes, bytearray)):
    return {"__bytes__": bytes(x).hex()}
  if isinstance(x, complex):
    return {"__complex__": [encode(complex.__complex__(x).real), encode(complex.__complex__(x).imag)]}
  return {"__opaque__": f"{type(x).__module__}.{type(x).__qualname__}"}


def decode(x, depth=0):
  """Tagged data -> plain Python values (S side; strict, raises ValueError)."""
  if depth > MAX_DEPTH:
    raise ValueError("value nested too deeply")
  d = depth + 1
  if x is None or type(x) in (bool, int, float, str):
    return x
  if type(x) is list:
    return [decode(e, d) for e in x]
  if type(x) is not dict or len(x) != 1 or next(iter(x)) not in TAGS:
    raise ValueError(f"malformed value of type {type(x).__name__}")
  (tag, v), = x.items()
  if tag == "__opaque__":
    return Opaque(str(v))
  if tag == "__bigint__":
    return int(v, 16)
  if tag == "__float__":
    if v not in ("nan", "inf", "-inf"):
      raise ValueError(f"bad float {v!r}")
    return float(v)
  if tag == "__bytes__":
    return bytes.fromhex(v)
  if tag == "__complex__":
    return complex(float(v[0]), float(v[1]))
  if type(v) is not list:
    raise ValueError(f"malformed {tag}")
  if tag == "__dict__":
    return {decode(k, d): decode(e, d) for k, e in v}
  items = [decode(e, d) for e in v]
  return {"__tuple__": tuple, "__set__": set, "__frozenset__": frozenset}[tag](items)


# ----------------------------------------------------------------------------- framing
def send(fd, obj):
  data = json.dumps(obj, allow_nan=False).encode()
  data = struct.pack(">I", len(data)) + data
  while data:
    data = data[os.write(fd, data):]


def _read_exact(fd, n, deadline):
  chunks, got = [], 0
  while got < n:
    if deadline is not None:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise TimeoutError("timed out")
    chunk = os.read(fd, min(n - got, 1 << 20))
    if not chunk:
      raise EOFError("channel closed")
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def recv(fd, deadline=None, max_bytes=1 << 26):
  (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
  if n > max_bytes:
    raise ValueError(f"message of {n} bytes exceeds the cap of {max_bytes}")
  return json.loads(_read_exact(fd, n, deadline))


# ----------------------------------------------------------------------------- os helpers
def _check(ret, what):
  if ret != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()
  _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
         f"mount {target}")


def prctl(option, arg):
  _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def close_fds_except(keep):
  fd = 3
  for k in sorted(set(keep)) + [1 << 20]:
    if k >= fd:
      os.closerange(fd, k)
      fd = k + 1


def drop_privileges(cfg):
  if cfg["drop"]:
    os.setgroups([])
    os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
    os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
  # Credential changes clear both settings, so (re)set them afterwards.
  prctl(PR_SET_DUMPABLE, 0)
  prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _traversable(path, uid, gid):
  """True when every directory on ``path`` grants search (x) permission to uid/gid."""
  cur = "/"
  for part in [p for p in path.split("/") if p]:
    cur = os.path.join(cur, part)
    st = os.stat(cur)
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    if not st.st_mode & bit:
      return cur
  return None


def setup_namespaces(cfg):
  """unshare + private mounts; returns the working directory for the worker."""
  ns = cfg["namespaces"]
  if not ns:
    return cfg["workdir"]
  flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | (CLONE_NEWUSER if ns == "user" else 0)
  uid, gid = os.getuid(), os.getgid()
  _check(_libc.unshare(flags), "unshare")
  if ns == "user":  # unprivileged: map the caller's ids to themselves inside the namespace
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
      with open(f"/proc/self/{name}", "w") as f:
        f.write(text)
  mount("none", "/", None, MS_REC | MS_PRIVATE)
  if cfg["drop"]:  # make the interpreter readable to the sandbox uid (e.g. pyenv under /root)
    for path in cfg["expose"]:
      blocker = _traversable(path, cfg["uid"], cfg["gid"])
      if blocker is None:
        continue
      stage = cfg["workdir"]
      mount(path, stage, None, MS_BIND | MS_REC)
      mount("tmpfs", blocker, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
      os.makedirs(path, exist_ok=True)
      mount(stage, path, None, MS_MOVE)
      mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
  size = cfg["tmpfs_bytes"]
  mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={size}")
  for extra in ("/var/tmp", "/dev/shm"):
    if os.path.isdir(extra):
      mount("/tmp", extra, None, MS_BIND)
  return "/tmp"


def set_worker_limits(lim):
  for name, value in (("RLIMIT_AS", lim["memory_bytes"]), ("RLIMIT_NPROC", lim["max_processes"]),
                      ("RLIMIT_FSIZE", lim["max_file_bytes"]), ("RLIMIT_NOFILE", lim["max_open_files"]),
                      ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
  resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))


# ----------------------------------------------------------------------------- worker (W)
def _fresh_stdio():
  for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
    stream = open(fd, mode, closefd=False, encoding="utf-8", errors="replace")
    setattr(sys, name, stream)
    setattr(sys, f"__{name}__", stream)


def _redirect(stdin_path, out_name, err_name):
  for fd, path, flags in ((0, stdin_path, os.O_RDONLY),
                          (1, out_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                          (2, err_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
    f = os.open(path, flags, 0o600)
    os.dup2(f, fd)
    os.close(f)
  _fresh_stdio()


def _exc_text(e):
  return f"{type(e).__name__}: {e}"[:2000]


def worker_rpc(r, w, lim):
  """Loads the program, then answers call requests until the channel closes."""
  _redirect(os.devnull, ".w_stdout", ".w_stderr")
  set_worker_limits(lim)
  sys.argv = ["solution.py"]
  ns = {"__name__": "solution", "__builtins__": __builtins__}
  send(w, {"op": "ready"})
  while True:
    try:
      msg = recv(r)
    except EOFError:
      os._exit(0)
    if msg["op"] == "load":
      try:
        exec(compile(msg["src"], "solution.py", "exec"), ns)
        reply = {"ok": True, "names": [k for k, v in ns.items() if callable(v) and not k.startswith("__")]}
      except BaseException as e:  # SystemExit included: an early exit is a failure
        reply = {"ok": False, "error": _exc_text(e)}
    else:
      try:
        fn = ns.get(msg["fn"])
        if fn is None and msg.get("method") and isinstance(ns.get("Solution"), type):
          fn = getattr(ns["Solution"](), msg["fn"])
        if fn is None:
          raise NameError(f"name {msg['fn']!r} is not defined by the program")
        args = decode(msg["args"])
        kwargs = decode(msg["kwargs"])
        reply = {"ok": True, "value": encode(fn(*args, **kwargs))}
      except BaseException as e:
        reply = {"ok": False, "exc_type": type(e).__name__, "error": _exc_text(e)}
    sys.stdout.flush()
    send(w, reply)


def worker_stdio(src, lim):
  """Runs the program once as ``__main__`` with fds 0/1/2 already set up by Z."""
  _fresh_stdio()
  set_worker_limits(lim)
  sys.argv = ["main.py"]
  status = 0
  try:
    exec(compile(src, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
  except SystemExit as e:
    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if not isinstance(e.code, int) and e.code is not None:
      print(e.code, file=sys.stderr)
  except BaseException as e:
    import traceback
    traceback.print_exception(e)
    status = 1
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  except BaseException:
    status = status or 1
  os._exit(status & 0xFF)


# ----------------------------------------------------------------------------- zygote (Z)
def _reap_namespace(cfg, pid):
  """Kills the worker and (when Z is pid 1 of a private pid namespace) everything else."""
  for target in ([-1] if cfg["namespaces"] else []) + [pid]:
    try:
      os.kill(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
  while True:
    try:
      if os.waitpid(-1, 0)[0] == 0:
        break
    except ChildProcessError:
      break


def _tail(path, limit):
  try:
    with open(path, "rb") as f:
      f.seek(0, 2)
      f.seek(max(0, f.tell() - limit))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return ""


def zygote(cfg, r, w, workdir):
  close_fds_except([r, w])
  null = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1, 2):
    os.dup2(null, fd)
  if cfg["namespaces"]:
    try:
      mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
      pass  # reported by the capability probe as private_proc=False
  drop_privileges(cfg)
  os.chdir(workdir)
  import builtins
  builtins.exit = builtins.quit = sys.exit  # normally added by site, which -S skips
  lim = cfg["limits"]
  while True:
    try:
      msg = recv(r)
    except EOFError:
      os._exit(0)
    if msg["op"] == "spawn":
      pid = os.fork()
      if pid == 0:
        worker_rpc(r, w, lim)
      status = os.waitpid(pid, 0)[1]
      _reap_namespace(cfg, pid)
      send(w, {"op": "exited", "status": status, "stderr": _tail(".w_stderr", 2000)})
    elif msg["op"] == "stdio":
      with open(".stdin", "w", encoding="utf-8") as f:
        f.write(msg["stdin"])
      t0 = time.perf_counter()
      pid = os.fork()
      if pid == 0:
        os.close(r)
        os.close(w)
        _redirect(".stdin", ".stdout", ".stderr")
        worker_stdio(msg["src"], lim)
      pidfd = os.pidfd_open(pid)
      ready = select.select([pidfd], [], [], msg["timeout"])[0]
      elapsed = time.perf_counter() - t0
      os.close(pidfd)
      if not ready:
        os.kill(pid, signal.SIGKILL)
      status = os.waitpid(pid, 0)[1]
      _reap_namespace(cfg, pid)
      with open(".stdout", "rb") as f:
        out = f.read(lim["max_file_bytes"])
      send(w, {"op": "stdio_done", "timed_out": not ready, "status": status, "elapsed": elapsed,
               "stdout": out.decode("utf-8", "replace"), "stderr": _tail(".stderr", 2000)})


# ----------------------------------------------------------------------------- supervisor (S)
class Channel:
  """S's side of the pipes to Z/W; times every exchange with the worker."""

  def __init__(self, r, w, max_bytes):
    self.r, self.w, self.max_bytes = r, w, max_bytes
    self.runtime = 0.0
    self.deadline = None
    self.calls = 0

  def request(self, msg, timed=True):
    t0 = time.perf_counter()
    send(self.w, msg)
    try:
      reply = recv(self.r, self.deadline, self.max_bytes)
    except TimeoutError:
      self.runtime += time.perf_counter() - t0
      raise Abort("timeout: the test exceeded its time limit") from None
    except (EOFError, ValueError, OSError) as e:
      raise Abort(f"protocol error: {e}") from None
    if timed:
      self.runtime += time.perf_counter() - t0
    if not isinstance(reply, dict):
      raise Abort("protocol error: reply is not an object")
    if reply.get("op") == "exited":
      raise Abort(f"worker exited (wait status {reply.get('status')}); stderr: {reply.get('stderr', '')[-500:]}")
    return reply

  def call(self, fn, args, kwargs, method=False):
    self.calls += 1
    reply = self.request({"op": "call", "fn": fn, "method": method,
                          "args": encode(list(args)), "kwargs": encode(dict(kwargs))})
    if reply.get("ok") is True:
      try:
        return decode(reply.get("value"))
      except (ValueError, TypeError, KeyError, IndexError) as e:
        raise Abort(f"protocol error: undecodable value ({e})") from None
    name, text = str(reply.get("exc_type")), str(reply.get("error"))[:2000]
    exc = getattr(__builtins__, name, None) if isinstance(__builtins__, type(sys)) else __builtins__.get(name)
    if isinstance(exc, type) and issubclass(exc, Exception):
      raise exc(f"[candidate] {text}")
    raise CandidateError(text)

  def start_worker(self, src, deadline):
    send(self.w, {"op": "spawn"})
    self.deadline = deadline
    try:
      ready = recv(self.r, deadline, self.max_bytes)
    except (TimeoutError, EOFError, ValueError) as e:
      raise Abort(f"worker did not start: {e}") from None
    if ready.get("op") != "ready":
      raise Abort(f"worker did not start: {ready.get('stderr', ready)}")
    reply = self.request({"op": "load", "src": src})
    if reply.get("ok") is not True:
      raise Abort(f"program failed to load: {reply.get('error')}")
    return set(reply.get("names") or ())


class Remote:
  """Callable stub for a function defined by the candidate program."""

  def __init__(self, chan, name):
    self._chan, self._name = chan, name

  def __call__(self, *args, **kwargs):
    return self._chan.call(self._name, args, kwargs)


class FallbackBuiltins(dict):
  """Builtins mapping for the check: unknown names resolve to the program's functions."""

  def __init__(self, chan, names):
    import builtins
    super().__init__(vars(builtins))
    self._chan, self._names = chan, names

  def __missing__(self, key):
    if key in self._names:
      return Remote(self._chan, key)
    raise KeyError(key)


def normalise_stdout(s):
  return "\n".join(" ".join(line.split()) for line in s.strip().splitlines())


def _plain(x):
  if isinstance(x, (list, tuple)):
    return [_plain(e) for e in x]
  if isinstance(x, dict):
    return {k: _plain(v) for k, v in x.items()}
  return x


def check_job(job, chan, timeout):
  """Runs the tests in order, stopping at the first failure.

  Returns:
    (n_passed, error or None, timed_out, runtime_s). runtime_s is the time the
    candidate itself ran: for stdio tests the zygote's fork-to-reap time of each
    run; otherwise S's round-trip time of the program load plus every call.
  """
  tests = job["tests"]
  kind = tests["kind"]
  if kind == "stdio":
    runtime = 0.0
    for i, (stdin, expected) in enumerate(tests["pairs"]):
      chan.deadline = time.monotonic() + timeout + 5.0
      reply = chan.request({"op": "stdio", "src": job["program"], "stdin": stdin, "timeout": timeout},
                           timed=False)
      runtime += float(reply["elapsed"])
      if reply["timed_out"]:
        return i, f"test {i}: timeout after {timeout} s", True, runtime
      if reply["status"] != 0:
        return i, f"test {i}: wait status {reply['status']}; stderr: {reply['stderr'][-500:]}", False, runtime
      if normalise_stdout(reply["stdout"]) != normalise_stdout(expected):
        return i, f"test {i}: wrong output {reply['stdout'][:200]!r}", False, runtime
    return len(tests["pairs"]), None, False, runtime
  names = chan.start_worker(job["program"], time.monotonic() + timeout)
  if kind == "call":
    method = tests["fn_name"] not in names
    for i, (args, expected) in enumerate(zip(tests["inputs"], tests["outputs"])):
      chan.deadline = time.monotonic() + timeout
      try:
        got = chan.call(tests["fn_name"], args, {}, method=method)
      except Exception as e:  # the candidate raised
        return i, f"test {i}: {type(e).__name__}: {e}"[:1000], False, chan.runtime
      if _plain(got) != _plain(expected):
        return i, f"test {i}: expected {expected!r:.200}, got {got!r:.200}", False, chan.runtime
    return len(tests["inputs"]), None, False, chan.runtime
  # HumanEval: the data set's check() runs here (trusted), candidate calls are remote.
  chan.deadline = time.monotonic() + timeout
  env = {"__name__": "__check__", "__builtins__": FallbackBuiltins(chan, names)}
  try:
    if tests.get("prompt"):
      exec(compile(tests["prompt"], "prompt.py", "exec"), env)
    env[tests["entry_point"]] = candidate = Remote(chan, tests["entry_point"])  # not the prompt's stub
    exec(compile(tests["test_src"], "test.py", "exec"), env)
    env["check"](candidate)
  except Exception as e:
    return 0, f"check failed: {type(e).__name__}: {e}"[:1000], False, chan.runtime
  if chan.calls == 0:
    return 0, "check never called the candidate", False, chan.runtime
  return 1, None, False, chan.runtime


def supervisor(cfg):
  prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
  try:
    workdir = setup_namespaces(cfg)
  except OSError as e:
    os.write(1, json.dumps({"setup_error": str(e)}).encode())
    return
  to_w, from_w = os.pipe(), os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      zygote(cfg, to_w[0], from_w[1], workdir)
    finally:
      os._exit(70)
  os.close(to_w[0])
  os.close(from_w[1])
  drop_privileges(cfg)
  resource.setrlimit(resource.RLIMIT_AS, (cfg["limits"]["memory_bytes"],) * 2)
  # The job is read only now: the zygote (and every worker) was forked without it.
  job = json.loads(_read_all(0))
  chan = Channel(from_w[0], to_w[1], cfg["limits"]["max_file_bytes"] + (1 << 20))
  timed_out = False
  try:
    n_passed, error, timed_out, runtime = check_job(job, chan, float(job["timeout_s"]))
  except Abort as e:
    n_passed, error, runtime = 0, str(e), chan.runtime
    timed_out = str(e).startswith("timeout")
  except Exception as e:  # a bug in the check itself must fail closed, never pass
    n_passed, error, runtime = 0, f"harness error: {type(e).__name__}: {e}", chan.runtime
  os.write(1, json.dumps({"nonce": job["nonce"], "n_tests": job["n_tests"], "n_passed": n_passed,
                          "passed": error is None and n_passed == job["n_tests"],
                          "error": error, "timed_out": timed_out, "runtime_s": runtime}).encode())
  # Closing stdout/stderr hands the verdict over at once; the caller then kills
  # the process group, and namespace teardown is left to the kernel.
  os.close(1)
  os.close(2)
  os.kill(pid, signal.SIGKILL)
  os.waitpid(pid, 0)


def _read_all(fd):
  chunks = []
  while True:
    chunk = os.read(fd, 1 << 20)
    if not chunk:
      return b"".join(chunks)
    chunks.append(chunk)


def probe(cfg):
  """Reports what this machine allows (run by ``code.sandbox_capabilities``)."""
  report = {"namespaces": None, "error": None}
  try:
    setup_namespaces(cfg)
    report["namespaces"] = cfg["namespaces"]
  except OSError as e:
    report["error"] = str(e)
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    out = {"private_proc": False, "stdlib_readable": False, "network_blocked": False}
    try:
      os.close(r)
      if report["namespaces"]:
        try:
          mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
          out["private_proc"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) == [1]
        except OSError:
          pass
      drop_privileges(cfg)
      out["uid"] = os.getuid()
      import colorsys  # noqa: F401  (a stdlib module not imported yet: readability check)
      out["stdlib_readable"] = True
      import socket
      try:
        socket.create_connection(("127.0.0.1", cfg["probe_port"]), timeout=1).close()
      except OSError:
        out["network_blocked"] = True
    except BaseException as e:
      out["child_error"] = repr(e)
    os.write(w, json.dumps(out).encode())
    os._exit(0)
  os.close(w)
  child = _read_all(r)
  os.waitpid(pid, 0)
  report.update(json.loads(child or b"{}"))
  os.write(1, json.dumps(report).encode())


def fork_server(sock_fd):
  """Forks one supervisor per request (saves interpreter start-up and imports per run).

  A request is one SOCK_SEQPACKET message: JSON {"cfg", "env", "cwd"} plus the
  supervisor's stdin, stdout and stderr fds. The reply is the supervisor's pid
  (its own session, so the caller can kill the process group). The server never
  sees a job: jobs go from the caller straight to the supervisor's stdin. It
  exits when the caller's end of the socket closes.
  """
  import socket
  sock = socket.socket(fileno=sock_fd)
  while True:
    try:
      while os.waitpid(-1, os.WNOHANG)[0]:
        pass
    except ChildProcessError:
      pass
    try:
      msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
    except OSError:
      os._exit(0)
    if not msg:
      os._exit(0)
    req = json.loads(msg)
    pid = os.fork()
    if pid == 0:
      try:
        os.setsid()
        for i, fd in enumerate(fds):
          os.dup2(fd, i)
        close_fds_except([])
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        supervisor(req["cfg"])
      finally:
        os._exit(0)
    for fd in fds:
      os.close(fd)
    sock.send(str(pid).encode())


if __name__ == "__main__":
  sys.set_int_max_str_digits(0) if hasattr(sys, "set_int_max_str_digits") else None
  _cfg = json.loads(sys.argv[1])
  if _cfg["role"] == "probe":
    probe(_cfg)
  elif _cfg["role"] == "server":
    fork_server(_cfg["fd"])
  else:
    supervisor(_cfg)
