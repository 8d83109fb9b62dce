"""NLI verifiers for ALCE: the ``NLIVerifier`` interface, a lexical-overlap baseline and
transformers models (TRUE seq2seq or any sequence-classification NLI model)."""

from __future__ import annotations

import abc
import threading
from typing import Sequence

import numpy as np

from mr_rl.rewards.alce.text import normalize_answer
from mr_rl.rewards.calls import check_deadline

DEFAULT_NLI_MODEL = "google/t5_xxl_true_nli_mixture"


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
    for s in range(0, len(order), self.batch_size):
      # One forward per lock hold, the caller's deadline asked before each: a call abandoned
      # at its timeout stops here, where it once held the model for its whole (4,000-sentence)
      # run and every call of the next batch timed out behind it.
      check_deadline()
      idx = order[s:s + self.batch_size]
      with self._lock, self._torch.inference_mode():
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
