"""DeepCoder-Preview data (TAG code synthesis, "DeepCoder-RT") and its test specs.

Hub: agentica-org/DeepCoder-Preview-Dataset, configurations `primeintellect`, `taco`,
`lcbv5` (train) and `lcbv5`, `codeforces` (test). Each row has `problem` (statement)
and `tests`, a JSON string whose shape depends on the source:
  * primeintellect / codeforces: list of `{"type": "stdin_stdout", "input", "output"}`
    or `{"type": "function_call", "fn_name", "input": [args], "output": [value]}`;
  * taco: `{"inputs": [...], "outputs": [...]}` plus `"fn_name"` for call-based tests;
  * lcbv5: list of `{"testtype": "stdin" | "functional", "input", "output"}`, the
    function name in the row's `metadata["func_name"]`; functional inputs hold one JSON
    value per line (one per argument) and the output one JSON value.
`parse_tests` turns all of them into one `CodeTestSpec` record for the sandbox.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mr_rl.data import sources
from mr_rl.data.example import Example

DEEPCODER_HUB = "agentica-org/DeepCoder-Preview-Dataset"
DEEPCODER_SPLITS = {"primeintellect": ("train",), "taco": ("train",),
                    "lcbv5": ("train", "test"), "codeforces": ("test",)}


@dataclasses.dataclass(frozen=True)
class CodeTestSpec:
  """Tests of one problem, normalised.

  Attributes:
    kind: "stdio" (feed `inputs[i]` on stdin, compare stdout with `outputs[i]`) or
      "call" (call `fn_name(*inputs[i])`, compare the return value with `outputs[i]`).
    inputs: stdin strings, or tuples of JSON-decoded arguments.
    outputs: expected stdout strings, or JSON-decoded expected return values.
    fn_name: function (or `Solution` method) name for call tests, else None.
    list_wrapped: call tests in the APPS convention (taco, primeintellect), where the
      expected value may be wrapped in a one-element list: a checker should accept a
      return value `v` when `v == outputs[i]` or `outputs[i] == [v]` (as APPS does).

  For `mr_rl.rewards.sandbox.CodeTests` use `CodeTests.stdio(spec.pairs)` or
  `CodeTests.call(spec.fn_name, spec.inputs, spec.outputs)` (the latter compares
  exactly, so list-wrapped outputs need the APPS rule above).
  """

  kind: str
  inputs: tuple[Any, ...]
  outputs: tuple[Any, ...]
  fn_name: str | None = None
  list_wrapped: bool = False

  def __post_init__(self):
    if self.kind not in ("stdio", "call"):
      raise ValueError(f"kind must be 'stdio' or 'call', got {self.kind!r}")
    if len(self.inputs) != len(self.outputs):
      raise ValueError(f"{len(self.inputs)} inputs but {len(self.outputs)} outputs")
    if self.kind == "call" and not self.fn_name:
      raise ValueError("call tests need fn_name")
    if self.kind == "stdio" and not all(
        isinstance(x, str) for x in self.inputs + self.outputs):
      raise ValueError("stdio test inputs and outputs must be strings")

  @property
  def pairs(self) -> tuple[tuple[str, str], ...]:
    """`(stdin, expected_stdout)` pairs of stdio tests."""
    if self.kind != "stdio":
      raise ValueError("pairs exist only for stdio tests")
    return tuple(zip(self.inputs, self.outputs))

  def __len__(self) -> int:
    return len(self.inputs)

  def to_dict(self) -> dict[str, Any]:
    return {"kind": self.kind, "inputs": [list(x) if isinstance(x, tuple) else x
                                          for x in self.inputs],
            "outputs": list(self.outputs), "fn_name": self.fn_name,
            "list_wrapped": self.list_wrapped}


def _as_text(x: Any) -> str:
  if isinstance(x, str):
    return x
  if isinstance(x, list) and all(isinstance(s, str) for s in x):
    return "\n".join(x)  # Some stdio tests store the lines as a list.
  raise ValueError(f"stdio test value must be a string, got {type(x).__name__}")


def _json_lines(text: str) -> tuple[Any, ...]:
  return tuple(json.loads(line) for line in text.split("\n") if line.strip())


def parse_tests(tests: str | list | dict, metadata: Any = None) -> CodeTestSpec:
  """Parses a DeepCoder `tests` field (JSON string or decoded) into `CodeTestSpec`.

  Args:
    tests: the row's `tests` value.
    metadata: the row's `metadata` (dict or JSON string); lcbv5 keeps `func_name` there.

  Raises:
    ValueError: unknown shape, mixed stdio/call tests, no tests, or missing fn_name.
  """
  if isinstance(tests, str):
    try:
      tests = json.loads(tests)
    except json.JSONDecodeError as e:
      raise ValueError(f"tests is not valid JSON: {e}") from e
  if isinstance(metadata, str):
    metadata = json.loads(metadata) if metadata.strip() else {}
  metadata = metadata or {}
  if isinstance(tests, dict):  # taco
    if "inputs" not in tests or "outputs" not in tests:
      raise ValueError(f"dict tests need inputs and outputs, got keys {sorted(tests)}")
    fn = tests.get("fn_name")
    if fn:
      return CodeTestSpec("call", tuple(tuple(a) if isinstance(a, list) else (a,)
                                     for a in tests["inputs"]),
                       tuple(tests["outputs"]), fn_name=fn, list_wrapped=True)
    return CodeTestSpec("stdio", tuple(_as_text(x) for x in tests["inputs"]),
                     tuple(_as_text(x) for x in tests["outputs"]))
  if not isinstance(tests, list) or not tests:
    raise ValueError(f"tests must be a non-empty list or a dict, got {type(tests).__name__}")
  kinds, inputs, outputs, fns, wrapped = set(), [], [], set(), False
  for t in tests:
    if not isinstance(t, dict) or "input" not in t or "output" not in t:
      raise ValueError(f"each test needs input and output, got {t!r:.200}")
    ttype = t.get("type", t.get("testtype"))
    if ttype in ("stdin_stdout", "stdin"):
      kinds.add("stdio")
      inputs.append(_as_text(t["input"]))
      outputs.append(_as_text(t["output"]))
    elif ttype == "function_call":  # primeintellect: decoded args, list-wrapped output.
      kinds.add("call")
      fns.add(t.get("fn_name") or metadata.get("func_name"))
      args = t["input"]
      inputs.append(tuple(args) if isinstance(args, list) else (args,))
      outputs.append(t["output"])
      wrapped = True
    elif ttype == "functional":  # lcbv5: one JSON value per line.
      kinds.add("call")
      fns.add((t.get("metadata") or {}).get("func_name") or metadata.get("func_name"))
      inputs.append(_json_lines(t["input"]) if isinstance(t["input"], str)
                    else tuple(t["input"]))
      outputs.append(json.loads(t["output"]) if isinstance(t["output"], str) else t["output"])
    else:
      raise ValueError(f"unknown test type {ttype!r}")
  if len(kinds) != 1:
    raise ValueError(f"mixed test kinds {sorted(kinds)} in one problem")
  kind = kinds.pop()
  if kind == "call":
    fns.discard(None)
    if len(fns) != 1:
      raise ValueError(f"call tests need exactly one function name, got {sorted(fns)}")
    return CodeTestSpec("call", tuple(inputs), tuple(outputs), fn_name=fns.pop(),
                     list_wrapped=wrapped)
  return CodeTestSpec("stdio", tuple(inputs), tuple(outputs))


def load_deepcoder(*, split: str = "train", path: str | None = None,
                   cache_dir: str | None = None, subsets: tuple[str, ...] | None = None,
                   kinds: tuple[str, ...] = ("stdio",), max_tests: int | None = None,
                   max_examples: int | None = None, seed: int = 0) -> list[Example]:
  """DeepCoder problems with parsed tests (`metadata["tests"]`, a `CodeTestSpec`).

  **(project definition)** TAG's "DeepCoder-RT" has 3,741 train / 185 test problems
  but the summary does not give its filter. Here: the configurations in `subsets`
  that have `split` (default: all of them), problems whose test kind is in `kinds`
  (default stdio only, the programs whose runtime the fast / no-op rewards time),
  optionally at most `max_tests` tests, de-duplicated on the problem text; if
  `max_examples` is set, the first `max_examples` in `seed`-ed hash order.

  Args:
    split: "train" or "test".
    path: a local file or saved dataset holding the rows of one split (all subsets
      together), or a clone of the hub repository (read per subset).
    cache_dir: `datasets` cache directory.
    subsets: DeepCoder configurations to read (None: all that have `split`).
    kinds: test kinds to keep, a subset of ("stdio", "call").
    max_tests: drop problems with more tests than this (None: no limit).
    max_examples: cap on the number of problems (None: all).
    seed: hash seed for the cap.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if not kinds or not set(kinds) <= {"stdio", "call"}:
    raise ValueError(f"kinds must be a non-empty subset of ('stdio', 'call'), got {kinds!r}")
  if subsets is None:
    subsets = tuple(s for s, sp in DEEPCODER_SPLITS.items() if split in sp)
  for s in subsets:
    if s not in DEEPCODER_SPLITS:
      raise ValueError(f"unknown DeepCoder subset {s!r}; valid: {sorted(DEEPCODER_SPLITS)}")
    if split not in DEEPCODER_SPLITS[s] and path is None:
      raise ValueError(f"DeepCoder subset {s!r} has no split {split!r} "
                       f"(it has {DEEPCODER_SPLITS[s]})")
  name = "deepcoder"
  tables = []
  if path is not None and not _is_repo_clone(path):
    tables.append(("local", sources.read_rows(name, DEEPCODER_HUB, path=path, split=split,
                                              cache_dir=cache_dir)))
  else:
    for s in subsets:
      tables.append((s, sources.read_rows(name, DEEPCODER_HUB, path=path, split=split,
                                          config_name=s, cache_dir=cache_dir)))
  rows = []
  for subset, ds in tables:
    sources.require_columns(ds, ("problem", "tests"), name)
    for r in ds:
      tests = parse_tests(r["tests"], r.get("metadata"))
      if tests.kind not in kinds or (max_tests is not None and len(tests) > max_tests):
        continue
      rows.append((subset, r, tests))
  rows = sources.dedupe(rows, lambda x: " ".join(x[1]["problem"].split()))
  if max_examples is not None:
    rows = sources.hash_order(rows, lambda x: " ".join(x[1]["problem"].split()), seed)
    rows = rows[:max_examples]
  out = []
  for subset, r, tests in rows:
    extra = {"starter_code": r["starter_code"]} if r.get("starter_code") else {}
    out.append(Example.single_turn(
        f"{name}/{subset}/{sources.stable_hash(' '.join(r['problem'].split())):016x}", name,
        r["problem"], None, tests=tests, subset=subset, **extra))
  return out


def _is_repo_clone(path: str) -> bool:
  import os  # pylint: disable=g-import-not-at-top
  return os.path.isdir(path) and not any(
      os.path.exists(os.path.join(path, f))
      for f in ("dataset_info.json", "state.json", "dataset_dict.json"))
