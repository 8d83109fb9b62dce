"""ALCE rewards: ASQA STR-EM, ELI5 claims-NLI, AutoAIS citation recall / precision / F1.

AMRP appendix B.2 / docs/methods.md §7: `r_alce = [r_corr, r_cite]`, where `r_corr`
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

Modules: ``text`` (normalisation, preprocessing, sentences, citations), ``verifiers``,
``scoring`` (STR-EM, claims-NLI, AutoAIS) and ``channels`` (the registered channels and the
shared verifier instances). Everything public is exported here.
"""

from mr_rl.rewards.alce.channels import (alce_citation, alce_correctness, get_verifier,
                                         make_channel)
from mr_rl.rewards.alce.scoring import (CitationScores, citation_scores, claims_nli, score_batch,
                                        str_em)
from mr_rl.rewards.alce.text import (format_passage, normalize_answer, parse_citations,
                                     prepare_response, remove_citations, split_sentences)
from mr_rl.rewards.alce.verifiers import (DEFAULT_NLI_MODEL, LexicalOverlapVerifier, NLIVerifier,
                                          TransformersNLIVerifier, t2s_label)

__all__ = ["DEFAULT_NLI_MODEL", "CitationScores", "LexicalOverlapVerifier", "NLIVerifier",
           "TransformersNLIVerifier", "alce_citation", "alce_correctness", "citation_scores",
           "claims_nli", "format_passage", "get_verifier", "make_channel", "normalize_answer",
           "parse_citations", "prepare_response", "remove_citations", "score_batch",
           "split_sentences", "str_em", "t2s_label"]
