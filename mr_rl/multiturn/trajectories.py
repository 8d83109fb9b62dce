"""Finished trajectories as the learner's rollout, their rewards and metrics.

Shape letters (docs/shapes.md): B prompts, G trajectories per prompt, K reward channels,
P prompt columns, S response columns.

Token-in/token-out: `to_rollout` copies each trajectory's ids and log-probs as the slot held
them (sampled and inserted observation ids); `policy_mask_BGS` is 0 on the observations, so
`mr_rl.rl.batch.make_batch(..., policy_mask_BGS=...)` trains on the sampled ids only while
the model still attends to the observations. Rewards read `policy_text`, the policy's own
ids; environment channels are reduced over steps in `mr_rl.multiturn.channels`.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from mr_rl.multiturn.rollout import Trajectory, TurnStats
from mr_rl.rollout import Rollout


def to_rollout(trajs: Sequence[Trajectory], prompt_tokens_BP, prompt_mask_BP, *, group_size: int,
               max_new_tokens: int, decode: Callable[[Sequence[int]], str], pad_id: int = 0
               ) -> tuple[Rollout, np.ndarray]:
  """The `Rollout` of B * G trajectories (row order) and its policy mask int32 [B, G, S].

  `mask` is 1 on every id of a trajectory (the learner attends to observations), `lengths`
  counts them, `truncated` marks trajectories that did not end on their own ('budget',
  'max_turns' and the failed ones), `texts` are `decode` of the whole trajectory.
  """
  B, G, S = len(prompt_tokens_BP), group_size, max_new_tokens
  if len(trajs) != B * G:
    raise ValueError(f"{len(trajs)} trajectories for B * G = {B * G}")
  tokens = np.full((B * G, S), pad_id, np.int32)
  logprobs = np.zeros((B * G, S), np.float32)
  mask = np.zeros((B * G, S), np.int32)
  policy = np.zeros((B * G, S), np.int32)
  texts = []
  for n, t in enumerate(trajs):
    if t.row != n:
      raise ValueError(f"trajectory {n} is row {t.row}: pass them in row order")
    length = 0 if t.tokens is None else len(t.tokens)
    if length:
      tokens[n, :length], logprobs[n, :length] = t.tokens, t.logprobs
      mask[n, :length], policy[n, :length] = 1, t.policy_mask
    texts.append(decode(t.tokens[:length].tolist()) if length else "")
  lengths = mask.sum(1)
  ro = Rollout(
      prompt_tokens=np.asarray(prompt_tokens_BP), prompt_mask=np.asarray(prompt_mask_BP),
      tokens=tokens.reshape(B, G, S), logprobs=logprobs.reshape(B, G, S),
      mask=mask.reshape(B, G, S), lengths=lengths.reshape(B, G).astype(np.int32),
      truncated=np.array([t.status != "done" for t in trajs]).reshape(B, G),
      texts=[texts[b * G:(b + 1) * G] for b in range(B)],
      owned=np.ones((B, G), bool))
  return ro, policy.reshape(B, G, S)


def policy_text(render, trajectory: Trajectory) -> tuple[str, int]:
  """(the text the policy wrote, its sampled token count): the ids under the policy mask,
  observations left out, so what a reward reads and counts is the policy's own."""
  if trajectory.tokens is None:
    return "", 0
  ids = trajectory.tokens[trajectory.policy_mask == 1]
  return render.turn_text(ids.tolist()), int(ids.size)


# Metrics that depend on when environment steps finish relative to decode steps (wall clock),
# not on the draw: the tokens, rewards and other metrics of a draw do not.
TIMING_METRICS = ("multiturn/env_time_s", "multiturn/decode_time_s", "multiturn/host_wait_share",
                  "multiturn/slot_utilization", "multiturn/slot_waiting_share")


def turn_metrics(trajs: Sequence[Trajectory], stats: TurnStats) -> dict[str, float]:
  """The rollout's multi-turn metrics (names as logged)."""
  turns = np.array([t.turns for t in trajs], np.float64)
  obs = sum(int((t.policy_mask == 0).sum()) for t in trajs if t.policy_mask is not None)
  total = sum(len(t.tokens) for t in trajs if t.tokens is not None)
  info = lambda key: float(sum(t.info.get(key, 0.0) for t in trajs))
  busy_s = stats.decode_time_s + stats.wait_time_s
  return {
      "multiturn/turns_mean": float(turns.mean()) if turns.size else 0.0,
      "multiturn/turns_max": float(turns.max()) if turns.size else 0.0,
      "multiturn/tool_calls": info("tool_calls"),
      "multiturn/tool_failures": info("tool_failures"),
      "multiturn/env_errors": float(sum(t.status == "error" for t in trajs)),
      "multiturn/env_timeouts": float(sum(t.status == "timeout" for t in trajs)),
      "multiturn/ended_max_turns": float(sum(t.status == "max_turns" for t in trajs)),
      "multiturn/ended_budget": float(sum(t.status == "budget" for t in trajs)),
      "multiturn/observations_truncated": float(sum(t.observations_truncated for t in trajs)),
      "multiturn/observation_token_share": obs / max(1, total),
      "multiturn/env_time_s": stats.env_time_s,
      "multiturn/decode_time_s": stats.decode_time_s,
      "multiturn/host_wait_share": stats.wait_time_s / max(busy_s, 1e-9),
      "multiturn/slot_utilization": stats.slot_utilization,
      "multiturn/slot_waiting_share": stats.waiting_share,
      "multiturn/token_mismatches": float(stats.token_mismatches),
  }
