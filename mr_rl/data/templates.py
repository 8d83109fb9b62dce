"""Prompt templates per task and model family (docs/methods.md §7).

Two styles:
  * `chat` (instruct models: Qwen3-4B-Instruct-2507, Llama-3.1-8B-Instruct,
    Qwen3-30B-A3B-Instruct-2507): the turns go through the tokenizer's own
    `apply_chat_template(..., add_generation_prompt=True)`; a tokenizer without a chat
    template is an error, never a silent switch to plain text.
  * `plain` (base models: DeepSeek-Math-7B-Base, Qwen3-1.7B-Base, Llama-3.2-3B,
    Llama-3.1-8B): `<system>\\n\\nUser: <turn>\\nAssistant: <turn>\\n...User: <turn>\\nAssistant:`.
Each paper model's style is listed by its family (`FamilySpec.model_styles`,
mr_rl/models/families); a run sets it with `config.data.style`, or leaves it '' (`run_style`:
the listed style of the model's name, else the tokenizer's: chat with a chat template).

Task instructions:
  * AMRP math (`amrp_math`): a system instruction asking for
    `<reasoning>...</reasoning><answer>...</answer>`, the layout the format reward
    checks (docs/methods.md §7).
  * TAG math (`tag_math`): the user turn ends with the usual "reason step by step, final
    answer in \\boxed{}" request; the accuracy reward reads the last `\\boxed{}`.
  * TAG code (`tag_code`): asks for one Python program in a ```python block that reads
    stdin and writes stdout (or defines the requested function).
  * `alce` and `helpsteer2`: no extra instruction (the ALCE prompt carries its own).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Sequence

from mr_rl.data.example import Example

AMRP_MATH_SYSTEM = (
    "You are a careful mathematician. Solve the user's problem. First write your"
    " step-by-step reasoning inside <reasoning> and </reasoning>, then write only the"
    " final answer inside <answer> and </answer>. Write nothing outside these two blocks,"
    " in this form:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>")
TAG_BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TAG_CODE_INSTRUCTION = (
    "Write a complete Python 3 solution. Unless a function signature is given, read the"
    " input from standard input and print the answer to standard output. Return the code"
    " in a single ```python code block.")

STYLES = ("chat", "plain")


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
  """How an `Example` becomes the model's input text.

  Attributes:
    style: "chat" (tokenizer chat template) or "plain" (User:/Assistant: text).
    system: system instruction (chat: a system turn; plain: a preamble), or None.
    suffix: text appended to the last user turn after a blank line, or None.
  """

  style: str
  system: str | None = None
  suffix: str | None = None

  def __post_init__(self):
    if self.style not in STYLES:
      raise ValueError(f"style must be one of {STYLES}, got {self.style!r}")

  def messages(self, example: Example) -> list[dict[str, str]]:
    """The turns handed to a chat template: [system] + example turns (+ suffix)."""
    msgs = [dict(m) for m in example.messages]
    if self.suffix:
      msgs[-1]["content"] = f"{msgs[-1]['content']}\n\n{self.suffix}"
    if self.system:
      msgs.insert(0, {"role": "system", "content": self.system})
    return msgs

  def render(self, example: Example, tokenizer: Any = None) -> str:
    """Returns the prompt string for `example`.

    Args:
      example: the record.
      tokenizer: a transformers tokenizer with a `chat_template` (chat style only).

    Raises:
      ValueError: chat style without a tokenizer that has a chat template.
    """
    msgs = self.messages(example)
    if self.style == "chat":
      if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer: chat-style templates need a tokenizer with a "
                         "chat_template; use style='plain' for base models")
      return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    parts = []
    if msgs[0]["role"] == "system":
      parts.append(msgs.pop(0)["content"] + "\n\n")
    for m in msgs:
      parts.append(f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content']}\n")
    parts.append("Assistant:")
    return "".join(parts)

  def render_batch(self, examples: Sequence[Example], tokenizer: Any = None) -> list[str]:
    return [self.render(ex, tokenizer) for ex in examples]

  def jinja(self) -> str:
    """A transformers chat template (Jinja) that writes a plain-style prompt as `render` does
    (this template's system preamble unless the messages bring their own, its suffix on the
    last turn; "Assistant:" with ``add_generation_prompt``), for exports of policies trained
    on plain prompts. Chat style has none: the tokenizer's own template is the format."""
    if self.style != "plain":
      raise ValueError("jinja(): only plain-style templates have one (chat style uses the "
                       "tokenizer's own chat template)")
    lit = json.dumps  # a JSON string is a Jinja string literal
    return (
        f"{{%- set ns = namespace(system={lit(self.system or '')}, start=0) -%}}"
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set ns.system = messages[0]['content'] -%}{%- set ns.start = 1 -%}{%- endif -%}"
        "{%- if ns.system -%}{{ ns.system }}{{ '\n\n' }}{%- endif -%}"
        "{%- for m in messages[ns.start:] -%}"
        "{{ 'User' if m['role'] == 'user' else 'Assistant' }}: {{ m['content'] }}"
        + (f"{{%- if loop.last -%}}{{{{ '\n\n' }}}}{{{{ {lit(self.suffix)} }}}}{{%- endif -%}}"
           if self.suffix else "")
        + "{{ '\n' }}{%- endfor -%}"
        "{%- if add_generation_prompt -%}Assistant:{%- endif -%}")


# The prompt of a run without a template (config.data.template ''): BOS, then the example's
# prompt as it is (`mr_rl.rollout.Policy` with add_bos), so one user message.
UNTEMPLATED_JINJA = (
    "{%- if messages | length != 1 or messages[0]['role'] != 'user' -%}"
    "{{ raise_exception('this policy was trained on bare prompts (mr_rl config.data.template "
    "is empty): give exactly one user message, its prompt') }}{%- endif -%}"
    "{{ bos_token }}{{ messages[0]['content'] }}")


def chat_template_of_run(template_task: str, model: str, style: str = "",
                         has_chat_template: bool | None = None) -> str | None:
  """The chat template (Jinja) that writes prompts the way a run with `config.data.template =
  template_task`, `config.data.style = style` and `config.model.path = model` wrote them
  (`run_style`; `has_chat_template`: whether the model's tokenizer has one), or None where
  that is the tokenizer's own chat template (chat style)."""
  if not template_task:
    return UNTEMPLATED_JINJA
  template = make_template(template_task, style=run_style(style, model, has_chat_template))
  return None if template.style == "chat" else template.jinja()


def run_style(style: str, model: str, has_chat_template: bool | None) -> str:
  """The prompt style of a run (`config.data.style`): `style` when set; else the listed style
  of a paper model's hub id or preset name (a local copy keeps the model's name); else the
  tokenizer's: 'chat' when it has a chat template (`has_chat_template`), 'plain' otherwise.

  Raises:
    ValueError: '' for a model the papers do not list, and `has_chat_template` is None.
  """
  if style:
    return style
  from mr_rl.models import families
  listed = families.model_styles().get(_model_key(model))
  if listed:
    return listed
  if has_chat_template is None:
    raise ValueError(f"the prompt style of {model!r} is read from its tokenizer; none at hand")
  return "chat" if has_chat_template else "plain"


TASK_INSTRUCTIONS = {
    "amrp_math": {"system": AMRP_MATH_SYSTEM},
    "tag_math": {"suffix": TAG_BOXED_INSTRUCTION},
    "tag_code": {"suffix": TAG_CODE_INSTRUCTION},
    "alce": {},
    "helpsteer2": {},
}

def _model_key(name: str) -> str:
  return re.sub(r"[^a-z0-9]+", "_", name.lower().split("/")[-1]).strip("_")


def style_for_model(model: str) -> str:
  """Template style of a paper model (hub id or preset name, case/punctuation-insensitive).

  Raises:
    ValueError: the model is not one of the papers' models; set the style explicitly.
  """
  from mr_rl.models import families  # each family lists its models' styles
  key, styles = _model_key(model), families.model_styles()
  if key not in styles:
    raise ValueError(f"model {model!r} has no known template style; set config.data.style "
                     f"to 'chat' or 'plain' (known: {sorted(styles)})")
  return styles[key]


def make_template(task: str, *, style: str | None = None, model: str | None = None) -> PromptTemplate:
  """Template for `task` in `style` (or the style of `model`)."""
  if task not in TASK_INSTRUCTIONS:
    raise ValueError(f"task must be one of {sorted(TASK_INSTRUCTIONS)}, got {task!r}")
  if (style is None) == (model is None):
    raise ValueError("give exactly one of style= and model=")
  return PromptTemplate(style=style or style_for_model(model), **TASK_INSTRUCTIONS[task])
