"""The package's shape: no import circles among mr_rl's modules (function-level imports
included), no private name imported from another module, small modules where they must be;
the design docs name only paths that exist and stay within their line budget."""

import ast
import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules() -> dict[str, str]:
  out = {}
  for dirpath, _, files in os.walk(os.path.join(REPO, "mr_rl")):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(dirpath, f)
        name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
  return out


def _imports(name: str, path: str, modules) -> list[tuple[str, str | None, int]]:
  """(imported module, imported name or None, line) for every import in the file, at any depth."""
  package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
  out = []
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      out += [(a.name, None, node.lineno) for a in node.names if a.name.startswith("mr_rl")]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      if not base.startswith("mr_rl"):
        continue
      for a in node.names:
        full = f"{base}.{a.name}"
        out.append((full, None, node.lineno) if full in modules else (base, a.name, node.lineno))
  return out


def _graph():
  modules = _modules()
  edges = {m: set() for m in modules}
  for m, path in modules.items():
    for target, _, _ in _imports(m, path, modules):
      if target in modules and target != m:
        edges[m].add(target)
        # Importing a module runs its packages' __init__ first (those outside m's own package).
        parts = target.split(".")
        for i in range(2, len(parts)):
          pkg = ".".join(parts[:i])
          if pkg in modules and not m.startswith(pkg + ".") and pkg != m:
            edges[m].add(pkg)
  return edges


def _cycle(edges):
  """One import cycle as a list of modules, or None."""
  color, stack = {}, []

  def visit(v):
    color[v] = 1
    stack.append(v)
    for w in sorted(edges[v]):
      if color.get(w) == 1:
        return stack[stack.index(w):] + [w]
      if w not in color:
        found = visit(w)
        if found:
          return found
    color[v] = 2
    stack.pop()
    return None

  for v in sorted(edges):
    if v not in color:
      found = visit(v)
      if found:
        return found
  return None


def test_no_import_circles():
  assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()))


def test_the_cycle_finder_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_private_names_imported_across_modules():
  """`from mr_rl.x import _name` only inside the package that defines it (a package's own
  private helper modules, such as aggregators/_common, are its business)."""
  modules = _modules()
  bad = []
  for m, path in modules.items():
    for target, name, line in _imports(m, path, modules):
      private = name.startswith("_") if name else target.rpartition(".")[2].startswith("_")
      owner = target if name else target.rpartition(".")[0]
      if private and not (m == owner or m.startswith(owner + ".")):
        bad.append(f"{path}:{line}: {target}{'.' + name if name else ''}")
  assert not bad, bad


@pytest.mark.parametrize("package", ["mr_rl"])
def test_modules_stay_small(package):
  long = {}
  for dirpath, _, files in os.walk(os.path.join(REPO, package)):
    for f in files:
      if f.endswith(".py"):
        n = sum(1 for _ in open(os.path.join(dirpath, f)))
        if n >= 500:
          long[os.path.join(dirpath, f)] = n
  assert not long, long


def test_settings_modules_stay_under_400_lines():
  """The settings layer (mr_rl/settings/, and mr_rl/fields.py, its declarations) is split by
  sections, each module under 400 lines (issue: one declaration per setting)."""
  paths = [os.path.join(REPO, "mr_rl", "fields.py")] + [
      os.path.join(dirpath, f) for dirpath, _, files in os.walk(os.path.join(REPO, "mr_rl",
                                                                             "settings"))
      for f in files if f.endswith(".py")]
  assert len(paths) > 3
  long = {p: n for p in paths if (n := sum(1 for _ in open(p))) >= 400}
  assert not long, long


def test_the_settings_layer_imports_no_runtime_module():
  """`import mr_rl.settings` loads no jax: the sections that runtime modules declare are
  imported when a config is derived or built (`mr_rl.fields.Lazy`)."""
  import subprocess
  import sys
  code = ("import sys, mr_rl.settings; bad = [m for m in sys.modules if m.split('.')[0] in "
          "('jax', 'flax', 'optax')]; print(bad); assert not bad")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                     timeout=120, env={**os.environ, "PYTHONPATH": REPO})
  assert p.returncode == 0, p.stdout + p.stderr


def _importers(package: str, allowed: tuple[str, ...]) -> list[str]:
  """The modules of mr_rl outside `allowed` (and their submodules) that import `package`."""
  modules = _modules()
  inside = lambda m, names: any(m == n or m.startswith(n + ".") for n in names)
  return [m for m, path in modules.items() if not inside(m, allowed)
          and any(inside(t, (package,)) for t, _, _ in _imports(m, path, modules))]


def test_no_module_imports_the_test_helpers():
  """`mr_rl.testing` (xla_env, runs, tpu_compile) is for tests and benchmarks: no module of
  mr_rl outside it imports it."""
  assert not _importers("mr_rl.testing", ("mr_rl.testing",)), \
      _importers("mr_rl.testing", ("mr_rl.testing",))


def test_only_runlocal_imports_the_tiny_assets():
  """In the package only `config_lib.local` (`:runlocal`) and the test helpers may import
  `mr_rl.tiny_assets` (the tiny checkpoints, tokenizers, data files and reward model)."""
  allowed = ("mr_rl.tiny_assets", "mr_rl.config_lib.local", "mr_rl.testing")
  assert not _importers("mr_rl.tiny_assets", allowed), _importers("mr_rl.tiny_assets", allowed)


def test_the_importer_finder_finds_an_import():
  """`config_lib.local` imports the tiny assets: reported unless its package is allowed."""
  assert "mr_rl.config_lib.local" in _importers("mr_rl.tiny_assets", ("mr_rl.tiny_assets",))
  assert "mr_rl.config_lib.local" not in _importers("mr_rl.tiny_assets", ("mr_rl.config_lib",))


# The design docs: BUILD_NOTES.md is the index, docs/<area>.md the current design per area.
_DOC_PATH = re.compile(r"(?<![\w/.])(?:mr_rl|configs|launch|benchmarks|tests|docs|notebooks)/"
                       r"[\w./*<>{}-]*")
# Design text, in lines: BUILD_NOTES.md and docs/*.md, except the dated benchmark log and the
# reference pages (formulas, shape glossary, house style). A new area's text replaces a log, it
# does not grow the total: move measurements to docs/benchmarks.md, history to git.
DESIGN_TEXT_EXCLUDED = ("benchmarks.md", "methods.md", "shapes.md", "style.md")
# 800, plus the new area docs/multiturn.md (issue 42) at 78 lines.
DESIGN_TEXT_BUDGET = 880


def _design_docs():
  docs = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
  return [os.path.join(REPO, "BUILD_NOTES.md")] + docs


def test_paths_named_in_the_design_docs_exist():
  """Every repository path in backticks in BUILD_NOTES.md or docs/*.md (`mr_rl/rl/batch.py`,
  `configs/demo.py:seed=1`, `python benchmarks/sampler.py --long-tail`) exists, so a doc
  cannot keep citing a module that moved."""
  missing = []
  for path in _design_docs():
    text = open(path, encoding="utf-8").read()
    for span in re.findall(r"`([^`]+)`", text):
      for ref in _DOC_PATH.findall(span):
        if any(c in ref for c in "<>{}*"):
          continue  # a pattern such as configs/<file>
        ref = ref.rstrip(".,")
        if not os.path.exists(os.path.join(REPO, ref)):
          missing.append(f"{os.path.relpath(path, REPO)}: {ref}")
  assert not missing, missing


def test_the_path_check_finds_a_missing_path():
  assert _DOC_PATH.findall("python mr_rl/rl/packing.py:x --out DIR") == ["mr_rl/rl/packing.py"]
  assert not os.path.exists(os.path.join(REPO, "mr_rl/rl/packing.py"))


def test_design_text_stays_within_its_budget():
  counted = {os.path.relpath(p, REPO): sum(1 for _ in open(p, encoding="utf-8"))
             for p in _design_docs() if os.path.basename(p) not in DESIGN_TEXT_EXCLUDED}
  assert sum(counted.values()) <= DESIGN_TEXT_BUDGET, counted


# Where a model family's or a rollout engine's own code lives (their registries' modules).
_EXTENSION_MODULES = ("mr_rl/models/families/", "mr_rl/rollout_engines/")


def _name_comparisons(path: str, words=("family", "engine")) -> list[str]:
  """`x.family == "llama"`, `engine != "static"`, `family in ("qwen3", ...)`: a variable named
  after one of `words` compared with string constants."""
  def named(node):
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return any(name == w or name.endswith("_" + w) for w in words)

  def strings(node):
    if isinstance(node, ast.Constant):
      return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)

  out = []
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Compare):
      sides = [node.left, *node.comparators]
      if any(named(s) for s in sides) and any(strings(s) for s in sides):
        out.append(f"{os.path.relpath(path, REPO)}:{node.lineno}")
  return out


def test_families_and_engines_are_looked_up_not_named():
  """Outside their own modules no code branches on a model family's or a rollout engine's
  name: it asks the registry (`mr_rl.models.families.FAMILIES`,
  `mr_rl.rollout_engines.ENGINES`), so adding one touches its own module only."""
  bad = []
  for top in ("mr_rl", "launch"):
    for dirpath, _, files in os.walk(os.path.join(REPO, top)):
      for f in files:
        path = os.path.join(dirpath, f)
        rel = os.path.relpath(path, REPO).replace(os.sep, "/")
        if f.endswith(".py") and not rel.startswith(_EXTENSION_MODULES):
          bad += _name_comparisons(path)
  assert not bad, bad


def test_the_name_comparison_finder_finds_them(tmp_path):
  src = tmp_path / "m.py"
  src.write_text('if cfg.family == "llama": pass\nif engine in ("static", "x"): pass\n'
                 'if rollout_engine != "static": pass\nif family == other: pass\n')
  assert [x.rsplit(":", 1)[1] for x in _name_comparisons(str(src))] == ["1", "2", "3"]
