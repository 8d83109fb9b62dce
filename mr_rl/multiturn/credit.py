"""Per-turn credit (an option; trajectory-level GRPO is the default): turn rewards placed on
each turn's last token, with per-turn group-relative advantages.

Shape letters (docs/shapes.md): B prompts, G trajectories per prompt, S response columns.

For turn j of trajectory g, u[g, j] = sum_k w_k * r_k(step after turn j) (a turn without a
step, the last turn of a budget-cut trajectory, has none). Turn advantages are normalised
within the group at the same turn index: a[g, j] = (u[g, j] - mean_g u[., j]) / (std + eps)
over the trajectories that have turn j (0 where fewer than two have it). A token of turn i
gets the trajectory advantage A[b, g] plus the reward-to-go of turn advantages,
sum_{j >= i} a[g, j] (rewards on a turn's last token, undiscounted). Observation tokens keep
whatever value here; their loss mask is 0.

Bias (docs/multiturn.md): the baseline of turn j is the group's mean at the same turn index,
but trajectories reach turn j from different histories, so it is not a state-dependent
baseline and the per-turn term is a biased estimate of the turn's advantage (it favours
turns that follow easy histories); trajectories with fewer turns get fewer terms, so the
option also rewards or penalises length through the count of terms.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from mr_rl.multiturn.rollout import Trajectory


def turn_rewards(trajs: Sequence[Trajectory], weights: Mapping[str, float]) -> list[list[float]]:
  """u[n][j], the weighted step reward after each policy turn that had a step."""
  return [[sum(w * r.get(k, 0.0) for k, w in weights.items()) for r in t.turn_rewards]
          for t in trajs]


def per_turn_advantages(trajs: Sequence[Trajectory], A_BG, weights: Mapping[str, float], *,
                        group_size: int, max_new_tokens: int, eps: float = 1e-6) -> np.ndarray:
  """Per-token advantages [B, G, S] (module docstring) for `make_batch(advantages_BG=...)`."""
  A_BG = np.asarray(A_BG, np.float32)
  B, G, S = A_BG.shape[0], group_size, max_new_tokens
  u = turn_rewards(trajs, weights)
  out = np.zeros((B * G, S), np.float32)
  for b in range(B):
    rows = range(b * G, (b + 1) * G)
    depth = max((len(u[n]) for n in rows), default=0)
    a = np.zeros((G, depth), np.float32)
    for j in range(depth):
      have = [n for n in rows if len(u[n]) > j]
      if len(have) < 2:
        continue
      vals = np.array([u[n][j] for n in have], np.float32)
      norm = (vals - vals.mean()) / (vals.std() + eps)
      for n, v in zip(have, norm):
        a[n - b * G, j] = v
    to_go = np.cumsum(a[:, ::-1], axis=1)[:, ::-1]  # sum over turns j >= i
    for g, n in enumerate(rows):
      t = trajs[n]
      out[n] = A_BG[b, g]
      if t.tokens is None:
        continue
      cols = np.arange(len(t.tokens))
      turn_of = np.searchsorted(np.asarray(t.turn_ends), cols, side="left")  # turn per column
      extra = np.zeros((len(t.tokens),), np.float32)
      inside = turn_of < depth
      extra[inside] = to_go[g, turn_of[inside]]
      out[n, :len(t.tokens)] += extra
  return out.reshape(B, G, S)


def turn_weights(settings) -> dict[str, float]:
  """`multiturn.turn_weights`, or 1 for each environment channel of the run's rewards."""
  given = dict(settings.multiturn.turn_weights)
  if given:
    return {k: float(v) for k, v in given.items()}
  from mr_rl.multiturn import channels  # pylint: disable=import-outside-toplevel
  r = settings.rewards
  return {r.channels[k]: 1.0 for k in channels.environment_channels(r)}
