"""Math reward rules (docs/methods.md §7): accuracy, format, length, brief, negative.

Answer extraction (``extract_answer``), in priority order:

1. The last complete ``<answer>...</answer>`` block (AMRP's output format). If
   it contains a ``\\boxed{...}``/``\\fbox{...}``, the last one inside the block
   is the answer, otherwise the block's stripped text. The block is the
   model's declared final answer, so boxes in the reasoning before it are
   treated as intermediate results.
2. Otherwise the last complete ``\\boxed{...}`` or ``\\fbox{...}`` anywhere
   (TAG's format). Braces are matched with nesting; ``\\{`` and ``\\}`` are
   escaped braces. An unterminated box (a truncated response) is skipped.
3. Otherwise there is no answer: accuracy and negative score 0.

Extraction is a single linear pass (no backtracking regexes), so any response
length is handled in bounded time. An extracted answer longer than
``MAX_ANSWER_CHARS`` characters is not parsed at all (it scores 0): real final
answers are short, and the LaTeX parser is super-linear in the input.

math-verify (``parse``/``verify``) guards itself with ``signal.alarm``, which
only works on the main thread, and sympy can hang in C code (e.g.
``9^{9^{9^9}}``) where no signal helps. So ``accuracy`` and ``negative`` run
math-verify in worker processes of ``pool.shared_pool()`` with its own
timeouts disabled (``parsing_timeout=None, timeout_seconds=None``) and a hard
wall-clock timeout per call that kills and replaces the worker; they can be
called from any thread and any caller (unguarded scripts, stdin, notebooks: the
workers never import ``__main__``). This module registers its worker set-up with
the pool when imported (``math_preload``: math-verify loaded once in the zygote).
``*_in_process`` variants run the same code in the calling process, with no
timeout, and are what the runner's "process" channels execute inside the workers.
"""

from __future__ import annotations

import re
from typing import Any

from mr_rl.rewards.channels import RewardConfigError
from mr_rl.rewards.process.pool import shared_pool

MAX_ANSWER_CHARS = 1000
DEFAULT_TIMEOUT_S = 10.0

_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_REASONING_OPEN, _REASONING_CLOSE = "<reasoning>", "</reasoning>"
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_MATH_DELIMITERS = ("$", "\\(", "\\[", "\\boxed", "\\fbox")
_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")


def _check_str(value: Any, name: str) -> None:
  if not isinstance(value, str):
    raise TypeError(f"{name} must be str, got {type(value).__name__}")


def _matching_braces(text: str) -> dict[int, int]:
  """Maps the index of every balanced '{' to its '}' (one pass; '\\x' is skipped)."""
  match, stack, i, n = {}, [], 0, len(text)
  while i < n:
    ch = text[i]
    if ch == "\\":
      i += 2
      continue
    if ch == "{":
      stack.append(i)
    elif ch == "}" and stack:
      match[stack.pop()] = i
    i += 1
  return match


def _last_box(text: str) -> str | None:
  """Content of the last complete \\boxed{...} / \\fbox{...} in `text`."""
  starts = [m.end() - 1 for m in _BOX_RE.finditer(text)]  # indices of the '{'
  if not starts:
    return None
  match = _matching_braces(text)
  for start in reversed(starts):
    if start in match:
      return text[start + 1:match[start]].strip()
  return None


def _extract(response: str) -> tuple[str, str] | None:
  """Returns (answer, source) with source "boxed" or "answer", or None."""
  close = response.rfind(_ANSWER_CLOSE)
  if close >= 0:
    open_ = response.rfind(_ANSWER_OPEN, 0, close)
    if open_ >= 0:
      block = response[open_ + len(_ANSWER_OPEN):close]
      boxed = _last_box(block)
      if boxed is not None:
        return boxed, "boxed"
      block = block.strip()
      return (block, "answer") if block else None
  boxed = _last_box(response)
  return (boxed, "boxed") if boxed is not None else None


def extract_answer(response: str) -> str | None:
  """Final answer of `response` (see the module docstring for the priority), or None."""
  _check_str(response, "response")
  found = _extract(response)
  return None if found is None else found[0]


def _to_parse_input(answer: str, source: str) -> str:
  """Wraps an extracted answer so math-verify reads it as one LaTeX expression."""
  if source == "boxed":
    return "\\boxed{" + answer + "}"
  if any(d in answer for d in _MATH_DELIMITERS):
    return answer  # prose with inline math: let math-verify find the expression
  return "$" + answer + "$"


def _reference_parse_input(reference: str) -> str:
  if any(d in reference for d in _MATH_DELIMITERS):
    return reference
  return "$" + reference + "$"


# ----------------------------------------------------------------------------
# Worker-side code: math-verify with its signal-based timeouts disabled.
# ----------------------------------------------------------------------------

# `_verify_parsed` / `_parse_number` unpickle from this module: the zygote loads it once, with
# math-verify warmed up by `math_preload`.
shared_pool().add_setup(preload=("mr_rl.rewards.math_preload", "mr_rl.rewards.math"))


def _verify_parsed(pred_input: str, gold_input: str) -> bool:
  from math_verify import parse, verify  # pylint: disable=import-outside-toplevel
  gold = parse(gold_input, parsing_timeout=None)
  if not gold:
    raise RewardConfigError(f"reference {gold_input!r} could not be parsed by math-verify")
  pred = parse(pred_input, parsing_timeout=None)
  return bool(pred) and verify(gold, pred, timeout_seconds=None)


def _sympy_number(value: Any) -> float | None:
  """Real value of a parsed answer, or None when it is not a real number."""
  import sympy  # pylint: disable=import-outside-toplevel
  if not isinstance(value, sympy.Basic):
    return None
  if isinstance(value, sympy.Eq) and isinstance(value.lhs, sympy.Symbol):
    value = value.rhs  # "x = -3" states the value -3
  if not isinstance(value, sympy.Expr) or not value.is_number:
    return None
  value = value.doit()  # math-verify keeps e.g. percentages as UnevaluatedExpr
  if value.is_extended_real is False:
    return None
  if value in (sympy.oo, sympy.S.NegativeInfinity):
    return float(value)
  try:
    number = complex(value.evalf())
  except TypeError:  # zoo, nan, or an unevaluable number
    return None
  if abs(number.imag) > 1e-12 * max(1.0, abs(number.real)):
    return None
  return number.real


def _parse_number(parse_input: str) -> float | None:
  from math_verify import parse  # pylint: disable=import-outside-toplevel
  parsed = parse(parse_input, parsing_timeout=None)
  return _sympy_number(parsed[0]) if parsed else None


def accuracy_in_process(response: str, reference: str) -> float:
  """``accuracy`` in the calling process with no timeout (for worker processes)."""
  _check_str(response, "response")
  _check_str(reference, "reference")
  found = _extract(response)
  if found is None or len(found[0]) > MAX_ANSWER_CHARS:
    return 0.0
  return float(_verify_parsed(_to_parse_input(*found), _reference_parse_input(reference)))


def _negative_value(found: tuple[str, str] | None) -> float | None:
  """Fast path: None when the answer needs sympy, else the decided reward."""
  if found is None or len(found[0]) > MAX_ANSWER_CHARS:
    return 0.0
  if _PLAIN_NUMBER_RE.fullmatch(found[0]):
    return float(float(found[0]) < 0)
  return None


def negative_in_process(response: str) -> float:
  """``negative`` in the calling process with no timeout (for worker processes)."""
  _check_str(response, "response")
  found = _extract(response)
  fast = _negative_value(found)
  if fast is not None:
    return fast
  number = _parse_number(_to_parse_input(*found))
  return float(number is not None and number < 0)


# ----------------------------------------------------------------------------
# Public rewards.
# ----------------------------------------------------------------------------


def _check_timeout(timeout_s: float) -> None:
  if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
    raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")


def accuracy(response: str, reference: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
  """Math accuracy (docs/methods.md §7): 1.0 iff the extracted final answer is
  math-verify-equivalent to `reference`, else 0.0 (also when there is no answer
  or it is longer than MAX_ANSWER_CHARS).

  Safe from any thread: math-verify runs in a shared worker process.

  Args:
    response: model output.
    reference: gold answer as LaTeX (``$...$`` is added unless it has math delimiters).
    timeout_s: wall-clock limit for parse + verify.

  Raises:
    pool.RewardTimeoutError: math-verify ran longer than `timeout_s`
      (the runner scores it as the channel's failure value, 0, and counts it).
    channels.RewardConfigError (a ValueError): the reference cannot be parsed (the
      runner stops the run: no response can fix it).
  """
  _check_str(response, "response")
  _check_str(reference, "reference")
  _check_timeout(timeout_s)
  found = _extract(response)
  if found is None or len(found[0]) > MAX_ANSWER_CHARS:
    return 0.0
  ok = shared_pool().call(_verify_parsed, _to_parse_input(*found),
                          _reference_parse_input(reference), timeout_s=timeout_s)
  return float(ok)


def negative(response: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
  """TAG negative rule (docs/methods.md §7): 1.0 iff the final answer is a real
  number < 0.

  Plain decimals are decided directly; anything else (``-\\frac{1}{2}``,
  ``-5\\%``, ``x = -3``, ``-\\sqrt{2}``, ``1 - \\pi``) is parsed by math-verify
  and evaluated by sympy in a worker process. Non-numeric answers (sets,
  intervals, symbols, text, complex numbers) and missing answers score 0.

  Raises:
    pool.RewardTimeoutError: parsing/evaluation ran longer than `timeout_s`.
  """
  _check_str(response, "response")
  _check_timeout(timeout_s)
  found = _extract(response)
  fast = _negative_value(found)
  if fast is not None:
    return fast
  number = shared_pool().call(_parse_number, _to_parse_input(*found), timeout_s=timeout_s)
  return float(number is not None and number < 0)


def format_reward(response: str) -> float:
  """AMRP format rule (docs/methods.md §7): 1.0 iff the whole response is
  ``<reasoning>...</reasoning>`` then ``<answer>...</answer>`` with only
  whitespace before, between and after.

  Each of the four tags must occur exactly once (no nested or repeated blocks);
  the contents are free (empty contents are allowed: accuracy judges them).
  """
  _check_str(response, "response")
  text = response.strip()
  tags = (_REASONING_OPEN, _REASONING_CLOSE, _ANSWER_OPEN, _ANSWER_CLOSE)
  if any(text.count(t) != 1 for t in tags):
    return 0.0
  if not (text.startswith(_REASONING_OPEN) and text.endswith(_ANSWER_CLOSE)):
    return 0.0
  r_close, a_open = text.find(_REASONING_CLOSE), text.find(_ANSWER_OPEN)
  if a_open < r_close:
    return 0.0
  between = text[r_close + len(_REASONING_CLOSE):a_open]
  return float(between.strip() == "")


def _check_num_tokens(num_tokens: Any) -> int:
  if isinstance(num_tokens, bool) or not hasattr(num_tokens, "__index__"):
    raise TypeError(f"num_tokens must be an int, got {type(num_tokens).__name__}")
  num_tokens = int(num_tokens)
  if num_tokens < 0:
    raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
  return num_tokens


def length_reward(num_tokens: int, max_full: int = 2800, zero_at: int = 3000) -> float:
  """AMRP soft length rule (docs/methods.md §7):
  ``max(1 - max(L - max_full, 0) / (zero_at - max_full), 0)`` = 1 up to 2800
  generated tokens, falling linearly to 0 at 3000."""
  L = _check_num_tokens(num_tokens)
  if not 0 <= max_full < zero_at:
    raise ValueError(f"need 0 <= max_full < zero_at, got max_full={max_full}, zero_at={zero_at}")
  return max(1.0 - max(L - max_full, 0) / (zero_at - max_full), 0.0)


def brief(num_tokens: int, threshold: int) -> float:
  """TAG brief rule (docs/methods.md §7): 1.0 iff L < threshold generated tokens
  (Qwen 200, Llama 128, Qwen-30B 512)."""
  L = _check_num_tokens(num_tokens)
  if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold <= 0:
    raise ValueError(f"threshold must be a positive int, got {threshold!r}")
  return float(L < threshold)
