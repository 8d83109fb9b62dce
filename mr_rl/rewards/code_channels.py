"""TAG code reward channels for the runner: ``code_correct``, ``code_fast``, ``code_noop``.

docs/methods.md §7 (TAG code task): correctness ``RP = 1`` iff every test passes in an
isolated sandbox; the auxiliary channels are *fast* (runtime < 60 ms) and *no-op*
(runtime < 3 ms). The sandbox, the verdict and the runtime measurement are
``mr_rl.rewards.sandbox``; this module turns a policy response and a data set example into
one sandbox run and shares that run between the three channels.

Response -> program (``extract_program``): the last complete fenced block whose info
string is ``python`` / ``py`` / ``python3`` (any case); if there is none, the last
complete fenced block without an info string; if there is none either, the whole
response. An unterminated fence (a response cut at the length limit) is not a block.

Example -> tests (``tests_from_example``), first match wins:
  * ``example["tests"]``: a ``mr_rl.data.CodeTestSpec`` (DeepCoder), its ``to_dict()`` form
    (also as the read-only mapping ``Example.as_mapping`` produces), or a ready
    ``mr_rl.rewards.sandbox.CodeTests``;
  * HumanEval fields ``example["test"]`` (defines ``check(candidate)``),
    ``example["entry_point"]`` and optionally ``example["prompt"]`` (trusted helpers).
Call tests in the APPS convention (``CodeTestSpec.list_wrapped``: taco, primeintellect)
accept a return value ``v`` when ``v == expected`` or ``expected == [v]``. The sandbox's
``call`` kind compares exactly, so these specs run as a generated trusted ``check``
(``humaneval`` kind: it runs in the supervisor, the candidate is called remotely, so the
verdict is as tamper-proof as for plain call tests; the result counts as one test).
When the function is a method of a class ``Solution`` (no top-level def of that name,
found with ``ast`` without running anything), a two-line forwarder
``def fn(*a, **k): return Solution().fn(*a, **k)`` is appended to the program, which is
what the sandbox's call kind does itself (a fresh instance per call).

One sandbox run per response: ``RunCache`` hands each run to each channel (consumer) at most
once, so when the runner evaluates ``code_correct``, ``code_fast`` and ``code_noop`` of one
response concurrently, the first call runs the sandbox and the other two wait for its result,
while the same program text scored again by the same channel (another response, a later step)
runs again: no channel is paid twice for one run. All channels built by the factories below
share one module-level cache (``shared_run_cache()``), keyed also by the sandbox config.

``code_fast`` / ``code_noop`` read only the runtime (``fast`` / ``noop`` here): like
the paper's auxiliary channels they ignore correctness; the TAG gate in the aggregator
couples them to ``code_correct``.
"""

from __future__ import annotations

import ast
import collections
import concurrent.futures as cf
import functools
import json
import threading
from typing import Any, Callable, Mapping

from mr_rl.data.code import CodeTestSpec
from mr_rl.rewards import sandbox as code_sandbox
from mr_rl.rewards.channels import REWARDS, UNIT_RANGE, MissingFieldError, RewardChannel

FAST_THRESHOLD_MS = 60.0  # TAG "Correct & fast": T < 60 ms
NOOP_THRESHOLD_MS = 3.0  # TAG "Correct & no-op": T < 3 ms

__all__ = ["extract_program", "tests_from_spec", "tests_from_example", "prepare_program",
           "RunCache", "shared_run_cache", "correct", "fast", "noop", "FAST_THRESHOLD_MS",
           "NOOP_THRESHOLD_MS", "code_channel"]

_PY_TAGS = ("python", "py", "python3")

# Generated trusted check for APPS-style (list-wrapped) call tests. `_CASES` is the JSON of
# [[args, expected], ...]; `_plain` makes tuples compare equal to lists, as the call kind does.
_WRAPPED_MARK = "# mr_rl: generated check for list-wrapped call tests\n"
_WRAPPED_CHECK = _WRAPPED_MARK + '''\
import json as _json
_CASES = _json.loads({cases!r})


def _plain(x):
  if isinstance(x, (list, tuple)):
    return [_plain(e) for e in x]
  if isinstance(x, dict):
    return {{k: _plain(v) for k, v in x.items()}}
  return x


def check(candidate):
  for i, (args, expected) in enumerate(_CASES):
    got = _plain(candidate(*args))
    ok = got == expected or (isinstance(expected, list) and len(expected) == 1
                             and got == expected[0])
    assert ok, "test %d: expected %.200r, got %.200r" % (i, expected, got)
'''
_SOLUTION_FORWARDER = "\n\n\ndef {fn}(*args, **kwargs):\n  return Solution().{fn}(*args, **kwargs)\n"


# ----------------------------------------------------------------------------- extraction
def _fenced_blocks(text: str):
  """(tag, body) of each fenced block, as ``re.finditer`` of
  ``^[ \t]*```[ \t]*([^\n`]*)\n(.*?)^[ \t]*```[ \t]*$`` (DOTALL, MULTILINE) finds them, in
  one pass over the lines: linear where that regex was quadratic (from every opening line it
  scanned to the end for a closing one: 50 KB of "```x" lines held the GIL 2.5-4.3 s). An
  opening line is ```` ``` ```` plus a tag without backticks, followed by a newline; its
  block ends at the next line that is only ```` ``` ```` (and spaces / tabs). An opening line
  with no closing line after it means no later one has one either."""
  lines = text.split("\n")
  starts = [0] * len(lines)
  for i in range(1, len(lines)):
    starts[i] = starts[i - 1] + len(lines[i - 1]) + 1
  i, n = 0, len(lines)
  while i < n - 1:  # an opening line needs its newline
    head = lines[i].lstrip(" \t")
    if head.startswith("```") and "`" not in head[3:]:
      j = i + 1
      while j < n and lines[j].strip(" \t") != "```":
        j += 1
      if j == n:
        return
      yield head[3:], text[starts[i + 1]:starts[j]]
      i = j + 1
    else:
      i += 1


def extract_program(response: str) -> str:
  """The program in a policy response (see the module docstring for the rule).

  Raises:
    TypeError: response is not a str.
  """
  if not isinstance(response, str):
    raise TypeError(f"response must be a str, got {type(response).__name__}")
  python_blocks, bare_blocks = [], []
  for tag, body in _fenced_blocks(response):
    tag = tag.strip().lower()
    if tag in _PY_TAGS:
      python_blocks.append(body)
    elif not tag:
      bare_blocks.append(body)
  if python_blocks:
    return python_blocks[-1]
  if bare_blocks:
    return bare_blocks[-1]
  return response


# ----------------------------------------------------------------------------- tests
def _spec_from_mapping(d: Mapping[str, Any]) -> CodeTestSpec:
  missing = [k for k in ("kind", "inputs", "outputs") if k not in d]
  if missing:
    raise ValueError(f"example['tests'] mapping lacks {missing} (keys: {sorted(d)}); expected "
                     "CodeTestSpec.to_dict() fields")
  inputs = d["inputs"]
  if d["kind"] == "call":
    inputs = [tuple(a) if isinstance(a, (list, tuple)) else (a,) for a in inputs]
  return CodeTestSpec(d["kind"], tuple(inputs), tuple(_thaw(o) for o in d["outputs"]),
                      fn_name=d.get("fn_name"), list_wrapped=bool(d.get("list_wrapped", False)))


def _thaw(x: Any) -> Any:
  """Read-only mappings / tuples (Example metadata freezing) -> plain dicts / lists."""
  if isinstance(x, Mapping):
    return {k: _thaw(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_thaw(v) for v in x]
  return x


def tests_from_spec(spec: CodeTestSpec) -> code_sandbox.CodeTests:
  """``CodeTestSpec`` -> sandbox ``CodeTests`` (list-wrapped call tests: generated check).

  Raises:
    TypeError: spec is not a CodeTestSpec.
    ValueError: no tests, or arguments / outputs that are not JSON data.
  """
  if not isinstance(spec, CodeTestSpec):
    raise TypeError(f"spec must be a CodeTestSpec, got {type(spec).__name__}")
  if len(spec) == 0:
    raise ValueError("spec holds no tests")
  if spec.kind == "stdio":
    return code_sandbox.CodeTests.stdio(spec.pairs)
  inputs = [_thaw(list(a)) for a in spec.inputs]
  outputs = [_thaw(o) for o in spec.outputs]
  if not spec.list_wrapped:
    return code_sandbox.CodeTests.call(spec.fn_name, inputs, outputs)
  try:
    cases = json.dumps([[a, o] for a, o in zip(inputs, outputs)], allow_nan=False)
  except (TypeError, ValueError) as e:
    raise ValueError(f"call test arguments / outputs must be JSON data: {e}") from None
  return code_sandbox.CodeTests.humaneval(_WRAPPED_CHECK.format(cases=cases), spec.fn_name)


def tests_from_example(example: Mapping[str, Any]) -> code_sandbox.CodeTests:
  """The sandbox tests of one example (see the module docstring for the accepted fields).

  Raises:
    TypeError: example is not a mapping, or example['tests'] has an unknown type.
    MissingFieldError (a KeyError): the example has neither 'tests' nor HumanEval 'test' +
      'entry_point'.
  """
  if not isinstance(example, Mapping):
    raise TypeError(f"example must be a mapping, got {type(example).__name__}")
  if "tests" in example:
    t = example["tests"]
    if isinstance(t, code_sandbox.CodeTests):
      return t
    if isinstance(t, CodeTestSpec):
      return tests_from_spec(t)
    if isinstance(t, Mapping):
      return tests_from_spec(_spec_from_mapping(t))
    raise TypeError(f"example['tests'] must be a CodeTestSpec, its dict form or CodeTests, got "
                    f"{type(t).__name__}")
  if "test" in example and "entry_point" in example:
    return code_sandbox.CodeTests.humaneval(example["test"], example["entry_point"],
                                    prompt=example.get("prompt"))
  raise MissingFieldError(f"example has no code tests: need 'tests' (CodeTestSpec) or HumanEval "
                          f"'test' and 'entry_point' (keys: {sorted(example)})")


def _top_level_names(program: str) -> set[str] | None:
  """Names bound at the top level of a program (None when it does not parse)."""
  try:
    tree = ast.parse(program)
  except (SyntaxError, ValueError):
    return None
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split(".")[0] for a in node.names)
  return names


def prepare_program(program: str, tests: code_sandbox.CodeTests) -> str:
  """The program as run: a ``Solution`` forwarder is appended for generated (list-wrapped)
  checks whose function is only a ``Solution`` method."""
  if tests.kind == "humaneval" and tests.test_src.startswith(_WRAPPED_MARK):
    names = _top_level_names(program)
    if names is not None and tests.entry_point not in names and "Solution" in names:
      return program + _SOLUTION_FORWARDER.format(fn=tests.entry_point)
  return program


# ----------------------------------------------------------------------------- shared runs
class _Entry:
  """One sandbox run of a key, and the consumers (channels) that have taken its result."""
  __slots__ = ("future", "consumers")

  def __init__(self, consumer: str):
    self.future: cf.Future = cf.Future()
    self.consumers = {consumer}


class RunCache:
  """Shares one sandbox run between the channels of one response, never more.

  ``get(program, tests, timeout_s, config, consumer)`` gives ``consumer`` (a channel name) a
  run of the key (program, tests, timeout, config) that this consumer has not taken yet:
  a finished or in-flight one that another consumer started, else a new one. So the three
  channels of a response (``code_correct``, ``code_fast``, ``code_noop``) share one run, and
  every further call of a channel on the same program text - another response of the group,
  a later step - is a new run: a result is never paid twice by one channel. (Before, one
  process-wide result per program text paid a random yes / no guesser's one lucky pass
  every time the text came back: 12 times in 12, where the sandbox passes it 1-2 times.)
  ``consumer=None`` is a private run, shared with nobody. A run that raises (e.g.
  ``SandboxError``) is dropped; every waiter gets the exception. A run every registered
  consumer has taken is dropped; at most ``maxsize`` runs are kept (least recently used
  first out).

  Attributes:
    runs: sandbox runs started.
    hits: calls answered by a run another consumer started (finished or in flight).
  """

  def __init__(self, maxsize: int = 4096):
    if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 1:
      raise ValueError(f"maxsize must be a positive int, got {maxsize!r}")
    self.maxsize = maxsize
    self._entries: collections.OrderedDict[tuple, list[_Entry]] = collections.OrderedDict()
    self._consumers: set[str] = set()
    self._lock = threading.Lock()
    self.runs = 0
    self.hits = 0

  def register(self, consumer: str) -> None:
    """Declares a consumer (a channel built on this cache): a run is dropped once every
    registered consumer took it."""
    with self._lock:
      self._consumers.add(consumer)

  @staticmethod
  def key(program: str, tests: code_sandbox.CodeTests, timeout_s: float,
          config: code_sandbox.SandboxConfig | None) -> tuple:
    return (program, json.dumps(tests.payload(), sort_keys=True), float(timeout_s), config)

  def __len__(self) -> int:
    with self._lock:
      return sum(len(v) for v in self._entries.values())

  def get(self, program: str, tests: code_sandbox.CodeTests, timeout_s: float,
          config: code_sandbox.SandboxConfig | None = None,
          consumer: str | None = None) -> code_sandbox.CodeResult:
    key = self.key(program, tests, timeout_s, config)
    with self._lock:
      entries = self._entries.get(key, []) if consumer is not None else []
      entry = next((e for e in entries if consumer not in e.consumers), None)
      owner = entry is None
      if owner:
        entry = _Entry(consumer)
        self.runs += 1
        if consumer is not None:
          self._consumers.add(consumer)
          if not self._consumers <= entry.consumers:  # another consumer may take it
            self._entries.setdefault(key, []).append(entry)
            self._evict()
      else:
        entry.consumers.add(consumer)
        self.hits += 1
        self._entries.move_to_end(key)
        if self._consumers <= entry.consumers:  # every consumer has it: nobody will again
          self._drop(key, entry)
    if not owner:
      return entry.future.result()
    try:
      result = code_sandbox.run(program, tests, timeout_s=timeout_s, config=config)
    except BaseException as e:
      with self._lock:
        self._drop(key, entry)
      entry.future.set_exception(e)
      raise
    entry.future.set_result(result)
    return result

  def _drop(self, key: tuple, entry: _Entry) -> None:
    entries = self._entries.get(key, [])
    if entry in entries:
      entries.remove(entry)
    if not entries:
      self._entries.pop(key, None)

  def _evict(self) -> None:
    while sum(len(v) for v in self._entries.values()) > self.maxsize:
      key = next(iter(self._entries))
      self._entries[key].pop(0)
      if not self._entries[key]:
        del self._entries[key]

  def clear(self) -> None:
    with self._lock:
      self._entries.clear()
      self.runs = self.hits = 0


_SHARED = RunCache()


def shared_run_cache() -> RunCache:
  """The cache every channel built by the registered factories uses."""
  return _SHARED


# ----------------------------------------------------------------------------- rules
def correct(result: code_sandbox.CodeResult) -> float:
  """TAG primary channel RP: 1.0 iff every test passed."""
  return 1.0 if result.passed else 0.0


def fast(result: code_sandbox.CodeResult, threshold_ms: float = FAST_THRESHOLD_MS) -> float:
  """TAG "fast" auxiliary channel: 1.0 iff ``runtime_s`` < ``threshold_ms`` (60 ms)."""
  code_sandbox.require_timeout("threshold_ms", threshold_ms)
  return 1.0 if result.runtime_s * 1e3 < threshold_ms else 0.0


def noop(result: code_sandbox.CodeResult, threshold_ms: float = NOOP_THRESHOLD_MS) -> float:
  """TAG "no-op" auxiliary channel: 1.0 iff ``runtime_s`` < ``threshold_ms`` (3 ms)."""
  code_sandbox.require_timeout("threshold_ms", threshold_ms)
  return 1.0 if result.runtime_s * 1e3 < threshold_ms else 0.0


# ----------------------------------------------------------------------------- channels
_SCORERS: dict[str, Callable[..., float]] = {
    "correct": lambda r, threshold_ms: correct(r),
    "fast": fast,
    "noop": noop,
}
_DEFAULT_MS = {"correct": None, "fast": FAST_THRESHOLD_MS, "noop": NOOP_THRESHOLD_MS}


def _channel_fn(response, example, num_tokens, *, which, threshold_ms, timeout_s, config,
                prepend_prompt, cache, consumer):
  del num_tokens
  tests = tests_from_example(example)
  program = extract_program(response)
  if prepend_prompt:
    if tests.kind != "humaneval" or not isinstance(example.get("prompt"), str):
      raise ValueError("prepend_prompt=True needs HumanEval examples with a 'prompt' str")
    program = example["prompt"] + program
  program = prepare_program(program, tests)
  result = (cache or _SHARED).get(program, tests, timeout_s, config, consumer)
  return _SCORERS[which](result, threshold_ms)


def code_channel(which: str, *, name: str | None = None, threshold_ms: float | None = None,
                 timeout_s: float = code_sandbox.SMALL_TEST_TIMEOUT_S,
                 sandbox: code_sandbox.SandboxConfig | Mapping[str, Any] | None = None,
                 prepend_prompt: bool = False, cache: RunCache | None = None) -> RewardChannel:
  """A TAG code channel (docs/methods.md §7).

  Args:
    which: "correct" (1 iff every test passes), "fast" (runtime < threshold_ms, default
      60) or "noop" (runtime < threshold_ms, default 3).
    name: channel name (default ``code_<which>``).
    threshold_ms: runtime threshold of fast / noop (must be None for correct).
    timeout_s: per-test timeout (TAG: 10 s small tests, 30 s medium tests). The runner's
      ``timeout_s`` must exceed the whole run (about ``timeout_s * (n_tests + 1)``).
    sandbox: a ``mr_rl.rewards.sandbox.SandboxConfig`` or its fields as a dict (default config).
    prepend_prompt: HumanEval completion style: run ``example['prompt'] + program``.
    cache: run cache (default the shared one, so the three channels share runs).

  Raises:
    ValueError / TypeError: unknown ``which``, bad thresholds / timeout / sandbox fields.
  """
  if which not in _SCORERS:
    raise ValueError(f"which must be one of {sorted(_SCORERS)}, got {which!r}")
  if which == "correct":
    if threshold_ms is not None:
      raise ValueError("threshold_ms applies only to the fast / noop channels")
  else:
    threshold_ms = _DEFAULT_MS[which] if threshold_ms is None else threshold_ms
    code_sandbox.require_timeout("threshold_ms", threshold_ms)
  code_sandbox.require_timeout("timeout_s", timeout_s)
  if sandbox is not None and hasattr(sandbox, "items"):  # a dict or ConfigDict of fields
    sandbox = code_sandbox.SandboxConfig(**dict(sandbox.items()))
  elif sandbox is not None and not isinstance(sandbox, code_sandbox.SandboxConfig):
    raise TypeError(f"sandbox must be a SandboxConfig, a dict of its fields or None, got "
                    f"{type(sandbox).__name__}")
  if not isinstance(prepend_prompt, bool):
    raise TypeError(f"prepend_prompt must be a bool, got {prepend_prompt!r}")
  if cache is not None and not isinstance(cache, RunCache):
    raise TypeError(f"cache must be a RunCache, got {type(cache).__name__}")
  name = name or f"code_{which}"
  (cache or _SHARED).register(name)
  fn = functools.partial(_channel_fn, which=which, threshold_ms=threshold_ms,
                         timeout_s=float(timeout_s), config=sandbox,
                         prepend_prompt=prepend_prompt, cache=cache, consumer=name)
  return RewardChannel(name, fn, "thread", value_range=UNIT_RANGE)


# Registered channels (kind "thread": the host side only waits on the sandbox's pipes); each
# takes `code_channel`'s keyword arguments.
@REWARDS.register
def code_correct(**kw: Any) -> RewardChannel:
  """1 iff every test passes: ``code_channel("correct", **kw)`` (timeout_s=10, sandbox=None,
  prepend_prompt=False)."""
  return code_channel("correct", **kw)


@REWARDS.register
def code_fast(**kw: Any) -> RewardChannel:
  """Runtime < threshold_ms (default 60): ``code_channel("fast", **kw)``."""
  return code_channel("fast", **kw)


@REWARDS.register
def code_noop(**kw: Any) -> RewardChannel:
  """Runtime < threshold_ms (default 3): ``code_channel("noop", **kw)``."""
  return code_channel("noop", **kw)
