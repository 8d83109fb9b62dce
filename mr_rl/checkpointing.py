"""orbax checkpoints of everything a run needs to continue exactly where it stopped.

One checkpoint per saved step under WORKDIR/checkpoints/<step>/ with two items:
  * `state`: the device pytree {train_state (params, optimiser, step), aggregator state,
    root PRNG key} saved with StandardSave (sharded arrays are written per shard);
  * `meta`: JSON host state {step, data iterator position, shortcut-alarm history, reward
    error counts}.
orbax writes each step to a temporary directory and renames it when complete, so a run
killed mid-save leaves the previous checkpoint intact; `latest_step` only sees finished ones.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


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

  def save(self, step: int, state: Any, meta: dict) -> None:
    self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                  meta=ocp.args.JsonSave(meta)))
    self._mngr.wait_until_finished()

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restores `step` into the structure, shapes and shardings of `abstract_state`."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    return out["state"], dict(out["meta"])

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()
