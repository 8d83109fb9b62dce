"""A few records of each data set in its hub schema, so the real loaders parse them."""

from __future__ import annotations

import json
import os
import tempfile

from mr_rl.tiny_assets.assets import asset_dir

# (problem, short solution, answer): a few with negative answers for TAG's negative channel.
MATH_PROBLEMS = [
    ("What is 7 + 5?", "Adding gives 12.", "12"),
    ("Compute 3 - 10.", "Subtracting gives -7.", "-7"),
    ("What is 6 times 4?", "Multiplying gives 24.", "24"),
    ("Solve 2x + 6 = 0 for x.", "Then 2x = -6, so x = -3.", "-3"),
    ("What is the square root of 81?", "Since 9^2 = 81, it is 9.", "9"),
    ("Compute \\frac{3}{4} + \\frac{1}{4}.", "The sum is \\frac{4}{4} = 1.", "1"),
    ("What is 15 divided by 3?", "Dividing gives 5.", "5"),
    ("Evaluate -2 \\cdot 8.", "The product is -16.", "-16"),
    ("What is 2^5?", "Doubling five times gives 32.", "32"),
    ("Find x if x - 4 = -9.", "Adding 4 gives x = -5.", "-5"),
    ("What is 100 - 37?", "Subtracting gives 63.", "63"),
    ("How many sides does a hexagon have?", "A hexagon has 6 sides.", "6"),
]
ALCE_QUESTIONS = [  # (question, long answer, docs, short answers / claims)
    ("Who painted the Mona Lisa?", "The Mona Lisa was painted by Leonardo da Vinci [1].",
     [("Mona Lisa", "The Mona Lisa is a portrait painted by Leonardo da Vinci."),
      ("Louvre", "The Louvre in Paris displays the Mona Lisa."),
      ("Renaissance", "The Renaissance was a period of European art.")],
     ["Leonardo da Vinci"]),
    ("When did the Apollo 11 landing happen?", "Apollo 11 landed on the Moon in July 1969 [1].",
     [("Apollo 11", "Apollo 11 landed on the Moon on 20 July 1969."),
      ("NASA", "NASA ran the Apollo program."),
      ("Moon", "The Moon orbits the Earth.")],
     ["20 July 1969", "July 1969"]),
    ("What is the capital of Australia?", "The capital of Australia is Canberra [1].",
     [("Canberra", "Canberra is the capital city of Australia."),
      ("Sydney", "Sydney is the largest city in Australia."),
      ("Australia", "Australia is a country in Oceania.")],
     ["Canberra"]),
    ("Who wrote Pride and Prejudice?", "Pride and Prejudice was written by Jane Austen [1].",
     [("Pride and Prejudice", "Pride and Prejudice is an 1813 novel by Jane Austen."),
      ("Jane Austen", "Jane Austen was an English novelist."),
      ("Novel", "A novel is a long work of fiction.")],
     ["Jane Austen"]),
    ("What gas do plants absorb?", "Plants absorb carbon dioxide from the air [1].",
     [("Photosynthesis", "Plants absorb carbon dioxide and release oxygen."),
      ("Oxygen", "Oxygen is produced during photosynthesis."),
      ("Leaf", "Leaves contain chlorophyll.")],
     ["carbon dioxide"]),
]
CODE_PROBLEMS = [  # (problem, solution, [(stdin, stdout)])
    ("Read two integers and print their sum.", "a, b = map(int, input().split())\nprint(a + b)",
     [("1 2\n", "3\n"), ("5 7\n", "12\n")]),
    ("Read a string and print it reversed.", "print(input()[::-1])",
     [("abc\n", "cba\n"), ("hello\n", "olleh\n")]),
    ("Read n and print n squared.", "n = int(input())\nprint(n * n)",
     [("3\n", "9\n"), ("10\n", "100\n")]),
    ("Read a line of integers and print the maximum.", "print(max(map(int, input().split())))",
     [("1 5 2\n", "5\n"), ("-3 -1\n", "-1\n")]),
]
HELPSTEER_PAIRS = [  # (prompt, response)
    ("Give me three tips for better sleep.", "Keep a regular schedule, avoid screens late, and "
     "keep the room cool."),
    ("Explain what a prime number is.", "A prime number has exactly two divisors: 1 and itself."),
    ("Write a haiku about rain.", "Soft rain on the roof / the garden drinks in silence / "
     "puddles hold the sky"),
    ("What is the boiling point of water?\n<extra_id_1>Assistant\n100 degrees Celsius at sea "
     "level.\n<extra_id_1>User\nAnd in Fahrenheit?", "212 degrees Fahrenheit."),
]


def _math_rows(name: str) -> list[dict]:
  rows = []
  for i, (p, s, a) in enumerate(MATH_PROBLEMS):
    if name in ("big_math_hard", "big_math_llama_calibrated"):
      # Solve rates in both subsets' bands ([0, 0.2] hard, [0.3, 0.7] Llama-calibrated).
      rows.append(dict(problem=p, answer=a, source="tiny", domain=["Arithmetic"],
                       llama8b_solve_rate=[0.05, 0.5][i % 2]))
    elif name == "numina_math":
      rows.append(dict(problem=p, solution=s, answer=a, problem_type="Algebra",
                       question_type="math-word-problem", source="tiny", synthetic=False,
                       problem_is_valid="Yes", solution_is_valid="Yes"))
    elif name == "math500":
      rows.append(dict(problem=p, solution=s, answer=a, subject="Prealgebra", level=1,
                       unique_id=f"test/tiny/{i}.json"))
    elif name == "amc":
      rows.append(dict(id=i, problem=p, answer=float(a), url=f"https://aops.test/2023_AMC_{i}"))
    elif name == "aime":
      rows.append(dict(id=i, problem=p, solution=s, answer=a,
                       url=f"https://aops.test/wiki/2024_AIME_I_Problems/Problem_{i}"))
  return rows




def make_tiny_data(name: str, directory: str) -> str:
  """Writes a few records of data set `name` in its hub schema; returns the `path=` to pass.

  Files: `<name>.jsonl` (math, DeepCoder, HelpSteer2) or `<asqa|eli5>_eval_gtr/bm25_top100.json`
  (ALCE). A single file serves every split (the loaders take its rows as the requested split;
  Big-Math and ALCE cut their own train/test split). Use small loader options with them
  (e.g. Big-Math `test_size=4`), see `RUNLOCAL_DATA_OPTIONS`.
  """
  from mr_rl import data
  data.DATASETS.get(name)  # an unknown name fails here, listing the valid ones
  directory = os.path.abspath(os.path.expanduser(directory))
  os.makedirs(directory, exist_ok=True)
  if name.startswith("alce_"):
    task = name[len("alce_"):]
    from mr_rl.data import alce as alce_data
    path = os.path.join(directory, alce_data.ALCE_FILES[task])
    records = []
    for k in range(4):  # 20 records -> 16 train / 4 test under the 80/20 split
      for j, (q, ans, docs, extra) in enumerate(ALCE_QUESTIONS):
        q_k = q if k == 0 else f"{q} (variant {k})"
        rec = dict(question=q_k, answer=ans, sample_id=f"tiny-{task}-{k}-{j}",
                   docs=[dict(title=t, text=x, score=1.0) for t, x in docs])
        if task == "asqa":
          rec["qa_pairs"] = [dict(question=q_k, short_answers=list(extra), wikipage=None)]
        else:
          rec["claims"] = [ans.split(" [")[0] + ".", docs[0][1], docs[1][1]]
        records.append(rec)
    payload = json.dumps(records, indent=1)
  else:
    path = os.path.join(directory, f"{name}.jsonl")
    if name == "deepcoder":
      rows = [dict(problem=p, tests=json.dumps([dict(type="stdin_stdout", input=i, output=o)
                                                for i, o in tests]),
                   starter_code="", metadata=json.dumps({}))
              for p, _, tests in CODE_PROBLEMS]
    elif name == "helpsteer2":
      rows = [dict(prompt=p, response=r, helpfulness=3, correctness=3, coherence=4, complexity=1,
                   verbosity=1) for p, r in HELPSTEER_PAIRS]
    else:
      rows = _math_rows(name)
    payload = "".join(json.dumps(r) + "\n" for r in rows)
  # Write-then-rename so a concurrent reader never sees a partial file.
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(payload)
  os.replace(tmp, path)
  return path


# Loader options that make the tiny files usable (merged into config.data.options by runlocal).
RUNLOCAL_DATA_OPTIONS = {
    "big_math_hard": {"test_size": 2},
    "big_math_llama_calibrated": {"test_size": 2},
    "numina_math": {"num_examples": 8},
    "deepcoder": {},
}


def runlocal_data(name: str, root: str | None = None) -> str:
  """The tiny local file for data set `name` under the runlocal cache (written if missing)."""
  path = runlocal_data_path(name, root)
  return path if os.path.exists(path) else make_tiny_data(name, os.path.dirname(path))


def runlocal_data_path(name: str, root: str | None = None) -> str:
  """Where `runlocal_data(name, root)` puts its file; writes nothing."""
  from mr_rl.data import alce as alce_data
  fname = (alce_data.ALCE_FILES[name[len("alce_"):]] if name.startswith("alce_")
           else f"{name}.jsonl")
  return os.path.join(asset_dir(root), "data", fname)
