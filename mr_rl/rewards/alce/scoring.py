"""ALCE scores: ASQA STR-EM, ELI5 claims-NLI and AutoAIS citation recall / precision / F1,
batched into three verifier rounds (``score_batch``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from mr_rl.rewards.alce.text import (format_passage, normalize_answer, parse_citations,
                                     prepare_response, remove_citations, split_sentences)
from mr_rl.rewards.alce.verifiers import NLIVerifier


def str_em(response: str, qa_pairs: Sequence[Mapping[str, Any]], *,
           first_line_only: bool = True) -> float:
  """ASQA STR-EM of one response (fraction of qa_pairs with a short answer present)."""
  if not qa_pairs:
    raise ValueError("qa_pairs is empty")
  context = normalize_answer(remove_citations(prepare_response(response, first_line_only)))
  hits = 0
  for qa in qa_pairs:
    answers = [normalize_answer(a) for a in qa["short_answers"]]
    hits += any(a in context for a in answers)
  return hits / len(qa_pairs)


@dataclasses.dataclass(frozen=True)
class CitationScores:
  """AutoAIS scores of one response."""
  recall: float
  precision: float
  f1: float
  num_sentences: int
  num_citations: int


def _f1(p: float, r: float) -> float:
  return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def score_batch(responses: Sequence[str], examples: Sequence[Mapping[str, Any]],
                verifier: NLIVerifier, *, correctness: bool = True, citation: bool = True,
                max_citations: int = 3, first_line_only: bool = True,
                max_sentences: int | None = None):
  """Scores many responses with three batched verifier rounds.

  Args:
    responses: N responses.
    examples: N mappings with `docs` (the passages shown in the prompt, cited 1-based)
      and `task` ("asqa": needs `qa_pairs`; "eli5": needs `claims`).
    verifier: the NLI verifier.
    correctness: compute r_corr (STR-EM or claims-NLI).
    citation: compute the AutoAIS citation scores.
    max_citations: citations kept per sentence (ALCE default 3).
    first_line_only: ALCE's first-line truncation.
    max_sentences: sentences verified per response (None: all, as ALCE). Later ones count
      as unsupported, never asked: a response's verifier work is at most max_sentences *
      (1 + 2 * max_citations) queries, so no response can hold the verifier for the batch.

  Returns:
    (corr float32[N] or None, list of N `CitationScores` or None).
  """
  if len(responses) != len(examples):
    raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
  if not isinstance(max_citations, int) or max_citations < 1:
    raise ValueError(f"max_citations must be a positive int, got {max_citations!r}")
  if max_sentences is not None and (not isinstance(max_sentences, int) or max_sentences < 1):
    raise ValueError(f"max_sentences must be None or a positive int, got {max_sentences!r}")
  texts = [prepare_response(r, first_line_only) for r in responses]
  queries: list[tuple[str, str]] = []

  def ask(premise, hypothesis) -> int:
    queries.append((premise, hypothesis))
    return len(queries) - 1

  def run() -> np.ndarray:
    if not queries:
      return np.zeros(0, bool)
    res = verifier.entails([q[0] for q in queries], [q[1] for q in queries])
    queries.clear()
    return np.asarray(res, bool)

  # Round 1: claims and joint-citation recall.
  corr = np.zeros(len(texts), np.float32) if correctness else None
  claim_q: list[tuple[int, list[int]]] = []
  sent_info = []  # per response: list of (sentence, refs, query id or None)
  for n, (text, ex) in enumerate(zip(texts, examples)):
    if correctness:
      task = ex.get("task")
      if task == "asqa":
        corr[n] = str_em(text, ex["qa_pairs"], first_line_only=False)
      elif task == "eli5":
        if not ex["claims"]:
          raise ValueError(f"examples[{n}] has no claims")
        premise = remove_citations(text)
        claim_q.append((n, [ask(premise, c) for c in ex["claims"]]))
      else:
        raise ValueError(f"examples[{n}]['task'] must be 'asqa' or 'eli5', got {task!r}")
    if citation:
      docs, info = ex["docs"], []
      for i, sent in enumerate(split_sentences(text)):
        if max_sentences is not None and i >= max_sentences:
          info.append(("", [], None))  # counted in recall's denominator, never verified
          continue
        refs = parse_citations(sent)[:max_citations]
        ok = bool(refs) and all(0 <= k < len(docs) for k in refs)
        target = remove_citations(sent).strip()
        qid = ask("\n".join(format_passage(docs[k]) for k in refs), target) if ok else None
        info.append((target, refs if ok else [], qid))
      sent_info.append(info)
  r1 = run()
  for n, qids in claim_q:
    corr[n] = float(np.mean(r1[qids]))
  if not citation:
    return corr, None

  # Round 2: for entailed multi-citation sentences, each cited passage alone.
  single = {}
  for n, info in enumerate(sent_info):
    for s, (target, refs, qid) in enumerate(info):
      if qid is not None and r1[qid] and len(refs) > 1:
        for j, k in enumerate(refs):
          single[n, s, j] = ask(format_passage(examples[n]["docs"][k]), target)
  r2 = run()
  # Round 3: for passages that fail alone, do the remaining citations still entail?
  rest = {}
  for (n, s, j), qid in single.items():
    if not r2[qid]:
      target, refs, _ = sent_info[n][s]
      others = refs[:j] + refs[j + 1:]
      rest[n, s, j] = ask("\n".join(format_passage(examples[n]["docs"][k]) for k in others),
                          target)
  r3 = run()

  scores = []
  for n, info in enumerate(sent_info):
    entail = prec = cites = 0
    for s, (_, refs, qid) in enumerate(info):
      ok = qid is not None and bool(r1[qid])
      entail += ok
      cites += len(refs)
      if ok and len(refs) > 1:
        prec += sum(1 for j in range(len(refs))
                    if r2[single[n, s, j]] or not r3[rest[n, s, j]])
      else:
        prec += ok
    recall = entail / len(info) if info else 0.0
    precision = prec / cites if cites else 0.0
    scores.append(CitationScores(recall, precision, _f1(precision, recall), len(info), cites))
  return corr, scores


def claims_nli(response: str, claims: Sequence[str], verifier: NLIVerifier, *,
               first_line_only: bool = True) -> float:
  """ELI5 claims-NLI of one response: fraction of claims it entails."""
  corr, _ = score_batch([response], [{"task": "eli5", "claims": claims, "docs": []}], verifier,
                        citation=False, first_line_only=first_line_only)
  return float(corr[0])


def citation_scores(response: str, docs: Sequence[Mapping[str, Any]], verifier: NLIVerifier,
                    *, max_citations: int = 3, first_line_only: bool = True) -> CitationScores:
  """AutoAIS citation recall / precision / F1 of one response against its passages."""
  _, scores = score_batch([response], [{"docs": docs}], verifier, correctness=False,
                          max_citations=max_citations, first_line_only=first_line_only)
  return scores[0]
