"""orbax checkpoints of everything a run needs to continue exactly where it stopped.

One checkpoint per saved step under WORKDIR/checkpoints/<step>/ with two items:
  * `state`: the pytree {train_state (params, optimiser, step; sharded arrays are written per
    shard), aggregator state and root PRNG key (host values)} saved with StandardSave;
  * `meta`: JSON host state {step, data iterator position, shortcut-alarm history, reward
    error counts, the run's settings}.
orbax writes each step to a temporary directory and renames it when complete, so a run
killed mid-save leaves the previous checkpoint intact; `latest_step` only sees finished ones.
A finished checkpoint that cannot be read (a truncated or deleted file) is skipped by
`restore_latest`, which says which one and why and moves it aside with its files
(`checkpoints/unreadable-<step>`), so the run saves that step again. With several processes
every process saves and restores its own shards of the same checkpoint.

A state is saved only when every float in its train state is finite (`nonfinite_leaves`; the
trainer stops naming the step and the leaves otherwise), so a diverged update never evicts a
good checkpoint; `restore_latest` skips a checkpoint whose train state is not finite (one
written before this check existed, or by hand) and takes the newest finite one.

Resuming checks the settings (`check_resume`): a resumed run whose settings differ from the
checkpoint's in anything but `RESUMABLE` stops and lists the fields.

Layout: decoder blocks are stacked over layers ({'layers': [L, ...]}, the layer scan). A
checkpoint written before the scan holds them per layer ('layers_0', 'layers_1', ...; params,
LoRA adapters and their Adam moments alike): `restore` reads it in that layout and stacks it,
bit for bit, so such a run resumes where it stopped.
"""

from __future__ import annotations

import logging
import os
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from mr_rl import compilation, distributed, package_paths
from mr_rl.errors import ConfigError
from mr_rl.models.transformer import stack_layers, unstack_layers

_LOG = logging.getLogger(__name__)

# Settings a resumed run may change: how long it runs, how it logs, evaluates and exports, and
# how it resumes. Everything else changes what the run computes (data, model, rewards, method,
# optimiser, sampling, mesh, seed), so a resume with other values is refused.
RESUMABLE = ("total_steps", "checkpoint_every", "log_every", "kl_ref_every", "alarm_window",
             "eval", "logging", "export", "compile", "resume")


# Settings added after runs were recorded without them, with the value that computes what those
# runs computed: a checkpoint that lacks one of them resumes under that value.
ADDED = {"model.compute_dtype": "", "model.attention_impl": "auto", "batch.column_buckets": 0,
         "data.style": ""}
# Settings recorded under another name by older runs: {old name: current name}.
# (engine options: mr_rl.rollout_engines)
MOVED = {"rollout.slots": "rollout.engine_options.slots"}


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


@jax.jit
@functools.partial(compilation.program, "finite_check")
def _all_finite(leaves):
  return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def nonfinite_leaves(tree: Any) -> list[str]:
  """The paths of the floating-point leaves of `tree` that hold a NaN or an inf (reduced where
  the leaves live, one bool per leaf to the host; every process must call it)."""
  leaves = [(jax.tree_util.keystr(path), x)
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  if not leaves:
    return []
  ok = distributed.to_host(_all_finite(tuple(x for _, x in leaves)))
  return [path for (path, _), fine in zip(leaves, ok) if not fine]


class NonFiniteStateError(FloatingPointError):
  """A state to save holds a NaN or an inf: it is not saved (it would evict a good one)."""


def check_resume(saved: Mapping | None, current: Mapping, directory: str) -> None:
  """Raises ConfigError (a ValueError) listing the settings (`mr_rl.metrics.settings_dict`
  form) that differ
  between a checkpoint and the run resuming it, outside `RESUMABLE`."""
  if saved is None:  # a checkpoint written before settings were recorded
    _LOG.warning("checkpoint in %s records no settings; resuming without checking them",
                 directory)
    return
  a, b = {**ADDED, **flatten(saved)}, flatten(current)
  for old, new in MOVED.items():
    if old in a and new not in a:
      a[new] = a.pop(old)
  if "model.path" in a:  # (a record of an older mr_rl named the clone it ran from)
    a["model.path"] = package_paths.portable(a["model.path"])
  allowed = lambda k: k.split(".")[0] in RESUMABLE
  diff = sorted(k for k in set(a) | set(b) if not allowed(k) and a.get(k) != b.get(k))
  changed = [k for k in diff if k in a]
  added = [k for k in diff if k not in a]  # fields this mr_rl has and the checkpoint's lacks
  if diff:
    lines = "\n".join(f"  {k}: {a[k]!r} -> {b.get(k, '(unset)')!r}" for k in changed)
    text = (f"Differing fields (checkpoint -> now):\n{lines}\nUse a new workdir, or set these "
            f"back. " if changed else "")
    if added:
      text += (f"Fields this version of mr_rl has that the checkpoint's version did not record "
               f"(now): {', '.join(f'{k}={b[k]!r}' for k in added)}; which value reproduces "
               f"that run is not known, so resume it with the mr_rl version that wrote it, or "
               f"start a new workdir. ")
    raise ConfigError(
        f"the checkpoint in {directory} was written with other settings; resuming with these "
        f"would train a different run. {text}Fields a resume may change: "
        f"{', '.join(RESUMABLE)}")


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
    """Saves `state` as checkpoint `step` (a step already saved is left as it is: preemption
    right after a save).

    Raises:
      NonFiniteStateError: `state['train']` holds a NaN or an inf (nothing is written).
    """
    if step in self._mngr.all_steps():
      return
    bad = nonfinite_leaves(_train_part(state))
    if bad:
      raise NonFiniteStateError(
          f"the train state after step {step} holds NaN or inf in {len(bad)} arrays "
          f"({', '.join(bad[:4])}{', ...' if len(bad) > 4 else ''}); not saved, so the "
          f"checkpoints in {self.directory} stay the last finite ones (lower the learning "
          f"rate or check the rewards and the loss of the steps before it)")
    self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                  meta=ocp.args.JsonSave(meta)))
    self._mngr.wait_until_finished()

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restores `step` into the structure, shapes and shardings of `abstract_state` (a
    checkpoint of the per-layer layout is converted, module docstring)."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    per_layer = self._per_layer(step)
    if per_layer:
      target = unstack_layers(target, per_layer)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    state = out["state"]
    if per_layer:
      _LOG.warning("checkpoint %s holds the per-layer layout of an older mr_rl; converted to "
                   "the stacked layout", os.path.join(self.directory, str(step)))
      state = stack_layers(state, per_layer)
    return state, dict(out["meta"])

  def state_metadata(self, step: int):
    """The tree of the `state` item of checkpoint `step` (shapes and dtypes, nothing read)."""
    handler = ocp.PyTreeCheckpointHandler()
    try:
      return handler.metadata(epath.Path(self.directory) / str(step) / "state").tree
    finally:
      handler.close()

  def _per_layer(self, step: int) -> int:
    """The layer count of a checkpoint in the per-layer layout ('layers_0', ...), else 0."""
    try:
      tree = self.state_metadata(step)
    except Exception:  # pylint: disable=broad-except  # no metadata: restore reports the error
      return 0
    names = set()
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
      for k in path:
        name = str(getattr(k, "key", getattr(k, "name", "")))
        if name.startswith("layers_") and name[7:].isdigit():
          names.add(int(name[7:]))
    return max(names) + 1 if names else 0

  def restore_latest(self, abstract_state: Any, log=None) -> tuple[Any, dict] | None:
    """The newest checkpoint that reads back whole and finite, or None if there is none.

    A checkpoint that fails to restore (missing or truncated files, corrupt metadata, a train
    state holding NaN or inf) is skipped with a message naming it and the error, and moved
    aside with its files (`unreadable_name`), so its step is saved again. If every checkpoint
    fails, that is an error naming each (a run never silently restarts from scratch).
    """
    failures, bad = [], []
    for step in sorted(self._mngr.all_steps(), reverse=True):
      path = os.path.join(self.directory, str(step))
      try:
        state, meta = self.restore(step, abstract_state)
        if int(meta["step"]) != step:
          raise ValueError(f"its meta says step {meta['step']}")
        nonfinite = nonfinite_leaves(_train_part(state))
        if nonfinite:
          raise NonFiniteStateError(
              f"its train state holds NaN or inf ({', '.join(nonfinite[:4])})")
      except Exception as e:  # pylint: disable=broad-except  # reported, then the next one
        msg = f"skipping checkpoint {path}: it cannot be restored ({type(e).__name__}: {e})"
        failures.append(msg)
        bad.append(step)
        continue
      self._set_aside(bad, failures, log)
      return state, meta
    if failures:
      raise RuntimeError("no checkpoint in " + self.directory + " can be restored:\n" +
                         "\n".join(failures))
    return None

  def _set_aside(self, steps: list[int], messages: list[str], log) -> None:
    """Moves the unreadable checkpoints `steps` to `unreadable_name` (process 0 renames; every
    process waits for it and reloads the step list), logging each with its message."""
    for step, msg in zip(steps, messages):
      moved = unreadable_name(self.directory, step)
      if distributed.is_primary():
        epath.Path(self.directory, str(step)).rename(moved)
      msg += f"; moved to {moved} (its files kept), so step {step} is saved again"
      _LOG.warning(msg)
      if log:
        log(msg)
    if steps:
      distributed.barrier("mr_rl.checkpointing.set_aside")
      self._mngr.reload()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()


def unreadable_name(directory: str, step: int) -> str:
  """Where checkpoint `step` of `directory` goes when it does not read back: a name orbax does
  not take for a step (`unreadable-<step>`, `-2`, ... when taken)."""
  base, n = os.path.join(directory, f"unreadable-{step}"), 1
  out = base
  while epath.Path(out).exists():
    n += 1
    out = f"{base}-{n}"
  return out


def _train_part(state: Any) -> Any:
  """What must be finite in a saved state: the train state (params, optimiser) of the trainer's
  {'train', 'agg', 'key'} dict (aggregator statistics may hold NaN: a channel that does not
  apply), or the whole state otherwise."""
  return state["train"] if isinstance(state, Mapping) and "train" in state else state
