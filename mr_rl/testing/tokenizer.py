"""A real byte-level BPE tokenizer trained on a small built-in corpus, with a chat template."""

from __future__ import annotations

from mr_rl.testing.assets import FAMILIES
from mr_rl.testing.datasets import ALCE_QUESTIONS, CODE_PROBLEMS, HELPSTEER_PAIRS, MATH_PROBLEMS

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
