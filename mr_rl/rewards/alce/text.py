"""ALCE's text rules: answer normalisation, response preprocessing, sentences, citations."""

from __future__ import annotations

import re
import string
from typing import Any, Mapping

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CITE_OPEN = re.compile(r"\[(\d+)")


def normalize_answer(text: str) -> str:
  """ALCE / SQuAD normalisation: lowercase, no punctuation, no articles, single spaces."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
  return " ".join(_ARTICLES.sub(" ", text).split())


def remove_citations(text: str) -> str:
  """Drops citation markers: ` [k` / `[k` openings, every `]`, and ` |`."""
  text = re.sub(r" ?\[\d+", "", text)
  return text.replace(" |", "").replace("]", "")


def prepare_response(response: str, first_line_only: bool = True) -> str:
  """ALCE's preprocessing: strip, then (by default) keep only the first line."""
  if not isinstance(response, str):
    raise TypeError(f"response must be a str, got {type(response).__name__}")
  response = response.strip()
  return response.split("\n")[0] if first_line_only else response


_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e u.s u.k inc ltd co corp no fig al approx"
    " jan feb mar apr jun jul aug sep sept oct nov dec".split())
# A run of sentence punctuation and its closing quotes / brackets: greedy and never retried,
# so finding every run is linear. (The old `[.!?]+[\"')\]]*(?=\s+\S)` retried the lookahead
# from every position of a run of dots: quadratic, 5-7 s for two 16,000-dot responses.)
_RUN = re.compile(r"[.!?]+[\"')\]]*")
_NON_SPACE = re.compile(r"\S")
_INITIALS = re.compile(r"(\w\.)+\w")


def _last_word(text: str, start: int, end: int) -> str:
  """``text[start:end].split()[-1]`` (or ""), scanning back from ``end`` only."""
  k = end
  while k > start and text[k - 1].isspace():
    k -= 1
  j = k
  while j > start and not text[j - 1].isspace():
    j -= 1
  return text[j:k]


def split_sentences(text: str) -> list[str]:
  """Rule-based sentence splitter (stand-in for NLTK punkt), linear in ``len(text)``.

  Splits after `.`, `!` or `?` (plus closing quotes / brackets) followed by whitespace and
  more text, unless the next non-space character is lowercase or the word ending in `.` is
  a common abbreviation or a single-letter initial ("J. K. Rowling", "U.S.").
  """
  sents, start, n = [], 0, len(text)
  for m in _RUN.finditer(text):
    end = m.end()
    if end >= n or not text[end].isspace():
      continue
    nxt = _NON_SPACE.search(text, end)
    if nxt is None:  # only whitespace follows: no boundary here or later
      break
    if text[nxt.start()].islower():
      continue
    group = m.group()
    if group[0] == "." and len(group.rstrip("\"')]")) == 1:
      w = _last_word(text, start, m.start()).lower().lstrip("(\"'")
      if w in _ABBREVIATIONS or (len(w) == 1 and w.isalpha()) or _INITIALS.fullmatch(w):
        continue
    sents.append(text[start:end].strip())
    start = end
  tail = text[start:].strip()
  if tail:
    sents.append(tail)
  return [s for s in sents if s]


def parse_citations(sentence: str) -> list[int]:
  """0-based passage indices cited in `sentence` (ALCE: every `[k` opening, k >= 1)."""
  return [int(k) - 1 for k in _CITE_OPEN.findall(sentence)]


def format_passage(doc: Mapping[str, Any]) -> str:
  """ALCE's AutoAIS passage text: `"Title: <title>\\n<text>"`."""
  return f"Title: {doc['title']}\n{doc['text']}"
