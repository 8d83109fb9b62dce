"""Pickling what goes to a reward worker: refused early when it refers to ``__main__``, which
the workers never import (``mr_rl.rewards.process.pool``)."""

from __future__ import annotations

import io
import pickle
import types
from typing import Any


class _ImportablePickler(pickle.Pickler):
  """Pickler that refuses objects of ``__main__`` (the workers never import it)."""

  def persistent_id(self, obj: Any) -> None:
    if isinstance(obj, (types.FunctionType, type)) and obj.__module__ == "__main__":
      raise pickle.PicklingError(
          f"{obj.__qualname__} is defined in __main__; reward workers never import the "
          f"caller's __main__, so functions and classes sent to them must live in an "
          f"importable module")
    return None


def dumps_importable(obj: Any) -> bytes:
  """Pickles `obj` for a worker process.

  Raises:
    pickle.PicklingError: `obj` does not pickle or refers to ``__main__``.
  """
  buf = io.BytesIO()
  try:
    _ImportablePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
  except pickle.PicklingError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (TypeError, AttributeError, ...)
    raise pickle.PicklingError(f"cannot pickle {obj!r} for a worker process: {e!r}") from e
  return buf.getvalue()
