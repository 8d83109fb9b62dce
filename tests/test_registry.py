"""mr_rl.registry: the one registry style (decorators, aliases, plugins, error shape)."""

import sys
import textwrap

import pytest

from mr_rl.registry import Registry, UnknownNameError, import_plugins


def test_decorator_names_aliases_and_error_shape():
  reg = Registry("widget")

  @reg.register
  def alpha():
    return 1

  @reg.register("beta_fn", aliases=("b",))
  def beta():
    return 2

  assert reg.get("alpha") is alpha and reg.get("beta_fn") is beta and reg.get("b") is beta
  assert reg.names() == ("alpha", "beta_fn") and reg.canonical("b") == "beta_fn"
  assert "b" in reg and "gamma" not in reg and len(reg) == 2
  with pytest.raises(UnknownNameError, match=r"^unknown widget 'gamma'; valid: alpha, beta_fn$"):
    reg.get("gamma")
  with pytest.raises(ValueError, match="widget 'alpha' is already registered"):
    reg.add("alpha", beta)
  with pytest.raises(ValueError, match="widget 'b' is already registered"):
    reg.add("b", beta)


def test_plugins_load_on_first_lookup(tmp_path, monkeypatch):
  pkg = tmp_path / "regplug_mod.py"
  pkg.write_text(textwrap.dedent("""
      from tests_registry_holder import REG
      @REG.register
      def from_plugin():
        return 3
  """))
  holder = tmp_path / "tests_registry_holder.py"
  holder.write_text("from mr_rl.registry import Registry\n"
                    "REG = Registry('thing', plugins=('regplug_mod',))\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import tests_registry_holder  # noqa: F401
  assert "regplug_mod" not in sys.modules
  assert tests_registry_holder.REG.get("from_plugin")() == 3
  assert "regplug_mod" in sys.modules


def test_import_plugins_names_the_field():
  with pytest.raises(ImportError, match=r"config.plugins: plugin module 'no_such_mod_xyz'"):
    import_plugins("mr_rl.registry, no_such_mod_xyz")
  import_plugins("")  # nothing to import


def test_a_failing_plugin_raises_on_every_lookup(tmp_path, monkeypatch):
  (tmp_path / "regplug_bad.py").write_text("raise RuntimeError('plugin is broken')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  reg = Registry("thing", plugins=("regplug_bad",))
  reg.add("builtin", 1)
  for _ in range(2):  # never a partial registry after the first failure
    with pytest.raises(RuntimeError, match="plugin is broken"):
      reg.get("builtin")
