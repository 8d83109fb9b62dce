"""A real byte-level BPE tokenizer trained on a small built-in corpus, with a chat template."""

from __future__ import annotations

from mr_rl.tiny_assets.assets import family_spec
from mr_rl.tiny_assets.datasets import ALCE_QUESTIONS, CODE_PROBLEMS, HELPSTEER_PAIRS, MATH_PROBLEMS

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                  "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


def corpus() -> list[str]:
  """The built-in tokenizer training corpus: prompt instructions + every tiny record's text."""
  from mr_rl.data import alce, templates
  texts = [templates.AMRP_MATH_SYSTEM, templates.TAG_BOXED_INSTRUCTION,
           templates.TAG_CODE_INSTRUCTION, alce.INSTRUCTION]
  for demo in alce._DEMOS.values():  # pylint: disable=protected-access
    texts += [demo["question"], demo["answer"]] + [d["title"] + " " + d["text"]
                                                     for d in demo["docs"]]
  for p, s, a in MATH_PROBLEMS:
    texts += [p, s, f"<reasoning>\n{s}\n</reasoning>\n<answer>\n{a}\n</answer>",
              f"{s} The answer is \\boxed{{{a}}}."]
  for q, ans, docs, _ in ALCE_QUESTIONS:
    texts += [q, ans] + [t + " " + x for t, x in docs]
  for problem, solution, _ in CODE_PROBLEMS:
    texts += [problem, f"```python\n{solution}\n```"]
  texts += [p for p, _ in HELPSTEER_PAIRS]
  texts += ["User: Assistant: Document [1](Title: ): Answer: Question: " * 4,
            "0123456789 + - * / = ( ) { } [ ] < > ^ _ \\frac \\sqrt \\boxed \\cdot \\pi"]
  return texts


def make_tokenizer(directory: str, family: str = "qwen3", vocab_size: int = 2048):
  """Trains a byte-level BPE tokenizer on `corpus()` and saves it as a fast tokenizer, with
  the family's special tokens and chat template (`FamilySpec.tiny_tokens`,
  `tiny_chat_template`); a family token not in `SPECIAL_TOKENS` is added after them.

  Returns:
    The transformers tokenizer (reloadable with `AutoTokenizer.from_pretrained(directory)`).
  """
  spec = family_spec(family)
  bos, eos, pad = spec.tiny_tokens
  special = list(SPECIAL_TOKENS) + [t for t in dict.fromkeys(spec.tiny_tokens)
                                    if t is not None and t not in SPECIAL_TOKENS]
  if vocab_size < 256 + len(special) + 8:
    raise ValueError(f"vocab_size must be >= {256 + len(special) + 8} (bytes + special "
                     f"tokens), got {vocab_size}")
  from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  tok = Tokenizer(tok_models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(corpus(), trainer)
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad,
      chat_template=spec.tiny_chat_template,
      model_max_length=4096)
  fast.save_pretrained(directory)
  return fast
