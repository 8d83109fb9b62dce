"""DAPO dynamic sampling: keep only groups with a learning signal (Yu et al. 2025, DAPO, Eq. 11).

A group whose rewards are all equal (or that holds fewer than two valid values) gets an
all-zero group-relative advantage (`mr_rl.rl.advantages`): it costs a full update and moves
nothing but the normalisers. DAPO over-samples and drops such groups until the batch is full
of groups with signal. Which signal decides in a multi-reward run (`SIGNALS`):

* `scalar`: the aggregated reward R[B, G] (what GRPO / Dr.GRPO / RLOO normalise);
* `channels`: any channel of r[B, G, K] (GDPO / MO-GRPO normalise each channel within its
  group, so a group with any non-constant channel has a non-zero advantage);
* `auto`: `channels` for estimators that read the reward profile
  (`mr_rl.rl.advantages.uses_channels`), else `scalar`.

The trainer (`mr_rl.train`) samples rounds of `data.batch_prompts` prompts, the first with
the step's rollout key and round i with `fold_in(key, i)`, and keeps the groups with signal
in the order drawn: `refill` samples up to `max_rounds` extra rounds until B groups are kept
(surplus groups are dropped, as in DAPO), `shrink` takes what the first round kept. Slots left
empty are filled with dropped groups whose responses are masked out of the loss, so the
update keeps its shapes and trains on the kept groups alone. Stateful aggregators (AMRP, DRBO,
Lagrangian) advance once per step, on the kept groups: the `scalar` decision of every round
uses the aggregator applied with the step's starting state, without committing it.

Shape letters (docs/shapes.md): B prompts (groups), G responses per group, K reward channels.
"""

from __future__ import annotations

import numpy as np

MODES = ("off", "refill", "shrink")
SIGNALS = ("auto", "scalar", "channels")


def _nonconstant(x, axis: int) -> np.ndarray:
  """Along `axis`: at least two valid (non-NaN) values and not all equal."""
  x = np.asarray(x, np.float64)
  valid = ~np.isnan(x)
  hi = np.where(valid, x, -np.inf).max(axis)
  lo = np.where(valid, x, np.inf).min(axis)
  return (valid.sum(axis) >= 2) & (hi > lo)


def scalar_signal(R_BG) -> np.ndarray:
  """bool [B]: the group's aggregated rewards vary (a non-zero GRPO-family advantage)."""
  return _nonconstant(R_BG, 1)


def channel_signal(r_BGK) -> np.ndarray:
  """bool [B]: some channel varies within the group (a non-zero GDPO / MO-GRPO advantage)."""
  return _nonconstant(r_BGK, 1).any(-1)


def resolve_signal(signal: str, advantage_uses_channels: bool) -> str:
  """'scalar' or 'channels' for a configured `signal` (see the module docstring; the
  settings check it is one of `SIGNALS`, `mr_rl.settings.DynamicSamplingSettings`)."""
  if signal == "auto":
    return "channels" if advantage_uses_channels else "scalar"
  return signal


def fill(kept: list[tuple[int, int]], dropped: list[tuple[int, int]],
         batch_prompts: int) -> tuple[list[tuple[int, int]], int]:
  """The B groups of the update and how many of them carry the loss.

  Args:
    kept: (round, prompt) of the groups with signal, in the order drawn.
    dropped: (round, prompt) of the groups without, in the order drawn.
    batch_prompts: B.

  Returns:
    (picks, n_kept): the first min(B, len(kept)) kept groups, then dropped groups for the
    slots left (their loss is masked); n_kept = the number of kept groups among the picks.
  """
  picks = list(kept[:batch_prompts])
  n_kept = len(picks)
  picks += dropped[:batch_prompts - n_kept]
  if len(picks) != batch_prompts:
    raise ValueError(f"dynamic sampling has {len(picks)} groups for a batch of {batch_prompts}")
  return picks, n_kept
