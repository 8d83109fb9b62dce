"""One multi-turn draw: examples -> environments -> trajectories -> rollout and rewards.

Shape letters (docs/shapes.md): B prompts, G trajectories per prompt, K reward channels,
P prompt columns, S response columns.

`draw` is what a multi-turn step consumes: it builds one environment per trajectory
(`make_env`), renders each prompt from `reset(example)` (the G environments of a prompt must
agree on it), runs `TurnRollout` and returns the learner's rollout with its policy mask and
the trajectory-level rewards r[B, G, K]: the environments' channels
(`mr_rl.multiturn.channels.EnvironmentChannel`, reduced over steps) and
`text_rewards` scored on what the policy wrote (`trajectories.policy_text`). These r[B, G, K] go through the
aggregators and the trajectory-level GRPO advantage unchanged (`mr_rl.rl.signal`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from mr_rl.multiturn import channels as channels_lib
from mr_rl.multiturn import trajectories as traj_lib
from mr_rl.multiturn.rollout import Trajectory, TurnRollout
from mr_rl.rollout import Rollout


@dataclasses.dataclass
class TurnDraw:
  """A multi-turn draw.

  Attributes:
    rollout: the learner's `Rollout` (observations inside, `mask` 1 on them).
    policy_mask_BGS: int32 [B, G, S], 1 on sampled ids (`make_batch(policy_mask_BGS=...)`).
    r_BGK: float32 [B, G, K], channels in `channels` order.
    trajectories: the B * G `Trajectory`s in row order.
    metrics: `trajectories.turn_metrics`.
  """
  rollout: Rollout
  policy_mask_BGS: np.ndarray
  r_BGK: np.ndarray
  channels: tuple[str, ...]
  trajectories: list[Trajectory]
  metrics: dict


def left_pad(ids: Sequence[Sequence[int]], pad_id: int = 0,
             width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded ids and mask [B, P] (P = `width`, or the longest when None)."""
  P = max(len(x) for x in ids)
  if width is not None:
    if P > width:
      raise ValueError(f"a prompt's first messages render to {P} tokens, more than the prompt "
                       f"width {width} (config.data.max_prompt_len)")
    P = width
  tokens = np.full((len(ids), P), pad_id, np.int32)
  mask = np.zeros((len(ids), P), np.int32)
  for b, x in enumerate(ids):
    tokens[b, P - len(x):], mask[b, P - len(x):] = x, 1
  return tokens, mask


def draw(engine: TurnRollout, params, examples: Sequence[Any], make_env: Callable[[], Any],
         render: Any, *, group_size: int, key: jax.Array,
         env_channels: Sequence[channels_lib.EnvironmentChannel | str] = (),
         text_rewards: Mapping[str, Callable[[str, Any], float]] | None = None,
         on_failure: float = 0.0, prompt_width: int | None = None) -> TurnDraw:
  """Runs B * G trajectories of `examples` (module docstring).

  Args:
    engine: the `TurnRollout`.
    params: the policy's parameters.
    examples: B examples (`reset`'s argument).
    make_env: a factory of one environment per trajectory.
    render: the renderer (`prompt_ids`, `turn_text`, `observation_ids`).
    group_size: G.
    key: PRNG key of the draw.
    env_channels: channels read from the environments' step rewards: `EnvironmentChannel`s,
      or names (then 'sum' over steps, range [on_failure, 1e6], 0 where never reported).
    text_rewards: {channel: fn(text, example) -> float} on the policy's text.
    on_failure: the text channels' (and named environment channels') score of a
      trajectory whose environment failed.
    prompt_width: P of the learner's rollout (the run's `data.max_prompt_len`: one learner
      width per response bucket, as single-turn prompts); None: the longest prompt.
  """
  text_rewards = dict(text_rewards or {})
  env_channels = [c if isinstance(c, channels_lib.EnvironmentChannel) else
                  channels_lib.EnvironmentChannel(c, reduce="sum", on_failure=on_failure,
                                                  missing=max(0.0, on_failure))
                  for c in env_channels]
  eot = getattr(render, "end_of_turn_id", None)
  if eot is not None and eot not in engine.end_of_turn_ids:
    raise ValueError(f"the renderer's end-of-turn id {eot} is not among the rollout's "
                     f"end_of_turn_ids {engine.end_of_turn_ids}: turns would not end there")
  clash = {c.name for c in env_channels} & set(text_rewards)
  if clash:
    raise ValueError(f"channels {sorted(clash)} are both environment and text channels")
  envs, prompts = [], []
  for b, example in enumerate(examples):
    ids = None
    for _ in range(group_size):
      env = make_env()
      got = render.prompt_ids(env.reset(example))
      if ids is not None and got != ids:
        raise ValueError(f"the environments of prompt {b} render different first messages")
      ids = got
      envs.append(env)
    prompts.append(ids)
  tokens_BP, mask_BP = left_pad(prompts, engine.pad_id, prompt_width)
  trajs = engine.run(params, tokens_BP, mask_BP, envs, key=key, group_size=group_size,
                     render=render)
  ro, policy = traj_lib.to_rollout(trajs, tokens_BP, mask_BP, group_size=group_size,
                                   max_new_tokens=engine.max_new_tokens, decode=render.turn_text,
                                   pad_id=engine.pad_id)
  channels = tuple(c.name for c in env_channels) + tuple(text_rewards)
  r = channels_lib.environment_scores(trajs, env_channels, group_size)
  text = np.zeros((len(trajs), len(text_rewards)), np.float32)
  for n, t in enumerate(trajs):
    for k, fn in enumerate(text_rewards.values()):
      text[n, k] = on_failure if t.failed else fn(traj_lib.policy_text(render, t)[0],
                                                  examples[n // group_size])
  r_BGK = np.concatenate([r, text.reshape(len(examples), group_size, -1)], -1)
  return TurnDraw(ro, policy, r_BGK, channels, trajs,
                  traj_lib.turn_metrics(trajs, engine.last_stats))
