"""Synthetic arithmetic: chains of single-digit additions and subtractions.

A problem is `Q:7+5-9+3=`; the reference solution writes the running total step by step,

    <r>7+5=12;12-9=3;3+3=6</r><a>6</a><eos>

so longer chains need longer responses. The base policy of the demo (`warmstart`) answers in
these styles (`Problem.solution`): step-by-step reasoning as above ('concise'), on chains of
up to 5 terms after restating the question ('restated': `<r>7+5-9+3;7+5=12;...`, its usual
long style); chained reasoning that writes each operation once (`<r>7+5=12-9=3+3=6</r>...`,
0.6-0.66x the restated length, at every chain length, so a correct answer can be made shorter
without being less right); loops (a step repeated until the response cap: a runaway, no
answer); and direct answers `<r></r><a>6</a>`, short, always brief, and for a small model a
guess on long chains. It also breaks the format (`</r>=6`) and slips on the sign of
the answer at some rate. The channels mirror the papers' rewards at toy scale:

- `acc`:  the final answer equals the true value (the primary channel);
- `brief`: response shorter than a token threshold (TAG "correct & brief");
- `negative`: the final answer is a number < 0 (TAG "correct & negative", incompatible with
  `acc` on problems whose answer is positive);
- `fmt`:  the whole response is `<r>...</r><a>...</a>` (AMRP's format rule, with short tags);
- `len`:  AMRP's soft length rule `max(1 - max(L - L0, 0) / (L1 - L0), 0)` at toy scale.

Importing this module (the demo config's `config.plugins = "mr_rl.demo"` does) registers the
`arithmetic` data set with `mr_rl.data` and the `arith_*` channels with the reward registry.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mr_rl import data as data_lib
from mr_rl.rewards.channels import REWARDS, UNIT_RANGE, RewardChannel

SPECIAL = ("<pad>", "<bos>", "<eos>")
TAGS = ("<r>", "</r>", "<a>", "</a>")
CHARS = tuple("0123456789+-=;:Q ")


def make_tokenizer() -> PreTrainedTokenizerFast:
  """A character-level Hugging Face tokenizer (saved with the demo checkpoint)."""
  vocab = {t: i for i, t in enumerate(SPECIAL + TAGS + CHARS)}
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
  tok.decoder = decoders.Fuse()
  return PreTrainedTokenizerFast(
      tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
      additional_special_tokens=list(TAGS))


@dataclasses.dataclass(frozen=True)
class Problem:
  terms: tuple[int, ...]
  ops: tuple[str, ...]  # len(terms) - 1 entries of '+' or '-'

  @property
  def answer(self) -> int:
    total = self.terms[0]
    for op, t in zip(self.ops, self.terms[1:]):
      total = total + t if op == "+" else total - t
    return total

  @property
  def prompt(self) -> str:
    expr = str(self.terms[0]) + "".join(o + str(t) for o, t in zip(self.ops, self.terms[1:]))
    return f"Q:{expr}="

  def steps(self) -> list[str]:
    """The running-total steps, e.g. ['7+5=12', '12-9=3', '3+3=6']."""
    steps, total = [], self.terms[0]
    for op, t in zip(self.ops, self.terms[1:]):
      new = total + t if op == "+" else total - t
      steps.append(f"{total}{op}{t}={new}")
      total = new
    return steps

  def solution(self, style: str = "concise", answer: int | None = None,
               broken_format: bool = False, loop_step: int = 0) -> str:
    """A response in one of the base policy's styles (see `STYLES`).

    Args:
      style: 'concise' (each running-total step once: `7+5=12;12-9=3;3+3=6`); 'restated'
        (the question copied first, then the steps: `7+5-9+3;7+5=12;12-9=3;3+3=6`);
        'chained' (each operation once, the running total carried on: `7+5=12-9=3+3=6`: the
        same steps without repeating each total); 'verbose' (each step written twice);
        'loop' (a runaway: the steps up to `loop_step`, then that step repeated without end,
        so it never answers and overshoots any cap); 'direct' (no reasoning:
        `<r></r><a>6</a>`, short, and for a small model a guess on long chains); 'tool' (a
        calculator call `<r>7+5-9+3</r>`, then the answer: `mr_rl.demo.calculator`).
      answer: the answer written (default the true one; a sign slip writes `-answer`).
      broken_format: write the answer as `=6` after `</r>` instead of `<a>6</a>` (still
        scored by `accuracy`, fails `fmt`).
      loop_step: the step index where a 'loop' starts repeating.
    """
    if style not in STYLES:
      raise ValueError(f"unknown solution style {style!r}; valid: {STYLES}")
    answer = self.answer if answer is None else int(answer)
    if style == "tool":  # the calculator's call, its observation not written (`calculator`)
      return f"<r>{self.prompt[len('Q:'):-len('=')]}</r><a>{answer}</a>"
    steps = [] if style == "direct" else self.steps()
    if style == "verbose":
      steps = [s for step in steps for s in (step, step)]
    if style == "chained" and steps:
      # 7+5=12;12-9=3 -> 7+5=12-9=3: each later step without its leading running total.
      ops = [f"{o}{t}" for o, t in zip(self.ops, self.terms[1:])]
      steps = [steps[0] + "".join(f"{op}={s.rpartition('=')[2]}"
                                  for op, s in zip(ops[1:], steps[1:]))]
    if style == "restated":
      steps = [self.prompt[len("Q:"):-len("=")]] + steps
    if style == "loop":
      if not 0 <= loop_step < len(steps):
        raise ValueError(f"loop_step must be in [0, {len(steps)}), got {loop_step}")
      return "<r>" + ";".join(steps[:loop_step] + [steps[loop_step]] * LOOP_REPEATS)
    tail = f"={answer}" if broken_format else f"<a>{answer}</a>"
    return "<r>" + ";".join(steps) + "</r>" + tail


STYLES = ("concise", "restated", "chained", "verbose", "loop", "direct", "tool")
LOOP_REPEATS = 16  # a loop written out this far exceeds any response budget of the demo


def sample_problems(rng: np.random.Generator, n: int, *, min_terms: int = 2,
                    max_terms: int = 5, p_minus: float = 0.3) -> list[Problem]:
  """Draws `n` problems with 2..max_terms single-digit terms.

  Subtraction has probability `p_minus`, so most answers are positive and the `negative`
  channel is, for most problems, incompatible with being right.
  """
  if not 2 <= min_terms <= max_terms:
    raise ValueError(f"need 2 <= min_terms <= max_terms, got {min_terms}, {max_terms}")
  out = []
  for _ in range(n):
    k = int(rng.integers(min_terms, max_terms + 1))
    terms = tuple(int(x) for x in rng.integers(0, 10, size=k))
    ops = tuple("-" if u < p_minus else "+" for u in rng.random(k - 1))
    out.append(Problem(terms, ops))
  return out


_LOOSE_RE = re.compile(r"\s*=\s*(-?\d+)\s*")
_FORMAT_RE = re.compile(r"\s*<r>[^<]*</r>\s*<a>[^<]*</a>\s*")  # no tag inside a block


def _last_answer_block(response: str) -> str | None:
  """The last of ``re.findall(r"<a>(.*?)</a>", response, re.S)`` (None: no block), in one
  forward pass: that regex scanned to the end from every unclosed ``<a>`` (quadratic)."""
  last, pos = None, 0
  while (open_ := response.find("<a>", pos)) >= 0:
    close = response.find("</a>", open_ + 3)
    if close < 0:
      break
    last, pos = response[open_ + 3:close], close + 4
  return last


def extract_answer(response: str) -> int | None:
  """The final answer: the integer in the last `<a>...</a>` block, or, without one, the
  broken-format answer `</r>=6` (an integer after the last `</r>`, after `=`).

  Anything else has no answer: a response cut off by the cap mid-reasoning is not credited
  with the last running total it wrote, and a bare number without `</r>` is not an answer.
  """
  block = _last_answer_block(response)
  if block is not None:
    text = block.strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else None
  head, sep, tail = response.rpartition("</r>")
  if not sep:
    return None
  m = _LOOSE_RE.fullmatch(tail)
  return int(m.group(1)) if m else None


def accuracy(response: str, answer: int) -> float:
  got = extract_answer(response)
  return float(got is not None and got == answer)


def negative(response: str) -> float:
  got = extract_answer(response)
  return float(got is not None and got < 0)


def fmt(response: str) -> float:
  return float(_FORMAT_RE.fullmatch(response) is not None)


def brief(num_tokens: int, threshold: int) -> float:
  return float(num_tokens < threshold)


def soft_length(num_tokens: int, full_until: int, zero_at: int) -> float:
  """AMRP's length rule (docs/methods.md §7) with toy-scale limits."""
  if zero_at <= full_until:
    raise ValueError(f"zero_at ({zero_at}) must exceed full_until ({full_until})")
  return max(1.0 - max(num_tokens - full_until, 0) / (zero_at - full_until), 0.0)


def examples(n: int, seed: int, split: str = "train", **problem_kw) -> list:
  """`n` problems as `mr_rl.data.Example`s (reference = the integer answer as text).

  Train and test problems come from disjoint seeds (`split` enters the seed).
  """
  from mr_rl.data import Example
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  rng = np.random.default_rng([seed, 0 if split == "train" else 1])
  return [Example.single_turn(f"arithmetic/{split}/{i}", "arithmetic", p.prompt,
                              reference=str(p.answer), answer=p.answer, num_terms=len(p.terms))
          for i, p in enumerate(sample_problems(rng, n, **problem_kw))]


@data_lib.register_dataset("arithmetic", default_split="train")
def load_arithmetic(*, split: str, path: str | None = None, num_train: int = 20000,
                    num_eval: int = 512, seed: int = 0, min_terms: int = 2, max_terms: int = 5,
                    p_minus: float = 0.3) -> list:
  """The `arithmetic` data set: `num_train` ('train') or `num_eval` ('test') generated problems
  of `seed` (`config.data.options`; the demo config sets `seed` with the run's seed)."""
  if path:
    raise ValueError(f"the arithmetic data set is generated, not read: config.data.path must be "
                     f"empty, got {path!r}")
  n = num_train if split == "train" else num_eval
  return examples(int(n), int(seed), split, min_terms=min_terms, max_terms=max_terms,
                  p_minus=p_minus)


# Reward channels of the demo (`arith_*` names): light rules, run on the runner's threads.
@REWARDS.register
def arith_acc() -> RewardChannel:
  return RewardChannel("arith_acc", lambda resp, ex, n: accuracy(resp, int(ex["answer"])),
                       value_range=UNIT_RANGE)


@REWARDS.register
def arith_negative() -> RewardChannel:
  return RewardChannel("arith_negative", lambda resp, ex, n: negative(resp),
                       value_range=UNIT_RANGE)


@REWARDS.register
def arith_fmt() -> RewardChannel:
  return RewardChannel("arith_fmt", lambda resp, ex, n: fmt(resp),
                       value_range=UNIT_RANGE)


@REWARDS.register
def arith_brief(threshold: int = 14) -> RewardChannel:
  return RewardChannel("arith_brief", lambda resp, ex, n: brief(n, threshold),
                       value_range=UNIT_RANGE)


@REWARDS.register
def arith_len(full_until: int = 12, zero_at: int = 24) -> RewardChannel:
  return RewardChannel("arith_len", lambda resp, ex, n: soft_length(n, full_until, zero_at),
                       value_range=UNIT_RANGE)
