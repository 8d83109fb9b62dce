"""Tiny local checkpoints and data files, so every paper config runs on a CPU (`runlocal`).

    from mr_rl import tiny
    path = tiny.make_tiny_checkpoint("/tmp/tiny/qwen3", family="qwen3")   # 'llama', 'qwen3_moe'
    data = tiny.make_tiny_data("numina_math", "/tmp/tiny/data")           # -> path= for loaders
    rm = tiny.make_tiny_reward_model("/tmp/tiny/rm")                      # ArmoRM stand-in
    # runlocal uses the cached versions under $MR_RL_CACHE (default ~/.cache/mr_rl):
    tiny.tiny_checkpoint_for("Qwen3-4B-Instruct-2507", "qwen3"); tiny.runlocal_data("alce_asqa")

`make_tiny_checkpoint` writes a randomly initialised decoder (`mr_rl.models.save_pretrained`:
safetensors + config.json, loadable by transformers) and a real byte-level BPE tokenizer
trained with the `tokenizers` library on a small built-in corpus (the papers' prompt
instructions plus the tiny data below), saved as a transformers fast tokenizer with a chat
template (ChatML for the Qwen families, Llama-3 headers for Llama), pad/eos (and bos for
Llama) set. `make_tiny_data` writes a few records of each data set in its hub schema (the
columns the loaders in `mr_rl.data` read), so `load_dataset(name, path=...)` runs the same
parsing, filtering and splitting code as on the real data. `make_tiny_reward_model` adds a
3-objective `score` head (LlamaForSequenceClassification layout) to a tiny Llama.

All are idempotent: a finished directory is reused (a `.done` marker written before an atomic
rename of a private build directory, so concurrent builders never see a partial one). The
cache directory name carries a hash of this file, so editing it invalidates old assets.
Weights are drawn with numpy from fixed seeds (no compile); equal arguments give equal model
configurations, so the trainer's compiled functions, cached per model, are shared by every
config's `runlocal` run in one process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from typing import Callable

import numpy as np

FAMILIES = ("qwen3", "llama", "qwen3_moe")
VERSION = "v1"  # bump when the files written here change (cache directories are keyed on it)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                  "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# family -> (bos, eos, pad) special tokens, as in the real tokenizers.
_FAMILY_TOKENS = {
    "qwen3": (None, "<|im_end|>", "<|endoftext|>"),
    "qwen3_moe": (None, "<|im_end|>", "<|endoftext|>"),
    "llama": ("<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"),
}
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content']"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")


def cache_root() -> str:
  """`$MR_RL_CACHE` or `~/.cache/mr_rl` (the runlocal assets live under `asset_dir()`)."""
  return os.path.expanduser(os.environ.get("MR_RL_CACHE") or os.path.join("~", ".cache", "mr_rl"))


def asset_dir(root: str | None = None) -> str:
  """`<root>/tiny-<VERSION>-<hash of this file>`: any change here invalidates cached assets."""
  with open(__file__, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:10]
  return os.path.join(root or cache_root(), f"tiny-{VERSION}-{digest}")


def _build_once(directory: str, build: Callable[[str], None]) -> str:
  """Runs `build(tmp)` in a private directory and renames it to `directory` (idempotent)."""
  directory = os.path.abspath(os.path.expanduser(directory))
  if os.path.exists(os.path.join(directory, ".done")):
    return directory
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".build-", dir=parent)
  try:
    build(tmp)
    with open(os.path.join(tmp, ".done"), "w") as f:
      f.write(VERSION)
    try:
      os.rename(tmp, directory)
    except OSError:
      if not os.path.exists(os.path.join(directory, ".done")):
        raise FileExistsError(f"{directory} exists but is not a finished tiny asset directory; "
                              "remove it and retry")
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  return directory


# ----------------------------------------------------------------------------- tokenizer
def corpus() -> list[str]:
  """The built-in tokenizer training corpus: prompt instructions + every tiny record's text."""
  from mr_rl.data import alce, templates
  texts = [templates.AMRP_MATH_SYSTEM, templates.TAG_BOXED_INSTRUCTION,
           templates.TAG_CODE_INSTRUCTION, alce.INSTRUCTION]
  for demo in alce._DEMOS.values():  # pylint: disable=protected-access
    texts += [demo["question"], demo["answer"]] + [d["title"] + " " + d["text"]
                                                     for d in demo["docs"]]
  for p, s, a in _MATH:
    texts += [p, s, f"<reasoning>\n{s}\n</reasoning>\n<answer>\n{a}\n</answer>",
              f"{s} The answer is \\boxed{{{a}}}."]
  for q, ans, docs, _ in _ALCE:
    texts += [q, ans] + [t + " " + x for t, x in docs]
  for problem, solution, _ in _CODE:
    texts += [problem, f"```python\n{solution}\n```"]
  texts += [p for p, _ in _HELPSTEER]
  texts += ["User: Assistant: Document [1](Title: ): Answer: Question: " * 4,
            "0123456789 + - * / = ( ) { } [ ] < > ^ _ \\frac \\sqrt \\boxed \\cdot \\pi"]
  return texts


def make_tokenizer(directory: str, family: str = "qwen3", vocab_size: int = 2048):
  """Trains a byte-level BPE tokenizer on `corpus()` and saves it as a fast tokenizer.

  Returns:
    The transformers tokenizer (reloadable with `AutoTokenizer.from_pretrained(directory)`).
  """
  if family not in FAMILIES:
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
  if vocab_size < 256 + len(SPECIAL_TOKENS) + 8:
    raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS) + 8} (bytes + special "
                     f"tokens), got {vocab_size}")
  from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  tok = Tokenizer(tok_models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(corpus(), trainer)
  bos, eos, pad = _FAMILY_TOKENS[family]
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad,
      chat_template=LLAMA3_TEMPLATE if family == "llama" else CHATML_TEMPLATE,
      model_max_length=4096)
  fast.save_pretrained(directory)
  return fast


# ---------------------------------------------------------------------------- checkpoint
def tiny_model_config(family: str, vocab_size: int, *, d_model: int = 32, n_layers: int = 1,
                      max_seq_len: int = 4096):
  """A `ModelConfig` of the family's layout at toy size (1 layer, d=32 by default)."""
  from mr_rl import models
  if family not in FAMILIES:
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
  common = dict(family=family, vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                n_heads=2, n_kv_heads=1, head_dim=16, d_ff=2 * d_model, max_seq_len=max_seq_len)
  if family == "llama":
    from mr_rl.models.config import freeze_rope_scaling
    return models.ModelConfig(
        rope_theta=500_000.0, norm_eps=1e-5, qk_norm=False, tie_embeddings=False,
        rope_scaling=freeze_rope_scaling(dict(rope_type="llama3", factor=8.0,
                                              low_freq_factor=1.0, high_freq_factor=4.0,
                                              original_max_position_embeddings=256)),
        **common)
  if family == "qwen3_moe":
    return models.ModelConfig(rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=False,
                              num_experts=4, num_experts_per_tok=2, moe_d_ff=d_model,
                              norm_topk_prob=True, **common)
  return models.ModelConfig(rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True, **common)


def numpy_init(model, seed: int = 0, std: float = 0.02):
  """Random params without compiling anything: N(0, std) weights, RMSNorm scales 1.

  Shapes come from `jax.eval_shape` (`models.abstract_params`); drawing them with numpy
  avoids a jitted `model.init`, which costs seconds of compile time per family on a CPU.
  """
  import jax
  from mr_rl import models
  rng = np.random.default_rng(seed)
  shapes = models.abstract_params(model)

  def draw(path, x):
    if jax.tree_util.keystr(path).endswith("['scale']"):
      return np.ones(x.shape, np.float32)
    return (std * rng.standard_normal(x.shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def make_tiny_checkpoint(directory: str, family: str = "qwen3", *, d_model: int = 32,
                         n_layers: int = 1, vocab_size: int = 2048, seed: int = 0) -> str:
  """Writes a tiny random `family` checkpoint with its tokenizer to `directory` (idempotent).

  Args:
    directory: output directory (reused if it already holds a finished checkpoint).
    family: 'qwen3' | 'llama' | 'qwen3_moe'.
    d_model, n_layers: model size (defaults: 1 layer, d=32).
    vocab_size: BPE vocabulary cap; the built-in corpus yields ~1,300 tokens, enough for
      whole-word tokens of the prompt instructions (the tiny ALCE prompts stay under 512).
      The model's vocabulary is the tokenizer's actual size.
    seed: initialisation seed.

  Returns:
    The absolute directory path.
  """
  if family not in FAMILIES:
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")

  def build(tmp):
    from mr_rl import models
    tokenizer = make_tokenizer(tmp, family, vocab_size)
    cfg = tiny_model_config(family, len(tokenizer), d_model=d_model, n_layers=n_layers)
    model = models.Transformer(cfg)
    models.save_pretrained(model, numpy_init(model, seed), tmp)
    with open(os.path.join(tmp, "config.json")) as f:
      hf = json.load(f)
    for name in ("bos", "eos", "pad"):
      hf[f"{name}_token_id"] = getattr(tokenizer, f"{name}_token_id")
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2)

  return _build_once(directory, build)


def tiny_checkpoint_for(model_name: str, family: str, root: str | None = None) -> str:
  """A tiny `family` checkpoint in a directory named `model_name` (e.g. 'Qwen3-4B-Instruct-2507').

  The trainer picks the prompt template style from the checkpoint directory's name
  (`mr_rl.data.style_for_model`), so the stand-in carries the name of the model it replaces.
  All names of one family get byte-identical copies of one checkpoint.
  """
  root = asset_dir(root)
  source = make_tiny_checkpoint(os.path.join(root, "families", family), family)
  return _build_once(os.path.join(root, "models", family, model_name),
                     lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))


REWARD_OBJECTIVES = ("helpsteer-helpfulness", "helpsteer-correctness", "helpsteer-coherence")


def make_tiny_reward_model(directory: str, *, seed: int = 1) -> str:
  """A tiny Llama reward model with a 3-objective `score` head (LlamaForSequenceClassification
  layout, objectives = ArmoRM's HelpSteer heads 0-2), loadable by
  `mr_rl.rewards.reward_model` and transformers; idempotent."""

  def build(tmp):
    from safetensors.numpy import load_file, save_file
    src = make_tiny_checkpoint(os.path.join(os.path.dirname(os.path.abspath(directory)),
                                            ".rm-backbone"), "llama", seed=seed)
    shutil.copytree(src, tmp, dirs_exist_ok=True)
    os.remove(os.path.join(tmp, ".done"))
    with open(os.path.join(tmp, "config.json")) as f:
      hf = json.load(f)
    tensors = load_file(os.path.join(tmp, "model.safetensors"))
    rng = np.random.default_rng(seed)
    tensors["score.weight"] = rng.standard_normal(
        (len(REWARD_OBJECTIVES), hf["hidden_size"])).astype(np.float32)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    hf.update(architectures=["LlamaForSequenceClassification"],
              id2label={str(i): n for i, n in enumerate(REWARD_OBJECTIVES)},
              label2id={n: i for i, n in enumerate(REWARD_OBJECTIVES)})
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2)

  return _build_once(directory, build)


def tiny_reward_model(root: str | None = None) -> str:
  """The runlocal stand-in for ArmoRM-Llama3-8B-v0.1 (written on first use)."""
  return make_tiny_reward_model(os.path.join(asset_dir(root), "reward_model"))


# ---------------------------------------------------------------------------------- data
# (problem, short solution, answer): a few with negative answers for TAG's negative channel.
_MATH = [
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
_ALCE = [  # (question, long answer, docs, short answers / claims)
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
_CODE = [  # (problem, solution, [(stdin, stdout)])
    ("Read two integers and print their sum.", "a, b = map(int, input().split())\nprint(a + b)",
     [("1 2\n", "3\n"), ("5 7\n", "12\n")]),
    ("Read a string and print it reversed.", "print(input()[::-1])",
     [("abc\n", "cba\n"), ("hello\n", "olleh\n")]),
    ("Read n and print n squared.", "n = int(input())\nprint(n * n)",
     [("3\n", "9\n"), ("10\n", "100\n")]),
    ("Read a line of integers and print the maximum.", "print(max(map(int, input().split())))",
     [("1 5 2\n", "5\n"), ("-3 -1\n", "-1\n")]),
]
_HELPSTEER = [  # (prompt, response)
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
  for i, (p, s, a) in enumerate(_MATH):
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


def _write_jsonl(path: str, rows: list[dict]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


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
      for j, (q, ans, docs, extra) in enumerate(_ALCE):
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
              for p, _, tests in _CODE]
    elif name == "helpsteer2":
      rows = [dict(prompt=p, response=r, helpfulness=3, correctness=3, coherence=4, complexity=1,
                   verbosity=1) for p, r in _HELPSTEER]
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
  root = os.path.join(asset_dir(root), "data")
  from mr_rl.data import alce as alce_data
  fname = (alce_data.ALCE_FILES[name[len("alce_"):]] if name.startswith("alce_")
           else f"{name}.jsonl")
  path = os.path.join(root, fname)
  return path if os.path.exists(path) else make_tiny_data(name, root)
