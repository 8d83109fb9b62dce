"""ALCE rewards: rule parts on hand-made cases, batching, runner channels, NLI plumbing."""

import random
import re
import time

import numpy as np
import pytest

from mr_rl.rewards import alce

DOCS = [
    {"title": "Eiffel Tower", "text": "The Eiffel Tower is in Paris and was completed in 1889."},
    {"title": "Paris", "text": "Paris is the capital of France."},
    {"title": "Cheese", "text": "Brie is a soft cheese."},
]
LEX = alce.LexicalOverlapVerifier()


class CountingVerifier(alce.LexicalOverlapVerifier):
  """The lexical verifier, recording how often and on what it is called."""

  def __init__(self):
    super().__init__()
    self.calls = []

  def entails(self, premises, hypotheses):
    self.calls.append(list(zip(premises, hypotheses)))
    return super().entails(premises, hypotheses)


# ------------------------------------------------------------------------------ text

def test_normalisation_and_citation_helpers():
  assert alce.normalize_answer("  The U.S.A.,   an Apple!") == "usa apple"
  assert alce.remove_citations("Paris is big [1][2]. Rome [3] too.") == "Paris is big. Rome too."
  assert alce.parse_citations("a [1][2] b [3, 4] c [0]") == [0, 1, 2, -1]
  assert alce.prepare_response("  first line [1].\nsecond line") == "first line [1]."
  assert alce.prepare_response("a\nb", first_line_only=False) == "a\nb"
  assert alce.split_sentences(
      "Dr. Smith met J. K. Rowling in the U.S. in 1999 [1]. She said hi! Then? Done.") == [
          "Dr. Smith met J. K. Rowling in the U.S. in 1999 [1].", "She said hi!", "Then?",
          "Done."]
  assert alce.split_sentences("Pi is 3.14 [2]. Next") == ["Pi is 3.14 [2].", "Next"]


# The splitter before issue 33 (quadratic on runs of dots), the reference for the new one.
_OLD_BOUNDARY = re.compile(r"[.!?]+[\"')\]]*(?=\s+\S)")


def _old_split_sentences(text):
  sents, start = [], 0
  for m in _OLD_BOUNDARY.finditer(text):
    end = m.end()
    nxt = text[end:].lstrip()[:1]
    if nxt.islower():
      continue
    if m.group().startswith(".") and len(m.group().rstrip("\"')]")) == 1:
      word = text[start:m.start()].split()[-1:] or [""]
      w = word[0].lower().lstrip("(\"'")
      if (w in alce.text._ABBREVIATIONS or (len(w) == 1 and w.isalpha())  # pylint: disable=protected-access
          or re.fullmatch(r"(\w\.)+\w", w)):
        continue
    sents.append(text[start:end].strip())
    start = end
  tail = text[start:].strip()
  if tail:
    sents.append(tail)
  return [s for s in sents if s]


_PROSE = [
    "Dr. Smith met J. K. Rowling in the U.S. in 1999 [1]. She said hi! Then? Done.",
    "Pi is 3.14 [2]. Next", "He said \"no.\" Then he left (quietly.) The end!!  ",
    "Wait... what? e.g. this one. Mr. X arrived at 5 p.m. yesterday. \u00a0Ok.\tFine",
    "'Quoted.' [3] Next one.] [4]. lower case after. Upper After.\n\nNew paragraph?! Yes.",
]


def test_sentence_splitter_is_the_old_one_on_text_and_random_strings():
  rng = random.Random(0)
  alphabet = list("..!?\"')] ]\n\t\u00a0aAbBzZ.[1]") + ["Mr", "e.g", "U.S", "J", "x.y.z"]
  texts = _PROSE + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(60)))
                    for _ in range(3000)]
  for text in texts:
    assert alce.split_sentences(text) == _old_split_sentences(text), repr(text)


@pytest.mark.parametrize("attack", ["." * 16000, "!" * 16000, "." * 16000 + " X",
                                    ". " * 8000 + "x", "a." * 8000 + " ", "." * 8000 + '"' * 8000,
                                    "Mr. " * 4000, " " * 16000 + ".", ".\u00a0" * 8000])
def test_sentence_splitter_is_linear_on_runs_of_punctuation(attack):
  t0 = time.perf_counter()
  alce.split_sentences(attack * 2)  # two 16,000-dot responses took 5-7 s before
  assert time.perf_counter() - t0 < 0.25


def test_runner_threads_are_not_frozen_by_dots():
  """The splitter runs on the runner's threads under the GIL: a slow one stalls them all."""
  from mr_rl.rewards import runner  # pylint: disable=g-import-not-at-top
  rr = runner.RewardRunner([runner.get_reward("alce_citation", verifier="lexical")],
                           timeout_s=0.5, num_threads=2)
  asqa = {"task": "asqa", "docs": DOCS, "qa_pairs": [{"short_answers": ["1889"]}]}
  t0 = time.perf_counter()
  r, metrics = rr([["." * 16000, "." * 16000 + " The Eiffel Tower was completed in 1889 [1]."]],
                  [asqa], np.ones((1, 2), np.int64))
  assert time.perf_counter() - t0 < 0.5 and metrics["rewards/alce_citation/timeouts"] == 0
  np.testing.assert_allclose(r[0, :, 0], [0.0, 2 / 3])  # the dots: one uncited sentence


def test_str_em():
  qa = [{"short_answers": ["The Beatles", "Beatles"]}, {"short_answers": ["1964"]},
        {"short_answers": ["an apple", "U.S.A."]}]
  assert alce.str_em("They were the Beatles [1].", qa) == pytest.approx(1 / 3)
  assert alce.str_em("Beatles, in 1964, from the USA!", qa) == pytest.approx(1.0)
  assert alce.str_em("It was a pear [2].", qa) == 0.0
  # Citation digits are not answers; only the first line counts.
  assert alce.str_em("Nothing here [1964].", qa) == 0.0
  assert alce.str_em("No.\nThe Beatles in 1964.", qa) == 0.0
  with pytest.raises(ValueError, match="qa_pairs"):
    alce.str_em("x", [])


def test_claims_nli():
  claims = ["Brie is soft.", "Paris is the capital of France.", "Rome is in Italy."]
  resp = "Brie is a soft cheese [3]. Paris is the capital of France [2]."
  assert alce.claims_nli(resp, claims, LEX) == pytest.approx(2 / 3)
  assert alce.claims_nli("", claims, LEX) == 0.0


# ------------------------------------------------------------------------ citations

@pytest.mark.parametrize("response,recall,precision,n_sent,n_cite", [
    # S1 entailed by [1]; S2 entailed by [1][2] where [1] is irrelevant (only [2] is
    # credited); S3 entailed by [3]; S4 has no citation.
    ("The Eiffel Tower was completed in 1889 [1]. Paris is the capital of France [1][2]. "
     "Brie is soft [3]. It rains a lot.", 3 / 4, 3 / 4, 4, 4),
    # Neither passage alone entails, both together do: both citations are credited.
    ("The Eiffel Tower is in the capital of France [1][2].", 1.0, 1.0, 1, 2),
    # Not entailed: two citations, no credit. Out-of-range [5] / [0]: no recall, not counted.
    ("Brie was invented in 1066 [2][3]. Brie is soft [5]. Brie is soft [0].", 0.0, 0.0, 3, 2),
    # At most 3 citations are kept; the duplicated [1] is irrelevant twice over.
    ("Paris is the capital of France [2][1][1][3].", 1.0, 1 / 3, 1, 3),
    ("", 0.0, 0.0, 0, 0),
])
def test_citation_scores_hand_made(response, recall, precision, n_sent, n_cite):
  s = alce.citation_scores(response, DOCS, LEX)
  assert (s.num_sentences, s.num_citations) == (n_sent, n_cite)
  assert s.recall == pytest.approx(recall) and s.precision == pytest.approx(precision)
  f1 = 0.0 if recall + precision == 0 else 2 * recall * precision / (recall + precision)
  assert s.f1 == pytest.approx(f1)


def _reference_citation_scores(response, docs, verifier, max_citations=3):
  """ALCE's AutoAIS loop, one verifier call per question (no batching)."""
  one = lambda p, h: bool(verifier.entails([p], [h])[0])
  fmt = lambda ids: "\n".join(alce.format_passage(docs[k]) for k in ids)
  sents = alce.split_sentences(alce.prepare_response(response))
  entail = entail_prec = total = 0
  for sent in sents:
    target = alce.remove_citations(sent).strip()
    ref = alce.parse_citations(sent)
    if not ref or any(k < 0 or k >= len(docs) for k in ref):
      joint = False
    else:
      ref = ref[:max_citations]
      total += len(ref)
      joint = one(fmt(ref), target)
    entail += joint
    if joint and len(ref) > 1:
      for k in ref:
        if one(fmt([k]), target):
          entail_prec += 1
        else:
          rest = list(ref)
          rest.remove(k)
          entail_prec += not one(fmt(rest), target)
    else:
      entail_prec += joint
  rec = entail / len(sents) if sents else 0.0
  return rec, (entail_prec / total if total else 0.0)


def test_batched_scores_equal_sequential_reference_and_use_three_rounds():
  rng = random.Random(0)
  parts = ["The Eiffel Tower was completed in 1889", "Paris is the capital of France",
           "Brie is soft", "The Eiffel Tower is in the capital of France", "Cheese is nice"]
  responses = []
  for _ in range(40):
    sents = []
    for _ in range(rng.randint(1, 4)):
      cites = "".join(f"[{rng.randint(0, 4)}]" for _ in range(rng.randint(0, 3)))
      sents.append(f"{rng.choice(parts)} {cites}.")
    responses.append(" ".join(sents))
  verifier = CountingVerifier()
  exs = [{"task": "eli5", "docs": DOCS, "claims": ["Brie is soft.", "Rome is old."]}] * 40
  corr, scores = alce.score_batch(responses, exs, verifier)
  assert len(verifier.calls) <= 3
  for resp, s, c in zip(responses, scores, corr):
    rec, prec = _reference_citation_scores(resp, DOCS, LEX)
    assert (s.recall, s.precision) == pytest.approx((rec, prec))
    assert c == pytest.approx(alce.claims_nli(resp, exs[0]["claims"], LEX))


def test_score_batch_errors():
  with pytest.raises(ValueError, match="task"):
    alce.score_batch(["x"], [{"task": "qampari", "docs": DOCS}], LEX)
  with pytest.raises(ValueError, match="examples"):
    alce.score_batch(["x", "y"], [{"task": "asqa", "docs": DOCS}], LEX)
  with pytest.raises(ValueError, match="premises"):
    LEX.entails(["a"], [])


def test_runner_channels():
  from mr_rl.rewards import runner  # pylint: disable=g-import-not-at-top
  chans = [runner.get_reward("alce_correctness", verifier="lexical"),
           runner.get_reward("alce_citation", verifier="lexical")]
  rr = runner.RewardRunner(chans, num_threads=2)
  asqa = {"task": "asqa", "docs": DOCS, "qa_pairs": [{"short_answers": ["1889"]},
                                                     {"short_answers": ["Lyon"]}]}
  eli5 = {"task": "eli5", "docs": DOCS, "claims": ["Brie is soft.", "Brie is hard."]}
  resp = [["The Eiffel Tower was completed in 1889 [1].", "Lyon [2]."],
          ["Brie is a soft cheese [3].", "Brie is soft [1][3]."]]
  r, _ = rr(resp, [asqa, eli5], np.ones((2, 2), np.int64))
  np.testing.assert_allclose(r[..., 0], [[0.5, 0.5], [0.5, 0.5]])
  np.testing.assert_allclose(r[..., 1], [[1.0, 0.0], [1.0, 2 / 3]])  # P=1/2, R=1 -> F1=2/3


# ------------------------------------------------------------- transformers plumbing

def _make_tokenizer():
  from tokenizers import Tokenizer, models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  words = ("<pad> </s> <unk> [CLS] [SEP] 1 0 : premise hypothesis title the eiffel tower is in"
           " paris and was completed 1889 capital of france brie a soft cheese").split()
  vocab = {w: i for i, w in enumerate(words)}
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.post_processor = processors.TemplateProcessing(
      single="$A </s>", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("</s>", 1), ("[CLS]", 3), ("[SEP]", 4)])
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                 unk_token="<unk>", cls_token="[CLS]", sep_token="[SEP]",
                                 model_max_length=64)


@pytest.fixture(scope="module")
def tiny_tokenizer():
  return _make_tokenizer()


PREMISES = ["the eiffel tower is in paris", "brie is a soft cheese", "paris",
            "the capital of france is paris and brie is a cheese", "1889", "tower"]
HYPOTHESES = ["paris", "brie is soft", "the eiffel tower was completed in 1889", "cheese",
              "france", "the tower"]


def test_t5_seq2seq_verifier(tmp_path, tiny_tokenizer):
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import T5Config, T5ForConditionalGeneration  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  v = len(tiny_tokenizer)
  start = tiny_tokenizer.convert_tokens_to_ids("[CLS]")
  cfg = T5Config(vocab_size=v, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                 pad_token_id=0, eos_token_id=1, decoder_start_token_id=start)
  model = T5ForConditionalGeneration(cfg).eval()
  one, zero = tiny_tokenizer.convert_tokens_to_ids(["1", "0"])
  texts = [f"premise: {p} hypothesis: {h}" for p, h in zip(PREMISES, HYPOTHESES)]
  with torch.no_grad():
    # Make the first generated token "1" for some inputs and "0" for the others: point
    # the output rows of "1" / "0" (tokens absent from the inputs) along +/- the spread
    # of the decoder states over these inputs, scaled to dominate every other logit.
    enc = tiny_tokenizer(texts, return_tensors="pt", padding=True)
    h = model(**enc, decoder_input_ids=torch.full((len(texts), 1), start),
              output_hidden_states=True).decoder_hidden_states[-1][:, 0]
    d = h[0] - h.mean(0)
    w = model.get_output_embeddings().weight
    w[one] = 200.0 * d / d.norm()
    w[zero] = -w[one]
  model.save_pretrained(tmp_path)
  tiny_tokenizer.save_pretrained(tmp_path)

  ver = alce.TransformersNLIVerifier(str(tmp_path), batch_size=4, max_new_tokens=1)
  assert ver.seq2seq
  p = ver.entailment_probs(PREMISES, HYPOTHESES)
  assert p.shape == (6,) and p.dtype == np.float32 and np.all((p >= 0) & (p <= 1))
  np.testing.assert_array_equal(p, ver.entailment_probs(PREMISES, HYPOTHESES))
  p1 = alce.TransformersNLIVerifier(str(tmp_path), batch_size=1).entailment_probs(
      PREMISES, HYPOTHESES)
  np.testing.assert_allclose(p, p1, atol=1e-5)  # padding / length-sorting are invisible
  e = ver.entails(PREMISES, HYPOTHESES)
  assert e.dtype == bool and e.shape == (6,) and 0 < e.sum() < 6
  with torch.no_grad():  # unbatched reference straight from transformers
    for i, (pr, hy) in enumerate(zip(PREMISES, HYPOTHESES)):
      ids = tiny_tokenizer(f"premise: {pr} hypothesis: {hy}", return_tensors="pt").input_ids
      logits = model(input_ids=ids, decoder_input_ids=torch.full((1, 1), start)).logits
      assert p[i] == pytest.approx(torch.softmax(logits[0, 0], -1)[one].item(), abs=1e-6)
      out = model.generate(ids, max_new_tokens=1, do_sample=False, num_beams=1)
      assert e[i] == (tiny_tokenizer.decode(out[0], skip_special_tokens=True) == "1")
  assert alce.t2s_label("1") and not alce.t2s_label("0") and not alce.t2s_label("1 1")
  _, scores = alce.score_batch(["paris is the capital of france [1]."], [{"docs": DOCS}], ver,
                               correctness=False)
  assert 0.0 <= scores[0].f1 <= 1.0


def _tiny_bert_nli(path, tiny_tokenizer):
  """A 1-layer BERT NLI classifier saved at `path`; returns the model."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import BertConfig, BertForSequenceClassification  # pylint: disable=g-import-not-at-top
  torch.manual_seed(1)
  labels = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}
  cfg = BertConfig(vocab_size=len(tiny_tokenizer), hidden_size=16, num_hidden_layers=1,
                   num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                   num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()},
                   pad_token_id=0)
  model = BertForSequenceClassification(cfg).eval()
  model.save_pretrained(path)
  tiny_tokenizer.save_pretrained(path)
  return model


def test_sequence_classification_verifier(tmp_path, tiny_tokenizer):
  import torch  # pylint: disable=g-import-not-at-top
  model = _tiny_bert_nli(tmp_path, tiny_tokenizer)
  ver = alce.TransformersNLIVerifier(str(tmp_path), batch_size=4)
  assert not ver.seq2seq and ver.entail_index == 2
  p = ver.entailment_probs(PREMISES, HYPOTHESES)
  e = ver.entails(PREMISES, HYPOTHESES)
  assert p.shape == e.shape == (6,) and np.all((p > 0) & (p < 1))
  np.testing.assert_array_equal(e, ver.entails(PREMISES, HYPOTHESES))
  p1 = alce.TransformersNLIVerifier(str(tmp_path), batch_size=1).entailment_probs(
      PREMISES, HYPOTHESES)
  np.testing.assert_allclose(p, p1, atol=1e-5)
  with torch.no_grad():
    enc = tiny_tokenizer(PREMISES, HYPOTHESES, return_tensors="pt", padding=True)
    probs = torch.softmax(model(**enc).logits, -1).numpy()
  np.testing.assert_allclose(p, probs[:, 2], atol=1e-5)
  np.testing.assert_array_equal(e, probs.argmax(-1) == 2)
  assert alce.TransformersNLIVerifier(str(tmp_path), entailment_label="neutral").entail_index == 1
  with pytest.raises(ValueError, match="entailment_label"):
    alce.TransformersNLIVerifier(str(tmp_path), entailment_label="yes")


def test_scores_read_data_example_metadata():
  from mr_rl import data  # pylint: disable=g-import-not-at-top
  ex = data.Example.single_turn("alce_asqa/1", "alce_asqa", "prompt", "long answer",
                                task="asqa", docs=DOCS, question="q",
                                qa_pairs=[{"question": "q", "short_answers": ["1889"]}])
  corr, cites = alce.score_batch(["It was completed in 1889 [1]."], [ex.as_mapping()], LEX)
  assert corr[0] == 1.0 and cites[0].recall == 1.0 and cites[0].precision == 1.0


# ------------------------------------------------------------------ bounded verifier work
CITED = "The Eiffel Tower was completed in 1889 [1]. "


def test_a_response_of_many_cited_sentences_asks_the_verifier_a_bounded_number_of_times():
  """Attack (issue 41, 6): 4,000 cited sentences were 4,000 verifier queries in one call (the
  shared NLI model held 1.6 s). Now at most max_sentences of a response are verified and the
  rest count as unsupported; an honest response (the control) scores as before."""
  ex = {"task": "asqa", "docs": DOCS, "qa_pairs": [{"short_answers": ["1889"]}]}
  ch = alce.alce_citation(verifier="lexical")
  counting = CountingVerifier()
  alce.channels._VERIFIERS[("lexical", ())] = counting  # pylint: disable=protected-access
  try:
    attack = ch.fn(CITED * 4000, ex, 1)
    asked = sum(len(c) for c in counting.calls)
    assert asked <= 64 * (1 + 2 * 3), asked  # 64 sentences (MAX_SENTENCES), 3 citations
    assert attack <= 2 * (64 / 4000) and attack < 1.0  # F1 of recall 64 / 4000
    honest = "The Eiffel Tower was completed in 1889 [1]. Paris is the capital of France [2]."
    assert ch.fn(honest, ex, 1) == alce.citation_scores(honest, DOCS, LEX).f1 == 1.0
  finally:
    alce.channels._VERIFIERS.pop(("lexical", ()))  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="max_sentences"):
    alce.alce_citation(verifier="lexical", max_sentences=0)


def test_an_abandoned_verifier_call_does_not_hold_the_model_for_the_next_batch(tmp_path,
                                                                              tiny_tokenizer):
  """Attack (issue 41, 6): the NLI model's lock was held for a whole call, so a call abandoned
  at its timeout kept it for its remaining forwards and every call of the next batch timed
  out. Now the lock is held per forward and an abandoned call stops at its next one."""
  from mr_rl.rewards import runner as rr  # pylint: disable=g-import-not-at-top
  _tiny_bert_nli(tmp_path, tiny_tokenizer)
  ver = alce.TransformersNLIVerifier(str(tmp_path), batch_size=1)
  decide, forwards = ver._decide, []  # pylint: disable=protected-access

  def slow_decide(enc):  # a forward of a big model: 50 ms
    forwards.append(time.monotonic())
    time.sleep(0.05)
    return decide(enc)
  ver._decide = slow_decide  # pylint: disable=protected-access

  def cite(response, example, num_tokens):
    return alce.score_batch([response], [example], ver, correctness=False,
                            max_sentences=None)[1][0].f1
  runner = rr.RewardRunner([rr.RewardChannel("cite", cite, value_range=(0, 1))], timeout_s=0.5,
                           num_threads=2, max_failure_share=1.0)
  ex = [{"docs": DOCS}]
  _, m = runner([[CITED * 100]], ex, np.ones((1, 1), np.int64))  # 100 forwards: 5 s
  assert m["rewards/cite/timeouts"] == 1
  t0 = time.monotonic()
  _, m = runner([[CITED, "Paris is the capital of France [2]."]], ex, np.ones((1, 2), np.int64))
  assert m["rewards/cite/timeouts"] == 0, time.monotonic() - t0  # the honest control
  time.sleep(0.2)
  assert len(forwards) < 20  # the abandoned call stopped at its deadline (100 before)
