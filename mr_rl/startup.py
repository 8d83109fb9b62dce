"""Checks of settings against what they run on (the model, the data, the devices), made before
the first step by `mr_rl.train.build` and, where no weights or data are needed, by `--dry_run`
(`mr_rl.config_lib.dry_run`). Each names the fields to change (docs/runs.md, "Refused at
start-up")."""

from __future__ import annotations

import math
import os
from typing import Mapping

from mr_rl.errors import ConfigError, DataError

BATCH_AXES = ("data", "fsdp", "expert")  # (mr_rl.models.sharding.BATCH_AXES)


def check_positions(s, max_seq_len: int, source: str) -> None:
  """A prompt of `data.max_prompt_len` tokens plus a response of `rollout.max_new_tokens` fit
  the model's `max_seq_len` positions (`max_position_embeddings` of `source`)."""
  total = s.data.max_prompt_len + s.rollout.max_new_tokens
  if total > max_seq_len:
    raise ConfigError(
        f"config.data.max_prompt_len={s.data.max_prompt_len} + config.rollout.max_new_tokens="
        f"{s.rollout.max_new_tokens} = {total} tokens, beyond the model's {max_seq_len} "
        f"positions (max_position_embeddings of {source}); lower them to a sum <= "
        f"{max_seq_len}")


def check_rows(s, n: int, where: str) -> None:
  """The training rows give at least one batch of `data.batch_prompts` prompts."""
  if n < s.data.batch_prompts:
    raise DataError(f"{where} has {n} rows, fewer than one batch of "
                    f"config.data.batch_prompts={s.data.batch_prompts}; give more rows or "
                    f"lower config.data.batch_prompts to <= {n}")


def local_rows(path: str) -> int | None:
  """The rows of a local `.jsonl` (non-blank lines) or `.csv` file (records after the header),
  or None for anything else (a loader may drop rows, never add them: an upper bound)."""
  ext = os.path.splitext(path)[1].lower()
  if not path or ext not in (".jsonl", ".csv") or not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8", errors="replace", newline="") as f:
    if ext == ".jsonl":
      return sum(1 for line in f if line.strip())
    import csv
    return max(0, sum(1 for rec in csv.reader(f) if any(rec)) - 1)


def mesh_shape(sizes: Mapping[str, int], n_devices: int) -> dict[str, int]:
  """`config.mesh` with its -1 axis filled from `n_devices` (ConfigError when the sizes do not
  make `n_devices`)."""
  shape = {k: int(v) for k, v in sizes.items()}
  known = math.prod(v for v in shape.values() if v != -1)
  fill = [k for k, v in shape.items() if v == -1]
  if fill and n_devices % known == 0:
    shape[fill[0]] = n_devices // known
  if math.prod(shape.values()) != n_devices:
    raise ConfigError(f"config.mesh={dict(sizes)} does not make the {n_devices} devices at "
                      "hand; give sizes whose product is the device count (one of them may be "
                      "-1: the rest)")
  return shape


def check_devices(s, n_devices: int) -> None:
  """The rollout rows `data.batch_prompts x rollout.group_size` of an engine that splits them
  (`EngineSpec.splits_rows`: the static one) split evenly over the mesh's batch axes
  (`config.mesh` on `n_devices` devices; one device: nothing to split)."""
  if n_devices <= 1:
    return
  shape = mesh_shape(s.mesh, n_devices)
  from mr_rl import rollout_engines
  if not rollout_engines.ENGINES.get(s.rollout.engine).splits_rows:
    return
  ways = math.prod(shape.get(a, 1) for a in BATCH_AXES)
  if s.rows % ways:
    raise ConfigError(
        f"the rollout rows config.data.batch_prompts x config.rollout.group_size = "
        f"{s.data.batch_prompts} x {s.rollout.group_size} = {s.rows} do not split over "
        f"{ways} ways (config.mesh {shape} on {n_devices} devices); make the product a "
        f"multiple of {ways}, or set config.mesh so its data, fsdp and expert sizes divide it")
