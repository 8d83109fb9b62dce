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
_BOUNDARY = re.compile(r"[.!?]+[\"')\]]*(?=\s+\S)")


def split_sentences(text: str) -> list[str]:
  """Rule-based sentence splitter (stand-in for NLTK punkt).

  Splits after `.`, `!` or `?` (plus closing quotes / brackets) followed by whitespace,
  unless the next character is lowercase or the word ending in `.` is a common
  abbreviation or a single-letter initial ("J. K. Rowling", "U.S.").
  """
  sents, start = [], 0
  for m in _BOUNDARY.finditer(text):
    end = m.end()
    nxt = text[end:].lstrip()[:1]
    if nxt.islower():
      continue
    if m.group().startswith(".") and len(m.group().rstrip("\"')]")) == 1:
      word = text[start:m.start()].split()[-1:] or [""]
      w = word[0].lower().lstrip("(\"'")
      if w in _ABBREVIATIONS or (len(w) == 1 and w.isalpha()) or re.fullmatch(r"(\w\.)+\w", w):
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
