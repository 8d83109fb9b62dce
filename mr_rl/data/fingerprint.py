"""The fingerprint of a run's training rows, and the resume check that compares it.

A checkpoint records the data iterator's position `(epoch, index, seed)`: a position in the
list of training examples. That position means the same thing only over the same rows, so the
checkpoint also records `fingerprint(rows)` (`{"sha256", "rows", "source"}`). A resumed run
computes the fingerprint of the rows it loaded and `restore_position` refuses a mismatch,
naming both fingerprints, the row counts and the data source, unless
`config.resume.allow_data_change` says the change is meant (then a warning is logged and the
saved position is kept, or moved to the start of the next epoch if the new rows end before it).

The hash is sha256 over a canonical JSON serialisation of each example (uid, data set, turns,
reference, metadata; keys sorted, each row length-prefixed), in the order the iterator draws
from, so it is the same in every process and on every machine and changes with any row's text,
order or count. It is computed once per run from the loaded rows (docs/runs.md, "Data checks
and the fingerprint").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any, Callable, Mapping, Sequence

from mr_rl.errors import DataError

_LOG = logging.getLogger(__name__)

FINGERPRINT_KEY = "data_fingerprint"  # where a checkpoint's meta holds the fingerprint
_SHOWN = 12  # hex digits of a fingerprint shown in messages


def _plain(value: Any) -> Any:
  """JSON-ready value: mappings with str keys, tuples as lists, numpy scalars as Python ones,
  dataclasses (a code problem's `CodeTestSpec`) as their type name and fields."""
  if isinstance(value, Mapping):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if hasattr(value, "tolist"):  # numpy scalars and arrays
    return _plain(value.tolist())
  if value is None or isinstance(value, (str, bool, int, float)):
    return value
  if dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. a CodeTestSpec
    return {"__type__": type(value).__name__,
            **{f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
  if isinstance(value, (bytes, bytearray)):
    return {"__bytes__": bytes(value).hex()}
  if isinstance(value, (set, frozenset)):
    return sorted((_plain(v) for v in value), key=repr)
  raise TypeError(f"cannot fingerprint a value of type {type(value).__name__}: {value!r}")


def _row_bytes(ex: Any) -> bytes:
  if hasattr(ex, "messages") and hasattr(ex, "uid"):  # a mr_rl.data.Example
    row = {"uid": ex.uid, "dataset": ex.dataset, "messages": ex.messages,
           "reference": ex.reference, "metadata": ex.metadata}
  else:
    row = ex
  return json.dumps(_plain(row), sort_keys=True, ensure_ascii=False, allow_nan=True,
                    separators=(",", ":")).encode("utf-8")


def fingerprint(examples: Sequence[Any], source: str) -> dict[str, Any]:
  """`{"sha256": hex digest, "rows": count, "source": source}` of the rows, in their order.

  Args:
    examples: the rows the data iterator draws from (`mr_rl.data.Example`s, or JSON values).
    source: where they came from, for messages (e.g. "data set 'math500' (file 'x.jsonl')").
  """
  h = hashlib.sha256()
  for ex in examples:
    b = _row_bytes(ex)
    h.update(len(b).to_bytes(8, "big"))
    h.update(b)
  return {"sha256": h.hexdigest(), "rows": len(examples), "source": source}


def describe_source(data_settings, split: str | None = None) -> str:
  """`config.data`'s rows for messages: "data set 'math500' (file 'x.jsonl')[, split 'train']"."""
  from mr_rl.data import registry, sources  # pylint: disable=g-import-not-at-top
  d = data_settings
  hub = registry.hub_id(d.name) if d.name in registry.DATASETS.names() else ""
  where = f" ({sources.describe(hub, d.path or None)})" if d.path or hub else ""
  return f"data set {d.name!r}{where}" + (f", split {split!r}" if split is not None else "")


class DataChangedError(DataError):
  """The rows a resumed run loaded are not the rows its checkpoint was trained on."""


def _show(fp: Mapping[str, Any]) -> str:
  return f"{fp['sha256'][:_SHOWN]}.. ({fp['rows']} rows, {fp['source']})"


def restore_position(data_iter, meta: Mapping[str, Any], now: Mapping[str, Any],
                     allow_change: bool, directory: str,
                     log: Callable[[str], None] | None = None) -> None:
  """Moves `data_iter` to the checkpoint's data position after checking its rows.

  Args:
    data_iter: the run's `ResumableIterator` over the rows fingerprinted as `now`.
    meta: the checkpoint's meta (`data`: the position; `data_fingerprint`: the rows', absent
      in checkpoints written before fingerprints were recorded).
    now: `fingerprint(...)` of the rows this run loaded.
    allow_change: `config.resume.allow_data_change`.
    directory: the checkpoint directory (messages).
    log: the run's console log (None: the logging module only).

  Raises:
    DataChangedError: the fingerprints differ and `allow_change` is False.
  """
  def say(msg):
    _LOG.warning(msg)
    if log:
      log(msg)

  saved = meta.get(FINGERPRINT_KEY)
  position = dict(meta["data"])
  if saved is None:
    say(f"the checkpoint in {directory} records no data fingerprint (written before they "
        f"were); resuming at its data position without checking the rows "
        f"(now {_show(now)})")
  elif saved["sha256"] != now["sha256"]:
    if not allow_change:
      raise DataChangedError(
          f"the training rows differ from those the checkpoint in {directory} was trained on: "
          f"checkpoint {_show(saved)}, now {_show(now)}. Its data position (epoch "
          f"{position['epoch']}, example {position['index']}) would point into other rows. "
          f"Point config.data back at the same rows, use a new workdir, or continue on the "
          f"new rows with --config.resume.allow_data_change=True.")
    say(f"config.resume.allow_data_change: the training rows changed since the checkpoint in "
        f"{directory} (checkpoint {_show(saved)}, now {_show(now)}); continuing at its data "
        f"position over the new rows")
    if position["index"] > data_iter.usable:
      say(f"the saved data position (epoch {position['epoch']}, example {position['index']}) "
          f"is past the {data_iter.usable} usable rows of an epoch now; continuing at the "
          f"start of epoch {position['epoch'] + 1}")
      position.update(epoch=position["epoch"] + 1, index=0)
  data_iter.restore(position)
