"""Tools, their schemas, the call formats, the tool environment and the import-path loading."""

import json
import sys
import types

import pytest

from mr_rl.multiturn import builtin_tools, env, tools


def lookup(city: str, limit: int = 3, tags: list[str] | None = None) -> str:
  """Looks a city up.

  Args:
    city: the city's name,
      in English.
    limit: how many results.
    tags: filters.
  """
  return f"{city}:{limit}"


def test_schema_from_signature_and_docstring():
  s = tools.schema(lookup)["function"]
  assert s["name"] == "lookup" and s["description"] == "Looks a city up."
  props = s["parameters"]["properties"]
  assert props["city"] == {"type": "string", "description": "the city's name, in English."}
  assert props["limit"]["type"] == "integer"
  assert s["parameters"]["required"] == ["city"]


def test_schema_refuses_untyped_and_undocumented_tools():
  def untyped(x):
    """Doc."""
  def undocumented(x: str):
    pass
  with pytest.raises(TypeError, match="no type annotation"):
    tools.schema(untyped)
  with pytest.raises(TypeError, match="no docstring"):
    tools.schema(undocumented)


def test_hermes_call_runs_the_tool_and_answers():
  e = tools.ToolEnv([lookup])
  call = tools.HermesFormat().render_call("lookup", {"city": "Oslo", "limit": 2})
  r = e.step(env.Turn(text=f"Let me look.\n{call}", token_ids=(), index=0))
  assert not r.done and r.messages == [{"role": "tool", "content": "Oslo:2"}]
  assert r.rewards == {tools.FORMAT_CHANNEL: 1.0, tools.SUCCESS_CHANNEL: 1.0}
  assert e.step(env.Turn(text="The answer is 4.", token_ids=(), index=1)).done


@pytest.mark.parametrize("text,error", [
    ("<tool_call>{not json}</tool_call>", "not JSON"),
    ("<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>", "unknown tool"),
    ("<tool_call>{\"name\": \"lookup\"", "without"),
])
def test_malformed_calls_answer_with_the_error(text, error):
  r = tools.ToolEnv([lookup]).step(env.Turn(text=text, token_ids=(), index=0))
  assert error in r.messages[0]["content"] and r.rewards == {tools.FORMAT_CHANNEL: 0.0, tools.SUCCESS_CHANNEL: 0.0}
  assert r.info["tool_failures"] == 1


def test_a_raising_tool_answers_or_raises_as_configured():
  bad = tools.HermesFormat().render_call("calculator", {"expression": "1/0"})
  r = tools.ToolEnv([builtin_tools.calculator]).step(env.Turn(bad, (), 0))
  assert "ZeroDivisionError" in r.messages[0]["content"]
  assert r.rewards[tools.SUCCESS_CHANNEL] == 0.0
  with pytest.raises(ZeroDivisionError):
    tools.ToolEnv([builtin_tools.calculator], tool_errors="raise").step(env.Turn(bad, (), 0))


def test_plain_format_calls_the_one_tool():
  e = tools.ToolEnv([builtin_tools.calculator], format=tools.PlainFormat("<r>", "</r>"))
  r = e.step(env.Turn(text="<r>7+5-9</r>", token_ids=(), index=0))
  assert r.messages[0]["content"] == "3"
  assert e.step(env.Turn(text="<a>3</a>", token_ids=(), index=1)).done


def test_calculator_refuses_non_arithmetic():
  assert builtin_tools.calculator("(2+3)*4") == "20"
  with pytest.raises(ValueError):
    builtin_tools.calculator("__import__('os')")


def test_python_tool_runs_in_the_sandbox():
  from mr_rl.rewards import sandbox
  if not sandbox.sandbox_capabilities().network_isolated:
    pytest.skip("this machine's sandbox has no network isolation")
  assert builtin_tools.python("print(sum(range(10)))") == "45\n"
  assert builtin_tools.python("x = 1") == ""
  assert "ZeroDivisionError" in builtin_tools.python("print(1/0)")
  # The sandbox's own limits hold: no network.
  out = builtin_tools.python("import socket\nsocket.create_connection(('1.1.1.1', 53), 1)")
  assert out.startswith("error:")


def test_tools_and_environments_load_by_import_path(monkeypatch):
  mod = types.ModuleType("mt_plugin")
  mod.lookup = lookup
  mod.not_a_tool = 3
  mod.make_env = lambda: tools.ToolEnv(["mt_plugin:lookup"])
  mod.not_an_env = lambda: object()
  monkeypatch.setitem(sys.modules, "mt_plugin", mod)
  assert list(tools.load_tools(["mt_plugin:lookup"])) == ["lookup"]
  make = env.environment_factory("mt_plugin:make_env")
  assert isinstance(make(), env.Environment)
  with pytest.raises(env.EnvConfigError, match="no attribute"):
    tools.load_tools(["mt_plugin:missing"])
  with pytest.raises(env.EnvConfigError, match="not a function"):
    tools.load_tools(["mt_plugin:not_a_tool"])
  with pytest.raises(env.EnvConfigError, match="did not import"):
    env.environment_factory("no_such_module_xyz:f")
  with pytest.raises(env.EnvConfigError, match="no reset"):
    env.environment_factory("mt_plugin:not_an_env")
  assert json.dumps(make().schemas())  # the schemas are JSON


def test_step_result_is_checked():
  with pytest.raises(ValueError, match="done=True"):
    env.StepResult(messages=[{"role": "tool", "content": "x"}], done=True)
  with pytest.raises(TypeError, match="role"):
    env.StepResult(messages=[{"text": "x"}])
  with pytest.raises(TypeError, match="not a number"):
    env.StepResult(rewards={"a": "1"})
