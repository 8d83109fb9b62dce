"""Tools as typed Python functions, the tool-call formats, and the built-in tool environment.

A tool is a function with annotated parameters and a Google-style docstring:

    def calculator(expression: str) -> str:
      '''Evaluates an arithmetic expression.

      Args:
        expression: digits, + - * / and parentheses.
      '''

`schema(fn)` gives its JSON schema (the OpenAI / Qwen3 `tools=` form: name, description
from the docstring's first paragraph, parameters from the signature and the `Args:` lines).
`ToolEnv` wraps tools as an `Environment`: a turn that holds a call in the family's format
runs the tool and answers with its result as a 'tool' message; a turn without a call ends
the trajectory. Formats: `HermesFormat` (Qwen3's `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`) and `PlainFormat` (the text between two markers is the one argument of
the one tool: the demo tokenizer, which has no letters). The per-step timeout and the host
workers are the rollout's (`mr_rl.multiturn.rollout`): a tool runs where the step runs, on a
host thread or in a worker process (`mr_rl.multiturn.workers`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from typing import Any, Callable, Mapping, Sequence

from mr_rl.multiturn.env import EnvConfigError, StepResult, Turn, resolve

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
               dict: "object"}

# Reward channels a `ToolEnv` step reports.
FORMAT_CHANNEL = "tool_format"    # 1 per well-formed call, 0 per malformed one
SUCCESS_CHANNEL = "tool_success"  # 1 per call that returned, 0 per malformed or raising one


def _json_type(annotation, name: str, fn_name: str) -> dict:
  origin = typing.get_origin(annotation)
  args = [a for a in typing.get_args(annotation) if a is not type(None)]
  if origin in (typing.Union, types.UnionType) and len(args) == 1:  # Optional[X]: X
    return _json_type(args[0], name, fn_name)
  if origin in (list, Sequence, tuple) or annotation in (list, tuple):
    args = typing.get_args(annotation)
    out = {"type": "array"}
    if args and args[0] in _JSON_TYPES:
      out["items"] = {"type": _JSON_TYPES[args[0]]}
    return out
  if origin in (dict, Mapping):
    return {"type": "object"}
  if annotation in _JSON_TYPES:
    return {"type": _JSON_TYPES[annotation]}
  raise TypeError(f"tool {fn_name!r}: parameter {name!r} has annotation {annotation!r}; a tool "
                  f"parameter must be one of {[t.__name__ for t in _JSON_TYPES]} (or list[...])")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
  """(description, {arg: description}) of a Google-style docstring."""
  doc = inspect.cleandoc(doc or "")
  description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
  args, current, in_args = {}, None, False
  for line in doc.splitlines():
    if re.match(r"^(Args|Arguments|Parameters):\s*$", line):
      in_args = True
      continue
    if in_args:
      if line and not line[0].isspace():  # the next section
        break
      m = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
      if m and (current is None or len(line) - len(line.lstrip()) <= args[current][1]):
        current = m[1]
        args[current] = (m[2].strip(), len(line) - len(line.lstrip()))
      elif current is not None and line.strip():
        args[current] = (args[current][0] + " " + line.strip(), args[current][1])
  return description, {k: v for k, (v, _) in args.items()}


def schema(fn: Callable) -> dict:
  """The JSON schema of a tool function (`{"type": "function", "function": {...}}`).

  Raises:
    TypeError: a parameter without a supported annotation, *args / **kwargs, or no docstring.
  """
  name = fn.__name__
  if not (fn.__doc__ or "").strip():
    raise TypeError(f"tool {name!r} has no docstring: its first paragraph is the tool's "
                    "description")
  description, arg_docs = _docstring_parts(fn.__doc__)
  hints = typing.get_type_hints(fn)
  properties, required = {}, []
  for p in inspect.signature(fn).parameters.values():
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
      raise TypeError(f"tool {name!r}: *args / **kwargs have no schema")
    if p.name not in hints:
      raise TypeError(f"tool {name!r}: parameter {p.name!r} has no type annotation")
    prop = _json_type(hints[p.name], p.name, name)
    if p.name in arg_docs:
      prop["description"] = arg_docs[p.name]
    properties[p.name] = prop
    if p.default is p.empty:
      required.append(p.name)
  return {"type": "function", "function": {
      "name": name, "description": description,
      "parameters": {"type": "object", "properties": properties, "required": required}}}


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """A parsed call: the tool's name and its arguments (None: the call was malformed, and
  `error` says why)."""
  name: str | None
  arguments: Mapping[str, Any] | None
  error: str | None = None


class HermesFormat:
  """Qwen3's format: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; the
  first call of a turn is run."""
  OPEN, CLOSE = "<tool_call>", "</tool_call>"

  def parse(self, text: str, tools: Mapping[str, Callable]) -> ToolCall | None:
    start = text.find(self.OPEN)
    if start < 0:
      return None
    end = text.find(self.CLOSE, start)
    if end < 0:
      return ToolCall(None, None, f"{self.OPEN} without {self.CLOSE}")
    body = text[start + len(self.OPEN):end].strip()
    try:
      call = json.loads(body)
    except json.JSONDecodeError as e:
      return ToolCall(None, None, f"the call is not JSON: {e}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
      return ToolCall(None, None, "the call is not an object with a string 'name'")
    args = call.get("arguments", {})
    if not isinstance(args, dict):
      return ToolCall(call["name"], None, "'arguments' is not an object")
    return ToolCall(call["name"], args)

  def render_call(self, name: str, arguments: Mapping[str, Any]) -> str:
    return f"{self.OPEN}\n{json.dumps({'name': name, 'arguments': dict(arguments)})}\n{self.CLOSE}"


class PlainFormat:
  """The text between `open` and `close` (the first pair of the turn) is the one argument
  of the one tool, e.g. `<r>7+5-9</r>` calls calculator(expression='7+5-9')."""

  def __init__(self, open: str, close: str):  # pylint: disable=redefined-builtin
    if not open or not close:
      raise ValueError("PlainFormat needs non-empty open and close markers")
    self.open, self.close = open, close

  def parse(self, text: str, tools: Mapping[str, Callable]) -> ToolCall | None:
    start = text.find(self.open)
    if start < 0:
      return None
    end = text.find(self.close, start + len(self.open))
    if end < 0:
      return ToolCall(None, None, f"{self.open} without {self.close}")
    if len(tools) != 1:
      raise EnvConfigError(f"PlainFormat calls one tool; {len(tools)} given")
    (name, fn), = tools.items()
    params = schema(fn)["function"]["parameters"]["properties"]
    if len(params) != 1:
      raise EnvConfigError(f"PlainFormat passes one argument; tool {name!r} takes {len(params)}")
    return ToolCall(name, {next(iter(params)): text[start + len(self.open):end]})

  def render_call(self, name: str, arguments: Mapping[str, Any]) -> str:
    del name
    return f"{self.open}{next(iter(arguments.values()))}{self.close}"


FORMATS = {"hermes": HermesFormat, "plain": PlainFormat}


def load_tools(specs: Sequence[str | Callable]) -> dict[str, Callable]:
  """{name: function} of tools given as functions or import paths 'pkg.mod:fn', each
  schema-checked now (a bad tool stops the run at start-up)."""
  out = {}
  for spec in specs:
    fn = resolve(spec, "tool") if isinstance(spec, str) else spec
    if not callable(fn):
      raise EnvConfigError(f"tool {spec!r} is a {type(fn).__name__}, not a function")
    try:
      schema(fn)
    except TypeError as e:
      raise EnvConfigError(str(e)) from e
    if fn.__name__ in out:
      raise EnvConfigError(f"two tools are named {fn.__name__!r}")
    out[fn.__name__] = fn
  if not out:
    raise EnvConfigError("a tool environment needs at least one tool")
  return out


class ToolEnv:
  """An `Environment` over tools (module docstring).

  Args:
    tools: functions or import paths.
    format: a format object (`HermesFormat()`, `PlainFormat(open, close)`).
    result_template: how a result becomes the 'tool' message's content ('{result}').
    prompt_key: the example's field holding its chat messages (`reset` returns them).
    error_template: how an error (a malformed call, a tool that raised) becomes the 'tool'
      message's content ('{error}'; a small vocabulary needs a fixed text).
    tool_errors: 'answer' (a tool that raises answers with the error, counted in
      `tool_failures`: the model's call was bad) or 'raise' (the step raises, which fails the
      trajectory under the rollout's failure rules).
  """

  def __init__(self, tools: Sequence[str | Callable], format=None,  # pylint: disable=redefined-builtin
               result_template: str = "{result}", prompt_key: str = "messages",
               error_template: str = "error: {error}", tool_errors: str = "answer"):
    if tool_errors not in ("answer", "raise"):
      raise ValueError(f"tool_errors must be 'answer' or 'raise', got {tool_errors!r}")
    self.tool_errors = tool_errors
    self.error_template = error_template
    self.tools = load_tools(tools)
    self.format = format if format is not None else HermesFormat()
    self.result_template = result_template
    self.prompt_key = prompt_key

  def schemas(self) -> list[dict]:
    """The tools' JSON schemas (what a chat template's `tools=` takes)."""
    return [schema(fn) for fn in self.tools.values()]

  def reset(self, example: Mapping[str, Any]) -> list[dict]:
    """The example's messages (a mapping's `prompt_key`, or an `mr_rl.data.Example`'s)."""
    messages = (example.get(self.prompt_key) if isinstance(example, Mapping)
                else getattr(example, self.prompt_key, None))
    if not messages:
      raise KeyError(f"ToolEnv.reset: the example has no {self.prompt_key!r} messages")
    return [dict(m) for m in messages]

  def step(self, turn: Turn) -> StepResult:
    call = self.format.parse(turn.text, self.tools)
    if call is None:  # no call: the final answer
      return StepResult(done=True, info={"tool_calls": 0})
    info = {"tool_calls": 1, "tool_failures": 0}
    if call.error is None and call.name not in self.tools:
      call = ToolCall(call.name, None, f"unknown tool {call.name!r}; tools: {sorted(self.tools)}")
    if call.error is not None:
      return StepResult(messages=[{"role": "tool",
                                   "content": self.error_template.format(error=call.error)}],
                        rewards={FORMAT_CHANNEL: 0.0, SUCCESS_CHANNEL: 0.0},
                        info={**info, "tool_failures": 1})
    try:
      result = self.tools[call.name](**call.arguments)
      ok = 1.0
    except Exception as e:  # pylint: disable=broad-except  (the tool's failure is the answer)
      if self.tool_errors == "raise":
        raise
      result, ok = self.error_template.format(error=f"{type(e).__name__}: {e}"), 0.0
      info["tool_failures"] = 1
    content = self.result_template.format(result=result) if ok else str(result)
    return StepResult(messages=[{"role": "tool", "content": content}],
                      rewards={FORMAT_CHANNEL: 1.0, SUCCESS_CHANNEL: ok}, info=info)
