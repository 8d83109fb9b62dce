"""Observation deltas against whole-conversation renderings, per model family and for the
demo tokenizer (mr_rl/multiturn/render.py)."""

from __future__ import annotations

import os

import pytest

from mr_rl.demo import task
from mr_rl.multiturn import render as render_lib
from mr_rl.multiturn import builtin_tools, tools
from mr_rl.tiny_assets import tokenizer as tiny_tokenizer

CALL = tools.HermesFormat().render_call("calculator", {"expression": "7+5"})
CONVERSATION = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "What is 7+5, then times 3?"},
    {"role": "assistant", "content": f"Let me compute.\n{CALL}"},
    {"role": "tool", "content": "12"},
    {"role": "assistant", "content": "Now the product."},
    {"role": "user", "content": "Go on."},
    {"role": "assistant", "content": "The answer is 36."},
]


@pytest.fixture(scope="module")
def family_tokenizer(tmp_path_factory):
  made = {}

  def get(family):
    if family not in made:
      made[family] = tiny_tokenizer.make_tokenizer(str(tmp_path_factory.mktemp(family)), family,
                                                   vocab_size=1024)
    return made[family]
  return get


def _trajectory_ids(r, encode, messages):
  """The ids a multi-turn rollout holds: the prompt, then per assistant turn its sampled ids
  (content + end of turn), then each observation's delta."""
  first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
  ids = r.prompt_ids(messages[:first])
  i = first
  while i < len(messages):
    ids += encode(messages[i]["content"]) + [r.end_of_turn_id]
    j = i + 1
    while j < len(messages) and messages[j]["role"] != "assistant":
      j += 1
    if j > i + 1:
      ids += r.observation_ids(messages[i + 1:j])[0]
    i = j
  return ids


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe"])
def test_delta_rendering_equals_the_whole_conversation(family, family_tokenizer):
  tok = family_tokenizer(family)
  r = render_lib.ChatRenderer(tok)
  encode = lambda text: tok.encode(text, add_special_tokens=False)
  whole = encode(tok.apply_chat_template(CONVERSATION, tokenize=False))
  ids = _trajectory_ids(r, encode, CONVERSATION)
  # The whole rendering ends with the last turn's template tail (ChatML's newline after
  # <|im_end|>), which the policy never samples: its trajectory stops at the end of turn.
  tail = whole[len(ids):]
  assert whole[:len(ids)] == ids
  assert tok.decode(tail) in ("", "\n")


def test_a_template_that_is_not_append_only_is_refused(family_tokenizer):
  tok = family_tokenizer("qwen3")
  # Qwen3's real template drops earlier assistant turns' reasoning; this one drops every
  # earlier assistant turn's content once a later message exists.
  tok.chat_template = (
      "{%- for m in messages %}{%- if m['role'] == 'assistant' and not loop.last %}"
      "{{ '<|im_start|>assistant\\n<|im_end|>\\n' }}{%- else %}"
      "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
      "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
  with pytest.raises(render_lib.NotAppendOnly):
    render_lib.ChatRenderer(tok)


def _trl_template(name):
  """A chat template as its model ships it: TRL keeps byte-exact copies (`trl/chat_templates`)."""
  trl = pytest.importorskip("trl")
  path = os.path.join(os.path.dirname(trl.__file__), "chat_templates", name)
  if not os.path.exists(path):
    pytest.skip(f"this trl has no {name}")
  return open(path, encoding="utf-8").read()


def test_qwen3_real_templates_and_tool_observations(tmp_path):
  """Qwen3-4B-Instruct-2507's own template (configs/math_tools.py's model) is append-only for
  tool observations, the tools' schemas in its system block: the deltas are the whole
  conversation's ids. The hybrid-thinking Qwen3 template is refused: it writes an empty
  `<think>` block on the last assistant turn only (and drops earlier turns' reasoning once a
  new user turn comes; a non-empty reasoning survives a tool message)."""
  tok = tiny_tokenizer.make_tokenizer(str(tmp_path), "qwen3", vocab_size=1024)
  schemas = [tools.schema(builtin_tools.python)]
  tok.chat_template = _trl_template("qwen3_instruct_2507.jinja")
  r = render_lib.ChatRenderer(tok, tools=schemas)
  assert r.delta_text([{"role": "tool", "content": "12"}]) == (
      "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n")
  assert '"name": "python"' in r.prompt_text([{"role": "user", "content": "Q"}])
  encode = lambda text: tok.encode(text, add_special_tokens=False)
  whole = encode(tok.apply_chat_template(CONVERSATION, tools=schemas, tokenize=False))
  ids = _trajectory_ids(r, encode, CONVERSATION)
  assert whole[:len(ids)] == ids and tok.decode(whole[len(ids):]) in ("", "\n")
  tok.chat_template = _trl_template("qwen3.jinja")
  with pytest.raises(render_lib.NotAppendOnly, match="<think>"):
    render_lib.ChatRenderer(tok, tools=schemas)
  turn = [{"role": "user", "content": "A"},
          {"role": "assistant", "content": "<think>\nr\n</think>\n\nB"}]
  before = tok.apply_chat_template(turn, tokenize=False)
  tool = [{"role": "tool", "content": "x"}]
  assert tok.apply_chat_template(turn + tool, tokenize=False,
                                 add_generation_prompt=True).startswith(before)
  again = turn + tool + [{"role": "assistant", "content": "C"}, {"role": "user", "content": "D"}]
  assert not tok.apply_chat_template(again, tokenize=False).startswith(before)


def test_plain_rendering_for_the_demo_tokenizer():
  tok = task.make_tokenizer()
  r = render_lib.PlainRenderer(tok, template="={content};", marker="--")
  prompt = [{"role": "user", "content": "Q:7+5-9="}]
  turns = ["<r>7+5</r>", "<r>12-9</r>", "<a>3</a><eos>"]
  observations = ["12", "3"]
  ids = r.prompt_ids(prompt)
  text = "Q:7+5-9="
  for i, turn in enumerate(turns):
    ids += tok.encode(turn, add_special_tokens=False)
    text += turn
    if i < len(observations):
      ids += r.observation_ids([{"role": "tool", "content": observations[i]}])[0]
      text += f"={observations[i]};"
  assert ids == tok.encode(text, add_special_tokens=False)
  cut, truncated = r.observation_ids([{"role": "tool", "content": "1234567890"}], max_tokens=8)
  assert truncated and len(cut) <= 8 and r.turn_text(cut).endswith("--;")
