"""Paths inside the installed mr_rl package, written so that a run moves with its workdir.

The demo's base policy lives in the package (`mr_rl/demo/assets/base_policy`), so a run's
settings record would name the clone it was started from, and resuming or exporting the same
workdir from another clone (or another machine) would be refused as a changed `model.path`.
The record (`mr_rl.metrics.settings_dict`) writes such a path as `<mr_rl>/demo/assets/...`,
which `local` (and so `mr_rl.models.hf_io.resolve_path`) maps back to this installation.
"""

from __future__ import annotations

import os

PREFIX = "<mr_rl>/"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def portable(path: str) -> str:
  """`path` as `<mr_rl>/rel` when it lies inside this package (or, for a path recorded by
  another copy of mr_rl, inside a directory named mr_rl whose rest exists here); else as is."""
  if not isinstance(path, str) or not path or path.startswith(PREFIX):
    return path
  if os.path.isabs(path):
    real = os.path.realpath(path)
    if real.startswith(PACKAGE_DIR + os.sep):
      return PREFIX + os.path.relpath(real, PACKAGE_DIR).replace(os.sep, "/")
    marker = f"{os.sep}mr_rl{os.sep}"
    if marker in path:  # another clone's package: the same file if its rest exists here
      rest = path.rsplit(marker, 1)[1]
      if rest and os.path.exists(os.path.join(PACKAGE_DIR, rest)):
        return PREFIX + rest.replace(os.sep, "/")
  return path


def local(path: str) -> str:
  """A `<mr_rl>/rel` path as this installation's file; any other path as is."""
  if isinstance(path, str) and path.startswith(PREFIX):
    return os.path.join(PACKAGE_DIR, *path[len(PREFIX):].split("/"))
  return path
