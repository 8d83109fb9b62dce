"""Loaders of mr_rl.data on small local files with the real hub schemas (no network)."""

import json
import random

import datasets
import pytest

from mr_rl import data
from mr_rl.data import alce as alce_data
from mr_rl.data import helpsteer
from mr_rl.data import math as math_data


def _write_jsonl(path, rows):
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return str(path)


# ----------------------------------------------------------------------------- Big-Math

def _big_math_rows():
  rng = random.Random(0)
  rows = []
  for i in range(60):
    rate = None if i % 13 == 0 else round(rng.random(), 3)
    rows.append({"problem": f"Compute {i} + {i}.", "answer": str(2 * i),
                 "source": rng.choice(["cn_k12", "olympiads", "orca_math"]),
                 "domain": ["Mathematics -> Algebra"], "llama8b_solve_rate": rate})
  rows.append(dict(rows[5]))  # exact duplicate problem
  rows.append({**rows[7], "problem": "  Compute 7 +   7. "})  # whitespace duplicate
  rows += [{"problem": "Edge low", "answer": "1", "source": "x", "domain": [],
            "llama8b_solve_rate": 0.0},
           {"problem": "Edge high", "answer": "1", "source": "x", "domain": [],
            "llama8b_solve_rate": 0.2},
           {"problem": "Empty answer", "answer": "", "source": "x", "domain": [],
            "llama8b_solve_rate": 0.1}]
  return rows


@pytest.fixture(scope="module")
def big_math_file(tmp_path_factory):
  d = tmp_path_factory.mktemp("bigmath")
  datasets.Dataset.from_list(_big_math_rows()).to_parquet(str(d / "big_math.parquet"))
  return str(d / "big_math.parquet")


def test_big_math_hard_split_rule(big_math_file, tmp_path):
  rows = _big_math_rows()
  expected = {" ".join(r["problem"].split()) for r in rows
              if r["llama8b_solve_rate"] is not None and r["answer"]
              and 0.0 <= r["llama8b_solve_rate"] <= 0.2}
  test = data.load_dataset("big_math_hard", path=big_math_file, split="test", test_size=4,
                           cache_dir=str(tmp_path))
  train = data.load_dataset("big_math_hard", path=big_math_file, split="train", test_size=4,
                            cache_dir=str(tmp_path))
  assert len(test) == 4
  got = [" ".join(e.prompt.split()) for e in test + train]
  assert len(got) == len(set(got))  # de-duplicated and disjoint
  assert set(got) == expected  # edges 0.0 and 0.2 included, None / empty answer excluded
  assert "Edge low" in got and "Edge high" in got and "Empty answer" not in got
  for e in test + train:
    assert 0.0 <= e.metadata["llama8b_solve_rate"] <= 0.2
    assert e.reference and e.dataset == "big_math_hard"
  assert all(e.messages[0]["role"] == "user" for e in test)


def test_big_math_split_independent_of_row_order_and_thresholds(big_math_file, tmp_path):
  rows = _big_math_rows()
  random.Random(3).shuffle(rows)
  shuffled = _write_jsonl(tmp_path / "shuffled.jsonl", rows)
  kw = dict(split="test", test_size=5, cache_dir=str(tmp_path))
  a = data.load_dataset("big_math_llama_calibrated", path=big_math_file, **kw)
  b = data.load_dataset("big_math_llama_calibrated", path=shuffled, **kw)
  assert [e.uid for e in a] == [e.uid for e in b]
  assert all(0.3 <= e.metadata["llama8b_solve_rate"] <= 0.7 for e in a)
  c = data.load_dataset("big_math_llama_calibrated", path=big_math_file, seed=1, **kw)
  assert [e.uid for e in c] != [e.uid for e in a]
  d = data.load_dataset("big_math_hard", path=big_math_file, split="train", test_size=0,
                        min_solve_rate=0.9, max_solve_rate=1.0, cache_dir=str(tmp_path))
  assert d and all(e.metadata["llama8b_solve_rate"] >= 0.9 for e in d)
  with pytest.raises(ValueError, match="min_solve_rate"):
    data.load_dataset("big_math_hard", path=big_math_file, min_solve_rate=0.5,
                      max_solve_rate=0.1)


# ------------------------------------------------------------------------- NuminaMath

@pytest.mark.parametrize("answer,ok", [
    ("12", True), ("\\frac{1}{2}", True), ("x^2+1", True), ("3\\sqrt{2}", True),
    ("-7.5", True), ("proof", False), ("notfound", False), ("", False),
    ("\\text{yes}", False), ("no solution", False), ("1" * 80, False)])
def test_is_verifiable_answer(answer, ok):
  assert math_data.is_verifiable_answer(answer) is ok


def test_numina_subset_filters_and_is_deterministic(tmp_path):
  base = {"solution": "...", "problem_type": "Algebra", "source": "olympiads",
          "synthetic": False, "problem_is_valid": "Yes", "solution_is_valid": "Yes"}
  rows = []
  for i, ans in enumerate(["12", "\\frac{1}{2}", "x^2+1", "proof", "notfound", "\\text{yes}",
                           "-3", "2\\pi"]):
    rows.append({**base, "problem": f"Problem {i}", "answer": ans,
                 "question_type": "proof" if ans == "proof" else "math-word-problem"})
  rows.append({**base, "problem": "MCQ", "answer": "B", "question_type": "MCQ"})
  rows.append({**base, "problem": "Invalid", "answer": "5", "question_type": "math-word-problem",
               "problem_is_valid": "No"})
  rows.append({**base, "problem": "Synth", "answer": "6", "question_type": "math-word-problem",
               "synthetic": True})
  path = _write_jsonl(tmp_path / "numina.jsonl", rows)
  kw = dict(path=path, cache_dir=str(tmp_path))
  full = data.load_dataset("numina_math", num_examples=100, **kw)
  assert sorted(e.reference for e in full) == sorted(
      ["12", "\\frac{1}{2}", "x^2+1", "-3", "2\\pi", "6"])
  no_synth = data.load_dataset("numina_math", num_examples=100, include_synthetic=False, **kw)
  assert "6" not in [e.reference for e in no_synth]
  three = data.load_dataset("numina_math", num_examples=3, **kw)
  again = data.load_dataset("numina_math", num_examples=3, **kw)
  assert len(three) == 3 and [e.uid for e in three] == [e.uid for e in again]
  assert [e.uid for e in three] == [e.uid for e in full[:3]]  # a prefix of the hash order
  with pytest.raises(ValueError, match="split"):
    data.load_dataset("numina_math", split="test", **kw)


# -------------------------------------------------------------- MATH-500, AMC, AIME

def test_math500_schema(tmp_path):
  rows = [{"problem": f"What is {i}?", "solution": "It is.", "answer": str(i),
           "subject": "Algebra", "level": 1 + i % 5, "unique_id": f"test/algebra/{i}.json"}
          for i in range(6)]
  exs = data.load_dataset("math500", path=_write_jsonl(tmp_path / "m.jsonl", rows),
                          cache_dir=str(tmp_path))
  assert [e.uid for e in exs] == [f"math500/test/algebra/{i}.json" for i in range(6)]
  assert exs[2].reference == "2" and exs[2].metadata["level"] == 3
  assert exs[2].prompt == "What is 2?"


def test_amc_aime_replication(tmp_path):
  amc = [{"id": i, "problem": f"AMC {i}", "answer": float(10 * i + 2),
          "url": f"https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_{i}"}
         for i in range(3)]
  exs = data.load_dataset("amc", path=_write_jsonl(tmp_path / "amc.jsonl", amc),
                          cache_dir=str(tmp_path))
  assert len(exs) == 3 * 32
  assert [e.reference for e in exs[:33]] == ["2"] * 32 + ["12"]  # 2.0 -> "2", adjacent
  assert len({e.uid for e in exs}) == len(exs)
  assert [e.metadata["replica"] for e in exs[:32]] == list(range(32))
  aime = [{"id": 60 + i, "problem": f"AIME {y} {i}", "solution": "s", "answer": str(i),
           "url": f"https://artofproblemsolving.com/wiki/index.php/{y}_AIME_I_Problems/Problem_{i}"}
          for y in (2022, 2023, 2024) for i in range(2)]
  path = _write_jsonl(tmp_path / "aime.jsonl", aime)
  exs = data.load_dataset("aime", path=path, cache_dir=str(tmp_path))
  assert len(exs) == 2 * 32 and all("2024" in e.prompt for e in exs)
  assert len(data.load_dataset("aime", path=path, years=None, replicas=1,
                               cache_dir=str(tmp_path))) == 6


def test_a_row_without_answer_names_set_file_and_line(tmp_path):
  """The row's line of the file, as an editor shows it (a CSV's header counted): "row 7",
  counted from 0, was line 9 of the CSV."""
  from mr_rl import errors
  rows = [{"problem": f"What is {i}?", "solution": "s", "answer": None if i == 3 else str(i),
           "subject": "Algebra", "level": 1, "unique_id": f"test/algebra/{i}.json"}
          for i in range(5)]
  path = _write_jsonl(tmp_path / "m.jsonl", rows)
  with pytest.raises(errors.DataError, match=rf"^data set 'math500', line 4 of file '{path}': "
                                             r"answer is None$"):
    data.load_dataset("math500", path=path, cache_dir=str(tmp_path))
  amc = [{"id": i, "problem": f"AMC {i}", "answer": float("nan") if i == 1 else 2.0}
         for i in range(3)]
  path = _write_jsonl(tmp_path / "amc.jsonl", amc)
  with pytest.raises(errors.DataError, match=rf"^data set 'amc', line 2 of file '{path}': "
                                             r"answer nan is not finite$"):
    data.load_dataset("amc", path=path, cache_dir=str(tmp_path))
  import csv
  path = str(tmp_path / "m.csv")
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows({**r, "answer": "" if i == 7 else str(i)} for i, r in
                enumerate(rows + [dict(rows[0], unique_id=f"u{i}") for i in range(5)]))
  with pytest.raises(errors.DataError, match=rf"^data set 'math500', line 9 of file '{path}': "
                                             r"answer is None$"):
    data.load_dataset("math500", path=path, cache_dir=str(tmp_path))


# ------------------------------------------------------------------ unreadable local files
@pytest.mark.parametrize("content, needle", [
    ("", r"data file '{path}' is empty"),
    ("\n  \n", r"data file '{path}' is empty"),
    ('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n{"problem": "c"}\n',
     r"data file '{path}' could not be read: line 2 is not valid JSON \(column \d+: "),
])
def test_an_unreadable_jsonl_file_is_named_with_its_line(tmp_path, content, needle):
  path = tmp_path / "bad.jsonl"
  path.write_text(content)
  with pytest.raises(ValueError, match=needle.format(path=path)):
    data.load_dataset("math500", path=str(path), cache_dir=str(tmp_path))


def test_an_invalid_json_array_file_is_named_with_its_line(tmp_path):
  path = tmp_path / "bad.json"
  path.write_text('[{"problem": "a"},\n {"problem": "b"\n]')
  with pytest.raises(ValueError, match=rf"data file '{path}' could not be read: invalid JSON at "
                                       r"line 3, column 1"):
    data.load_dataset("math500", path=str(path), cache_dir=str(tmp_path))


# ------------------------------------------------------------------------- DeepCoder

PI_STDIO = [{"type": "stdin_stdout", "input": "1 2\n", "output": "3\n"},
            {"type": "stdin_stdout", "input": "5 5\n", "output": "10\n"}]
PI_CALL = [{"type": "function_call", "fn_name": "add", "input": [1, 2], "output": [3]}]
TACO_STDIO = {"inputs": ["3\n", "4\n"], "outputs": ["9\n", "16\n"]}
TACO_CALL = {"fn_name": "square", "inputs": [[3], [4]], "outputs": [[9], [16]]}
LCB_STDIN = [{"input": "2\n", "output": "4\n", "testtype": "stdin"}]
LCB_FUNC = [{"input": "[1, 2, 3]\n2", "output": "5", "testtype": "functional"}]


def test_parse_tests_all_shapes():
  t = data.parse_tests(json.dumps(PI_STDIO))
  assert (t.kind, t.inputs, t.outputs) == ("stdio", ("1 2\n", "5 5\n"), ("3\n", "10\n"))
  assert t.pairs == (("1 2\n", "3\n"), ("5 5\n", "10\n"))
  t = data.parse_tests(json.dumps(PI_CALL))
  assert (t.kind, t.fn_name, t.inputs, t.outputs, t.list_wrapped) == (
      "call", "add", ((1, 2),), ([3],), True)
  t = data.parse_tests(json.dumps(TACO_STDIO))
  assert t.kind == "stdio" and len(t) == 2
  t = data.parse_tests(json.dumps(TACO_CALL))
  assert (t.kind, t.fn_name, t.inputs) == ("call", "square", ((3,), (4,)))
  t = data.parse_tests(json.dumps(LCB_STDIN))
  assert t.kind == "stdio" and t.inputs == ("2\n",)
  t = data.parse_tests(json.dumps(LCB_FUNC), {"func_name": "maxSum"})
  assert (t.kind, t.fn_name, t.inputs, t.outputs, t.list_wrapped) == (
      "call", "maxSum", (([1, 2, 3], 2),), (5,), False)
  assert json.loads(json.dumps(t.to_dict()))["inputs"] == [[[1, 2, 3], 2]]


@pytest.mark.parametrize("bad,match", [
    ("{not json", "valid JSON"), ("[]", "non-empty"),
    (json.dumps(PI_STDIO + PI_CALL), "mixed"), (json.dumps(LCB_FUNC), "function name"),
    (json.dumps([{"type": "weird", "input": "", "output": ""}]), "unknown test type")])
def test_parse_tests_errors(bad, match):
  with pytest.raises(ValueError, match=match):
    data.parse_tests(bad)


def test_deepcoder_loader(tmp_path):
  rows = [{"problem": "Add two numbers.", "tests": json.dumps(PI_STDIO), "metadata": "{}"},
          {"problem": "Square.", "tests": json.dumps(TACO_STDIO), "metadata": "{}"},
          {"problem": "Add fn.", "tests": json.dumps(PI_CALL), "metadata": "{}"},
          {"problem": "Max sum.", "tests": json.dumps(LCB_FUNC),
           "metadata": json.dumps({"func_name": "maxSum"})},
          {"problem": "Add two   numbers.", "tests": json.dumps(PI_STDIO), "metadata": "{}"}]
  path = _write_jsonl(tmp_path / "dc.jsonl", rows)
  stdio = data.load_dataset("deepcoder", path=path, cache_dir=str(tmp_path))
  assert [e.prompt for e in stdio] == ["Add two numbers.", "Square."]
  assert isinstance(stdio[0].metadata["tests"], data.CodeTestSpec)
  both = data.load_dataset("deepcoder", path=path, kinds=("stdio", "call"),
                           cache_dir=str(tmp_path))
  assert len(both) == 4 and both[3].metadata["tests"].fn_name == "maxSum"
  capped = data.load_dataset("deepcoder", path=path, kinds=("stdio", "call"), max_tests=1,
                             cache_dir=str(tmp_path))
  assert {e.prompt for e in capped} == {"Add fn.", "Max sum."}
  with pytest.raises(ValueError, match="no split"):
    data.load_dataset("deepcoder", split="test", subsets=("taco",))


# ------------------------------------------------------------------------ HelpSteer2

def test_helpsteer2_unique_prompts_and_turns(tmp_path):
  multi = "Hi there\n<extra_id_1>Assistant\nHello! How can I help?\n<extra_id_1>User\nTell a joke"
  rows = []
  for p, k in (("Explain RL.", 2), (multi, 3), ("Write a haiku.", 1)):
    for j in range(k):
      rows.append({"prompt": p, "response": f"r{j}", "helpfulness": j, "correctness": 3,
                   "coherence": 4, "complexity": 1, "verbosity": 2})
  exs = data.load_dataset("helpsteer2", path=_write_jsonl(tmp_path / "hs.jsonl", rows),
                          cache_dir=str(tmp_path))
  assert [len(e.metadata["ratings"]) for e in exs] == [2, 3, 1]
  assert exs[1].messages == (
      {"role": "user", "content": "Hi there"},
      {"role": "assistant", "content": "Hello! How can I help?"},
      {"role": "user", "content": "Tell a joke"})
  assert exs[1].metadata["ratings"][2]["helpfulness"] == 2.0
  with pytest.raises(ValueError, match="end with a user turn"):
    helpsteer.split_turns("Hi\n<extra_id_1>Assistant\nHello")


# ----------------------------------------------------------------------------- ALCE

def _asqa_records(n):
  return [{"question": f"Who won match {i}?", "answer": f"Team {i} won match {i}.",
           "sample_id": f"-{1000 + i}",
           "qa_pairs": [{"context": "No context available.", "question": f"Who won {i}?",
                         "short_answers": [f"Team {i}", f"T{i}"], "wikipage": None}],
           "wikipages": [], "annotations": [],
           "docs": [{"id": str(k), "title": f"Doc {i}.{k}", "text": f"Text {i}.{k}",
                     "score": 1.0 - k / 10} for k in range(5)]}
          for i in range(n)]


def _eli5_records(n):
  return [{"question": f"Why does thing {i} happen?", "question_ctx": "", "answer": "Because.",
           "claims": [f"Claim {i}a.", f"Claim {i}b.", f"Claim {i}c."],
           "docs": [{"title": f"T{k}", "text": f"Passage {k}"} for k in range(4)]}
          for i in range(n)]


@pytest.mark.parametrize("task,n,n_train", [("asqa", 948, 758), ("eli5", 1000, 800)])
def test_alce_split_sizes_match_amrp(tmp_path, task, n, n_train):
  recs = _asqa_records(n) if task == "asqa" else _eli5_records(n)
  (tmp_path / alce_data.ALCE_FILES[task]).write_text(json.dumps(recs))
  train = data.load_dataset(f"alce_{task}", path=str(tmp_path))  # directory holding the file
  test = data.load_dataset(f"alce_{task}", path=str(tmp_path), split="test")
  assert (len(train), len(test)) == (n_train, n - n_train)
  assert not {e.uid for e in train} & {e.uid for e in test}
  again = data.load_dataset(f"alce_{task}", path=str(tmp_path), split="test")
  assert [e.uid for e in again] == [e.uid for e in test]


def test_alce_prompt_and_metadata(tmp_path):
  f = tmp_path / "asqa_eval_gtr_top100.json"
  f.write_text(json.dumps(_asqa_records(10)))
  exs = data.load_dataset("alce_asqa", path=str(f), split="train")
  ex = next(e for e in exs if e.uid == "alce_asqa/-1003")
  assert [d["title"] for d in ex.metadata["docs"]] == ["Doc 3.0", "Doc 3.1", "Doc 3.2"]
  assert ex.metadata["qa_pairs"][0]["short_answers"] == ("Team 3", "T3")
  p = ex.prompt
  assert p.count("Question:") == 2  # one demonstration + the query
  assert "Document [1](Title: Doc 3.0): Text 3.0" in p and "Doc 3.3" not in p
  assert p.endswith("Document [3](Title: Doc 3.2): Text 3.2\n\nAnswer:")
  assert "[1][2]" in p  # the demonstration answer cites
  # An ALCE prompt file (real schema) replaces instruction and demonstration.
  spec = {"instruction": "INSTR", "demo_sep": "\n###\n", "doc_prompt": "<{ID}|{T}|{P}>\n",
          "demo_prompt": "{INST}\nQ: {Q}\n{D}A: {A}",
          "demos": [{"question": "DQ", "answer": "DA [1].",
                     "docs": [{"title": "a", "text": "b"}] * 3}]}
  (tmp_path / "prompt.json").write_text(json.dumps(spec))
  ex2 = data.load_dataset("alce_asqa", path=str(f), prompt_file=str(tmp_path / "prompt.json"))
  assert ex2[0].prompt.startswith("INSTR\nQ: DQ\n<1|a|b>\n<2|a|b>\n<3|a|b>\nA: DA [1].\n###\n")
  eli = tmp_path / "eli5_eval_bm25_top100.json"
  eli.write_text(json.dumps(_eli5_records(5)))
  e5 = data.load_dataset("alce_eli5", path=str(eli), split="test")
  assert e5[0].metadata["claims"][0].startswith("Claim") and len(e5[0].metadata["docs"]) == 3


# ----------------------------------------------------------------- registry / errors

def test_registry_errors(tmp_path):
  with pytest.raises(ValueError, match=r"^unknown data set 'gsm8k'; valid: aime, alce_asqa, "):
    data.load_dataset("gsm8k")
  with pytest.raises(ValueError, match=r"unknown option\(s\) \['threshold'\]"):
    data.load_dataset("math500", threshold=3)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    data.load_dataset("math500", path=str(tmp_path / "nope.jsonl"))
  with pytest.raises(FileNotFoundError, match="neither"):
    data.load_dataset("alce_asqa", path=str(tmp_path))
  assert data.hub_id("alce_eli5") == "princeton-nlp/ALCE-data"


def test_missing_dataset_names_hub_id_and_path_option(tmp_path, monkeypatch):
  import huggingface_hub.constants  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  with pytest.raises(data.DatasetUnavailableError) as e:
    data.load_dataset("math500", cache_dir=str(tmp_path))
  msg = str(e.value)
  assert "HuggingFaceH4/MATH-500" in msg and "path=" in msg and "Offline mode" in msg
  with pytest.raises(data.DatasetUnavailableError, match="princeton-nlp/ALCE-data"):
    data.load_dataset("alce_eli5", cache_dir=str(tmp_path))
  with pytest.raises(data.DatasetUnavailableError, match="DeepCoder-Preview-Dataset"):
    data.load_dataset("deepcoder", cache_dir=str(tmp_path), subsets=("lcbv5",))


def test_saved_dataset_dir(tmp_path):
  rows = [{"prompt": "Q?", "response": "A", "helpfulness": 1, "correctness": 1,
           "coherence": 1, "complexity": 1, "verbosity": 1}]
  dd = datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})
  dd.save_to_disk(str(tmp_path / "hs"))
  exs = data.load_dataset("helpsteer2", path=str(tmp_path / "hs"), split="validation")
  assert exs[0].prompt == "Q?"
  with pytest.raises(ValueError, match="split 'train' not in"):
    data.load_dataset("helpsteer2", path=str(tmp_path / "hs"))
