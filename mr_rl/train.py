"""The trainer: the run's assembly (`build`) and its loop (`train`), one batch at a time.

    examples --(mr_rl.rollout.rollout: jitted KV-cache sampler)--> responses, old log-probs
             --(mr_rl.rollout.score: reward runner, host pool)--> r[B, G, K]
                     (NaN = the channel does not apply; a failed call scores its on_failure)
             --(aggregator, jitted, state carried)--> R[B, G] (+ channel weights)
             --(advantage estimator)--> A[B, G]
             --(mr_rl.rollout.update_batch; jitted policy step, AdamW)--> new params

`train(settings, workdir)` runs it for `settings.total_steps`, writing metrics, TensorBoard and
orbax checkpoints under `workdir` (or nothing, with workdir=None: the pipelines use that for
probes). Re-running with the same workdir resumes from the latest checkpoint and reproduces
the uninterrupted run's metrics exactly (all randomness is `fold_in(root, step)`).

Scale: with more than one device, `build` makes the `settings.mesh` mesh and every program
(sampler, reference / critic forward, update step) runs sharded on it (parameters created or
loaded straight into their shards, optimizer state and batches by `mr_rl.rl.update.learner`).
The reference log-prob and critic forwards run in `num_micro_batches` row chunks
(`mr_rl.rl.update.chunked_forward`), the split the update step uses for gradient
accumulation, so no program holds the activations of more than B*G / M rows.

Tokens in use (issue 16): the update batch, the reference / critic forwards and the sampler's
prefill cover only the columns in use (`mr_rl.rollout.update_batch`, bucketed widths); with
`update_batch.pack` the loss-carrying sequences are packed (`mr_rl.rl.packing`).
`dynamic_sampling` (DAPO) keeps the groups with a learning signal, over-sampling rounds of
prompts (`mr_rl.rl.dynamic_sampling`); `update_batch.mask_truncated` masks truncated
responses out of the loss; the sampler/trainer mismatch is logged every step
(`mismatch/*`) and, with `loss.recompute_old_logp` / `loss.tis_cap`, corrected in the step.

Shape letters: B prompts, G responses per prompt, K reward channels, N = B*G update rows,
T token columns of the update batch.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import aggregators, data, evaluation, metrics as metrics_lib, models
from mr_rl import rollout as rollout_lib
from mr_rl.checkpointing import Checkpointer
from mr_rl.models import sharding
from mr_rl.rewards.runner import RewardRunner, get_reward
from mr_rl.rl import advantages as adv_lib
from mr_rl.rl import dynamic_sampling
from mr_rl.rl import gae
from mr_rl.rl import packing
from mr_rl.rl import update as update_lib
from mr_rl.settings import RunSettings

_LOG = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ assembly
@dataclasses.dataclass
class Components:
  """Everything built once per run (and shared by the pipelines' sub-runs).

  Attributes:
    settings: the run's settings (sub-runs replace them).
    policy: model, tokenizer, prompt rendering and mesh (`mr_rl.rollout.Policy`).
    base_params: pi_0, the starting point and the KL reference.
    train_examples, eval_examples: the data set's train / eval splits.
    runner: the reward runner over `settings.rewards.channels`.
    eval_sets: `data.eval_sets` benchmark sets by name (evaluated instead of the eval split).
  """
  settings: RunSettings
  policy: rollout_lib.Policy
  base_params: Any
  train_examples: Sequence[Any]
  eval_examples: Sequence[Any]
  runner: RewardRunner
  eval_sets: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)

  @property
  def model(self):
    return self.policy.model

  @property
  def mesh(self):
    return self.policy.mesh


def load_policy(settings: RunSettings, mesh=None):
  """(model, params, tokenizer) from a checkpoint path / hub id, or a preset (random init,
  created already sharded on `mesh`; no tokenizer)."""
  dtype = jnp.dtype(settings.model.dtype)
  if settings.model.path:
    model, params = models.load_pretrained(settings.model.path, dtype=dtype, mesh=mesh)
    return model, params, models.load_tokenizer(settings.model.path)
  cfg = models.get_preset(settings.model.preset).replace(param_dtype=dtype, dtype=dtype)
  model = models.Transformer(cfg)
  key = jax.random.PRNGKey(settings.seed)
  if mesh is None:
    return model, models.init_params(model, key), None
  return model, sharding.init_sharded(model, key, mesh), None


def load_examples(settings: RunSettings) -> tuple[list, list]:
  """(train, eval) example lists of `data.name` (`mr_rl.data.load_dataset`)."""
  d = settings.data
  train = data.load_dataset(d.name, path=d.path or None, split=d.split, **d.options)
  evals = data.load_dataset(d.name, path=d.path or None, split=d.eval_split, **d.options)
  return train, evals


def load_eval_sets(settings: RunSettings) -> dict[str, list]:
  """{name: examples} for `data.eval_sets` (each at its loader's default split, or the `split`
  / `path` / loader options given in `data.eval_set_options[name]`)."""
  out = {}
  for name in settings.data.eval_sets:
    opts = dict(settings.data.eval_set_options.get(name, {}))
    path, split = opts.pop("path", None) or None, opts.pop("split", None) or None
    try:
      examples = data.load_dataset(name, path=path, split=split, **opts)
    except data.DatasetUnavailableError as e:
      raise data.DatasetUnavailableError(
          f"{e} For config.data.eval_sets, give the local copy as "
          f"config.data.eval_set_options.{name}.path.") from e
    if not examples:
      raise ValueError(f"config.data.eval_sets: data set {name!r} loaded no examples")
    other = sorted({ex.dataset for ex in examples} - {name})
    if other:  # per-set metrics group by Example.dataset
      raise ValueError(f"config.data.eval_sets: loader of {name!r} labelled examples {other}")
    out[name] = examples
  return out


def build_runner(settings: RunSettings) -> RewardRunner:
  """The reward runner over `settings.rewards.channels` (built from their specs, registered
  names or import paths) with their `rewards.params` and the failure-rate guard."""
  r = settings.rewards
  channels = [get_reward(spec, **r.params.get(name, {}))
              for spec, name in zip(r.specs, r.channels)]
  return RewardRunner(channels, timeout_s=r.timeout_s, max_failure_share=r.max_failure_share,
                      failure_patience=r.failure_patience)


def drop_long_prompts(policy: rollout_lib.Policy, examples, what: str) -> list:
  """`examples` without those whose prompt exceeds `data.max_prompt_len` (data.skip_long_prompts).

  Logs how many were dropped; raises ValueError if none is left.
  """
  P = policy.max_prompt_len
  kept = [ex for ex in examples if len(policy.prompt_ids(ex)) <= P]
  dropped = len(examples) - len(kept)
  if dropped:
    _LOG.warning("data.skip_long_prompts: dropped %d of %d %s examples longer than "
                 "data.max_prompt_len=%d tokens", dropped, len(examples), what, P)
  if not kept:
    raise ValueError(f"every one of the {len(examples)} {what} examples is longer than "
                     f"config.data.max_prompt_len={P} tokens; raise it")
  return kept


def build(settings: RunSettings) -> Components:
  """Loads the policy, data and reward channels of a run (on a mesh with > 1 device)."""
  mesh = sharding.make_mesh(dict(settings.mesh)) if jax.device_count() > 1 else None
  model, params, tokenizer = load_policy(settings, mesh)
  if tokenizer is None:
    raise ValueError("config.model.preset gives random weights but no tokenizer; point "
                     "config.model.path at a checkpoint directory with a tokenizer")
  d = settings.data
  if d.template:
    template = data.make_template(d.template, model=settings.model.path)
    render = lambda ex: template.render(ex, tokenizer)
  else:
    render = lambda ex: ex.prompt
  policy = rollout_lib.Policy(model, tokenizer, render, d.max_prompt_len,
                              add_bos=not d.template, mesh=mesh)
  train_ex, eval_ex = load_examples(settings)
  eval_sets = load_eval_sets(settings)
  if d.skip_long_prompts:
    train_ex = drop_long_prompts(policy, train_ex, "train")
    eval_ex = drop_long_prompts(policy, eval_ex, "eval split")
    eval_sets = {n: drop_long_prompts(policy, ex, f"eval set {n}") for n, ex in eval_sets.items()}
  else:  # benchmark prompts are only encoded at the end of a run: check them now
    for name, examples in eval_sets.items():
      n_long = sum(len(policy.prompt_ids(ex)) > d.max_prompt_len for ex in examples)
      if n_long:
        raise ValueError(f"{n_long} of the {len(examples)} prompts of eval set {name!r} are "
                         f"longer than config.data.max_prompt_len={d.max_prompt_len} tokens; "
                         "raise it or set config.data.skip_long_prompts")
  return Components(settings, policy, params, train_ex, eval_ex, build_runner(settings),
                    eval_sets)


# ------------------------------------------------------------------------ jitted pieces
@functools.lru_cache(maxsize=16)
def _logprob_fn(model):
  return update_lib.make_logprob_fn(update_lib.model_logits_fn(model))


@functools.lru_cache(maxsize=64)
def _aggregate_fn(name: str, hp_items: tuple, advantage: str, adv_hp_items: tuple):
  """Jitted aggregator + advantage: (agg_state, r_BGK, key) -> (R, A, new_state, metrics)."""
  agg = aggregators.get(name, **dict(hp_items))
  if advantage == "ppo":  # token-level GAE advantages are computed after the critic runs
    adv_fn = lambda R_BG, r_BGK, weights: jnp.zeros_like(R_BG)
  else:
    adv_fn = adv_lib.get_advantage(advantage, **dict(adv_hp_items))

  @jax.jit
  def fn(agg_state, r_BGK, key):
    R_BG, new_state, m = agg.apply(agg_state, r_BGK, key)
    weights = m.get("weights") if adv_lib.uses_channels(advantage) else None
    A_BG = adv_fn(R_BG, r_BGK, weights)
    m = dict(m, frac_zero_std=adv_lib.frac_zero_std(R_BG),
             frac_zero_std_channels=adv_lib.frac_zero_std_channels(r_BGK))
    return R_BG, A_BG, new_state, m

  return agg, fn


def _hashable(d) -> tuple:
  return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


# ------------------------------------------------------------------------------- train
@dataclasses.dataclass
class TrainResult:
  params: Any
  aggregator_state: Any
  history: list[dict]


def train(settings: RunSettings, workdir: str | None, *, comp: Components | None = None,
          init_params=None, log: Callable[[str], None] | None = print) -> TrainResult:
  """Runs GRPO-family or PPO training for settings.total_steps (resuming from workdir)."""
  comp = build(settings) if comp is None else dataclasses.replace(comp, settings=settings)
  s = settings
  names, K, M = s.rewards.channels, s.num_channels, s.update.num_micro_batches
  ppo = s.advantage == "ppo"
  agg, agg_fn = _aggregate_fn(s.aggregator.name, _hashable(s.aggregator.hp),
                              "grpo" if ppo else s.advantage,
                              () if ppo else _hashable(s.advantage_hp))
  if (s.data.batch_prompts * s.rollout.group_size) % M:
    raise ValueError(f"config.optim.num_micro_batches={M} must divide the rollout rows "
                     f"data.batch_prompts x rollout.group_size = "
                     f"{s.data.batch_prompts * s.rollout.group_size}")
  learner = update_lib.learner(comp.model, s.update, comp.mesh, ppo)
  logprob_fn = _logprob_fn(comp.model)
  root = jax.random.PRNGKey(s.seed)
  params = comp.base_params if init_params is None else init_params
  state = {"train": learner.init(params, jax.random.fold_in(root, 2**30)),
           "agg": agg.init(K), "key": root}
  data_iter = data.ResumableIterator(list(comp.train_examples), s.data.batch_prompts,
                                     seed=s.seed)
  alarm = metrics_lib.ShortcutAlarm(s.alarm_window)
  start = 0
  ckpt = writer = None
  if workdir is not None:
    os.makedirs(workdir, exist_ok=True)
    ckpt = Checkpointer(workdir) if s.checkpoint_every else None
    latest = ckpt.latest_step() if ckpt else None
    if latest is not None:
      state, meta = ckpt.restore(latest, state)
      state["train"] = learner.place_state(state["train"])
      start = int(meta["step"])
      data_iter.restore(meta["data"])
      alarm.restore(meta["alarm"])
      if log:
        log(f"resumed from {ckpt.directory} at step {start}")
    writer = metrics_lib.MetricsWriter(workdir, resume_step=start, settings=s)
  row_multiple = M * (1 if comp.mesh is None else sharding.data_parallel_size(comp.mesh))
  history = []
  eta = metrics_lib.ETA(s.total_steps)
  for step in range(start, s.total_steps):
    key = jax.random.fold_in(state["key"], step)
    k_roll, k_agg, k_upd = jax.random.split(key, 3)
    ro, r_BGK, reward_m, n_kept, dyn_m, t_roll, t_reward = _draw_groups(
        comp, state["train"].params, state["agg"], data_iter, agg_fn, k_roll, k_agg)
    t2 = time.perf_counter()
    B, G = r_BGK.shape[:2]
    b_used = n_kept or B  # no group kept: the aggregator sees the whole draw (no loss anyway)
    R_BG, A_BG, state["agg"], agg_m = agg_fn(state["agg"], jnp.asarray(r_BGK[:b_used]), k_agg)
    loss_rows = None
    if n_kept < B:  # dynamic sampling's unfilled slots: zero advantage, no loss
      A_BG = jnp.concatenate([A_BG, jnp.zeros((B - b_used, G), A_BG.dtype)])
      loss_rows = np.arange(B)[:, None] < np.full((1, G), n_kept)
    if s.batch.mask_truncated:  # DAPO overlong filtering
      loss_rows = ~ro.truncated if loss_rows is None else loss_rows & ~ro.truncated
    batch = rollout_lib.update_batch(ro, A_BG, loss_rows_BG=loss_rows, trim=s.batch.trim_columns)
    shape_m = {"batch/columns": float(batch["tokens_NT"].shape[1])}
    if ppo:
      forward = lambda fn, p: update_lib.chunked_forward(
          fn, p, batch["tokens_NT"], batch["mask_NT"], num_chunks=M, mesh=comp.mesh)
      _add_ppo_targets(batch, np.asarray(R_BG),
                       forward(learner.value_fn, state["train"].value_params), s.advantage_hp)
    if s.update.pack:
      batch = packing.pack(batch, s.update.loss.loss_agg, s.update.loss.norm_len, row_multiple)
      shape_m.update({"batch/packed_rows": float(batch["tokens_NT"].shape[0]),
                      "batch/packed_sequences": float(batch.pop("rows_packed")),
                      "batch/columns": float(batch["tokens_NT"].shape[1])})
      batch = {k: jnp.asarray(v) for k, v in batch.items()}
    ref_logp = None  # log pi_0: the KL penalty needs it; else only the kl_ref/* metrics do
    if s.update.loss.kl_coef > 0 or (s.kl_ref_every and step % s.kl_ref_every == 0):
      cols = [batch[k] for k in ("tokens_NT", "mask_NT", "segment_ids_NT") if k in batch]
      ref_logp = update_lib.chunked_forward(logprob_fn, comp.base_params, *cols, num_chunks=M,
                                            mesh=comp.mesh)
    if s.update.loss.kl_coef > 0:
      batch["ref_logp_NT"] = ref_logp
    state["train"], upd_m = learner.step(state["train"], learner.place_batch(batch), k_upd)
    kl_m = None if ref_logp is None else _kl_ref_metrics(ref_logp, batch["old_logp_NT"],
                                                         batch["response_mask_NT"])
    upd_m, kl_m, agg_m = jax.device_get((upd_m, kl_m, agg_m))  # the step's one host sync
    t3 = time.perf_counter()
    kept = ro if n_kept in (0, B) else ro.take(n_kept)
    m = _step_metrics(s, r_BGK[:b_used], R_BG, agg_m, upd_m, reward_m, kept, kl_m)
    m.update(shape_m)
    m.update(dyn_m)
    m.update(alarm.update(m["reward/scalar/mean"], m[f"reward/{names[s.rewards.primary]}/mean"]))
    m.update({"time/rollout": t_roll, "time/reward": t_reward, "time/update": t3 - t2})
    if s.eval.every and (step + 1) % s.eval.every == 0:
      m.update(evaluation.run_evaluation(comp, state["train"].params,
                                         jax.random.fold_in(root, 10**9 + step)))
    if not np.isfinite(m.get("loss/policy", 0.0)):
      raise FloatingPointError(f"non-finite policy loss at step {step}: {m.get('loss/policy')}")
    history.append({"step": step, **m})
    if writer:
      writer.write(step, m)
    eta_s = eta.update(step)
    if log and (step % s.log_every == 0 or step + 1 == s.total_steps):
      log(metrics_lib.console_line(step, s.total_steps, m, names, eta_s))
    if ckpt and ((step + 1) % s.checkpoint_every == 0 or step + 1 == s.total_steps):
      ckpt.save(step + 1, state, {"step": step + 1, "data": data_iter.state(),
                                  "alarm": alarm.state(),
                                  "reward_errors": dict(comp.runner.error_counts)})
  if ckpt:
    ckpt.close()
  if writer:
    writer.close()
  return TrainResult(state["train"].params, state["agg"], history)


def _add_ppo_targets(batch, R_BG, values_NT, hp) -> None:
  """PPO (METHODS.md 3): outcome reward at the last response token, GAE, batch whitening."""
  R_N = jnp.nan_to_num(R_BG.reshape(-1), nan=0.0)
  adv, ret = gae.ppo_advantages(R_N, values_NT, batch["response_mask_NT"],
                                gamma=float(hp.get("gamma", 1.0)), lam=float(hp.get("lam", 1.0)))
  del batch["advantages_BG"]
  batch.update(advantages_NT=adv, returns_NT=ret, old_values_NT=values_NT)


def _draw_groups(comp: Components, params, agg_state, data_iter, agg_fn, k_roll, k_agg):
  """The step's B groups: one rollout, or DAPO dynamic sampling's rounds (rl.dynamic_sampling).

  Round 0 samples `data.batch_prompts` prompts with `k_roll` (exactly the draw without
  dynamic sampling); round i > 0 with `fold_in(k_roll, i)`. The `scalar` signal applies the
  aggregator with the step's starting state (not committed) to each round.

  Returns:
    (rollout of the B groups, r_BGK, the reward runner's metrics over the rounds, n_kept =
    how many of the groups (the first ones) enter the loss, dynamic/* metrics, rollout
    seconds, reward seconds).
  """
  s = comp.settings
  dyn = s.dynamic
  B = s.data.batch_prompts
  rounds, kept, dropped, reward_m = [], [], [], {}
  t_roll = t_reward = 0.0
  for i in range(1 + (dyn.max_rounds if dyn.mode == "refill" else 0)):
    t0 = time.perf_counter()
    examples = next(data_iter)
    ro = rollout_lib.rollout(comp.policy, params, examples,
                             k_roll if i == 0 else jax.random.fold_in(k_roll, i), s.rollout)
    t1 = time.perf_counter()
    r_BGK, m = rollout_lib.score(comp.runner, ro, examples)
    t_roll, t_reward = t_roll + t1 - t0, t_reward + time.perf_counter() - t1
    for k, v in m.items():
      reward_m.setdefault(k, []).append(float(v))
    if dyn.mode == "off":
      return ro, r_BGK, {k: v[0] for k, v in reward_m.items()}, B, {}, t_roll, t_reward
    rounds.append((ro, r_BGK))
    if dyn.signal == "scalar":
      R_BG = agg_fn(agg_state, jnp.asarray(r_BGK), k_agg if i == 0 else
                    jax.random.fold_in(k_agg, i))[0]
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
  counts = ("errors", "timeouts", "seconds")
  reward_m = {k: float(np.sum(v) if k.endswith(counts) else np.mean(v))
              for k, v in reward_m.items()}
  return ro, r_BGK, reward_m, n_kept, dyn_m, t_roll, t_reward


@jax.jit
def _kl_ref_metrics(ref_logp_NT, logp_NT, response_mask_NT):
  """k1, k3 of KL(pi || pi_0) per response token (pi: the sampler's log-probs)."""
  resp = response_mask_NT.astype(jnp.float32)
  x = jnp.clip(ref_logp_NT - logp_NT, -20, 20)  # log pi_ref - log pi
  denom = jnp.maximum(resp.sum(), 1.0)
  return {"kl_ref/k1": (-x * resp).sum() / denom,
          "kl_ref/k3": ((jnp.exp(x) - 1 - x) * resp).sum() / denom}


_UPDATE_NAMES = {"policy_loss": "loss/policy", "pg_loss": "loss/pg", "entropy": "policy/entropy",
                 "kl": "loss/kl", "mismatch_abs": "mismatch/abs_logp_diff",
                 "mismatch_k3": "mismatch/k3", "tis_weight_mean": "mismatch/tis_weight_mean",
                 "tis_clip_frac": "mismatch/tis_clip_frac"}


def _step_metrics(s, r_BGK, R_BG, agg_m, upd_m, reward_m, ro, kl_m) -> dict:
  names = s.rewards.channels
  m = metrics_lib.channel_summaries(r_BGK, names)
  m.update(metrics_lib.profile_distribution(r_BGK, names))
  R = np.asarray(R_BG)
  m["reward/scalar/mean"] = float(np.nanmean(R)) if np.isfinite(R).any() else float("nan")
  m["reward/scalar/std"] = float(np.nanstd(R)) if np.isfinite(R).any() else float("nan")
  if "weights" in agg_m:
    for k, n in enumerate(names):
      m[f"weights/{n}"] = float(agg_m["weights"][k])
  m["frac_zero_std/scalar"] = float(agg_m["frac_zero_std"])
  for k, n in enumerate(names):
    m[f"frac_zero_std/{n}"] = float(agg_m["frac_zero_std_channels"][k])
  for k, v in agg_m.items():
    if k not in ("weights", "frac_zero_std", "frac_zero_std_channels") and np.ndim(v) == 0:
      m[f"aggregator/{k}"] = float(v)
  for k, v in upd_m.items():
    if np.ndim(v) == 0:
      m[_UPDATE_NAMES.get(k, f"update/{k}")] = float(v)
  m.update({k.replace("rewards/", "reward_runner/"): float(v) for k, v in reward_m.items()})
  m["response/length_mean"] = float(ro.lengths.mean())
  m["response/truncated_frac"] = float(ro.truncated.mean())
  if kl_m is not None:  # measured this step (kl_ref_every)
    m.update({k: float(v) for k, v in kl_m.items()})
  return m
