"""The trainer: the run's assembly (`build`) and its loop (`train`), one batch at a time.

Each step reads draw -> score -> signal -> batch -> step -> log (the stages:
`mr_rl.train_step`; `time/update` times signal, batch and step with a `metrics.StageTimer`):

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
`mr_rl.draw_queue`). Shape letters:
docs/shapes.md.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import compilation, data, distributed, draw_queue, evaluation
from mr_rl import metrics as metrics_lib, models, program_plan, train_step
from mr_rl import rollout as rollout_lib
from mr_rl import startup
from mr_rl import workdir as workdir_lib
from mr_rl.checkpointing import Checkpointer, check_resume
from mr_rl.errors import ConfigError
from mr_rl.preemption import PREEMPTED_EXIT_CODE, Preempted, Preemption  # noqa: F401
from mr_rl.models import sharding
from mr_rl.rewards.runner import RewardRunner, get_reward, shared_pool
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
      (`asynchrony.sampler_devices`, `mr_rl.draw_queue`); None: the learner uses `policy.mesh`.
    turns: a multi-turn run's draws (`mr_rl.multiturn.draw.TurnDraws`; the runner then holds
      only the text channels), or None.
  """
  settings: RunSettings
  policy: rollout_lib.Policy
  base_params: Any
  train_examples: Sequence[Any]
  eval_examples: Sequence[Any]
  runner: RewardRunner
  eval_sets: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
  learner_mesh: Any = None
  turns: Any = None

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


def prompt_style(settings: RunSettings, tokenizer) -> str:
  """`data.style` of the run (`mr_rl.data.templates.run_style`); chat style needs a tokenizer
  with a chat template (ConfigError naming the field otherwise)."""
  from mr_rl.data import templates
  has = bool(getattr(tokenizer, "chat_template", None))
  style = templates.run_style(settings.data.style, settings.model.path, has)
  if style == "chat" and not has:
    set_by = (f"config.data.style={settings.data.style!r}" if settings.data.style else
              f"config.data.style='' (the listed style of {settings.model.path!r})")
    raise ConfigError(f"{set_by} renders prompts with the tokenizer's chat template, and the "
                      f"tokenizer of {settings.model.path} has none; set config.data.style="
                      "'plain' (User:/Assistant: text) or give a tokenizer with a chat template")
  return style


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
  names or import paths) with their `rewards.params` and the failure-rate guard; environment
  channels (multi-turn runs) are filled by `mr_rl.multiturn.draw`, not the runner."""
  r = settings.rewards
  from mr_rl.multiturn import channels as mt_channels  # pylint: disable=import-outside-toplevel
  channels = [get_reward(spec, **r.params.get(name, {}))
              for spec, name in zip(r.specs, r.channels)
              if not mt_channels.is_environment_spec(spec)]
  shared_pool().set_limits(r.worker_max_calls, r.worker_memory_bytes)
  return RewardRunner(channels, timeout_s=r.timeout_s, max_failure_share=r.max_failure_share,
                      failure_patience=r.failure_patience,
                      not_applicable_patience=r.not_applicable_patience)


_CACHE_WARNED: set[str] = set()


def enable_compile_cache(settings: RunSettings) -> None:
  """jax's persistent compilation cache as `compile.cache_dir` says (`mr_rl.compilation`); a
  directory that cannot be made or written turns it off for the run, with one warning (the
  cache is optional: it saves compile time, never changes what is computed)."""
  d = settings.compile.cache
  if not d:
    return
  try:
    compilation.enable_cache(d)
  except OSError as e:
    if d not in _CACHE_WARNED and distributed.is_primary():
      _CACHE_WARNED.add(d)
      _LOG.warning("the compilation cache is off for this run: %s cannot be made or written "
                   "(%s); set config.compile.cache_dir (or MR_RL_CACHE) to a writable "
                   "directory, or config.compile.cache_dir='off'", d, e.strerror or e)


def build(settings: RunSettings) -> Components:
  """Loads the policy, data and reward channels of a run (on a mesh with > 1 device)."""
  enable_compile_cache(settings)
  learner_mesh = None
  if not settings.asynchrony.sampler_devices:  # (before a mesh or a sampler meets them)
    startup.check_devices(settings, jax.device_count())
  if settings.asynchrony.sampler_devices:  # disjoint sampler / learner devices (config.mesh:
    mesh, learner_mesh = draw_queue.split_meshes(  # the learner's devices)
        settings.mesh, settings.asynchrony.sampler_devices)
  else:
    mesh = sharding.make_mesh(dict(settings.mesh)) if jax.device_count() > 1 else None
  model, params, tokenizer = load_policy(settings, mesh if learner_mesh is None else learner_mesh)
  if tokenizer is None:
    raise ValueError("config.model.preset gives random weights but no tokenizer; point "
                     "config.model.path at a checkpoint directory with a tokenizer")
  startup.check_positions(settings, model.config.max_seq_len,
                          settings.model.path or f"preset {settings.model.preset}")
  d = settings.data
  if d.template:
    template = data.make_template(d.template, style=prompt_style(settings, tokenizer))
    render = lambda ex: template.render(ex, tokenizer)
  else:
    render = lambda ex: ex.prompt
  policy = rollout_lib.Policy(model, tokenizer, render, d.max_prompt_len,
                              add_bos=not d.template, mesh=mesh)
  turns = None
  if settings.multiturn.enabled:
    from mr_rl.multiturn import draw as turn_draw  # pylint: disable=import-outside-toplevel
    turns = turn_draw.TurnDraws(settings, policy)
  train_ex, eval_ex = load_examples(settings)
  eval_sets = load_eval_sets(settings)
  # Every prompt's length before step 0 (mr_rl.data.lengths): over-long ones are an error
  # naming them, or dropped with data.skip_long_prompts (before the rows are fingerprinted).
  where, path = data.describe_source(d), d.path or None
  check = functools.partial(data.check_prompt_lengths,  # (a multi-turn run's prompts: its own)
                            policy if turns is None else turns.checked_policy(policy),
                            skip=d.skip_long_prompts)
  train_ex = check(train_ex, f"train split {d.split!r} of {where}", path=path)
  eval_ex = check(eval_ex, f"eval split {d.eval_split!r} of {where}", path=path)
  eval_sets = {n: check(ex, f"eval set {n!r}",
                        path=settings.data.eval_set_options.get(n, {}).get("path") or None)
               for n, ex in eval_sets.items()}
  startup.check_rows(settings, len(train_ex),
                     f"train split {d.split!r} of {where} (after the length checks)")
  return Components(settings, policy, params, train_ex, eval_ex, build_runner(settings),
                    eval_sets, learner_mesh, turns)


# ----------------------------------------------------------------------- the loop
@dataclasses.dataclass
class TrainResult:
  params: Any
  aggregator_state: Any
  history: list[dict]


@dataclasses.dataclass
class _Outputs:
  """Where a run's steps go: the history `train` returns, the console (primary process) and,
  with a workdir, the metrics files (primary process) and orbax checkpoints (every process:
  the draws in flight written first, `DrawQueue.save`).

  Attributes:
    meta: step -> the checkpoint meta after that step (0-based).
  """
  settings: RunSettings
  draws: draw_queue.DrawQueue
  meta: Callable[[int], dict]
  log: Callable[[str], None] | None
  workdir: str | None = None
  ckpt: Checkpointer | None = None
  writer: metrics_lib.MetricsWriter | None = None
  history: list[dict] = dataclasses.field(default_factory=list)

  def write(self, step: int, m: dict, eta_s: float) -> None:
    """Records the step's metrics (a non-finite policy loss stops the run)."""
    if not np.isfinite(m.get("loss/policy", 0.0)):
      raise FloatingPointError(f"non-finite policy loss at step {step}: {m.get('loss/policy')}")
    self.history.append({"step": step, **m})
    if self.writer:
      self.writer.write(step, m)
    s = self.settings
    if self.log and (step % s.log_every == 0 or step + 1 == s.total_steps):
      self.log(metrics_lib.console_line(step, s.total_steps, m, s.rewards.channels, eta_s))

  def save(self, step: int, state) -> None:
    """The checkpoint after `step` (0-based; no-op when written already)."""
    meta = self.meta(step)  # (the draws in flight finished first)
    self.draws.save(self.workdir, step + 1, keep=self.ckpt.all_steps())
    self.ckpt.save(step + 1, state, meta)

  def end_step(self, step: int, state, preemption: Preemption) -> None:
    """Saves the checkpoint after `step` when one is due; on SIGTERM saves it, closes the
    files and raises Preempted."""
    s = self.settings
    periodic = s.checkpoint_every and (step + 1) % s.checkpoint_every == 0
    if self.ckpt and (periodic or step + 1 == s.total_steps):
      self.save(step, state)
      preemption.saved(step + 1)
    if preemption.reached(step):  # (a SIGTERM during that save counts here)
      if self.ckpt:
        self.save(step, state)  # no-op if just saved
      self.close()
      raise Preempted(f"stopped by SIGTERM after step {step + 1}" + (
          f"; saved in {self.ckpt.directory}" if self.ckpt else " (no workdir: not saved)"))

  def close(self) -> None:
    if self.ckpt:
      self.ckpt.close()
    if self.writer:
      self.writer.close()


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
  compiles = compilation.StepCompiles()
  comp = build(settings) if comp is None else dataclasses.replace(comp, settings=settings)
  s = settings
  log = log if distributed.is_primary() else None
  K, M = s.num_channels, s.update.num_micro_batches
  ppo = s.advantage == "ppo"
  agg, signal = signal_lib.signal_fn(s.aggregator.name, s.aggregator.hp,
                                     None if ppo else s.advantage, s.advantage_hp)
  learner = update_lib.learner(comp.model, s.update, comp.mesh, ppo)
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
  # The sampler's params: the policy of the learner's state the loop pushes (`DrawQueue.push`).
  draws = draw_queue.DrawQueue.for_run(s.asynchrony, comp.model, comp.policy.mesh,
                                       comp.learner_mesh, policy=functools.partial(
                                           learner.policy, base=comp.base_params))
  settings_record = metrics_lib.settings_dict(s)

  def meta_now(step):  # (the draws in flight finished: the data iterator is ours alone)
    draws.settle()
    return {"step": step + 1, "data": data_iter.state(), data.FINGERPRINT_KEY: rows_fp,
            "alarm": alarm.state(),
            "settings": settings_record, "reward_errors": dict(comp.runner.error_counts)}

  out, start = _Outputs(s, draws, meta_now, log, workdir), 0
  if workdir is not None:  # (made by `train`'s claim, a bucket URL too)
    out.ckpt = Checkpointer(workdir)  # all processes save; the end of training always is saved
    restored = out.ckpt.restore_latest(state, log)
    if restored is not None:
      state, meta = restored
      check_resume(meta.get("settings"), settings_record, out.ckpt.directory)
      state["train"] = learner.place_state(state["train"])
      start = int(meta["step"])
      data.restore_position(data_iter, meta, rows_fp, s.resume.allow_data_change,
                            out.ckpt.directory, log)
      alarm.restore(meta["alarm"])
      draws.restore(workdir, start)
      if log:
        log(f"resumed from {out.ckpt.directory} at step {start}")
    if distributed.is_primary():  # metrics, TensorBoard and W&B are written once
      out.writer = metrics_lib.MetricsWriter(workdir, resume_step=start, settings=s)

  def draw_for(u):  # the call that draws step u now (the policy and aggregator state of now)
    k_roll_u, k_agg_u, _ = train_step.step_keys(state["key"], u)
    return functools.partial(train_step.draw_groups, comp, draws.policy_params(), state["agg"],
                             data_iter, signal, k_roll_u, k_agg_u, overlap=draws)

  if s.compile.warmup:
    n = program_plan.warm_up(comp, s, learner, state["train"])
    compiles.take(log)
    if log:
      log(f"warm-up: compiled {n} programs ahead of step 0")
  with Preemption() as preemption, draws:
    if start:
      preemption.saved(start)  # (the checkpoint this run resumed from)
    draws.push(state["train"])
    row_multiple = M * (1 if comp.mesh is None else sharding.data_parallel_size(comp.mesh))
    eta = metrics_lib.ETA(s.total_steps)
    for step in range(start, s.total_steps):
      _, k_agg, k_upd = train_step.step_keys(state["key"], step)
      draws.fill(step, draw_for)  # draw + score, submitted up to max_staleness steps ahead
      draw = draws.take(step, draw_for)
      timer = metrics_lib.StageTimer(draw.seconds)  # time/rollout, time/reward (the draw's)
      with timer("update"):  # signal -> batch -> step
        sig = signal(state["agg"], jnp.asarray(draw.r_BGK[:draw.signal_groups]), k_agg)
        state["agg"] = jax.device_get(sig.agg_state)
        batch, ref_logp, batch_m = train_step.step_batch(s, step, draw, sig, learner,
                                                         state["train"], comp, row_multiple)
        placed = learner.place_batch(batch)
        state["train"], upd_m = learner.update(state["train"], placed, k_upd, comp.base_params)
        draws.draw_deferred()  # (split over processes: the next draws, beside the update)
        draws.push(state["train"])  # (split devices: a timed copy)
        kl_m = None if ref_logp is None else reference_kl(ref_logp, placed.old_logp,
                                                          placed.response_mask)
        # (the device values of the step come to the host here)
        upd_m, kl_m, agg_m, R_BG = jax.device_get((upd_m, kl_m, sig.metrics, sig.R_BG))
      m = train_step.log_metrics(s, draw, R_BG, agg_m, upd_m, kl_m, batch_m, alarm)  # log
      m.update(timer.metrics())
      m.update(draws.metrics())  # (after the weight push of this step's update)
      m.update(compiles.take(log))  # every program compiled (or loaded from the cache)
      if s.eval.every and (step + 1) % s.eval.every == 0:
        draws.settle()  # the reward runner is the evaluation's alone
        m.update(evaluation.run_evaluation(comp.policy, comp.runner, s, comp.eval_data,
                                           draws.policy_params(),
                                           jax.random.fold_in(root, 10**9 + step),
                                           turns=comp.turns))
      out.write(step, m, eta.update(step))
      out.end_step(step, state, preemption)
  out.close()
  # (split devices: the sampler's copy, where evaluation and export of the result run)
  return TrainResult(draws.policy_params(), state["agg"], out.history)
