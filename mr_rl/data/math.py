"""Math data sets: Big-Math (TAG), NuminaMath-1.5 10K, MATH-500, AMC, AIME (AMRP).

Hub schemas read here (column names are checked, missing ones raise ValueError):
  * SynthLabsAI/Big-Math-RL-Verified (split train): problem, answer, source, domain,
    llama8b_solve_rate.
  * AI-MO/NuminaMath-1.5 (split train): problem, solution, answer, problem_type,
    question_type, source, synthetic, problem_is_valid, solution_is_valid.
  * HuggingFaceH4/MATH-500 (split test): problem, solution, answer, subject, level,
    unique_id.
  * AI-MO/aimo-validation-amc (split train): id, problem, answer, url.
  * AI-MO/aimo-validation-aime (split train): id, problem, solution, answer, url.
"""

from __future__ import annotations

import math
import re

from mr_rl.data import sources
from mr_rl.data.example import Example, replicate
from mr_rl.errors import DataError

BIG_MATH_HUB = "SynthLabsAI/Big-Math-RL-Verified"
NUMINA_HUB = "AI-MO/NuminaMath-1.5"
MATH500_HUB = "HuggingFaceH4/MATH-500"
AMC_HUB = "AI-MO/aimo-validation-amc"
AIME_HUB = "AI-MO/aimo-validation-aime"

# Subset name -> (default lower, default upper) bound on llama8b_solve_rate, inclusive.
BIG_MATH_BANDS = {"hard": (0.0, 0.2), "llama_calibrated": (0.3, 0.7)}


def _norm_problem(text: str) -> str:
  return " ".join(text.split())


def format_answer(value) -> str:
  """Reference answer as text; integral floats (AMC stores 142.0) print as integers."""
  if value is None:
    raise ValueError("answer is None")
  if isinstance(value, float):
    if not math.isfinite(value):
      raise ValueError(f"answer {value!r} is not finite")
    if value.is_integer():
      return str(int(value))
    return repr(value)
  return str(value).strip()


def _row_answer(row, i: int, name: str, hub_id: str, path: str | None) -> str:
  """`format_answer(row["answer"])`; a bad answer names the data set, its file and the row's
  line (`sources.row_place`)."""
  try:
    return format_answer(row["answer"])
  except ValueError as e:
    raise DataError(f"data set {name!r}, {sources.row_place(hub_id, path, i)}: {e}") from e


def load_big_math(*, subset: str, split: str = "train", path: str | None = None,
                  cache_dir: str | None = None, min_solve_rate: float | None = None,
                  max_solve_rate: float | None = None, test_size: int = 1500,
                  seed: int = 0) -> list[Example]:
  """Big-Math-RL-Verified hard split or Llama-calibrated subset (TAG experimental setup).

  **(project definition)** The TAG summary names a "Big-Math hard split" (1,498 test
  problems) and a "Llama-calibrated Big-Math subset" (1,500 test problems) but not the
  rule that cuts them. Implemented rule, every threshold a config field:
    1. drop rows with a missing `llama8b_solve_rate` or an empty answer;
    2. de-duplicate on the whitespace-normalised problem text (first row kept);
    3. keep rows with `min_solve_rate <= llama8b_solve_rate <= max_solve_rate`
       (Llama-3.1-8B's solve rate, as Big-Math reports it); defaults per subset:
       hard `[0.0, 0.2]`, llama_calibrated `[0.3, 0.7]` (problems Llama models solve
       sometimes, so a Llama policy gets a learning signal);
    4. order by a `seed`-ed stable hash of the problem text; the first `test_size`
       rows are `test`, the rest `train`.

  Args:
    subset: "hard" or "llama_calibrated".
    split: "train" or "test".
    path: local copy of the hub train split (see `sources`).
    cache_dir: `datasets` cache directory.
    min_solve_rate: lower solve-rate bound (None: the subset's default).
    max_solve_rate: upper solve-rate bound (None: the subset's default).
    test_size: number of held-out test problems.
    seed: hash seed of the split.
  """
  if subset not in BIG_MATH_BANDS:
    raise ValueError(f"subset must be one of {sorted(BIG_MATH_BANDS)}, got {subset!r}")
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  lo = BIG_MATH_BANDS[subset][0] if min_solve_rate is None else float(min_solve_rate)
  hi = BIG_MATH_BANDS[subset][1] if max_solve_rate is None else float(max_solve_rate)
  if not 0.0 <= lo <= hi <= 1.0:
    raise ValueError(f"need 0 <= min_solve_rate <= max_solve_rate <= 1, got {lo}, {hi}")
  if not isinstance(test_size, int) or test_size < 0:
    raise ValueError(f"test_size must be a non-negative int, got {test_size!r}")
  name = f"big_math_{subset}"
  ds = sources.read_rows(name, BIG_MATH_HUB, path=path, split="train", cache_dir=cache_dir)
  cols = ("problem", "answer", "source", "domain", "llama8b_solve_rate")
  sources.require_columns(ds, cols, name)
  rows = [r for r in ds.select_columns(list(cols))
          if r["llama8b_solve_rate"] is not None and str(r["answer"] or "").strip()]
  rows = sources.dedupe(rows, lambda r: _norm_problem(r["problem"]))
  rows = [r for r in rows if lo <= float(r["llama8b_solve_rate"]) <= hi]
  rows = sources.hash_order(rows, lambda r: _norm_problem(r["problem"]), seed)
  rows = rows[:test_size] if split == "test" else rows[test_size:]
  return [
      Example.single_turn(
          f"{name}/{sources.stable_hash(_norm_problem(r['problem'])):016x}", name,
          r["problem"], format_answer(r["answer"]), source=r["source"],
          domain=list(r["domain"] or []) if not isinstance(r["domain"], str) else [r["domain"]],
          llama8b_solve_rate=float(r["llama8b_solve_rate"]))
      for r in rows]


_LATEX_CMD = re.compile(r"\\[a-zA-Z]+")
_WORD = re.compile(r"[A-Za-z]{3,}")
_NON_ANSWERS = {"", "proof", "notfound", "none", "n/a"}


def is_verifiable_answer(answer: str, *, max_chars: int = 64, check_parse: bool = True) -> bool:
  """Whether a NuminaMath answer is a checkable numeric value or math expression.

  **(project definition)** Rejects empty/"proof"/"notfound" answers, answers longer
  than `max_chars`, answers containing an English word (3+ letters left after removing
  LaTeX command names, so `\\text{yes}` or "no solution" fail while `\\frac{\\pi}{2}`
  passes), and, when `check_parse`, answers that math-verify cannot parse to a sympy
  object (the accuracy reward uses the same parser).
  """
  a = answer.strip()
  if a.lower() in _NON_ANSWERS or len(a) > max_chars:
    return False
  if _WORD.search(_LATEX_CMD.sub(" ", a)):
    return False
  if check_parse:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse  # pylint: disable=g-import-not-at-top
    try:
      parsed = parse(f"${a}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()])
    except Exception:  # pylint: disable=broad-except  # math-verify raises many types.
      return False
    return bool(parsed)
  return True


def load_numina_math(*, split: str = "train", path: str | None = None,
                     cache_dir: str | None = None, num_examples: int = 10_000, seed: int = 0,
                     question_types: tuple[str, ...] = ("math-word-problem",),
                     require_valid: bool = True, include_synthetic: bool = True,
                     max_answer_chars: int = 64, check_parse: bool = True) -> list[Example]:
  """The 10K-prompt NuminaMath-1.5 training subset of AMRP (appendix B.1).

  **(project definition)** AMRP does not say how its 10K subset was drawn. Rule:
    1. keep rows whose `question_type` is in `question_types` (default: word problems
       only, so no MCQ letters and no proofs), and, if `require_valid`, whose
       `problem_is_valid` and `solution_is_valid` are "Yes"; drop `synthetic` rows
       unless `include_synthetic`;
    2. de-duplicate on the whitespace-normalised problem;
    3. order by a `seed`-ed stable hash of the problem text and walk that order,
       taking rows whose answer passes `is_verifiable_answer` until `num_examples`
       are taken (the parser runs only on the rows walked).
  Only a training split exists.
  """
  if split != "train":
    raise ValueError(f"numina_math has only split 'train' (AMRP trains on it), got {split!r}")
  if not isinstance(num_examples, int) or num_examples < 1:
    raise ValueError(f"num_examples must be a positive int, got {num_examples!r}")
  name = "numina_math"
  ds = sources.read_rows(name, NUMINA_HUB, path=path, split="train", cache_dir=cache_dir)
  cols = ["problem", "answer", "problem_type", "question_type", "source"]
  sources.require_columns(ds, cols, name)
  optional = [c for c in ("synthetic", "problem_is_valid", "solution_is_valid")
              if c in ds.column_names]
  if require_valid:
    sources.require_columns(ds, ("problem_is_valid", "solution_is_valid"), name)
  if not include_synthetic:
    sources.require_columns(ds, ("synthetic",), name)
  rows = []
  for r in ds.select_columns(cols + optional):
    if r["question_type"] not in question_types:
      continue
    if require_valid and (r["problem_is_valid"] != "Yes" or r["solution_is_valid"] != "Yes"):
      continue
    if not include_synthetic and r["synthetic"]:
      continue
    if r["answer"] is None:
      continue
    rows.append(r)
  rows = sources.dedupe(rows, lambda r: _norm_problem(r["problem"]))
  out = []
  for r in sources.hash_order(rows, lambda r: _norm_problem(r["problem"]), seed):
    answer = str(r["answer"]).strip()
    if not is_verifiable_answer(answer, max_chars=max_answer_chars, check_parse=check_parse):
      continue
    out.append(Example.single_turn(
        f"{name}/{sources.stable_hash(_norm_problem(r['problem'])):016x}", name, r["problem"],
        answer, source=r["source"], problem_type=r["problem_type"],
        question_type=r["question_type"]))
    if len(out) == num_examples:
      break
  return out


def load_math500(*, split: str = "test", path: str | None = None,
                 cache_dir: str | None = None) -> list[Example]:
  """MATH-500 (500 problems, split `test`), in file order."""
  name = "math500"
  ds = sources.read_rows(name, MATH500_HUB, path=path, split=split, cache_dir=cache_dir)
  cols = ("problem", "solution", "answer", "subject", "level", "unique_id")
  sources.require_columns(ds, cols, name)
  return [Example.single_turn(f"{name}/{r['unique_id']}", name, r["problem"],
                              _row_answer(r, i, name, MATH500_HUB, path), subject=r["subject"],
                              level=r["level"], unique_id=r["unique_id"], solution=r["solution"])
          for i, r in enumerate(ds)]


_AIME_YEAR = re.compile(r"(\d{4})_AIME")


def load_aimo_validation(which: str, *, split: str = "train", path: str | None = None,
                         cache_dir: str | None = None, replicas: int = 32,
                         years: tuple[int, ...] | None = None) -> list[Example]:
  """AMC (83 problems) or AIME validation set of AI-MO, each problem replicated.

  AMRP (appendix B.1, Table 8) replicates each AMC and AIME 2024 problem 32 times
  (2,656 and 960 records) and decodes one greedy response per record. The AIME set on
  the hub holds 2022-2024 (90 problems); `years` keeps those whose AoPS `url` names a
  listed year (AIME default `(2024,)`, giving AMRP's 30; None keeps all).
  """
  if which not in ("amc", "aime"):
    raise ValueError(f"which must be 'amc' or 'aime', got {which!r}")
  hub = AMC_HUB if which == "amc" else AIME_HUB
  ds = sources.read_rows(which, hub, path=path, split=split, cache_dir=cache_dir)
  sources.require_columns(ds, ("id", "problem", "answer"), which)
  rows = [dict(r, _row=i) for i, r in enumerate(ds)]
  if years is not None:
    sources.require_columns(ds, ("url",), which)
    keep = {int(y) for y in years}
    def year(url):
      m = _AIME_YEAR.search(url or "") or re.search(r"/(\d{4})_", url or "")
      if m is None:
        raise ValueError(f"{which}: cannot read a year from url {url!r}; pass years=None")
      return int(m.group(1))
    rows = [r for r in rows if year(r["url"]) in keep]
  base = [Example.single_turn(f"{which}/{r['id']}", which, r["problem"],
                              _row_answer(r, r["_row"], which, hub, path), url=r.get("url"))
          for r in rows]
  return replicate(base, replicas)
