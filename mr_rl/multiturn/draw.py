"""A multi-turn run's draws: what `mr_rl.train_step.draw_groups` calls when `config.multiturn`
names an environment or tools.

Shape letters (docs/shapes.md): B prompts, G trajectories per prompt, K reward channels,
S response columns.

`TurnDraws` is built once per run (`mr_rl.train.build`): the environment factory, the renderer,
the `TurnRollout` (one continuous-engine slot per trajectory across turns, `rollout.slots`
slots, `rollout.max_new_tokens` columns for every turn and observation, on the policy's mesh) and the channels of
`config.rewards.channels` split into text channels (the reward runner's) and environment
channels (`mr_rl.multiturn.channels`). Each `draw` runs B * G trajectories and returns the
learner's rollout, its policy mask (0 on observations) and r[B, G, K] in the config's channel
order, which go through the aggregator and the trajectory-level advantage unchanged.

Prompts: the environments' `reset` gets each example with the data template's turns as its
messages (`data.template`: a system instruction, a request on the last user turn) when the
renderer is the tokenizer's chat template (`multiturn.renderer` ''), which renders them with
the tools' schemas; they are left-padded to `data.max_prompt_len` (one learner width per
response bucket, as single-turn prompts), and with the built-in tool environment the start-up
length check reads that rendering (`checked_policy`).

Text channels score what the policy wrote: its turns' text with the observations left out, and
its sampled token count (`trajectories.policy_text`), so a tool's output is never read as the policy's
answer or counted as its length.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np

from mr_rl import rollout as rollout_lib
from mr_rl import rollout_engines
from mr_rl.data.example import Example
from mr_rl.multiturn import channels as channels_lib
from mr_rl.multiturn import collect
from mr_rl.multiturn import trajectories as traj_lib
from mr_rl.multiturn.rollout import TurnRollout


# The device programs of a multi-turn rollout (`TurnRollout`): the continuous engine's, without
# the tail's `shrink`, plus `append` (`mr_rl.compilation.PROGRAMS` names).
TURN_PROGRAMS = ("engine_init", "engine_prefill", "engine_step", "engine_gather", "engine_append")


def expected_programs(settings, prompt_buckets: int) -> dict[str, int]:
  """{program: most compiles} of a multi-turn run's draws (`mr_rl.program_plan`): each turn
  program once per prompt bucket for the rollout's sampling, and once more for evaluation's
  during training (`eval.every`: its own `TurnRollout` and group size)."""
  sets = 1 + bool(settings.eval.every)
  return {name: prompt_buckets * sets for name in TURN_PROGRAMS}


def end_of_turn_ids(settings, render, tokenizer) -> tuple[int, ...]:
  """Ids that end a policy turn: the renderer's end of turn (a chat template's), the
  tokenizer's eos, and with `multiturn.tool_format = 'plain'` (the built-in tool environment's
  format, or an environment's that writes calls the same way) the closing marker, one token."""
  ids = [getattr(render, "end_of_turn_id", None), tokenizer.eos_token_id]
  mt = settings.multiturn
  if mt.tool_format == "plain":
    close = tokenizer.encode(mt.plain_close, add_special_tokens=False)
    if len(close) != 1:
      raise ValueError(f"config.multiturn.plain_close={mt.plain_close!r} is {len(close)} tokens; "
                       "a turn ends on one id, so the closing marker must be one token")
    ids.append(close[0])
  return tuple(dict.fromkeys(i for i in ids if i is not None))


class TurnDraws:
  """Draws of a multi-turn run (module docstring).

  Args:
    settings: the run's `RunSettings` (multiturn enabled).
    policy: the run's `mr_rl.rollout.Policy` (model, tokenizer, pad id).
  """

  def __init__(self, settings, policy: rollout_lib.Policy):
    s, mt = settings, settings.multiturn
    if not mt.enabled:
      raise ValueError("TurnDraws needs config.multiturn.env or config.multiturn.tools")
    self.settings = s
    self.make_env = mt.environment_factory()
    self.render = mt.make_renderer(policy.tokenizer)
    self.template = None  # the data template's turns, through the tokenizer's chat template
    if s.data.template and not mt.renderer:
      from mr_rl.data import templates  # pylint: disable=import-outside-toplevel
      self.template = templates.make_template(s.data.template, style="chat")
    self._tokenizer = policy.tokenizer
    self._model, self._pad_id, self._mesh = policy.model, policy.pad_id, policy.mesh
    self._engines = {}
    self.engine = self.engine_for(s.rollout)

  def engine_for(self, r) -> TurnRollout:
    """The `TurnRollout` of sampling settings `r` (the run's `rollout`, or evaluation's and
    the anchor probes' sampling): `rollout.slots` slots (0: one per training row), compiled
    once per temperature / top-k / top-p."""
    key = (r.temperature, r.top_k, r.top_p, r.max_new_tokens, r.dtype, r.cache_dtype)
    if key not in self._engines:
      s = self.settings
      slots = rollout_engines.option(s.rollout, "slots")  # the slot engines' option
      self._engines[key] = TurnRollout(
          rollout_lib.sampling_model(self._model, r.dtype), slots=int(slots or s.rows),
          max_new_tokens=r.max_new_tokens,
          end_of_turn_ids=end_of_turn_ids(s, self.render, self._tokenizer),
          temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, pad_id=self._pad_id,
          cache_dtype=r.cache_dtype or None, mesh=self._mesh, **s.multiturn.rollout_options())
    return self._engines[key]

  def first_examples(self, examples: Sequence[Any]) -> list:
    """`examples` as the environments' `reset` gets them: with the data template's turns as
    their messages (module docstring)."""
    if self.template is None:
      return list(examples)
    return [dataclasses.replace(ex, messages=tuple(self.template.messages(ex)))
            if isinstance(ex, Example) else ex for ex in examples]

  def checked_policy(self, policy: rollout_lib.Policy) -> rollout_lib.Policy:
    """`policy` with the prompts the draws render, for the start-up length check
    (`mr_rl.data.check_prompt_lengths`): with the built-in tool environment and the chat
    template, `reset`'s messages (the example's, templated) rendered with the tools' schemas;
    otherwise `policy` (an environment's own `reset` is not run for the check)."""
    mt = self.settings.multiturn
    if not mt.tools or mt.renderer:
      return policy
    env = self.make_env()  # (a tool environment's reset reads the example only)
    text = lambda ex: self.render.prompt_text(env.reset(self.first_examples([ex])[0]))
    return dataclasses.replace(policy, render=text, add_bos=False)

  def sample(self, params, examples: Sequence[Any], key: jax.Array, group_size: int,
             sampling=None) -> collect.TurnDraw:
    """B * G trajectories of `examples` (not scored); `sampling`: other sampling settings
    than the run's rollout (evaluation, anchor probes)."""
    if jax.process_count() > 1:
      raise NotImplementedError("multi-turn draws run in one process (docs/multiturn.md)")
    engine = self.engine if sampling is None else self.engine_for(sampling)
    return collect.draw(engine, params, self.first_examples(examples), self.make_env,
                        self.render, group_size=group_size, key=key,
                        prompt_width=self.settings.data.max_prompt_len)

  def draw(self, params, examples: Sequence[Any], key: jax.Array, runner, rewards,
           group_size: int, sampling=None) -> tuple[collect.TurnDraw, np.ndarray, dict, dict]:
    """(the draw, r_BGK, reward metrics, seconds) of B * G trajectories scored on `rewards`
    (a `RewardSettings`: the run's or a sub-run's channels; `runner` holds its text
    channels, in order)."""
    t0 = time.perf_counter()
    d = self.sample(params, examples, key, group_size, sampling)
    t_roll = time.perf_counter() - t0
    B, G = len(examples), group_size
    env = channels_lib.environment_channels(rewards)
    env_k, env_channels = list(env), list(env.values())
    text_k = [k for k in range(len(rewards.channels)) if k not in env]
    if tuple(runner.names) != tuple(rewards.channels[k] for k in text_k):
      raise ValueError(f"the reward runner's channels {runner.names} are not the text channels "
                       f"of {rewards.channels}")
    r_BGK = np.full((B, G, len(rewards.channels)), np.nan, np.float32)
    r_BGK[..., env_k] = channels_lib.environment_scores(d.trajectories, env_channels, G)
    for k, c in zip(env_k, env_channels):  # declared applicability, per prompt
      if c.applies is not None:
        for b, ex in enumerate(examples):
          if not c.applies(rollout_lib.example_dicts([ex])[0]):
            r_BGK[b, :, k] = np.nan
    pending = runner.start(rollout_lib.example_dicts(examples), G)
    for n, t in enumerate(d.trajectories):
      text, n_tok = traj_lib.policy_text(self.render, t)
      pending.add(n // G, n % G, text, n_tok)
    r_text, counts, seconds = pending.result()
    r_text, reward_m = runner.finish(r_text, counts, seconds)
    failed = np.array([t.failed for t in d.trajectories]).reshape(B, G)
    for j, k in enumerate(text_k):  # a failed environment fails every channel
      c = runner.channels[j]
      r_BGK[..., k] = np.where(failed & ~np.isnan(r_text[..., j]), c.on_failure, r_text[..., j])
    for k, c in zip(env_k, env_channels):
      col = r_BGK[..., k]
      reward_m[f"rewards/{c.name}/mean"] = float(np.nanmean(col)) if np.isfinite(col).any() \
          else float("nan")
    return d, r_BGK, reward_m, {"rollout": t_roll, "reward": time.perf_counter() - t0 - t_roll}
