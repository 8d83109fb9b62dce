"""ALCE reward channels ``alce_correctness`` and ``alce_citation`` and the shared verifiers."""

from __future__ import annotations

import functools
import threading
from typing import Any

from mr_rl.rewards.alce.scoring import score_batch
from mr_rl.rewards.alce.verifiers import (DEFAULT_NLI_MODEL, LexicalOverlapVerifier, NLIVerifier,
                                          TransformersNLIVerifier)
from mr_rl.rewards.channels import REWARDS, UNIT_RANGE, RewardChannel


MAX_SENTENCES = 64  # verified per response; ALCE's answers have a few (first line only)
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
             max_citations, first_line_only, max_sentences):
  del num_tokens
  v = get_verifier(verifier, **dict(verifier_kwargs))
  corr, cites = score_batch([response], [example], v, correctness=which == "correctness",
                            citation=which == "citation", max_citations=max_citations,
                            first_line_only=first_line_only, max_sentences=max_sentences)
  return float(corr[0]) if which == "correctness" else cites[0].f1


def make_channel(which: str, *, verifier: str = DEFAULT_NLI_MODEL, max_citations: int = 3,
                 first_line_only: bool = True, max_sentences: int = MAX_SENTENCES,
                 **verifier_kwargs: Any):
  """Runner channel `alce_correctness` (STR-EM / claims-NLI by `example["task"]`) or
  `alce_citation` (AutoAIS F1). The example mapping needs `task`, `docs` and
  `qa_pairs` (ASQA) or `claims` (ELI5), as `mr_rl.data` puts in `Example.metadata`.
  The verifier loads on first use and is shared between channels; calls run on the
  runner's threads (the model stays in this process). For throughput, score whole
  batches with `score_batch` instead. At most `max_sentences` sentences of a response are
  verified (`score_batch`), later ones count as unsupported."""
  if which not in ("correctness", "citation"):
    raise ValueError(f"which must be 'correctness' or 'citation', got {which!r}")
  if isinstance(max_sentences, bool) or not isinstance(max_sentences, int) or max_sentences < 1:
    raise ValueError(f"max_sentences must be a positive int, got {max_sentences!r}")
  fn = functools.partial(_channel, which=which, verifier=verifier,
                         verifier_kwargs=tuple(sorted(verifier_kwargs.items())),
                         max_citations=max_citations, first_line_only=first_line_only,
                         max_sentences=max_sentences)
  return RewardChannel(f"alce_{which}", fn, kind="thread", value_range=UNIT_RANGE)


@REWARDS.register
def alce_correctness(**kw: Any) -> RewardChannel:
  """``make_channel("correctness", **kw)``: STR-EM (ASQA) or claims-NLI (ELI5)."""
  return make_channel("correctness", **kw)


@REWARDS.register
def alce_citation(**kw: Any) -> RewardChannel:
  """``make_channel("citation", **kw)``: AutoAIS citation F1."""
  return make_channel("citation", **kw)
