"""The demo's multi-turn task: arithmetic with a calculator the policy can call.

A turn ends at `</r>` (a call) or `<eos>` (the answer). The text between `<r>` and `</r>` is
the calculator's one argument (`PlainFormat`), and its result comes back as the observation
`={result};`, or `=;` when the argument is not arithmetic (the character vocabulary holds no
error text). A transcript of the tool style, observation in brackets:

    Q:7+5-9+3=  ->  <r>7+5-9+3</r> [=6;] <a>6</a><eos>

Every `</r>` is a call, so the demo's other styles call it too: step-by-step reasoning
(`<r>7+5=12;...</r>`) and direct answers (`<r></r>`) get `=;` and then write their answer.
`python -m mr_rl.demo.warmstart --recipe=calculator` trains the base policy of this task on
such transcripts (the observation masked out of the loss), as `tool_transcript` builds them.

Config (`configs/demo_tools.py`): `multiturn.env = "mr_rl.demo.calculator:make_env"`,
`multiturn.renderer = "mr_rl.demo.calculator:renderer"`, end-of-turn ids `</r>` and `<eos>`.
"""

from __future__ import annotations

from typing import Any

from mr_rl.multiturn import builtin_tools, render as render_lib, tools as tools_lib
from mr_rl.multiturn.env import Turn

OPEN, CLOSE = "<r>", "</r>"
OBSERVATION = "={content};"


class CalculatorEnv(tools_lib.ToolEnv):
  """`ToolEnv` over the built-in calculator in the demo's format; `reset` gives the problem
  (an `mr_rl.data.Example`'s prompt) as the user's message."""

  def __init__(self):
    super().__init__([builtin_tools.calculator], format=tools_lib.PlainFormat(OPEN, CLOSE),
                     error_template="")

  def reset(self, example: Any) -> list[dict]:
    prompt = example["prompt"] if isinstance(example, dict) else example.prompt
    return [{"role": "user", "content": prompt}]


def make_env() -> CalculatorEnv:
  return CalculatorEnv()


def renderer(tokenizer) -> render_lib.PlainRenderer:
  """Prompts as the single-turn demo writes them (`<bos>Q:...=`); observations `={result};`."""
  return render_lib.PlainRenderer(tokenizer, template=OBSERVATION, marker="",
                                  bos=True)


def tool_transcript(prompt: str, response: str, tokenizer) -> tuple[list[int], list[int]]:
  """(ids, loss mask) of `response` (ending in `<eos>`) as the multi-turn rollout would hold
  it: after each `</r>`, the calculator's observation ids (mask 0). `response` is the policy's
  text without observations."""
  env, render = make_env(), renderer(tokenizer)
  env.reset({"prompt": prompt})
  encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
  ids, mask, rest, turn = [], [], response, 0
  while True:
    cut = rest.find(CLOSE)
    part = rest if cut < 0 else rest[:cut + len(CLOSE)]
    part_ids = encode(part)
    ids += part_ids
    mask += [1] * len(part_ids)
    if cut < 0:
      return ids, mask
    result = env.step(Turn(text=part, token_ids=tuple(part_ids), index=turn))
    obs, _ = render.observation_ids(result.messages)
    ids += obs
    mask += [0] * len(obs)
    rest, turn = rest[cut + len(CLOSE):], turn + 1
