"""The trainer: the run's assembly (`build`) and its loop (`train`), one batch at a time.

Each step reads draw -> score -> signal -> batch -> step -> log:

    examples --draw (mr_rl.rollout.rollout: jitted KV-cache sampler)--> Rollout [B, G, S]
             --score (mr_rl.rollout.StreamingScore: reward runner, host pool; with the
                      continuous engine a row is scored as soon as it finishes)--> r[B, G, K]
                     (NaN = the channel does not apply; a failed call scores its on_failure)
             --signal (mr_rl.rl.signal: aggregator, then advantage estimator; jitted,
                       aggregator state carried)--> R[B, G], A[B, G]
             --batch (mr_rl.rl.batch.make_batch)--> LearnerBatch [N, T]
             --step (mr_rl.rl.update: jitted policy step, AdamW)--> new params, metrics
             --log (mr_rl.metrics: metrics.jsonl, TensorBoard, W&B, console)

`train(settings, workdir)` runs it for `settings.total_steps`, writing metrics, TensorBoard and
orbax checkpoints under `workdir` (or nothing, with workdir=None: the pipelines use that for
probes). Re-running with the same workdir resumes from the latest checkpoint and reproduces
the uninterrupted run's metrics exactly (all randomness is `fold_in(root, step)`).

Scale: with more than one device, `build` makes the `settings.mesh` mesh and every program
(sampler, reference / critic forward, update step) runs sharded on it (parameters created or
loaded straight into their shards, optimizer state and batches by `mr_rl.rl.update.learner`).
The reference log-prob and critic forwards run in `num_micro_batches` row chunks
(`mr_rl.rl.update.chunked_forward`), the split the update step uses for gradient
accumulation, so no program holds the activations of more than N / M rows.

Recipes: `batch.trim_columns` / `optim.pack` (length-aware learner batches,
`mr_rl.rl.batch`); `dynamic` (DAPO: keep the groups with a learning signal,
`mr_rl.rl.dynamic_sampling`); `batch.mask_truncated` (truncated responses enter no
loss); the sampler/trainer mismatch is logged every step (`mismatch/*`) and, with
`optim.loss.recompute_old_logp` / `optim.loss.tis_cap`, corrected in the step;
`asynchrony.max_staleness` / `asynchrony.sampler_devices` (groups sampled up to s updates
ahead of the learner, host scoring overlapped or the sampler on devices of its own:
`mr_rl.async_rl`). Shape letters:
docs/shapes.md.
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

from mr_rl import async_rl, compilation, data, distributed, evaluation
from mr_rl import metrics as metrics_lib, models, program_plan
from mr_rl import rollout as rollout_lib
from mr_rl import workdir as workdir_lib
from mr_rl.checkpointing import Checkpointer, check_resume
from mr_rl.preemption import PREEMPTED_EXIT_CODE, Preempted, Preemption  # noqa: F401
from mr_rl.models import sharding
from mr_rl.rewards.runner import RewardRunner, get_reward, shared_pool
from mr_rl.rl import batch as batch_lib
from mr_rl.rl import dynamic_sampling
from mr_rl.rl import signal as signal_lib
from mr_rl.rl import update as update_lib
from mr_rl.rl.kl import reference_kl
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
    learner_mesh: the learner's mesh when the sampler has devices of its own
      (`asynchrony.sampler_devices`, `mr_rl.async_rl`); None: the learner uses `policy.mesh`.
  """
  settings: RunSettings
  policy: rollout_lib.Policy
  base_params: Any
  train_examples: Sequence[Any]
  eval_examples: Sequence[Any]
  runner: RewardRunner
  eval_sets: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
  learner_mesh: Any = None

  @property
  def model(self):
    return self.policy.model

  @property
  def mesh(self):
    """The learner's mesh (the sampler's is `policy.mesh`; the same unless split)."""
    return self.policy.mesh if self.learner_mesh is None else self.learner_mesh

  @property
  def eval_data(self):
    """What the run evaluates on: the `data.eval_sets` ({name: examples}) or, without them,
    the eval split (a list)."""
    return self.eval_sets or self.eval_examples


def load_policy(settings: RunSettings, mesh=None):
  """(model, params, tokenizer) from a checkpoint path / hub id, or a preset (random init,
  created already sharded on `mesh`; no tokenizer). Params are stored in `model.dtype`; the
  model computes in `model.compute_dtype` (mixed precision when they differ)."""
  m = settings.model
  dtype, compute = jnp.dtype(m.dtype), jnp.dtype(m.compute)
  kw = dict(moe_impl=m.moe_impl, remat=m.remat, attention_impl=m.attention_impl)
  if m.path:
    model, params = models.load_pretrained(m.path, dtype=dtype, compute_dtype=compute, mesh=mesh,
                                           **kw)
    return model, params, models.load_tokenizer(m.path)
  cfg = models.get_preset(m.preset).replace(param_dtype=dtype, dtype=compute, **kw)
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
  shared_pool().set_limits(r.worker_max_calls, r.worker_memory_bytes)
  return RewardRunner(channels, timeout_s=r.timeout_s, max_failure_share=r.max_failure_share,
                      failure_patience=r.failure_patience,
                      not_applicable_patience=r.not_applicable_patience)


def enable_compile_cache(settings: RunSettings) -> None:
  """jax's persistent compilation cache as `compile.cache_dir` says (`mr_rl.compilation`)."""
  if settings.compile.cache:
    compilation.enable_cache(settings.compile.cache)


def build(settings: RunSettings) -> Components:
  """Loads the policy, data and reward channels of a run (on a mesh with > 1 device)."""
  enable_compile_cache(settings)
  learner_mesh = None
  if settings.asynchrony.sampler_devices:  # disjoint sampler / learner devices (config.mesh:
    mesh, learner_mesh = async_rl.split_meshes(  # the learner's devices)
        settings.mesh, settings.asynchrony.sampler_devices)
  else:
    mesh = sharding.make_mesh(dict(settings.mesh)) if jax.device_count() > 1 else None
  model, params, tokenizer = load_policy(settings, mesh if learner_mesh is None else learner_mesh)
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
  # Every prompt's length before step 0 (mr_rl.data.lengths): over-long ones are an error
  # naming them, or dropped with data.skip_long_prompts (before the rows are fingerprinted).
  where, path = data.describe_source(d), d.path or None
  check = functools.partial(data.check_prompt_lengths, policy, skip=d.skip_long_prompts)
  train_ex = check(train_ex, f"train split {d.split!r} of {where}", path=path)
  eval_ex = check(eval_ex, f"eval split {d.eval_split!r} of {where}", path=path)
  eval_sets = {n: check(ex, f"eval set {n!r}",
                        path=settings.data.eval_set_options.get(n, {}).get("path") or None)
               for n, ex in eval_sets.items()}
  return Components(settings, policy, params, train_ex, eval_ex, build_runner(settings),
                    eval_sets, learner_mesh)


# ----------------------------------------------------------------------- the loop
@dataclasses.dataclass
class TrainResult:
  params: Any
  aggregator_state: Any
  history: list[dict]


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
    t_rollout, t_reward: seconds spent sampling (with the continuous engine this includes
      the reward calls that ran while rows decoded) and waiting for the rewards after it.
  """
  rollout: rollout_lib.Rollout
  r_BGK: np.ndarray
  n_kept: int
  reward_metrics: dict
  metrics: dict
  t_rollout: float
  t_reward: float

  @property
  def signal_groups(self) -> int:
    """Groups the aggregator sees: the kept ones, or all B when none was kept."""
    return self.n_kept or self.r_BGK.shape[0]


def train(settings: RunSettings, workdir: str | None, *, comp: Components | None = None,
          init_params=None, log: Callable[[str], None] | None = print) -> TrainResult:
  """Runs GRPO-family or PPO training for settings.total_steps (resuming from workdir), with
  the workdir claimed for the run (`mr_rl.workdir.claim`: one run per workdir, the same one on
  every process); `_train` has the loop."""
  if workdir is None:
    return _train(settings, None, comp=comp, init_params=init_params, log=log)
  with workdir_lib.claim(workdir, log=log if distributed.is_primary() else None):
    return _train(settings, workdir, comp=comp, init_params=init_params, log=log)


def _train(settings: RunSettings, workdir: str | None, *, comp: Components | None = None,
           init_params=None, log: Callable[[str], None] | None = print) -> TrainResult:
  """Runs GRPO-family or PPO training for settings.total_steps (resuming from workdir).

  Every compile of a device program is logged as it happens (`mr_rl.compilation`) and counted
  in the step's `compile/*` metrics; with `compile.warmup` the programs the settings predict
  compile before step 0 (`mr_rl.program_plan`)."""
  enable_compile_cache(settings)
  compiles = compilation.compile_log()
  seen = first = len(compiles)
  comp = build(settings) if comp is None else dataclasses.replace(comp, settings=settings)
  s = settings
  log = log if distributed.is_primary() else None
  names, K, M = s.rewards.channels, s.num_channels, s.update.num_micro_batches
  ppo = s.advantage == "ppo"
  agg, signal = signal_lib.signal_fn(s.aggregator.name, s.aggregator.hp,
                                     None if ppo else s.advantage, s.advantage_hp)
  learner = update_lib.learner(comp.model, s.update, comp.mesh, ppo)
  logprob_fn = logprob_forward(comp.model)
  root = jax.random.PRNGKey(s.seed)
  params = comp.base_params if init_params is None else init_params
  # The aggregator's state and the root key live on the host (numpy): every process holds the
  # same values (they come from the same global rewards), and orbax saves them once.
  state = {"train": learner.init(params, jax.random.fold_in(root, 2**30)),
           "agg": jax.device_get(agg.init(K)), "key": np.asarray(root)}
  data_iter = data.ResumableIterator(list(comp.train_examples), s.data.batch_prompts,
                                     seed=s.seed)
  rows_fp = None if workdir is None else data.fingerprint(  # (checked on resume, then saved)
      comp.train_examples, data.describe_source(s.data, s.data.split))
  alarm = metrics_lib.ShortcutAlarm(s.alarm_window)
  pipe = async_rl.Pipeline.for_run(s.asynchrony, comp.model, comp.policy.mesh, comp.learner_mesh)
  start = 0
  ckpt = writer = None
  history = []
  settings_record = metrics_lib.settings_dict(s)
  if workdir is not None:
    os.makedirs(workdir, exist_ok=True)
    ckpt = Checkpointer(workdir)  # all processes save; the end of training always is saved
    restored = ckpt.restore_latest(state, log)
    if restored is not None:
      state, meta = restored
      check_resume(meta.get("settings"), settings_record, ckpt.directory)
      state["train"] = learner.place_state(state["train"])
      start = int(meta["step"])
      data.restore_position(data_iter, meta, rows_fp, s.resume.allow_data_change,
                            ckpt.directory, log)
      alarm.restore(meta["alarm"])
      pipe.restore(workdir, start)
      if log:
        log(f"resumed from {ckpt.directory} at step {start}")
    if distributed.is_primary():  # metrics, TensorBoard and W&B are written once
      writer = metrics_lib.MetricsWriter(workdir, resume_step=start, settings=s)
  def draw_for(u):  # the call that draws step u now (the policy and aggregator state of now)
    k_roll_u, k_agg_u, _ = jax.random.split(jax.random.fold_in(state["key"], u), 3)
    return functools.partial(draw_groups, comp, pipe.sampler_params(learner.policy(
        state["train"], comp.base_params)), state["agg"], data_iter, signal, k_roll_u, k_agg_u,
                             overlap=pipe)

  def meta_now(step):  # (the draws in flight finished: the data iterator is ours alone)
    pipe.settle()
    return {"step": step + 1, "data": data_iter.state(), data.FINGERPRINT_KEY: rows_fp,
            "alarm": alarm.state(),
            "settings": settings_record, "reward_errors": dict(comp.runner.error_counts)}

  if s.compile.warmup:
    n = program_plan.warm_up(comp, s, learner, state["train"])
    compilation.log_compiles(compiles.since(seen), log)
    seen = len(compiles)
    if log:
      log(f"warm-up: compiled {n} programs ahead of step 0")
  with Preemption() as preemption, pipe:
    if start:
      preemption.saved(start)  # (the checkpoint this run resumed from)
    pipe.push(learner.policy(state["train"], comp.base_params))
    row_multiple = M * (1 if comp.mesh is None else sharding.data_parallel_size(comp.mesh))
    eta = metrics_lib.ETA(s.total_steps)
    for step in range(start, s.total_steps):
      key = jax.random.fold_in(state["key"], step)
      _, k_agg, k_upd = jax.random.split(key, 3)
      # draw + score (mr_rl.async_rl: submitted up to max_staleness steps ahead)
      pipe.fill(step, draw_for)
      draw = pipe.take(step, draw_for)
      t0 = time.perf_counter()
      # signal
      sig = signal(state["agg"], jnp.asarray(draw.r_BGK[:draw.signal_groups]), k_agg)
      state["agg"] = jax.device_get(sig.agg_state)
      # batch
      batch = learner_batch(s, draw, sig, learner, state["train"], comp.mesh, row_multiple,
                            comp.base_params)
      shape_m = {"batch/columns": float(batch.shape[1])}
      if s.update.pack:
        shape_m.update({"batch/packed_rows": float(batch.shape[0]),
                        "batch/packed_sequences": float(batch_lib.packed_sequences(batch))})
      ref_logp = None  # log pi_0: the KL penalty needs it; else only the kl_ref/* metrics do
      if s.update.loss.kl_coef > 0 or (s.kl_ref_every and step % s.kl_ref_every == 0):
        seg = () if batch.segment_ids is None else (batch.segment_ids,)
        ref_logp = update_lib.chunked_forward(logprob_fn, comp.base_params, batch.tokens,
                                              batch.mask, *seg, num_chunks=M, mesh=comp.mesh)
        if s.update.loss.kl_coef > 0:
          batch = batch.replace(ref_logp=ref_logp)
      # step
      placed = learner.place_batch(batch)
      state["train"], upd_m = learner.update(state["train"], placed, k_upd, comp.base_params)
      pipe.draw_deferred()  # (split over processes: the next draws, beside the update)
      pipe.push(learner.policy(state["train"], comp.base_params))  # split devices: timed
      kl_m = None if ref_logp is None else reference_kl(ref_logp, placed.old_logp,
                                                        placed.response_mask)
      # log (the device values of the step come to the host here)
      upd_m, kl_m, agg_m, R_BG = jax.device_get((upd_m, kl_m, sig.metrics, sig.R_BG))
      t1 = time.perf_counter()
      kept = draw.rollout if draw.n_kept in (0, draw.r_BGK.shape[0]) else \
          draw.rollout.take(draw.n_kept)
      m = metrics_lib.step_metrics(names, draw.r_BGK[:draw.signal_groups], R_BG, agg_m, upd_m,
                                   draw.reward_metrics, kept.lengths, kept.truncated)
      m.update({k: float(v) for k, v in (kl_m or {}).items()})  # measured every kl_ref_every
      m.update(shape_m)
      m.update(draw.metrics)
      m.update(alarm.update(m["reward/scalar/mean"], m[f"reward/{names[s.rewards.primary]}/mean"]))
      m.update({"time/rollout": draw.t_rollout, "time/reward": draw.t_reward,
                "time/update": t1 - t0})
      m.update(pipe.metrics())  # (after the weight push of this step's update)
      new = compiles.since(seen)  # every program compiled (or loaded from the cache) this step
      seen += len(new)
      compilation.log_compiles(new, log)
      m.update(compilation.metrics(new, seen - first))
      if s.eval.every and (step + 1) % s.eval.every == 0:
        pipe.settle()  # the reward runner is the evaluation's alone
        m.update(evaluation.run_evaluation(
            comp.policy, comp.runner, s, comp.eval_data,
            pipe.sampler_params(learner.policy(state["train"], comp.base_params)),
            jax.random.fold_in(root, 10**9 + step)))
      if not np.isfinite(m.get("loss/policy", 0.0)):
        raise FloatingPointError(f"non-finite policy loss at step {step}: {m.get('loss/policy')}")
      history.append({"step": step, **m})
      if writer:
        writer.write(step, m)
      eta_s = eta.update(step)
      if log and (step % s.log_every == 0 or step + 1 == s.total_steps):
        log(metrics_lib.console_line(step, s.total_steps, m, names, eta_s))
      periodic = s.checkpoint_every and (step + 1) % s.checkpoint_every == 0
      if ckpt and (periodic or step + 1 == s.total_steps):
        save(ckpt, pipe, workdir, step + 1, state, meta_now(step))
        preemption.saved(step + 1)
      preempted = preemption.reached(step)  # (a SIGTERM during that save counts here)
      if preempted:
        if ckpt:
          save(ckpt, pipe, workdir, step + 1, state, meta_now(step))  # no-op if just saved
          ckpt.close()
        if writer:
          writer.close()
        raise Preempted(f"stopped by SIGTERM after step {step + 1}"
                        + (f"; saved in {ckpt.directory}" if ckpt else " (no workdir: not saved)"))
  if ckpt:
    ckpt.close()
  if writer:
    writer.close()
  # (split devices: the sampler's copy, where evaluation and export of the result run)
  return TrainResult(pipe.sampler_params(learner.policy(state["train"], comp.base_params)),
                     state["agg"], history)


def save(ckpt: Checkpointer, pipe: async_rl.Pipeline, workdir: str, step: int, state,
         meta: dict) -> None:
  """A checkpoint of `step`, the draws in flight written first (`Pipeline.save`)."""
  pipe.save(workdir, step, keep=ckpt.all_steps())
  ckpt.save(step, state, meta)


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
  return batch_lib.make_batch(draw.rollout, A_BG, loss_rows_BG=loss_rows,
                              trim=s.batch.trim_columns,
                              column_buckets=s.batch.column_buckets, ppo=ppo, pack=pack)


def draw_groups(comp: Components, params, agg_state, data_iter, signal, k_roll,
                k_agg, overlap: async_rl.Pipeline | None = None):
  """The step's B groups: one rollout, or DAPO dynamic sampling's rounds (rl.dynamic_sampling).

  Round 0 samples `data.batch_prompts` prompts with `k_roll` (exactly the draw without
  dynamic sampling); round i > 0 with `fold_in(k_roll, i)`. The `scalar` signal applies the
  aggregator with the step's starting state (not committed) to each round.

  With `overlap` and no dynamic sampling, the scoring may run on its worker thread: the
  result is then an `async_rl.InFlight` whose `resolve()` gives the Draw. (Dynamic
  sampling's rounds need their scores to decide, so they are scored here.)
  """
  s = comp.settings
  dyn = s.dynamic
  B = s.data.batch_prompts
  rounds, kept, dropped, reward_m = [], [], [], {}
  t_roll = t_reward = 0.0
  for i in range(1 + (dyn.max_rounds if dyn.mode == "refill" else 0)):
    t0 = time.perf_counter()
    examples = next(data_iter)
    scoring = rollout_lib.StreamingScore(comp.runner, comp.policy, examples,
                                         s.rollout.group_size)  # rows scored as they finish
    ro = rollout_lib.rollout(comp.policy, params, examples,
                             k_roll if i == 0 else jax.random.fold_in(k_roll, i), s.rollout,
                             on_row=scoring)
    t1 = time.perf_counter()
    if dyn.mode == "off" and overlap is not None:  # the wait for the scores on a worker thread
      return overlap.score_later(scoring, ro, lambda r_BGK, m, t_reward: Draw(
          ro, r_BGK, B, {k: float(v) for k, v in m.items()}, {}, t1 - t0, t_reward))
    r_BGK, m = scoring.finish(ro)
    t_roll, t_reward = t_roll + t1 - t0, t_reward + time.perf_counter() - t1
    for k, v in m.items():
      reward_m.setdefault(k, []).append(float(v))
    if dyn.mode == "off":
      return Draw(ro, r_BGK, B, {k: v[0] for k, v in reward_m.items()}, {}, t_roll, t_reward)
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
  return Draw(ro, r_BGK, n_kept, reward_m, dyn_m, t_roll, t_reward)
