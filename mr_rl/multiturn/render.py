"""Observations as token deltas of the family's chat template (docs/multiturn.md, "Tokens").

A trajectory's ids are the prompt's ids, then for each turn the sampled ids (ending with the
end-of-turn id) and the observation's delta ids. The delta is rendered once, when the
observation is inserted, and never re-rendered: the learner trains on exactly these ids.
`ChatRenderer.observation_ids` renders an anchor conversation (a user and an assistant turn)
with and without the new messages and keeps the difference, starting right after the
assistant's end-of-turn text: the template's tail of the assistant turn (ChatML's newline),
the new messages and the next assistant header. Where a template is not append-only (the
anchor's rendering is not a prefix of the longer one, as Qwen3's real template, which drops
the reasoning of earlier assistant turns) this raises `NotAppendOnly` at start-up rather
than rendering a delta that no whole-conversation rendering equals.
`PlainRenderer` is for a tokenizer without a chat template (the demo's): messages are texts
joined by a template string.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

TRUNCATION_MARKER = "...[truncated]"
_ANCHOR = ({"role": "user", "content": "A"}, {"role": "assistant", "content": "B"})


class NotAppendOnly(ValueError):
  """The chat template renders a longer conversation with a different prefix."""


class ChatRenderer:
  """Prompt and observation ids from a tokenizer's chat template.

  Args:
    tokenizer: a transformers tokenizer with a `chat_template`.
    end_of_turn: the text of the id that ends an assistant turn (default: the tokenizer's
      EOS token; Llama 3 instruct: '<|eot_id|>').
    tools: tool schemas handed to the template (`tools=`), or None.
    marker: appended to a truncated observation's content.
  """

  def __init__(self, tokenizer, end_of_turn: str | None = None,
               tools: Sequence[Mapping[str, Any]] | None = None,
               marker: str = TRUNCATION_MARKER):
    self.marker = marker
    if not getattr(tokenizer, "chat_template", None):
      raise ValueError("ChatRenderer needs a tokenizer with a chat template; use PlainRenderer")
    self.tokenizer = tokenizer
    self.end_of_turn = end_of_turn or tokenizer.eos_token
    self.tools = list(tools) if tools else None
    ids = tokenizer.encode(self.end_of_turn, add_special_tokens=False)
    if len(ids) != 1:
      raise ValueError(f"end of turn {self.end_of_turn!r} is {len(ids)} tokens, not one")
    self.end_of_turn_id = ids[0]
    self.observation_ids([{"role": "tool", "content": "x"}])  # NotAppendOnly now, not mid-run

  def _render(self, messages, generation: bool) -> str:
    kw = {"tools": self.tools} if self.tools else {}
    return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                              add_generation_prompt=generation, **kw)

  def _encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text, add_special_tokens=False)

  def prompt_text(self, messages: Sequence[Mapping[str, str]]) -> str:
    """The first messages with the assistant header, as text (with the tools' schemas)."""
    return self._render(messages, True)

  def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """The first messages with the assistant header (the rollout's prompt)."""
    return self._encode(self.prompt_text(messages))

  def turn_text(self, ids: Sequence[int]) -> str:
    """A sampled turn's text, without its end-of-turn token."""
    ids = list(ids)
    if ids and ids[-1] == self.end_of_turn_id:
      ids = ids[:-1]
    return self.tokenizer.decode(ids, skip_special_tokens=False)

  def delta_text(self, messages: Sequence[Mapping[str, str]]) -> str:
    """The text inserted after an assistant turn's end-of-turn token (module docstring)."""
    before = self._render(_ANCHOR, False)
    after = self._render(list(_ANCHOR) + list(messages), True)
    if not after.startswith(before):
      raise NotAppendOnly(f"the chat template is not append-only: rendering {len(messages)} "
                          f"more message(s) changes the earlier text ({before!r} vs "
                          f"{after[:len(before)]!r})")
    cut = before.rfind("B" + self.end_of_turn)
    if cut < 0:
      raise NotAppendOnly(f"the template does not end an assistant turn with "
                          f"{self.end_of_turn!r}: {before!r}")
    return before[cut + 1 + len(self.end_of_turn):] + after[len(before):]

  def observation_ids(self, messages: Sequence[Mapping[str, str]],
                      max_tokens: int | None = None) -> tuple[list[int], bool]:
    """The observation's delta ids and whether its content was truncated to `max_tokens`
    (the last message's content cut, the marker appended)."""
    return _truncated(lambda m: self._encode(self.delta_text(m)), messages, max_tokens,
                      self._encode, self.tokenizer.decode, self.marker)


class PlainRenderer:
  """Messages as text joined by `template` (fields `role` and `content`), for a tokenizer
  without a chat template; the prompt's messages use `prompt_template`.

  Args:
    tokenizer: a transformers tokenizer.
    template: an observation message's text (the demo: '={content};').
    prompt_template: a first message's text.
    marker: appended to a truncated observation's content (in the tokenizer's vocabulary).
    bos: the prompt starts with the tokenizer's bos id (as a single-turn prompt without a
      data template does, `mr_rl.rollout.Policy`).
  """

  def __init__(self, tokenizer, template: str = "{content}", prompt_template: str = "{content}",
               marker: str = TRUNCATION_MARKER, bos: bool = False):
    if bos and tokenizer.bos_token_id is None:
      raise ValueError("PlainRenderer(bos=True): the tokenizer has no bos token")
    self.bos = bos
    self.marker = marker
    self.tokenizer = tokenizer
    self.template = template
    self.prompt_template = prompt_template

  def _encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text, add_special_tokens=False)

  def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
    ids = self._encode("".join(self.prompt_template.format(**m) for m in messages))
    return [self.tokenizer.bos_token_id] + ids if self.bos else ids

  def turn_text(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode(list(ids), skip_special_tokens=False)

  def delta_text(self, messages: Sequence[Mapping[str, str]]) -> str:
    return "".join(self.template.format(**m) for m in messages)

  def observation_ids(self, messages: Sequence[Mapping[str, str]],
                      max_tokens: int | None = None) -> tuple[list[int], bool]:
    return _truncated(lambda m: self._encode(self.delta_text(m)), messages, max_tokens,
                      self._encode, self.tokenizer.decode, self.marker)


def _truncated(render, messages, max_tokens, encode, decode, marker) -> tuple[list[int], bool]:
  ids = render(messages)
  if max_tokens is None or len(ids) <= max_tokens:
    return ids, False
  if not messages:
    raise ValueError("an empty observation cannot exceed max_tokens")
  last = dict(messages[-1])
  content = encode(last["content"])
  keep = len(content)
  while True:  # cut the last message's content until the whole delta fits
    keep = max(0, keep - (len(ids) - max_tokens))
    last["content"] = decode(content[:keep]) + marker
    ids = render(list(messages[:-1]) + [last])
    if len(ids) <= max_tokens:
      return ids, True
    if keep == 0:
      raise ValueError(f"max observation tokens {max_tokens} is below the template's own "
                       f"{len(ids)} tokens for an empty message")
