"""`config.multiturn` (mr_rl/multiturn/settings.py): declared fields, checked at start-up."""

import pytest

from mr_rl.multiturn import settings, tools


def test_tools_by_import_path_build_a_tool_env():
  c = settings.default_config()
  c.tools = "mr_rl.multiturn.builtin_tools:calculator,mr_rl.multiturn.builtin_tools:python"
  c.max_turns = 3
  s = settings.from_config(c)
  assert s.tools == ("mr_rl.multiturn.builtin_tools:calculator",
                     "mr_rl.multiturn.builtin_tools:python")
  e = s.environment_factory()()
  assert isinstance(e, tools.ToolEnv) and sorted(e.tools) == ["calculator", "python"]
  assert s.limits().max_turns == 3


@pytest.mark.parametrize("field,value,message", [
    ("tools", "mr_rl.multiturn.builtin_tools:nope", "no attribute"),
    ("env", "not_a_path", "import path"),
    ("env", "no_such_module_abc:make", "did not import"),
    ("max_turns", 0, "max_turns"),
    ("tool_format", "xml", "tool_format"),
])
def test_bad_values_stop_at_start_up(field, value, message):
  c = settings.default_config()
  if field != "env":
    c.tools = "mr_rl.multiturn.builtin_tools:calculator"
  c[field] = value
  with pytest.raises(ValueError, match=message):
    settings.from_config(c)


def test_unknown_fields_are_refused():
  c = dict(settings.default_config())
  c["max_turn"] = 3
  with pytest.raises(ValueError, match="unknown field"):
    settings.from_config(c)


def test_neither_env_nor_tools_is_a_single_turn_run():
  s = settings.from_config({"tools": ""})
  assert not s.enabled
