"""Multi-process runs: one process per host over one global mesh (Cloud TPU slices beyond one
host, multi-node GPU clusters, or several processes on one machine for debugging).

What every process does (docs/runs.md "Multi-process runs"):
- it runs the same program on the same data: every process iterates the same global batches
  (the iterator and all randomness are seeded, so they agree), encodes all B prompts and
  places them on the global mesh (a `device_put` of identical host values), so the sampler,
  the reference forward and the update step run as one SPMD program over all devices;
- rows are scored where they live: a process scores only the rows its devices hold
  (`owned_rows`; a row held by several processes, e.g. across a tensor-parallel axis, belongs
  to the lowest process index), so a host-side reward that depends on time or load is computed
  once per row; the rewards r[B, G, K] and the reward runner's counters are then gathered
  (`gather_rows`, `allgather`), and every decision taken on the host (the learning signal,
  dynamic sampling, the anchor election, the reward guards, a non-finite loss) is computed
  from the same global values on every process, so all take the same branch;
- outputs are written once, by process 0 (`is_primary`); checkpoints are written and read by
  all processes together (orbax).
A process that fails stops the others within `heartbeat_timeout_s`: the coordination service
notices the missing heartbeat and ends the rest instead of leaving them in a collective.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import numpy as np

HEARTBEAT_TIMEOUT_S = 20  # a dead process is noticed within this (jax's default: 100 s)
SHUTDOWN_TIMEOUT_S = 60


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S,
               shutdown_timeout_s: int = SHUTDOWN_TIMEOUT_S) -> None:
  """`jax.distributed.initialize`, before anything touches a device.

  With no arguments, jax detects the cluster (Cloud TPU, SLURM, Open MPI, ...); otherwise the
  three values (or the environment variables MR_RL_COORDINATOR_ADDRESS, MR_RL_NUM_PROCESSES,
  MR_RL_PROCESS_ID) describe a cluster by hand, e.g. several processes on one machine. On CPU
  the cross-process collectives run over gloo.
  """
  env = os.environ
  coordinator_address = coordinator_address or env.get("MR_RL_COORDINATOR_ADDRESS") or None
  if num_processes is None and env.get("MR_RL_NUM_PROCESSES"):
    num_processes = int(env["MR_RL_NUM_PROCESSES"])
  if process_id is None and env.get("MR_RL_PROCESS_ID"):
    process_id = int(env["MR_RL_PROCESS_ID"])
  manual = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in manual) and any(v is None for v in manual):
    raise ValueError("give all of --coordinator_address, --num_processes and --process_id (or "
                     "MR_RL_COORDINATOR_ADDRESS / MR_RL_NUM_PROCESSES / MR_RL_PROCESS_ID), or "
                     f"none of them for jax's cluster detection; got {manual}")
  if env.get("JAX_PLATFORMS", "").split(",")[0] == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             heartbeat_timeout_seconds=heartbeat_timeout_s,
                             shutdown_timeout_seconds=shutdown_timeout_s)


def is_primary() -> bool:
  """Whether this process writes the run's outputs (process 0)."""
  return jax.process_index() == 0


def to_host(x) -> np.ndarray:
  """The whole value of a jax array as numpy on this host (a cross-process gather when the
  array spans other processes' devices; every process must call it)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def owned_rows(sharding, n: int) -> np.ndarray:
  """bool [n]: the rows of an [n, ...] array placed with `sharding` (rows on axis 0) that this
  process is responsible for: those its devices hold, a row held by several processes (a
  replicated axis) going to the lowest process index."""
  owner = np.full((n,), np.iinfo(np.int32).max, np.int64)
  for device, index in sharding.devices_indices_map((n,)).items():
    rows = np.arange(n)[index[0]]
    owner[rows] = np.minimum(owner[rows], device.process_index)
  return owner == jax.process_index()


def allgather(tree) -> Any:
  """Each process's host values, stacked on a new leading axis [process_count, ...] (the same
  on every process). Identity with one process (the axis is still added)."""
  if jax.process_count() == 1:
    return jax.tree.map(lambda v: np.asarray(v)[None], tree)
  from jax.experimental import multihost_utils
  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree))


def gather_rows(values: np.ndarray, owned: np.ndarray) -> np.ndarray:
  """Rows computed where they are owned (`owned_rows`), assembled on every process: row i of
  the result is row i of the process that owns it."""
  if jax.process_count() == 1:
    return values
  all_values, all_owned = allgather((values, owned))
  if not (all_owned.sum(0) == 1).all():
    raise RuntimeError("gather_rows: every row must be owned by exactly one process")
  return all_values[all_owned.argmax(0), np.arange(values.shape[0])]


def sum_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
  """Per-process metrics summed over the processes (identity with one process); every process
  must pass the same keys."""
  if jax.process_count() == 1:
    return dict(metrics)
  keys = sorted(metrics)
  gathered = allgather(np.asarray([float(metrics[k]) for k in keys], np.float64))
  return dict(zip(keys, (float(v) for v in gathered.sum(0))))


def barrier(name: str) -> None:
  """Waits until every process has reached this point (no-op with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
