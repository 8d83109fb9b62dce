"""One registry style for every swappable piece (docs/style.md §4).

Aggregators, advantage estimators, loss aggregations, KL estimators, reward channels, data
sets and pipelines are each a `Registry`: entries are added with a decorator whose default
name is the function's own name, optional aliases are documented where they are declared,
and every lookup of an unknown name fails with the same message shape:

    unknown <kind> 'nme'; valid: a, b, c

    ESTIMATORS = Registry("advantage estimator")

    @ESTIMATORS.register
    def grpo(R_BG, eps=1e-6): ...

    @ESTIMATORS.register("dr_grpo", aliases=("drgrpo",))
    def dr_grpo(R_BG): ...

    ESTIMATORS.get("grpo")        # the function
    ESTIMATORS.names()            # ('dr_grpo', 'grpo')

A registry may name *plugin modules*: modules (dotted import paths, never imported by the
core at import time) that add entries when imported. They are imported on the first lookup,
so a name they register resolves without the caller importing them; a run's own modules come
in through `config.plugins` (`import_plugins`).
"""

from __future__ import annotations

import importlib
import re
import threading
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

T = TypeVar("T")


# 'package.module:attr' (attr may be dotted): how configs name a user's function or class.
IMPORT_PATH = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):"
                         r"(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")


def resolve_import_path(spec: str, what: str, error: type[Exception] = ValueError) -> Any:
  """The object an import path 'package.module:attr' names; otherwise `error` naming `what`
  and the cause (a malformed path, a module that does not import, a missing attribute)."""
  m = IMPORT_PATH.match(spec) if isinstance(spec, str) else None
  if m is None:
    raise error(f"{what}: {spec!r} is not an import path 'package.module:name'")
  try:
    obj = importlib.import_module(m["module"])
  except Exception as e:  # pylint: disable=broad-except  (ImportError or the module's own)
    raise error(f"{what}: module {m['module']!r} did not import: {e!r}") from e
  for part in m["attr"].split("."):
    if not hasattr(obj, part):
      raise error(f"{what}: module {m['module']!r} has no attribute {m['attr']!r}")
    obj = getattr(obj, part)
  return obj


class UnknownNameError(ValueError):
  """A registry lookup of a name that is not registered (the message lists the valid ones)."""


class Registry(Generic[T]):
  """Named entries of one kind.

  Args:
    kind: what an entry is, for messages ("aggregator", "reward channel", ...).
    plugins: dotted module paths imported on the first lookup (each registers entries).
  """

  def __init__(self, kind: str, plugins: Sequence[str] = ()):
    self.kind = kind
    self._entries: dict[str, T] = {}
    self._aliases: dict[str, str] = {}
    self._plugins = tuple(plugins)
    self._loaded = not self._plugins
    self._loading = False
    self._lock = threading.RLock()

  # ------------------------------------------------------------------------- adding
  def add(self, name: str, entry: T, aliases: Sequence[str] = ()) -> T:
    """Registers `entry` under `name` (and `aliases`); a taken name is an error."""
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.kind} name must be a non-empty str, got {name!r}")
    with self._lock:
      for n in (name, *aliases):
        if n in self._entries or n in self._aliases:
          raise ValueError(f"{self.kind} {n!r} is already registered")
      self._entries[name] = entry
      for a in aliases:
        self._aliases[a] = name
    return entry

  def register(self, name: str | Callable | None = None, *,
               aliases: Sequence[str] = ()) -> Any:
    """Decorator: `@reg.register`, `@reg.register("name")` or `@reg.register(aliases=(...))`.

    The name defaults to the decorated object's `__name__`.
    """
    if callable(name):  # bare @reg.register
      return self.add(name.__name__, name)

    def deco(entry):
      return self.add(name or entry.__name__, entry, aliases)

    return deco

  # ------------------------------------------------------------------------ looking up
  def _load_plugins(self) -> None:
    """Imports the plugin modules once. Other threads wait (the lock) until they are all in;
    a plugin that looks names up while it is imported sees the registry as it stands. A
    plugin that fails to import raises here, and the next lookup tries again (never a
    silently partial registry)."""
    if self._loaded:
      return
    with self._lock:
      if self._loaded or self._loading:
        return
      self._loading = True
      try:
        for module in self._plugins:
          importlib.import_module(module)
        self._loaded = True
      finally:
        self._loading = False

  def canonical(self, name: str) -> str:
    """The registered name behind `name` (itself or the name an alias points to)."""
    self._load_plugins()
    if name in self._entries:
      return name
    if name in self._aliases:
      return self._aliases[name]
    raise UnknownNameError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}")

  def get(self, name: str) -> T:
    """The entry registered under `name` (or an alias of it).

    Raises:
      UnknownNameError (a ValueError): `name` is not registered; the message lists the
        valid names.
    """
    return self._entries[self.canonical(name)]

  def names(self) -> tuple[str, ...]:
    """Registered names, sorted (aliases not included)."""
    self._load_plugins()
    return tuple(sorted(self._entries))

  def aliases(self) -> dict[str, str]:
    """{alias: name}."""
    self._load_plugins()
    return dict(self._aliases)

  def __contains__(self, name: object) -> bool:
    self._load_plugins()
    return name in self._entries or name in self._aliases

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self.names())

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}, {list(self.names())})"


def import_plugins(modules: str | Sequence[str], field: str = "config.plugins") -> None:
  """Imports a run's plugin modules (comma-separated or a sequence of dotted paths).

  Raises:
    ImportError: naming `field` and the module that did not import.
  """
  if isinstance(modules, str):
    modules = [m.strip() for m in modules.split(",")]
  for module in modules:
    if not module:
      continue
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ImportError(f"{field}: plugin module {module!r} did not import: {e!r}") from e


def setup_hooks(spec: str, field: str = "config.setup") -> list[Callable]:
  """The `package.module:function` hooks named in `spec` (comma-separated), imported now.

  Raises:
    ValueError: naming `field` and the hook that is malformed, does not import or is not
      callable.
  """
  hooks = []
  for item in (h.strip() for h in str(spec).split(",")):
    if not item:
      continue
    module, sep, attr = item.partition(":")
    if not (sep and module and attr):
      raise ValueError(f"{field}: {item!r} is not 'package.module:function'")
    try:
      fn = importlib.import_module(module)
      for part in attr.split("."):
        fn = getattr(fn, part)
    except (ImportError, AttributeError) as e:
      raise ValueError(f"{field}: hook {item!r} does not resolve: {e!r}") from e
    if not callable(fn):
      raise ValueError(f"{field}: hook {item!r} is not callable")
    hooks.append(fn)
  return hooks


def run_setup(config) -> None:
  """Calls each `config.setup` hook with the config: what a run needs built before it starts
  (runlocal's tiny model and data). `mr_rl.pipelines.run` calls it; `--dry_run` never does,
  so a dry run writes nothing."""
  for hook in setup_hooks(config.get("setup", "")):
    hook(config)


# What `mr_rl.main` runs, by `config.pipeline`: every pipeline is `fn(config, workdir)`. The
# registry lives in this leaf module so settings can check a pipeline name without importing
# the pipelines; the built-in ones (`train`, `tag`) register when `mr_rl.pipelines` is imported
# on the first lookup, plugins' (`config.plugins`, e.g. `demo`) when those are imported.
PIPELINES: Registry[Callable] = Registry("pipeline", plugins=("mr_rl.pipelines",))
