"""What the benchmark scripts share about their results: the machine's load average (on a shared
CPU every figure scales with it) and the `--json` file a run writes its results to."""

from __future__ import annotations

import json
import os


def load_avg() -> list[float]:
  """The 1, 5 and 15 minute load averages, rounded to 2 decimals."""
  return [round(x, 2) for x in os.getloadavg()]


def write_json(res: dict, path: str | None, *, indent: int = 1, announce: bool = False) -> dict:
  """Writes `res` to `path` as JSON when a path is given (`--json`); with `announce`, prints
  where. Returns `res`, so a benchmark's main() ends with `return report.write_json(res, a.json)`.
  """
  if path:
    with open(path, "w") as f:
      json.dump(res, f, indent=indent)
    if announce:
      print(f"wrote {path}")
  return res
