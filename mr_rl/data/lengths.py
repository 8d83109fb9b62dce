"""Prompt lengths checked at start-up, before step 0 (docs/runs.md, "Data checks and the
fingerprint").

Every prompt of the training rows, the eval split and the `data.eval_sets` is rendered and
tokenized once when a run is built (the tokenizer's batch call, `CHUNK` prompts at a time), so a
prompt longer than `data.max_prompt_len` tokens stops the run before it trains, naming the data
source, the first offenders (index among the loaded prompts, uid, line of a local `.jsonl` file)
and their lengths, or, with `data.skip_long_prompts`, is dropped (logged) before the data
iterator, and its fingerprint, see the rows.

A prompt longer than `char_bound` characters is too long without tokenizing it: no token of the
vocabulary spans more than `longest_token_chars` characters, so such a text has more than
`max_prompt_len` tokens (with a factor `CHAR_SLACK` for normalisers that merge characters, e.g.
NFC joining 3 Hangul jamo into one syllable). A 4 MB line is thus measured by `len`, never
turned into a 4 MB token list.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Sequence

import numpy as np

from mr_rl.errors import DataError

_LOG = logging.getLogger(__name__)

CHUNK = 1024       # prompts per batch call of the tokenizer
CHAR_SLACK = 4     # char_bound's factor over max_len x the longest token
SHOWN = 5          # offenders named in an error


def longest_token_chars(tokenizer) -> int:
  """The most characters one token of the vocabulary can span (its longest entry; byte-level
  BPE entries hold one character per byte, so this bounds the text's characters too)."""
  return max((len(t) for t in tokenizer.get_vocab()), default=1)


def char_bound(tokenizer, max_len: int) -> int:
  """A text with more characters than this has more than `max_len` tokens."""
  return CHAR_SLACK * max_len * max(longest_token_chars(tokenizer), 1)


def token_lengths(texts: Sequence[str], tokenizer, add_bos: bool, bound: int) -> np.ndarray:
  """Token counts of `texts` (a BOS counted with `add_bos`), -1 for a text longer than `bound`
  characters (not tokenized)."""
  out = np.full(len(texts), -1, np.int64)
  short = [i for i, t in enumerate(texts) if len(t) <= bound]
  extra = int(bool(add_bos) and tokenizer.bos_token_id is not None)
  for lo in range(0, len(short), CHUNK):
    idx = short[lo:lo + CHUNK]
    ids = tokenizer([texts[i] for i in idx], add_special_tokens=False)["input_ids"]
    out[idx] = [len(x) + extra for x in ids]
  return out


def _jsonl_lines(path: str | None, texts: set[str]) -> dict[str, list[int]]:
  """{text: line numbers (the first few)} for the texts that are a top-level string field of a
  line of a local `.jsonl` file (the loaders keep the prompt column's text as the prompt)."""
  if not path or not os.path.isfile(path) or not path.lower().endswith(".jsonl"):
    return {}
  found = {}
  with open(path, encoding="utf-8", errors="replace") as f:
    for n, line in enumerate(f, 1):
      try:
        row = json.loads(line)
      except ValueError:
        continue
      if isinstance(row, dict):
        for v in set(x for x in row.values() if isinstance(x, str) and x in texts):
          found.setdefault(v, []).append(n)
  return found


def _describe(examples, lengths, bad, path: str | None, bound: int) -> str:
  lines = _jsonl_lines(path, {getattr(examples[i], "prompt", None) for i in bad[:SHOWN]}
                       - {None})
  parts = []
  for i in bad[:SHOWN]:
    ex = examples[i]
    where = [f"uid {getattr(ex, 'uid', '?')!r}"]
    at = lines.get(getattr(ex, "prompt", None), [])
    if at:
      shown = ", ".join(map(str, at[:3])) + (", ..." if len(at) > 3 else "")
      where.insert(0, f"line{'s' if len(at) > 1 else ''} {shown} of {path!r}")
    size = (f"{lengths[i]} tokens" if lengths[i] >= 0 else
            f"over {bound} characters, not tokenized")
    parts.append(f"prompt {i} ({', '.join(where)}): {size}")
  more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
  return "; ".join(parts) + more


def check_prompt_lengths(policy, examples: Sequence[Any], what: str, *, skip: bool,
                         path: str | None = None) -> list:
  """`examples` whose rendered prompts fit `policy.max_prompt_len` tokens.

  Args:
    policy: a `mr_rl.rollout.Policy` (its `prompt_lengths`, `max_prompt_len`,
      `max_prompt_chars`).
    examples: the loaded examples.
    what: what they are, for messages (e.g. "train split of data set 'math500' (file ...)").
    skip: `data.skip_long_prompts`: drop the long ones (logged) instead of raising.
    path: the local data file they were read from (its line numbers name offenders), or None.

  Raises:
    ValueError: a prompt is too long (without `skip`), or every prompt is (with it).
  """
  P = policy.max_prompt_len
  lengths = policy.prompt_lengths(examples)
  bad = [int(i) for i in np.flatnonzero((lengths > P) | (lengths < 0))]
  if not bad:
    return list(examples)
  detail = _describe(examples, lengths, bad, path, policy.max_prompt_chars)
  if not skip:
    raise DataError(
        f"{len(bad)} of the {len(examples)} prompts of the {what} are longer than "
        f"config.data.max_prompt_len={P} tokens: {detail}. Raise config.data.max_prompt_len, "
        f"or drop them with config.data.skip_long_prompts=True (logged).")
  if len(bad) == len(examples):
    raise DataError(f"every one of the {len(examples)} prompts of the {what} is longer than "
                     f"config.data.max_prompt_len={P} tokens; raise it")
  _LOG.warning("data.skip_long_prompts: dropped %d of %d prompts of the %s longer than "
               "data.max_prompt_len=%d tokens: %s", len(bad), len(examples), what, P, detail)
  drop = set(bad)
  return [ex for i, ex in enumerate(examples) if i not in drop]
