"""Where the tiny assets live and how they are built: the cache directory and atomic builds."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import tempfile
from typing import Callable

VERSION = "v1"  # bump when the files written here change (cache directories are keyed on it)


def cache_root() -> str:
  """`$MR_RL_CACHE` or `~/.cache/mr_rl` (the runlocal assets live under `asset_dir()`)."""
  return os.path.expanduser(os.environ.get("MR_RL_CACHE") or os.path.join("~", ".cache", "mr_rl"))


def family_spec(family: str):
  """The `mr_rl.models.families` spec of `family` (imported here, not when mr_rl.tiny_assets is:
  a test's `xla_env` must come before jax).

  Raises:
    ValueError: `family` is not registered (the message lists the registered ones).
  """
  from mr_rl.models import families
  return families.FAMILIES.get(family)


def _fixture_sources() -> list[str]:
  """This package's files and the model families' (their tiny fixtures are built here)."""
  here = os.path.dirname(os.path.abspath(__file__))
  families_dir = os.path.join(os.path.dirname(here), "models", "families")
  return sorted(glob.glob(os.path.join(here, "*.py"))) + \
      sorted(glob.glob(os.path.join(families_dir, "*.py")))


def asset_dir(root: str | None = None) -> str:
  """`<root>/tiny-<VERSION>-<hash of the fixture sources>` (this package's files and the
  model families', `_fixture_sources`): any change to them invalidates cached assets."""
  digest = hashlib.sha256()
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for path in _fixture_sources():
    with open(path, "rb") as f:
      digest.update(os.path.relpath(path, package).encode() + b"\0" + f.read())
  return os.path.join(root or cache_root(), f"tiny-{VERSION}-{digest.hexdigest()[:10]}")


def build_once(directory: str, build: Callable[[str], None]) -> str:
  """Runs `build(tmp)` in a private directory and renames it to `directory` (idempotent)."""
  directory = os.path.abspath(os.path.expanduser(directory))
  if os.path.exists(os.path.join(directory, ".done")):
    return directory
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".build-", dir=parent)
  try:
    build(tmp)
    with open(os.path.join(tmp, ".done"), "w") as f:
      f.write(VERSION)
    try:
      os.rename(tmp, directory)
    except OSError:
      if not os.path.exists(os.path.join(directory, ".done")):
        raise FileExistsError(f"{directory} exists but is not a finished tiny asset directory; "
                              "remove it and retry")
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  return directory
