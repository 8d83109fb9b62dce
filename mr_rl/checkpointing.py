"""orbax checkpoints of everything a run needs to continue exactly where it stopped.

One checkpoint per saved step under WORKDIR/checkpoints/<step>/ with two items:
  * `state`: the pytree {train_state (params, optimiser, step; sharded arrays are written per
    shard), aggregator state and root PRNG key (host values)} saved with StandardSave;
  * `meta`: JSON host state {step, data iterator position, shortcut-alarm history, reward
    error counts, the run's settings}.
orbax writes each step to a temporary directory and renames it when complete, so a run
killed mid-save leaves the previous checkpoint intact; `latest_step` only sees finished ones.
A finished checkpoint that cannot be read (a truncated or deleted file) is skipped by
`restore_latest`, which says which one and why and leaves it on disk. With several processes
every process saves and restores its own shards of the same checkpoint.

Resuming checks the settings (`check_resume`): a resumed run whose settings differ from the
checkpoint's in anything but `RESUMABLE` stops and lists the fields.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp

_LOG = logging.getLogger(__name__)

# Settings a resumed run may change: how long it runs, how it logs, evaluates and exports.
# Everything else changes what the run computes (data, model, rewards, method, optimiser,
# sampling, mesh, seed), so a resume with other values is refused.
RESUMABLE = ("total_steps", "checkpoint_every", "log_every", "kl_ref_every", "alarm_window",
             "eval", "logging", "export")


def flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
  """{"a.b.c": value} of a nested dict."""
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, Mapping) and v:
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out


def check_resume(saved: Mapping | None, current: Mapping, directory: str) -> None:
  """Raises ValueError listing the settings (`mr_rl.metrics.settings_dict` form) that differ
  between a checkpoint and the run resuming it, outside `RESUMABLE`."""
  if saved is None:  # a checkpoint written before settings were recorded
    _LOG.warning("checkpoint in %s records no settings; resuming without checking them",
                 directory)
    return
  a, b = flatten(saved), flatten(current)
  allowed = lambda k: k.split(".")[0] in RESUMABLE
  diff = sorted(k for k in set(a) | set(b) if not allowed(k) and a.get(k) != b.get(k))
  if diff:
    lines = "\n".join(f"  {k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}"
                      for k in diff)
    raise ValueError(
        f"the checkpoint in {directory} was written with other settings; resuming with these "
        f"would train a different run. Differing fields (checkpoint -> now):\n{lines}\n"
        f"Use a new workdir, or set these back. Fields a resume may change: {', '.join(RESUMABLE)}")


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager with the two items above."""

  def __init__(self, workdir: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    self._mngr = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                                             create=True),
        item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    """The steps of the finished checkpoints on disk."""
    return list(self._mngr.all_steps())

  def save(self, step: int, state: Any, meta: dict) -> None:
    if step in self._mngr.all_steps():  # already saved (e.g. preemption right after a save)
      return
    self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                  meta=ocp.args.JsonSave(meta)))
    self._mngr.wait_until_finished()

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restores `step` into the structure, shapes and shardings of `abstract_state`."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    return out["state"], dict(out["meta"])

  def restore_latest(self, abstract_state: Any, log=None) -> tuple[Any, dict] | None:
    """The newest checkpoint that reads back whole, or None if there is none.

    A checkpoint that fails to restore (missing or truncated files, corrupt metadata) is
    skipped with a message naming it and the error; it stays on disk. If every checkpoint
    fails, that is an error naming each (a run never silently restarts from scratch).
    """
    failures = []
    for step in sorted(self._mngr.all_steps(), reverse=True):
      path = os.path.join(self.directory, str(step))
      try:
        state, meta = self.restore(step, abstract_state)
        if int(meta["step"]) != step:
          raise ValueError(f"its meta says step {meta['step']}")
      except Exception as e:  # pylint: disable=broad-except  # reported, then the next one
        msg = f"skipping checkpoint {path}: it cannot be restored ({type(e).__name__}: {e})"
        _LOG.warning(msg)
        if log:
          log(msg)
        failures.append(msg)
        continue
      return state, meta
    if failures:
      raise RuntimeError("no checkpoint in " + self.directory + " can be restored:\n" +
                         "\n".join(failures))
    return None

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()
