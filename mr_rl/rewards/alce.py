"""ALCE rewards: ASQA STR-EM, ELI5 claims-NLI, AutoAIS citation recall / precision / F1.

AMRP appendix B.2 / METHODS.md section 7: `r_alce = [r_corr, r_cite]`, where `r_corr`
is STR-EM (ASQA) or claims-NLI (ELI5) and `r_cite` the F1 of AutoAIS citation recall
and precision under an NLI verifier, all per response in [0, 1]. The rules follow
ALCE's evaluator (Gao et al. 2023, `eval.py`):

* Response preprocessing (`prepare_response`): strip, keep the first line (ALCE
  truncates at the first newline; `first_line_only=False` keeps everything).
* Normalisation (`normalize_answer`): lowercase, drop punctuation, drop the articles
  a/an/the, collapse whitespace.
* STR-EM: the fraction of `qa_pairs` for which any normalised short answer is a
  substring of the normalised, citation-free response.
* Claims-NLI: the fraction of `claims` entailed by the citation-free response.
* Citations: the response is split into sentences; `[k` markers give the cited
  passages (1-based, at most `max_citations` = 3 kept, as ALCE's default). Recall
  credits a sentence when the concatenation of its cited passages (each formatted
  `"Title: <title>\\n<text>"`, joined by newlines) entails the citation-free sentence;
  uncited sentences and out-of-range citations get 0. Precision, per citation: a
  citation of an entailed sentence with one citation counts; for an entailed sentence
  with several, citation j counts unless (a) passage j alone does not entail the
  sentence and (b) the other cited passages still do (j is irrelevant); citations of
  unentailed sentences do not count. Recall = credited sentences / sentences,
  precision = credited citations / citations (0 without citations),
  F1 = 2PR/(P+R) (0 when both are 0).

Deviations from ALCE, all documented: sentences are split with `split_sentences`, a
rule-based splitter in place of NLTK's punkt model (not installed here); a `[0]`
citation is out of range (ALCE would index the last passage); an empty response scores
0 (ALCE skips it in its corpus average).

NLI verifiers implement `NLIVerifier`: `entails(premises, hypotheses) -> bool[N]` and
`entailment_probs(...) -> float[N]`. `TransformersNLIVerifier` loads a hub id or local
path: the ALCE default `google/t5_xxl_true_nli_mixture` (seq2seq; input
`"premise: P hypothesis: H"`, entailed iff the greedy output decodes to "1") or any
sequence-classification NLI model with an entailment label. `LexicalOverlapVerifier`
is a deterministic lexical-overlap baseline for tests and smoke runs.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import re
import string
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from mr_rl.rewards import channels

DEFAULT_NLI_MODEL = "google/t5_xxl_true_nli_mixture"
_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CITE_OPEN = re.compile(r"\[(\d+)")


# ----------------------------------------------------------------------------- text

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


# ------------------------------------------------------------------------ verifiers

class NLIVerifier(abc.ABC):
  """Decides whether each premise entails its hypothesis."""

  @abc.abstractmethod
  def entailment_probs(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
    """float32[N] entailment probabilities in [0, 1]."""

  @abc.abstractmethod
  def entails(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
    """bool[N] entailment decisions."""


def _check_pairs(premises, hypotheses) -> tuple[list[str], list[str]]:
  premises, hypotheses = list(premises), list(hypotheses)
  if len(premises) != len(hypotheses):
    raise ValueError(f"premises ({len(premises)}) and hypotheses ({len(hypotheses)}) differ "
                     "in length")
  for name, seq in (("premises", premises), ("hypotheses", hypotheses)):
    if not all(isinstance(s, str) for s in seq):
      raise TypeError(f"{name} must be strings")
  return premises, hypotheses


class LexicalOverlapVerifier(NLIVerifier):
  """Lexical-overlap entailment baseline (deterministic, no model).

  The probability is the share of the hypothesis's normalised content words (not in a
  small stop list) that occur in the premise; entailed iff it is >= `threshold`. A
  hypothesis with no content words has probability 0.
  """

  STOPWORDS = frozenset("is are was were be been being of in on at to for and or by with as"
                        " it its this that these those from".split())

  def __init__(self, threshold: float = 1.0):
    if not 0.0 < threshold <= 1.0:
      raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    self.threshold = float(threshold)

  def _words(self, text: str) -> set[str]:
    return {w for w in normalize_answer(text).split() if w not in self.STOPWORDS}

  def entailment_probs(self, premises, hypotheses) -> np.ndarray:
    premises, hypotheses = _check_pairs(premises, hypotheses)
    out = np.zeros(len(premises), np.float32)
    for i, (p, h) in enumerate(zip(premises, hypotheses)):
      hw = self._words(h)
      out[i] = len(hw & self._words(p)) / len(hw) if hw else 0.0
    return out

  def entails(self, premises, hypotheses) -> np.ndarray:
    return self.entailment_probs(premises, hypotheses) >= self.threshold


class TransformersNLIVerifier(NLIVerifier):
  """NLI model loaded through transformers (torch), batched.

  Args:
    model: hub id or local path; a seq2seq model (config `is_encoder_decoder`) is used
      as ALCE uses TRUE (`"premise: P hypothesis: H"` -> "1"/"0"), any other model as
      `AutoModelForSequenceClassification` over (premise, hypothesis) pairs.
    batch_size: pairs per forward pass (pairs are length-sorted first).
    device: torch device string.
    dtype: torch dtype name for the weights ("float32", "bfloat16", ...).
    entailment_label: classification label meaning entailment (default: the label
      whose name starts with "entail", case-insensitive).
    max_length: truncate inputs to this many tokens (default: none for seq2seq,
      the tokenizer's model_max_length capped at the position table for classifiers).
    max_new_tokens: generation budget of the seq2seq decision (ALCE: 10).
  """

  def __init__(self, model: str = DEFAULT_NLI_MODEL, *, batch_size: int = 8,
               device: str = "cpu", dtype: str = "float32", entailment_label: str | None = None,
               max_length: int | None = None, max_new_tokens: int = 10):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    if not isinstance(batch_size, int) or batch_size < 1:
      raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
      raise ValueError(f"dtype must name a torch dtype, got {dtype!r}")
    self._torch = torch
    self.batch_size, self.device, self.max_new_tokens = batch_size, device, max_new_tokens
    self._lock = threading.Lock()
    config = transformers.AutoConfig.from_pretrained(model)
    self.tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    self.seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    cls = (transformers.AutoModelForSeq2SeqLM if self.seq2seq
           else transformers.AutoModelForSequenceClassification)
    self.model = cls.from_pretrained(model, dtype=getattr(torch, dtype)).to(device).eval()
    self.max_length = max_length
    if self.seq2seq:
      ids = self.tokenizer("1", add_special_tokens=False).input_ids
      if not ids:
        raise ValueError(f"model {model!r}: tokenizer cannot encode the label '1'")
      self._one_id = ids[0]
    else:
      labels = {str(v).lower(): int(k) for k, v in config.id2label.items()}
      if entailment_label is not None:
        if entailment_label.lower() not in labels:
          raise ValueError(f"entailment_label {entailment_label!r} not in {sorted(labels)}")
        self.entail_index = labels[entailment_label.lower()]
      else:
        hits = [i for name, i in labels.items() if name.startswith("entail")]
        if len(hits) != 1:
          raise ValueError(f"model {model!r} labels {sorted(labels)}: pass entailment_label")
        self.entail_index = hits[0]
      if max_length is None:
        self.max_length = min(self.tokenizer.model_max_length,
                              getattr(config, "max_position_embeddings", 512))

  def _encode(self, premises, hypotheses):
    kw = dict(return_tensors="pt", padding=True, truncation=self.max_length is not None,
              max_length=self.max_length)
    if self.seq2seq:
      texts = [f"premise: {p} hypothesis: {h}" for p, h in zip(premises, hypotheses)]
      enc = self.tokenizer(texts, **kw)
    else:
      enc = self.tokenizer(list(premises), list(hypotheses), **kw)
    return {k: v.to(self.device) for k, v in enc.items()}

  def _batched(self, premises, hypotheses, fn) -> np.ndarray:
    premises, hypotheses = _check_pairs(premises, hypotheses)
    out = [None] * len(premises)
    order = sorted(range(len(premises)), key=lambda i: len(premises[i]) + len(hypotheses[i]))
    with self._lock, self._torch.inference_mode():
      for s in range(0, len(order), self.batch_size):
        idx = order[s:s + self.batch_size]
        vals = fn(self._encode([premises[i] for i in idx], [hypotheses[i] for i in idx]))
        for i, v in zip(idx, vals):
          out[i] = v
    return np.asarray(out)

  def _probs(self, enc):
    torch = self._torch
    if self.seq2seq:
      start = self.model.config.decoder_start_token_id
      dec = torch.full((enc["input_ids"].shape[0], 1), start, dtype=torch.long,
                       device=self.device)
      logits = self.model(**enc, decoder_input_ids=dec).logits[:, 0, :]
      return torch.softmax(logits.float(), -1)[:, self._one_id].cpu().numpy()
    logits = self.model(**enc).logits
    return torch.softmax(logits.float(), -1)[:, self.entail_index].cpu().numpy()

  def _decide(self, enc):
    if self.seq2seq:
      out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                num_beams=1)
      texts = self.tokenizer.batch_decode(out, skip_special_tokens=True)
      return [t2s_label(t) for t in texts]
    return (self.model(**enc).logits.argmax(-1) == self.entail_index).cpu().numpy()

  def entailment_probs(self, premises, hypotheses) -> np.ndarray:
    if not premises:
      return np.zeros(0, np.float32)
    return self._batched(premises, hypotheses, self._probs).astype(np.float32)

  def entails(self, premises, hypotheses) -> np.ndarray:
    if not premises:
      return np.zeros(0, bool)
    return self._batched(premises, hypotheses, self._decide).astype(bool)


def t2s_label(decoded: str) -> bool:
  """ALCE's reading of TRUE's output: entailed iff the decoded text is exactly "1"."""
  return decoded == "1"


# -------------------------------------------------------------------------- scores

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
                max_citations: int = 3, first_line_only: bool = True):
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

  Returns:
    (corr float32[N] or None, list of N `CitationScores` or None).
  """
  if len(responses) != len(examples):
    raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
  if not isinstance(max_citations, int) or max_citations < 1:
    raise ValueError(f"max_citations must be a positive int, got {max_citations!r}")
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
      for sent in split_sentences(text):
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


# ------------------------------------------------------------------ reward channels

_VERIFIERS: dict[tuple, NLIVerifier] = {}
_VERIFIERS_LOCK = threading.Lock()


def get_verifier(spec: str = DEFAULT_NLI_MODEL, **kwargs: Any) -> NLIVerifier:
  """`"lexical"` (`LexicalOverlapVerifier(**kwargs)`) or a transformers model id / path
  (`TransformersNLIVerifier(spec, **kwargs)`); one shared instance per argument set."""
  key = (spec, tuple(sorted(kwargs.items())))
  with _VERIFIERS_LOCK:
    if key not in _VERIFIERS:
      _VERIFIERS[key] = (LexicalOverlapVerifier(**kwargs) if spec == "lexical"
                         else TransformersNLIVerifier(spec, **kwargs))
    return _VERIFIERS[key]


def _channel(response, example, num_tokens, *, which, verifier, verifier_kwargs,
             max_citations, first_line_only):
  del num_tokens
  v = get_verifier(verifier, **dict(verifier_kwargs))
  corr, cites = score_batch([response], [example], v, correctness=which == "correctness",
                            citation=which == "citation", max_citations=max_citations,
                            first_line_only=first_line_only)
  return float(corr[0]) if which == "correctness" else cites[0].f1


def make_channel(which: str, *, verifier: str = DEFAULT_NLI_MODEL, max_citations: int = 3,
                 first_line_only: bool = True, **verifier_kwargs: Any):
  """Runner channel `alce_correctness` (STR-EM / claims-NLI by `example["task"]`) or
  `alce_citation` (AutoAIS F1). The example mapping needs `task`, `docs` and
  `qa_pairs` (ASQA) or `claims` (ELI5), as `mr_rl.data` puts in `Example.metadata`.
  The verifier loads on first use and is shared between channels; calls run on the
  runner's threads (the model stays in this process). For throughput, score whole
  batches with `score_batch` instead."""
  if which not in ("correctness", "citation"):
    raise ValueError(f"which must be 'correctness' or 'citation', got {which!r}")
  fn = functools.partial(_channel, which=which, verifier=verifier,
                         verifier_kwargs=tuple(sorted(verifier_kwargs.items())),
                         max_citations=max_citations, first_line_only=first_line_only)
  return channels.RewardChannel(f"alce_{which}", fn, kind="thread",
                                value_range=channels.UNIT_RANGE)


@channels.REWARDS.register
def alce_correctness(**kw: Any) -> channels.RewardChannel:
  """``make_channel("correctness", **kw)``: STR-EM (ASQA) or claims-NLI (ELI5)."""
  return make_channel("correctness", **kw)


@channels.REWARDS.register
def alce_citation(**kw: Any) -> channels.RewardChannel:
  """``make_channel("citation", **kw)``: AutoAIS citation F1."""
  return make_channel("citation", **kw)
