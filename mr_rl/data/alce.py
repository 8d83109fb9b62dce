"""ALCE ASQA / ELI5 for citation-grounded QA (AMRP appendix B.1, docs/methods.md §7).

Source: princeton-nlp/ALCE-data (the hub repository holds `ALCE-data.tar`, whose
members `ALCE-data/asqa_eval_gtr_top100.json` and `ALCE-data/eli5_eval_bm25_top100.json`
are read here). Each file is a JSON list of records with `question`, `answer` (long
answer), `docs` (retrieved passages `{title, text, ...}`, best first) and, for ASQA,
`qa_pairs` (`{question, short_answers, ...}`), for ELI5, `claims` (3 sentences).

AMRP's setup: three retrieved passages and one in-context demonstration per prompt;
an 80/20 train/test split (758/190 ASQA, 800/200 ELI5). The prompt follows ALCE's
layout: instruction, the demonstration (question, its passages, a cited answer), then
the query's question and passages, ending in "Answer:". Passages are numbered from 1
and cited as [k]; `metadata["docs"]` holds exactly the passages shown, in order, so the
citation reward resolves [k] against them.
"""

from __future__ import annotations

import json
import os
import tarfile
from typing import Any, Mapping, Sequence

from mr_rl.data import sources
from mr_rl.data.example import Example

ALCE_HUB = "princeton-nlp/ALCE-data"
ALCE_TAR = "ALCE-data.tar"
ALCE_FILES = {"asqa": "asqa_eval_gtr_top100.json", "eli5": "eli5_eval_bm25_top100.json"}

DOC_PROMPT = "Document [{ID}](Title: {T}): {P}\n"
DEMO_PROMPT = "{INST}\n\nQuestion: {Q}\n\n{D}\nAnswer: {A}"
DEMO_SEP = "\n\n\n"
INSTRUCTION = (
    "Instruction: Answer the question accurately and concisely, using only the search"
    " results given below (some may be irrelevant). Support every factual statement"
    " with citations: put the numbers of the supporting results in brackets at the end"
    " of the sentence, e.g. [1] or [1][3]. Cite at least one and at most three results"
    " per sentence, and when several results support a sentence, cite the smallest set"
    " that suffices. Keep the tone neutral.")

# Built-in demonstrations (written for this project); ALCE's own ones can be used with
# `prompt_file=<ALCE repo>/prompts/{asqa,eli5}_default.json`.
_DEMOS = {
    "asqa": {
        "question": "Who wrote the novel that the film Blade Runner is based on?",
        "docs": [
            {"title": "Blade Runner", "text": "Blade Runner is a 1982 science fiction film"
             " directed by Ridley Scott. It is loosely based on the 1968 novel Do Androids"
             " Dream of Electric Sheep? by Philip K. Dick."},
            {"title": "Philip K. Dick", "text": "Philip Kindred Dick (1928-1982) was an"
             " American science fiction writer who wrote 44 novels and about 121 short"
             " stories."},
            {"title": "Blade Runner 2049", "text": "Blade Runner 2049 is a 2017 sequel"
             " directed by Denis Villeneuve, set thirty years after the first film."},
        ],
        "answer": "The 1982 film Blade Runner is loosely based on the novel Do Androids"
                  " Dream of Electric Sheep?, which was written by the American science"
                  " fiction writer Philip K. Dick [1][2].",
    },
    "eli5": {
        "question": "Why does bread go stale?",
        "docs": [
            {"title": "Staling", "text": "Staling is a chemical and physical process in"
             " bread that reduces its palatability. The main cause is the"
             " retrogradation of starch: starch molecules recrystallise as the bread"
             " cools and ages, which makes the crumb firm."},
            {"title": "Bread storage", "text": "Storing bread in a refrigerator speeds up"
             " staling, because starch recrystallises fastest at temperatures just above"
             " freezing."},
            {"title": "Toast", "text": "Toasting browns bread through the Maillard"
             " reaction."},
        ],
        "answer": "Bread goes stale mainly because its starch slowly recrystallises after"
                  " baking, which makes the crumb firm and dry [1]. This happens fastest"
                  " at cool temperatures just above freezing, so keeping bread in the"
                  " fridge makes it stale sooner [2].",
    },
}


def _fill(template: str, **fields: str) -> str:
  """Replaces `{NAME}` placeholders literally (ALCE's templates are not str.format-safe)."""
  for k, v in fields.items():
    template = template.replace("{" + k + "}", v)
  return template


def format_docs(docs: Sequence[Mapping[str, Any]], doc_prompt: str = DOC_PROMPT) -> str:
  """ALCE-style passage block: `Document [k](Title: t): text` lines, k from 1."""
  return "".join(_fill(doc_prompt, ID=str(i + 1), T=d["title"], P=d["text"])
                 for i, d in enumerate(docs))


def build_prompt(question: str, docs: Sequence[Mapping[str, Any]], demo: Mapping[str, Any],
                 *, instruction: str = INSTRUCTION, demo_prompt: str = DEMO_PROMPT,
                 demo_sep: str = DEMO_SEP, doc_prompt: str = DOC_PROMPT,
                 ndoc: int = 3) -> str:
  """Instruction + one demonstration + the query, in ALCE's layout (answer left empty)."""
  demo_text = _fill(demo_prompt, INST=instruction, Q=demo["question"],
                    D=format_docs(demo["docs"][:ndoc], doc_prompt), A=demo["answer"])
  query = _fill(demo_prompt, INST=instruction, Q=question,
                D=format_docs(docs[:ndoc], doc_prompt), A="")
  return demo_text + demo_sep + query.rstrip()


def _resolve_file(task: str, path: str | None, cache_dir: str | None) -> str:
  fname = ALCE_FILES[task]
  if path is not None:
    path = os.path.expanduser(os.fspath(path))
    for cand in (path, os.path.join(path, fname), os.path.join(path, "ALCE-data", fname)):
      if os.path.isfile(cand):
        return cand
    raise FileNotFoundError(f"path {path!r} for data set alce_{task} is neither {fname} nor a "
                            f"directory holding it (or ALCE-data/{fname})")
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top
    tar_path = huggingface_hub.hf_hub_download(ALCE_HUB, ALCE_TAR, repo_type="dataset",
                                               cache_dir=cache_dir)
  except Exception as e:  # pylint: disable=broad-except  # hub raises many error types.
    raise sources.DatasetUnavailableError(
        sources.hub_failure_message(f"alce_{task}", ALCE_HUB, e)) from e
  out_dir = os.path.join(os.path.dirname(tar_path), "extracted")
  out = os.path.join(out_dir, "ALCE-data", fname)
  if not os.path.isfile(out):
    with tarfile.open(tar_path) as tar:
      tar.extract(f"ALCE-data/{fname}", out_dir, filter="data")
  return out


def load_alce(task: str, *, split: str = "train", path: str | None = None,
              cache_dir: str | None = None, ndoc: int = 3, train_fraction: float = 0.8,
              seed: int = 0, prompt_file: str | None = None,
              demo_index: int = 0) -> list[Example]:
  """ASQA or ELI5 examples with a 3-passage, 1-demonstration prompt.

  Args:
    task: "asqa" or "eli5".
    split: "train" or "test" of the deterministic 80/20 split (`sources.train_test_split`,
      keyed on the question text).
    path: the ALCE JSON file, or a directory holding it (or `ALCE-data/<file>`).
    cache_dir: hub cache directory for `ALCE-data.tar`.
    ndoc: passages per prompt (AMRP: 3, the top-ranked ones).
    train_fraction: share of records in `train`.
    seed: hash seed of the split.
    prompt_file: an ALCE prompt JSON (`instruction`, `demo_prompt`, `doc_prompt`,
      `demo_sep`, `demos`) to use instead of the built-in instruction and demonstration.
    demo_index: which demonstration of `prompt_file` to use.
  """
  if task not in ALCE_FILES:
    raise ValueError(f"task must be one of {sorted(ALCE_FILES)}, got {task!r}")
  if not isinstance(ndoc, int) or ndoc < 1:
    raise ValueError(f"ndoc must be a positive int, got {ndoc!r}")
  name = f"alce_{task}"
  with open(_resolve_file(task, path, cache_dir), encoding="utf-8") as f:
    records = json.load(f)
  if not isinstance(records, list):
    raise ValueError(f"{name}: expected a JSON list of records")
  need = ("question", "answer", "docs") + (("qa_pairs",) if task == "asqa" else ("claims",))
  for i, r in enumerate(records):
    missing = [k for k in need if k not in r]
    if missing:
      raise ValueError(f"{name}: record {i} lacks keys {missing}")
  instruction, demo_prompt, demo_sep, demo = INSTRUCTION, DEMO_PROMPT, DEMO_SEP, _DEMOS[task]
  doc_prompt = DOC_PROMPT
  if prompt_file is not None:
    with open(prompt_file, encoding="utf-8") as f:
      spec = json.load(f)
    instruction, demo_prompt = spec["instruction"], spec["demo_prompt"]
    demo_sep, doc_prompt = spec["demo_sep"], spec["doc_prompt"]
    if not 0 <= demo_index < len(spec["demos"]):
      raise ValueError(f"demo_index {demo_index} out of range for {len(spec['demos'])} demos")
    demo = spec["demos"][demo_index]
  records = sources.train_test_split(records, lambda r: r["question"],
                                     train_fraction=train_fraction, seed=seed, split=split)
  out = []
  for r in records:
    docs = [{"title": d["title"], "text": d["text"]} for d in r["docs"][:ndoc]]
    if len(docs) < ndoc:
      raise ValueError(f"{name}: record {r['question']!r} has {len(docs)} < ndoc docs")
    meta: dict[str, Any] = {"docs": docs, "task": task, "question": r["question"]}
    if task == "asqa":
      meta["qa_pairs"] = [{"question": q.get("question"),
                           "short_answers": list(q["short_answers"])} for q in r["qa_pairs"]]
    else:
      meta["claims"] = list(r["claims"])
    rid = r.get("sample_id") or f"{sources.stable_hash(r['question']):016x}"
    prompt = build_prompt(r["question"], docs, demo, instruction=instruction,
                          demo_prompt=demo_prompt, demo_sep=demo_sep, doc_prompt=doc_prompt,
                          ndoc=ndoc)
    out.append(Example.single_turn(f"{name}/{rid}", name, prompt, str(r["answer"]), **meta))
  return out
