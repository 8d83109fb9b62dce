"""Reading raw rows from a local copy or the Hugging Face hub, and split helpers.

Resolution order: an explicit local `path` is used if given (and
must exist: a wrong path is an error, never a silent switch to the hub); otherwise
the hub id is read through `datasets` (which serves its local cache first and honours
`HF_DATASETS_OFFLINE=1` / `HF_HUB_OFFLINE=1`). A hub failure is re-raised as
`DatasetUnavailableError`, naming the hub id and the config field that points at a
local copy (`--config.data.path=...`, or `--config.data.eval_set_options.<set>.path=...`
for an evaluation set).

Local formats: a single `.json`/`.jsonl`/`.parquet`/`.csv` file (its rows are taken
as the requested split), a directory written by `Dataset.save_to_disk` /
`DatasetDict.save_to_disk`, or a directory holding a clone of the hub repository.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable, Sequence, TypeVar

from mr_rl.data.example import stable_hash
from mr_rl.errors import DataError, UserError

T = TypeVar("T")

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


class DatasetUnavailableError(UserError, FileNotFoundError):
  """Raised when a data set is neither at the given local path nor reachable on the hub."""


def hub_failure_message(name: str, hub_id: str, cause: BaseException | str) -> str:
  offline = any(os.environ.get(v, "0").upper() in ("1", "ON", "YES", "TRUE")
                for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))
  hint = (" Offline mode is on (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE) and the hub copy is not in"
          " the local cache." if offline else "")
  return (f"Data set {name!r} could not be loaded from the Hugging Face hub id {hub_id!r}"
          f" ({type(cause).__name__ if isinstance(cause, BaseException) else 'error'}: {cause})."
          f"{hint} Download it elsewhere and point at the local copy: as the run's data set"
          f" --config.data.path=PATH, as an evaluation set"
          f" --config.data.eval_set_options.{name}.path=PATH, in code"
          f" load_dataset({name!r}, path=PATH); a .json/.jsonl/.parquet/.csv file, a"
          f" save_to_disk directory or a clone of the hub repository all work.")


def _load_local(path: str, split: str, config_name: str | None, cache_dir: str | None):
  import datasets  # pylint: disable=g-import-not-at-top

  if os.path.isfile(path):
    ext = os.path.splitext(path)[1].lower()
    if ext not in _FILE_BUILDERS:
      raise DataError(f"path {path!r}: unsupported file type {ext!r}; expected one of "
                       f"{sorted(_FILE_BUILDERS)}")
    if ext in (".json", ".jsonl", ".csv") and _scan_text(path):
      raise DataError(f"data file {path!r} is empty")
    try:
      ds = datasets.load_dataset(_FILE_BUILDERS[ext], data_files=path, split="train",
                                 cache_dir=cache_dir)
    except Exception as e:  # pylint: disable=broad-except  (datasets / pyarrow errors)
      unwritable = _unwritable_cache(cache_dir)
      if unwritable:
        raise DataError(unwritable) from e
      raise DataError(f"data file {path!r} could not be read: {_file_problem(path, ext, e)}") \
          from e
    if len(ds) == 0:
      raise DataError(f"data file {path!r} has no rows")
    return ds
  if any(os.path.exists(os.path.join(path, f))
         for f in ("dataset_info.json", "state.json", "dataset_dict.json")):
    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
      if split not in ds:
        raise ValueError(f"split {split!r} not in the saved DatasetDict at {path!r} "
                         f"(has {sorted(ds)})")
      ds = ds[split]
    return ds
  return datasets.load_dataset(path, name=config_name, split=split, cache_dir=cache_dir)


def _unwritable_cache(cache_dir: str | None) -> str:
  """Why the `datasets` cache directory (`cache_dir`, else HF_DATASETS_CACHE's) cannot be
  written, or '' when it can."""
  import datasets  # pylint: disable=g-import-not-at-top
  d = os.path.expanduser(str(cache_dir or datasets.config.HF_DATASETS_CACHE))
  try:
    os.makedirs(d, exist_ok=True)
    if os.access(d, os.W_OK):
      return ""
    why = "not writable"
  except OSError as e:
    why = e.strerror or str(e)
  return (f"the datasets library's cache directory {d} cannot be made or written ({why}); the "
          "data file was not the problem: set HF_DATASETS_CACHE (or HF_HOME) to a writable "
          "directory")


def _scan_text(path: str, chunk_bytes: int = 1 << 20) -> bool:
  """Whether a text file holds nothing but whitespace, read once in chunks; bytes that are not
  UTF-8 raise ValueError naming the file, the line and the byte offset (before `datasets`
  reads it, which would fail only when that row is iterated, naming no file)."""
  blank, carry, offset, line, line_start = True, b"", 0, 1, 0
  with open(path, "rb") as f:
    while True:
      chunk = f.read(chunk_bytes)
      buf = carry + chunk
      try:
        buf.decode("utf-8")
        good, carry = len(buf), b""
      except UnicodeDecodeError as e:
        if chunk and e.reason == "unexpected end of data":  # a character cut by the chunk end
          good, carry = e.start, buf[e.start:]
        else:
          at = offset + e.start
          nl = buf.rfind(b"\n", 0, e.start)
          col = e.start - nl if nl >= 0 else at - line_start + 1
          bad_line = line + buf.count(b"\n", 0, e.start)
          raise DataError(
              f"data file {path!r} is not UTF-8 text: line {bad_line}, byte {col} of the line "
              f"(offset {at} in the file) holds {buf[e.start:e.end]!r} ({e.reason}); "
              f"re-encode the file as UTF-8") from None
      part = buf[:good]
      blank = blank and not part.strip()
      nl = part.rfind(b"\n")
      if nl >= 0:
        line, line_start = line + part.count(b"\n"), offset + nl + 1
      offset += good
      if not chunk:
        return blank


def _file_problem(path: str, ext: str, error: BaseException) -> str:
  """What is wrong with a local data file `datasets` failed on: for JSON, the first line
  (row) that does not parse; else the error (and its cause) as `datasets` reported it."""
  if ext in (".json", ".jsonl"):
    import json
    with open(path, encoding="utf-8", errors="replace") as f:
      text = f.read()
    try:
      json.loads(text)
      return f"{type(error).__name__}: {error}"  # one JSON document: not a parse problem
    except json.JSONDecodeError as whole:
      if ext == ".json" and text.lstrip().startswith("["):
        return f"invalid JSON at line {whole.lineno}, column {whole.colno}: {whole.msg}"
    for i, line in enumerate(text.splitlines(), 1):
      if line.strip():
        try:
          json.loads(line)
        except json.JSONDecodeError as e:
          return f"line {i} is not valid JSON (column {e.colno}: {e.msg}): {line[:120]!r}"
  cause = error.__cause__ or error.__context__
  return f"{type(error).__name__}: {error}" + (f" ({type(cause).__name__}: {cause})"
                                               if cause is not None else "")


def read_rows(name: str, hub_id: str, *, path: str | None = None, split: str = "train",
              config_name: str | None = None, cache_dir: str | None = None):
  """Returns a `datasets.Dataset` of raw rows for one split.

  Args:
    name: registry name (for error messages).
    hub_id: Hugging Face hub data set id used when `path` is None.
    path: local copy (see module docstring); must exist when given.
    split: split to read (ignored for a single local file, whose rows are the split).
    config_name: hub configuration (subset) name, if the data set has several.
    cache_dir: `datasets` cache directory (None: the library default).

  Raises:
    FileNotFoundError: `path` is given but does not exist.
    DatasetUnavailableError: no `path` and the hub id cannot be read (offline and not
      cached, unreachable, or unknown).
  """
  import datasets  # pylint: disable=g-import-not-at-top

  if path is not None:
    path = os.path.expanduser(os.fspath(path))
    if not os.path.exists(path):
      raise FileNotFoundError(f"path {path!r} for data set {name!r} does not exist")
    return _load_local(path, split, config_name, cache_dir)
  try:
    return datasets.load_dataset(hub_id, name=config_name, split=split, cache_dir=cache_dir)
  except (OSError, datasets.exceptions.DatasetsError) as e:  # ConnectionError is an OSError.
    raise DatasetUnavailableError(hub_failure_message(name, hub_id, e)) from e


def describe(hub_id: str, path: str | None) -> str:
  """Where a data set's rows came from, for messages: its local path or its hub id."""
  return f"file {path!r}" if path is not None else f"hub {hub_id!r}"


def row_place(hub_id: str, path: str | None, i: int) -> str:
  """Where row `i` (0-based, in file order) of a data set is, for messages: the line of a local
  `.csv` / `.jsonl` file where the row starts (blank lines and the CSV header counted, as an
  editor shows it), else the row's index counted from 0 and its source."""
  ext = os.path.splitext(path or "")[1].lower()
  if path is not None and ext in (".csv", ".jsonl") and os.path.isfile(path):
    with open(path, encoding="utf-8", newline="") as f:
      if ext == ".csv":
        import csv
        reader, start, n = csv.reader(f), 1, -1  # (row -1: the header)
        for rec in reader:
          if any(rec):
            if n == i:
              return f"line {start} of file {path!r}"
            n += 1
          start = reader.line_num + 1
      else:
        n = 0
        for line_no, line in enumerate(f, 1):
          if line.strip():
            if n == i:
              return f"line {line_no} of file {path!r}"
            n += 1
  return f"row {i} (counted from 0) of {describe(hub_id, path)}"


def require_columns(ds, columns: Iterable[str], name: str) -> None:
  """Raises ValueError naming the missing columns of `ds` (a `datasets.Dataset`)."""
  missing = [c for c in columns if c not in ds.column_names]
  if missing:
    raise DataError(f"data set {name!r} lacks columns {missing}; found {ds.column_names}")


def hash_order(items: Sequence[T], key: Callable[[T], Any], seed: int) -> list[T]:
  """`items` sorted by a seeded stable hash of `key(item)`: a deterministic shuffle.

  Unlike a permutation of row positions, the order (and hence any split or subset cut
  from a prefix) does not depend on the order of the rows in the source file.
  """
  return sorted(items, key=lambda it: (stable_hash(seed, key(it)), str(key(it))))


def dedupe(items: Iterable[T], key: Callable[[T], Any]) -> list[T]:
  """Keeps the first item of each `key` value, preserving order."""
  seen, out = set(), []
  for it in items:
    k = key(it)
    if k not in seen:
      seen.add(k)
      out.append(it)
  return out


def train_test_split(items: Sequence[T], key: Callable[[T], Any], *, train_fraction: float,
                     seed: int, split: str) -> list[T]:
  """Deterministic split: hash-order the items, the first floor(f*n) are `train`.

  With f = 0.8 this gives AMRP's 758/190 ASQA and 800/200 ELI5 splits (appendix B.1).
  """
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  ordered = hash_order(items, key, seed)
  n_train = math.floor(train_fraction * len(ordered))
  return ordered[:n_train] if split == "train" else ordered[n_train:]
