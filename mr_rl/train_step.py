"""The stages of one training step, which `mr_rl.train`'s loop runs in order:

    draw (+ score)  `draw_groups` -> `Draw` (through the draw queue: `mr_rl.draw_queue`)
    signal          `mr_rl.rl.signal.signal_fn`'s jitted function (called by the loop)
    batch           `step_batch`: `learner_batch` and, when asked, the reference forward
    step            the learner's update (`mr_rl.rl.update.learner`)
    log             `log_metrics` (then the loop's timings, `async/*` and `compile/*`)

Every random draw of step t comes from `step_keys(root, t)`, so a resumed run reproduces the
uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import draw_queue
from mr_rl import metrics as metrics_lib
from mr_rl import rollout as rollout_lib
from mr_rl.rl import batch as batch_lib
from mr_rl.rl import dynamic_sampling
from mr_rl.rl import signal as signal_lib
from mr_rl.rl import update as update_lib
from mr_rl.settings import RunSettings


def step_keys(root, step: int) -> tuple[Any, Any, Any]:
  """(k_roll, k_agg, k_upd) of `step`: the draw's, the signal's and the update's keys."""
  k_roll, k_agg, k_upd = jax.random.split(jax.random.fold_in(root, step), 3)
  return k_roll, k_agg, k_upd


@dataclasses.dataclass
class Draw:
  """A step's groups, sampled and scored (`draw_groups`).

  Attributes:
    rollout: the B groups' responses.
    r_BGK: their rewards.
    n_kept: the first n_kept groups carry the loss (B unless dynamic sampling fell short;
      with none kept, the signal is computed on all B and no row enters the loss).
    reward_metrics: the reward runner's metrics over the rounds.
    metrics: `dynamic/*` (dynamic sampling only).
    seconds: {"rollout": seconds sampling (with the continuous engine this includes the
      reward calls that ran while rows decoded), "reward": seconds waiting for the rewards
      after it}; the step's `metrics_lib.StageTimer` starts from them.
    policy_mask_BGS: multi-turn draws: 1 on the ids the policy sampled, 0 on observations
      (the loss mask; `mr_rl.multiturn.draw`); None: every response id is the policy's.
    trajectories: multi-turn draws: the B * G `Trajectory`s (per-turn credit reads their step
      rewards), else None.
  """
  rollout: rollout_lib.Rollout
  r_BGK: np.ndarray
  n_kept: int
  reward_metrics: dict
  metrics: dict
  seconds: dict
  policy_mask_BGS: np.ndarray | None = None
  trajectories: list | None = None

  @property
  def signal_groups(self) -> int:
    """Groups the aggregator sees: the kept ones, or all B when none was kept."""
    return self.n_kept or self.r_BGK.shape[0]


def draw_groups(comp, params, agg_state, data_iter, signal, k_roll,
                k_agg, overlap: draw_queue.DrawQueue | None = None):
  """The step's B groups: one rollout, or DAPO dynamic sampling's rounds (rl.dynamic_sampling).

  `comp` is the run's `mr_rl.train.Components` (settings, policy, reward runner). Round 0
  samples `data.batch_prompts` prompts with `k_roll` (exactly the draw without dynamic
  sampling); round i > 0 with `fold_in(k_roll, i)`. The `scalar` signal applies the
  aggregator with the step's starting state (not committed) to each round.

  With `overlap` and no dynamic sampling, the scoring may run on its worker thread: the
  result is then a `draw_queue.InFlight` whose `resolve()` gives the Draw. (Dynamic
  sampling's rounds need their scores to decide, so they are scored here.)
  """
  s = comp.settings
  dyn = s.dynamic
  B = s.data.batch_prompts
  if comp.turns is not None:  # multi-turn: trajectories with tools or an environment
    d, r_BGK, reward_m, seconds = comp.turns.draw(
        params, next(data_iter), k_roll, comp.runner, s.rewards, s.rollout.group_size)
    return Draw(d.rollout, r_BGK, B, reward_m, d.metrics, seconds, d.policy_mask_BGS,
                d.trajectories)
  rounds, kept, dropped, reward_m = [], [], [], {}
  timer = metrics_lib.StageTimer()
  for i in range(1 + (dyn.max_rounds if dyn.mode == "refill" else 0)):
    with timer("rollout"):
      examples = next(data_iter)
      scoring = rollout_lib.StreamingScore(comp.runner, comp.policy, examples,
                                           s.rollout.group_size)  # rows scored as they finish
      ro = rollout_lib.rollout(comp.policy, params, examples,
                               k_roll if i == 0 else jax.random.fold_in(k_roll, i), s.rollout,
                               on_row=scoring)
    if dyn.mode == "off" and overlap is not None:  # the wait for the scores on a worker thread
      return overlap.score_later(scoring, ro, lambda r_BGK, m, t_reward: Draw(
          ro, r_BGK, B, {k: float(v) for k, v in m.items()}, {},
          {**timer.seconds, "reward": t_reward}))
    with timer("reward"):
      r_BGK, m = scoring.finish(ro)
    for k, v in m.items():
      reward_m.setdefault(k, []).append(float(v))
    if dyn.mode == "off":
      return Draw(ro, r_BGK, B, {k: v[0] for k, v in reward_m.items()}, {}, timer.seconds)
    rounds.append((ro, r_BGK))
    if dyn.signal == "scalar":
      R_BG = signal(agg_state, jnp.asarray(r_BGK),
                    k_agg if i == 0 else jax.random.fold_in(k_agg, i)).R_BG
      has = dynamic_sampling.scalar_signal(np.asarray(R_BG))
    else:
      has = dynamic_sampling.channel_signal(r_BGK)
    kept += [(i, int(b)) for b in np.flatnonzero(has)]
    dropped += [(i, int(b)) for b in np.flatnonzero(~has)]
    if len(kept) >= B:
      break
  picks, n_kept = dynamic_sampling.fill(kept, dropped, B)
  ro = rollout_lib.Rollout.gather([x[0] for x in rounds], picks)
  r_BGK = np.stack([rounds[i][1][b] for i, b in picks])
  dyn_m = {"dynamic/dropped_frac": len(dropped) / (B * len(rounds)),
           "dynamic/rounds": float(len(rounds)), "dynamic/kept_frac": n_kept / B}
  # Counts and durations add up over the rounds; other runner metrics (means) are averaged.
  counts = ("errors", "timeouts", "unscorable", "not_applicable", "seconds")
  reward_m = {k: float(np.sum(v) if k.endswith(counts) else np.mean(v))
              for k, v in reward_m.items()}
  return Draw(ro, r_BGK, n_kept, reward_m, dyn_m, timer.seconds)


@functools.lru_cache(maxsize=16)
def logprob_forward(model):
  """The jitted reference forward `(params, tokens, mask[, segment_ids]) -> logp [N, T]`."""
  return update_lib.make_logprob_fn(update_lib.model_logits_fn(model))


def learner_batch(s: RunSettings, draw: Draw, sig: signal_lib.Signal, learner, train_state,
                  mesh, row_multiple: int, base=None) -> batch_lib.LearnerBatch:
  """The step's `LearnerBatch` from its draw and signal, as the settings ask: rows without
  loss (dynamic sampling's unfilled slots, truncated responses with `mask_truncated`), PPO's
  GAE targets from the critic (`base`: the frozen base of a LoRA critic), or packed rows."""
  B, G = draw.r_BGK.shape[:2]
  loss_rows = None
  if draw.n_kept < B:  # dynamic sampling's unfilled slots: zero advantage, no loss
    loss_rows = np.arange(B)[:, None] < np.full((1, G), draw.n_kept)
  if s.batch.mask_truncated:  # DAPO overlong filtering
    trunc = draw.rollout.truncated
    loss_rows = ~trunc if loss_rows is None else loss_rows & ~trunc
  ppo = pack = None
  if s.advantage == "ppo":
    ppo = batch_lib.PPOTargets(
        values_fn=lambda tok, mask: update_lib.chunked_forward(
            learner.value_fn, learner.critic(train_state, base), tok, mask,
            num_chunks=s.update.num_micro_batches, mesh=mesh),
        R_BG=sig.R_BG, gamma=float(s.advantage_hp.get("gamma", 1.0)),
        lam=float(s.advantage_hp.get("lam", 1.0)))
  elif s.update.pack:
    pack = batch_lib.PackSpec(s.update.loss.loss_agg, s.update.loss.norm_len, row_multiple)
  A_BG = None if ppo else signal_lib.pad_groups(sig, B).A_BG
  if s.multiturn.per_turn_credit:  # (+ per-turn advantages: [B, G, S])
    from mr_rl.multiturn import credit  # pylint: disable=import-outside-toplevel
    A_BG = credit.per_turn_advantages(draw.trajectories, np.asarray(A_BG), credit.turn_weights(s),
                                      group_size=G, max_new_tokens=s.rollout.max_new_tokens)
  return batch_lib.make_batch(draw.rollout, A_BG, loss_rows_BG=loss_rows,
                              trim=s.batch.trim_columns,
                              column_buckets=s.batch.column_buckets, ppo=ppo, pack=pack,
                              policy_mask_BGS=draw.policy_mask_BGS)


def step_batch(s: RunSettings, step: int, draw: Draw, sig: signal_lib.Signal, learner,
               train_state, comp, row_multiple: int):
  """(batch, ref_logp, metrics) of `step`: its `learner_batch`; log pi_0 of the batch's
  tokens where the KL penalty needs it (then in the batch) or the step measures `kl_ref/*`
  (every `kl_ref_every` steps), else None; and its `batch/*` shape metrics. `comp`: the run's
  `mr_rl.train.Components` (model, base params, learner mesh)."""
  batch = learner_batch(s, draw, sig, learner, train_state, comp.mesh, row_multiple,
                        comp.base_params)
  shape_m = {"batch/columns": float(batch.shape[1])}
  if s.update.pack:
    shape_m.update({"batch/packed_rows": float(batch.shape[0]),
                    "batch/packed_sequences": float(batch_lib.packed_sequences(batch))})
  ref_logp = None  # log pi_0: the KL penalty needs it; else only the kl_ref/* metrics do
  if s.update.loss.kl_coef > 0 or (s.kl_ref_every and step % s.kl_ref_every == 0):
    seg = () if batch.segment_ids is None else (batch.segment_ids,)
    ref_logp = update_lib.chunked_forward(
        logprob_forward(comp.model), comp.base_params, batch.tokens, batch.mask, *seg,
        num_chunks=s.update.num_micro_batches, mesh=comp.mesh)
    if s.update.loss.kl_coef > 0:
      batch = batch.replace(ref_logp=ref_logp)
  return batch, ref_logp, shape_m


def log_metrics(s: RunSettings, draw: Draw, R_BG, agg_m, upd_m, kl_m, batch_m,
                alarm: metrics_lib.ShortcutAlarm) -> dict[str, float]:
  """The step's logged scalars from its host values (`metrics_lib.step_metrics` over the
  kept groups, `kl_ref/*` when measured, the batch's shape, `dynamic/*`, the shortcut
  alarm); the loop adds `time/*`, `async/*`, `compile/*` and evaluation."""
  names = s.rewards.channels
  kept = draw.rollout if draw.n_kept in (0, draw.r_BGK.shape[0]) else \
      draw.rollout.take(draw.n_kept)
  m = metrics_lib.step_metrics(names, draw.r_BGK[:draw.signal_groups], R_BG, agg_m, upd_m,
                               draw.reward_metrics, kept.lengths, kept.truncated)
  m.update({k: float(v) for k, v in (kl_m or {}).items()})  # measured every kl_ref_every
  m.update(batch_m)
  m.update(draw.metrics)
  m.update(alarm.update(m["reward/scalar/mean"], m[f"reward/{names[s.rewards.primary]}/mean"]))
  return m
