"""Tests for mr_rl.rewards.math against the real math-verify (docs/methods.md §7).

Expected accuracy values are math-verify 0.9's real verdicts, each checked by
hand; where math-verify disagrees with mathematics the note says
"MV-DISAGREES" and the table keeps math-verify's verdict (that is what the
trainer will see).
"""

import concurrent.futures as cf
import threading
import time

import pytest

from mr_rl.rewards import math as mr
from mr_rl.rewards import runner


def B(s):
  return "Reasoning... so the answer is $\\boxed{" + s + "}$."


def A(s):
  return "<reasoning>work</reasoning>\n<answer>" + s + "</answer>"


# (response, reference, expected, note)
ACCURACY_CASES = [

  # (response, reference, expected, note)
    (B("\\frac{1}{2}"), "\\frac{1}{2}", 1.0, "identical fraction"),
    (B("0.5"), "\\frac{1}{2}", 1.0, "decimal vs fraction"),
    (B("\\dfrac{1}{2}"), "\\frac{1}{2}", 1.0, "dfrac"),
    (B("\\tfrac{3}{4}"), "0.75", 1.0, "tfrac vs decimal"),
    (B("1/2"), "\\frac{1}{2}", 1.0, "slash fraction"),
    (B("\\frac12"), "\\frac{1}{2}", 1.0, "brace-less frac"),
    (B("\\frac{2}{4}"), "\\frac{1}{2}", 1.0, "unreduced fraction"),
    (B("\\frac{1}{3}"), "\\frac{1}{2}", 0.0, "wrong fraction"),
    (B("0.333"), "\\frac{1}{3}", 0.0, "rounded decimal too coarse"),
    (B("\\sqrt{2}"), "\\sqrt{2}", 1.0, "root"),
    (B("\\frac{\\sqrt{2}}{2}"), "\\frac{1}{\\sqrt{2}}", 1.0, "rationalised root"),
    (B("2\\sqrt{3}"), "\\sqrt{12}", 1.0, "simplified root"),
    (B("\\sqrt{3}"), "\\sqrt{2}", 0.0, "wrong root"),
    (B("\\sqrt[3]{8}"), "2", 1.0, "cube root"),
    (B("[2, 5)"), "[2,5)", 1.0, "interval"),
    (B("(2, 5)"), "[2,5)", 0.0, "interval wrong bracket"),
    (B("(-\\infty, 3]"), "(-\\infty,3]", 1.0, "infinite interval"),
    (B("x \\in [2,5)"), "[2,5)", 1.0, "interval with membership"),
    (B("\\{1, 2, 3\\}"), "\\{3,2,1\\}", 1.0, "set order-free"),
    (B("\\{1, 2\\}"), "\\{1,2,3\\}", 0.0, "set missing element"),
    (B("1, 2, 3"), "\\{1,2,3\\}", 1.0, "bare list vs set"),
    (B("(1, 2)"), "(1,2)", 1.0, "ordered pair"),
    (B("(2, 1)"), "(1,2)", 0.0, "pair order matters"),
    (B("50\\%"), "50\\%", 1.0, "percentage"),
    (B("0.5"), "50\\%", 1.0, "percent as decimal"),
    (B("50"), "50\\%", 1.0, "MV-DISAGREES: math says 0; math-verify accepts the bare number for a percentage"),
    (B("10\\text{ cm}"), "10", 1.0, "unit stripped"),
    (B("10 \\mathrm{cm}"), "10", 1.0, "mathrm unit"),
    (B("5\\text{ dollars}"), "5", 1.0, "text unit"),
    (B("\\$5"), "5", 1.0, "dollar sign"),
    (B("90^\\circ"), "90", 1.0, "degrees"),
    (B("-3"), "-3", 1.0, "negative integer"),
    (B("3"), "-3", 0.0, "sign error"),
    (B("-\\frac{1}{2}"), "-0.5", 1.0, "negative fraction"),
    (B("\\frac{-1}{2}"), "-\\frac{1}{2}", 1.0, "minus in numerator"),
    (B("x = -3"), "-3", 1.0, "assignment equation"),
    (B("1{,}000"), "1000", 1.0, "thousands separator"),
    (B("1,000"), "1000", 1.0, "1,000 is read as one thousand, not the set {1, 0}"),
    (B("2^{10}"), "1024", 1.0, "power evaluated"),
    (B("\\pi"), "\\pi", 1.0, "pi"),
    (B("3.14"), "\\pi", 0.0, "pi approximation rejected"),
    (B("2\\pi"), "2 \\pi", 1.0, "symbolic multiple"),
    (B("x^2+2x+1"), "(x+1)^2", 1.0, "expanded polynomial"),
    (B("\\infty"), "\\infty", 1.0, "infinity"),
    (B("\\text{(A)}"), "A", 1.0, "choice letter"),
    ("First \\boxed{3}, then corrected: \\boxed{4}", "4", 1.0, "last box wins"),
    ("First \\boxed{4}, then changed to \\boxed{3}", "4", 0.0, "last box wins (wrong)"),
    ("\\fbox{7}", "7", 1.0, "fbox"),
    ("\\boxed{\\frac{1}{2}} and then \\boxed{3", "\\frac{1}{2}", 1.0, "unterminated last box skipped"),
    ("The answer is 7.", "7", 0.0, "no box, no answer block"),
    ("", "7", 0.0, "empty response"),
    ("\\boxed{}", "7", 0.0, "empty box"),
    (B("\\frac{1}{"), "\\frac{1}{2}", 0.0, "malformed frac"),
    (B("\\left( 1"), "1", 1.0, "malformed \\left( without \\right): math-verify still reads 1"),
    (B("}{"), "1", 0.0, "garbage braces"),
    (A("7"), "7", 1.0, "answer block"),
    (A("\\frac{1}{2}"), "0.5", 1.0, "answer block latex without $"),
    (A("The answer is $\\frac{3}{4}$."), "0.75", 1.0, "answer block prose with inline math"),
    (A("\\boxed{5}"), "5", 1.0, "box inside answer block"),
    ("\\boxed{9} <reasoning>r</reasoning><answer>5</answer>", "5", 1.0, "answer block beats earlier box"),
    ("<answer>5</answer> ... <answer>6</answer>", "6", 1.0, "last answer block"),
    ("<answer>5", "5", 0.0, "unterminated answer block, no box"),
    ("<answer>  </answer> \\boxed{5}", "5", 0.0, "empty answer block means no answer"),
    (A("[2,5)"), "[2,5)", 1.0, "interval in answer block"),
    (A("-7"), "-7", 1.0, "negative in answer block"),
    (B("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"), "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 1.0, "matrix"),
    (B("1+i"), "1+i", 1.0, "complex"),
    (B("e^{i\\pi}"), "-1", 0.0, "MV-DISAGREES: math says 1; math-verify reads i as a symbol, not the imaginary unit"),
    (B("\\log_2 8"), "3", 1.0, "logarithm"),
    (B("\\sin^2 x + \\cos^2 x"), "1", 1.0, "trig identity"),
]


NEGATIVE_CASES = [
    (B("-3"), 1.0, "negative integer"),
    (B("3"), 0.0, "positive integer"),
    (B("0"), 0.0, "zero"),
    (B("-0"), 0.0, "negative zero is not < 0"),
    (B("-0.25"), 1.0, "negative decimal"),
    (B(".5"), 0.0, "positive decimal without leading digit"),
    (B("-\\frac{1}{2}"), 1.0, "negative fraction"),
    (B("\\frac{-1}{2}"), 1.0, "minus in numerator"),
    (B("\\dfrac{3}{-4}"), 1.0, "minus in denominator"),
    (B("-\\frac{-1}{2}"), 0.0, "double negative"),
    (B("-5\\%"), 1.0, "negative percentage"),
    (B("x = -3"), 1.0, "assignment of a negative value"),
    (B("-\\sqrt{2}"), 1.0, "negative root"),
    (B("1 - \\pi"), 1.0, "sympy-evaluable expression"),
    (B("\\pi - 3"), 0.0, "positive expression"),
    (B("-\\infty"), 1.0, "minus infinity is below zero"),
    (B("-2i"), 0.0, "i is a symbol for math-verify: not numeric"),
    (B("x"), 0.0, "symbol"),
    (B("-x"), 0.0, "symbolic, sign unknown"),
    (B("(-1, 2)"), 0.0, "interval"),
    (B("-1, -2"), 0.0, "set of negatives is not a number"),
    (B("\\text{none}"), 0.0, "text"),
    (A("-7"), 1.0, "answer block"),
    (A("The answer is $-\\frac{3}{4}$."), 1.0, "answer block prose"),
    ("\\boxed{-1} then \\boxed{2}", 0.0, "last box wins"),
    ("The answer is -4.", 0.0, "no final answer"),
]


@pytest.fixture(scope="module")
def accuracy_results():
  """All accuracy cases at once from worker threads (never the main thread)."""
  with cf.ThreadPoolExecutor(4) as ex:
    return list(ex.map(lambda c: mr.accuracy(c[0], c[1]), ACCURACY_CASES))


@pytest.fixture(scope="module")
def negative_results():
  with cf.ThreadPoolExecutor(4) as ex:
    return list(ex.map(lambda c: mr.negative(c[0]), NEGATIVE_CASES))


def test_accuracy_table_is_large():
  assert len(ACCURACY_CASES) >= 60


@pytest.mark.parametrize("i", range(len(ACCURACY_CASES)),
                         ids=[c[3] for c in ACCURACY_CASES])
def test_accuracy(accuracy_results, i):
  response, reference, expected, note = ACCURACY_CASES[i]
  assert accuracy_results[i] == expected, (response, reference, note)


@pytest.mark.parametrize("i", range(len(NEGATIVE_CASES)), ids=[c[2] for c in NEGATIVE_CASES])
def test_negative(negative_results, i):
  response, expected, note = NEGATIVE_CASES[i]
  assert negative_results[i] == expected, (response, note)


@pytest.mark.parametrize("response, expected", [
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),                  # escaped braces do not close the box
    ("\\boxed {5}", "5"),                                 # space before the brace
    ("\\fbox{x}", "x"),
    ("\\boxed{1} \\fbox{2}", "2"),
    ("\\boxed{a{b}c}", "a{b}c"),
    ("\\boxed{1} and \\boxed{2", "1"),                   # unterminated last box skipped
    ("\\boxed{", None),
    ("no answer", None),
    ("<answer> 42 </answer>", "42"),
    ("\\boxed{1}<answer>2</answer>", "2"),               # answer block has priority
    ("<answer>so \\boxed{3}</answer>", "3"),             # box inside the block
    ("<answer>1</answer><answer>2</answer>", "2"),
    ("<answer>\n</answer>\\boxed{4}", None),             # declared but empty
    ("<answer>1", None),
])
def test_extract_answer(response, expected):
  assert mr.extract_answer(response) == expected


def test_extraction_is_linear_on_adversarial_input():
  text = "\\boxed{" * 100_000 + "x"  # 700k chars of unterminated boxes
  t0 = time.monotonic()
  assert mr.extract_answer(text) is None
  assert mr.accuracy(text, "1") == 0.0
  assert time.monotonic() - t0 < 5.0


def test_overlong_answer_is_not_parsed():
  answer = "1+" * (mr.MAX_ANSWER_CHARS // 2) + "1"
  assert len(answer) > mr.MAX_ANSWER_CHARS
  before = runner.shared_pool().restarts
  t0 = time.monotonic()
  assert mr.accuracy("\\boxed{" + answer + "}", str(mr.MAX_ANSWER_CHARS // 2 + 1)) == 0.0
  assert mr.negative("\\boxed{-" + answer + "}") == 0.0
  assert time.monotonic() - t0 < 1.0
  assert runner.shared_pool().restarts == before


def _call_in_thread(fn):
  """Runs fn on a fresh non-main thread; returns (result or exception, seconds)."""
  out = {}

  def target():
    t0 = time.monotonic()
    try:
      out["value"] = fn()
    except Exception as e:  # pylint: disable=broad-except
      out["value"] = e
    out["seconds"] = time.monotonic() - t0

  th = threading.Thread(target=target)
  th.start()
  th.join(60)
  assert not th.is_alive()
  return out["value"], out["seconds"]


@pytest.mark.parametrize("response, reason", [
    # latex2sympy's ANTLR parser is exponential in parenthesis depth (depth 31 ~ 8 s).
    ("\\boxed{" + "(" * 45 + "1" + ")" * 45 + "}", "parse"),
    # sympy evaluates the tower 9^(9^(9^9)) in C: no signal can interrupt it.
    ("\\boxed{9^{9^{9^{9}}}}", "verify"),
])
def test_pathological_input_times_out_off_main_thread(response, reason):
  pool = runner.shared_pool()
  restarts = pool.restarts
  value, seconds = _call_in_thread(lambda: mr.accuracy(response, "1", timeout_s=1.5))
  assert isinstance(value, runner.RewardTimeoutError), (reason, value)
  assert 1.5 <= seconds < 6.0, reason
  assert pool.restarts == restarts + 1
  # The pool is replaced and keeps working.
  value, _ = _call_in_thread(lambda: mr.accuracy("\\boxed{\\frac{2}{4}}", "0.5"))
  assert value == 1.0


def test_negative_times_out_on_huge_power():
  value, seconds = _call_in_thread(lambda: mr.negative("\\boxed{-9^{9^{9^{9}}}}", timeout_s=1.0))
  assert isinstance(value, runner.RewardTimeoutError)
  assert seconds < 5.0


@pytest.mark.parametrize("response, expected", [
    ("<reasoning>r</reasoning><answer>a</answer>", 1.0),
    ("  \n<reasoning>\nstep\n</reasoning>\n\n<answer>\n42\n</answer>\n ", 1.0),
    ("<reasoning></reasoning><answer></answer>", 1.0),       # contents are free
    ("<reasoning>r</reasoning> x <answer>a</answer>", 0.0),  # text between blocks
    ("hi <reasoning>r</reasoning><answer>a</answer>", 0.0),  # text before
    ("<reasoning>r</reasoning><answer>a</answer> bye", 0.0),  # text after
    ("<answer>a</answer><reasoning>r</reasoning>", 0.0),     # wrong order
    ("<reasoning>r</reasoning>", 0.0),
    ("<answer>a</answer>", 0.0),
    ("<reasoning>r<answer>a</answer></reasoning>", 0.0),     # nested
    ("<reasoning>r</reasoning></reasoning><answer>a</answer>", 0.0),
    ("<reasoning>r</reasoning><answer>a</answer><answer>b</answer>", 0.0),
    ("<reasoning>r</reasoning><answer>a", 0.0),              # truncated
    ("<think>r</think><answer>a</answer>", 0.0),
    ("", 0.0),
])
def test_format_reward(response, expected):
  assert mr.format_reward(response) == expected


@pytest.mark.parametrize("num_tokens, expected", [
    (0, 1.0), (100, 1.0), (2800, 1.0), (2801, 1.0 - 1 / 200), (2900, 0.5), (2950, 0.25),
    (3000, 0.0), (3001, 0.0), (100_000, 0.0),
])
def test_length_reward(num_tokens, expected):
  assert mr.length_reward(num_tokens) == pytest.approx(expected, abs=1e-12)


def test_length_reward_custom_and_validation():
  assert mr.length_reward(150, max_full=100, zero_at=200) == pytest.approx(0.5)
  import numpy as np
  assert mr.length_reward(np.int32(2900)) == pytest.approx(0.5)
  with pytest.raises(ValueError, match="num_tokens"):
    mr.length_reward(-1)
  with pytest.raises(TypeError, match="num_tokens"):
    mr.length_reward(2.5)
  with pytest.raises(ValueError, match="zero_at"):
    mr.length_reward(10, max_full=3000, zero_at=3000)


@pytest.mark.parametrize("num_tokens, threshold, expected", [
    (0, 200, 1.0), (199, 200, 1.0), (200, 200, 0.0), (201, 200, 0.0),
    (127, 128, 1.0), (128, 128, 0.0), (511, 512, 1.0), (512, 512, 0.0),
])
def test_brief(num_tokens, threshold, expected):
  assert mr.brief(num_tokens, threshold) == expected


def test_argument_errors():
  with pytest.raises(ValueError, match="threshold"):
    mr.brief(10, 0)
  with pytest.raises(TypeError, match="response"):
    mr.accuracy(None, "1")
  with pytest.raises(TypeError, match="reference"):
    mr.accuracy("\\boxed{1}", 1)
  with pytest.raises(TypeError, match="response"):
    mr.format_reward(b"<reasoning>")
  with pytest.raises(ValueError, match="timeout_s"):
    mr.negative("\\boxed{-1}", timeout_s=0)
  with pytest.raises(ValueError, match="reference"):
    mr.accuracy("\\boxed{1}", "")
