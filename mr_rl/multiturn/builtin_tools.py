"""Built-in tools: `python` (code run in the reward sandbox, under its limits) and
`calculator` (arithmetic without eval)."""

from __future__ import annotations

import ast
import operator

# A tool result longer than this is cut by the sandbox's verdict (`python`).
PYTHON_OUTPUT_CHARS = 200
PYTHON_TIMEOUT_S = 5.0

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node):
  if isinstance(node, ast.Expression):
    return _eval(node.body)
  if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(
      node.value, bool):
    return node.value
  if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
    return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
  if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
    return _OPS[type(node.op)](_eval(node.operand))
  raise ValueError(f"not arithmetic: {ast.dump(node)[:80]}")


def calculator(expression: str) -> str:
  """Evaluates an arithmetic expression.

  Args:
    expression: numbers with + - * / // % and parentheses, e.g. '7+5-9'.
  """
  if len(expression) > 200:
    raise ValueError("expression longer than 200 characters")
  value = _eval(ast.parse(expression.strip(), mode="eval"))
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  return str(value)


def python(code: str) -> str:
  """Runs a Python program and returns what it prints.

  Args:
    code: a complete Python 3 program; its standard output is the result.
  """
  from mr_rl.rewards import sandbox
  # One stdio test expecting no output: an empty output passes; any other output fails the
  # test and the verdict quotes it (cut to PYTHON_OUTPUT_CHARS); an error or timeout is the
  # verdict's error text.
  result = sandbox.run(code, sandbox.CodeTests.stdio([("", "")]), timeout_s=PYTHON_TIMEOUT_S)
  if result.passed:
    return ""
  prefix = "test 0: wrong output "
  if result.error and result.error.startswith(prefix):
    return ast.literal_eval(result.error[len(prefix):])
  if result.timed_out:
    return f"error: the program ran past {PYTHON_TIMEOUT_S} s"
  return f"error: {result.error}"
