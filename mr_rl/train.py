"""The trainer: one batch from rollout to update, in the order it happens.

    prompts --(sampler, KV cache)--> responses, old log-probs
            --(reward runner, host pool)--> r[B, G, K]   (NaN = failed / not applicable)
            --(aggregator, jitted, state carried)--> R[B, G] (+ channel weights)
            --(advantage estimator)--> A[B, G]
            --(jitted policy step, AdamW)--> new params

`train(settings, workdir)` runs it for `settings.total_steps`, writing metrics, TensorBoard and
orbax checkpoints under `workdir` (or nothing, with workdir=None: the pipelines use that for
probes). Re-running with the same workdir resumes from the latest checkpoint and reproduces
the uninterrupted run's metrics exactly (all randomness is `fold_in(root, step)`).

Scale: with more than one device, `build` makes the `settings.mesh` mesh and every program
(sampler, reference / critic forward, update step) runs sharded on it (parameters and
optimizer state by `mr_rl.models.sharding` / `mr_rl.rl.update.state_shardings`, rows over the
data axes). The reference log-prob and critic forwards run in `num_micro_batches` row chunks
(`mr_rl.rl.update.chunked_forward`), the split the update step uses for gradient
accumulation, so no program holds the activations of more than B*G / M rows.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import aggregators, metrics as metrics_lib, models, sampling
from mr_rl.checkpointing import Checkpointer
from mr_rl.rewards.runner import RewardRunner, get_reward
from mr_rl.rl import advantages as adv_lib
from mr_rl.rl import update as update_lib
from mr_rl.settings import RunSettings

_LOG = logging.getLogger(__name__)


# --------------------------------------------------------------------------- components
@dataclasses.dataclass
class Components:
  """Everything built once per run (and shared by the pipelines' sub-runs)."""
  settings: RunSettings
  model: models.Transformer
  tokenizer: Any
  base_params: Any              # pi_0 (also the KL reference)
  train_examples: Sequence[Any]
  eval_examples: Sequence[Any]
  render: Callable[[Any], str]  # example -> prompt text
  runner: RewardRunner
  mesh: Any = None
  eval_sets: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)


def load_policy(settings: RunSettings, mesh=None):
  """(model, params, tokenizer) from a checkpoint path/hub id or a preset (random init)."""
  dtype = jnp.dtype(settings.model.dtype)
  if settings.model.path:
    model, params = models.load_pretrained(settings.model.path, dtype=dtype, mesh=mesh)
    tokenizer = models.load_tokenizer(settings.model.path)
  else:
    cfg = models.get_preset(settings.model.preset).replace(param_dtype=dtype, dtype=dtype)
    model = models.Transformer(cfg)
    params = models.init_params(model, jax.random.PRNGKey(settings.seed))
    if mesh is not None:
      from mr_rl.models import sharding
      params = sharding.shard_params(params, model, mesh)
    tokenizer = None
  return model, params, tokenizer


def load_examples(settings: RunSettings):
  """(train, eval) example lists for the configured data set."""
  d = settings.data
  if d.name == "arithmetic":
    from mr_rl.demo import task
    opts = dict(d.options)
    n_train = int(opts.pop("num_train", 20000))
    n_eval = int(opts.pop("num_eval", max(settings.eval.num_prompts,
                                          settings.anchor.held_out_prompts)))
    return (task.examples(n_train, settings.seed, "train", **opts),
            task.examples(n_eval, settings.seed, "test", **opts))
  from mr_rl import data
  train = data.load_dataset(d.name, path=d.path or None, split=d.split, **d.options)
  evals = data.load_dataset(d.name, path=d.path or None, split=d.eval_split, **d.options)
  return train, evals


def load_eval_sets(settings: RunSettings) -> dict[str, list]:
  """{name: examples} for `data.eval_sets` (each at its loader's default split, or the `split`
  / `path` / loader options given in `data.eval_set_options[name]`)."""
  from mr_rl import data
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


def drop_long_prompts(comp: Components, examples, what: str) -> list:
  """`examples` without those whose prompt exceeds `data.max_prompt_len` (data.skip_long_prompts).

  Logs how many were dropped; raises ValueError if none is left.
  """
  P = comp.settings.data.max_prompt_len
  kept = [ex for ex in examples if len(prompt_ids(comp, ex)) <= P]
  dropped = len(examples) - len(kept)
  if dropped:
    _LOG.warning("data.skip_long_prompts: dropped %d of %d %s examples longer than "
                 "data.max_prompt_len=%d tokens", dropped, len(examples), what, P)
  if not kept:
    raise ValueError(f"every one of the {len(examples)} {what} examples is longer than "
                     f"config.data.max_prompt_len={P} tokens; raise it")
  return kept


def build(settings: RunSettings) -> Components:
  mesh = None
  if jax.device_count() > 1:
    from mr_rl.models import sharding
    mesh = sharding.make_mesh(dict(settings.mesh))
  model, params, tokenizer = load_policy(settings, mesh)
  if tokenizer is None:
    raise ValueError("config.model.preset gives random weights but no tokenizer; point "
                     "config.model.path at a checkpoint directory with a tokenizer")
  train_ex, eval_ex = load_examples(settings)
  if settings.data.template:
    from mr_rl import data
    template = data.make_template(settings.data.template, model=settings.model.path)
    render = lambda ex: template.render(ex, tokenizer)
  else:
    render = lambda ex: ex.prompt
  channels = [get_reward(n, **settings.rewards.params.get(n, {}))
              for n in settings.rewards.channels]
  runner = RewardRunner(channels, timeout_s=settings.rewards.timeout_s)
  comp = Components(settings, model, tokenizer, params, train_ex, eval_ex, render, runner, mesh,
                    load_eval_sets(settings))
  if settings.data.skip_long_prompts:
    comp = dataclasses.replace(
        comp, train_examples=drop_long_prompts(comp, comp.train_examples, "train"),
        eval_examples=drop_long_prompts(comp, comp.eval_examples, "eval split"),
        eval_sets={n: drop_long_prompts(comp, ex, f"eval set {n}")
                   for n, ex in comp.eval_sets.items()})
  else:  # benchmark prompts are only encoded at the end of a run: check them now
    P = settings.data.max_prompt_len
    for name, examples in comp.eval_sets.items():
      n_long = sum(len(prompt_ids(comp, ex)) > P for ex in examples)
      if n_long:
        raise ValueError(f"{n_long} of the {len(examples)} prompts of eval set {name!r} are "
                         f"longer than config.data.max_prompt_len={P} tokens; raise it or set "
                         "config.data.skip_long_prompts")
  return comp


# ------------------------------------------------------------------------ jitted pieces
def _batch_example(update_config: update_lib.UpdateConfig, ppo: bool) -> dict:
  """The keys (and ranks) of the batch `train` feeds the step (for its batch shardings)."""
  x = jax.ShapeDtypeStruct((1, 1), jnp.float32)
  keys = ["tokens_BT", "mask_BT", "response_mask_BT", "old_logp_BT"]
  keys += ["advantages_BT", "returns_BT", "old_values_BT"] if ppo else ["advantages_BG"]
  if update_config.loss.kl_coef > 0:
    keys.append("ref_logp_BT")
  return {k: x for k in keys}


@functools.lru_cache(maxsize=16)
def _state_shardings(model, update_config: update_lib.UpdateConfig, mesh, ppo: bool):
  """(param shardings, TrainState shardings, batch shardings) of a run on `mesh`."""
  from mr_rl.models import sharding
  rules = sharding.DEFAULT_RULES
  p_sh = sharding.param_shardings(model, mesh, rules)
  tx = update_lib.make_optimizer(update_config)
  params_abs = models.abstract_params(model)
  if ppo:
    value_tx = update_lib.make_optimizer(update_config, lr=update_config.value_lr)
    v_sh = update_lib.value_param_shardings(model, mesh, rules)
    state_abs = jax.eval_shape(lambda p: update_lib.init_train_state(
        p, tx, update_lib.init_value_params(model, p, jax.random.PRNGKey(0)), value_tx),
                               params_abs)
    st_sh = update_lib.state_shardings(state_abs, tx, p_sh, mesh, value_tx, v_sh)
  else:
    state_abs = jax.eval_shape(lambda p: update_lib.init_train_state(p, tx), params_abs)
    st_sh = update_lib.state_shardings(state_abs, tx, p_sh, mesh)
  b_sh = update_lib._batch_shardings(  # pylint: disable=protected-access
      _batch_example(update_config, ppo), mesh, update_lib.data_axes(mesh))
  return p_sh, st_sh, b_sh


def _mesh_kwargs(model, update_config, mesh, ppo: bool) -> dict:
  if mesh is None:
    return {}
  from mr_rl.models import sharding
  return dict(mesh=mesh, rules=sharding.DEFAULT_RULES,
              state_sharding=_state_shardings(model, update_config, mesh, ppo)[1],
              batch_example=_batch_example(update_config, ppo))


@functools.lru_cache(maxsize=16)
def _policy_step(model, update_config: update_lib.UpdateConfig, mesh=None):
  """One compiled update step per (model, settings, mesh), shared by the pipelines' sub-runs."""
  tx = update_lib.make_optimizer(update_config)
  return tx, update_lib.make_policy_step(update_lib.model_logits_fn(model), update_config, tx,
                                         **_mesh_kwargs(model, update_config, mesh, False))


@functools.lru_cache(maxsize=16)
def _ppo_step(model, update_config: update_lib.UpdateConfig, mesh=None):
  """PPO: policy + critic optimisers, the jitted step and the jitted critic forward."""
  tx = update_lib.make_optimizer(update_config)
  value_tx = update_lib.make_optimizer(update_config, lr=update_config.value_lr)
  value_fn = update_lib.model_value_fn(model)
  step = update_lib.make_ppo_step(update_lib.model_logits_fn(model), value_fn, update_config, tx,
                                  value_tx, **_mesh_kwargs(model, update_config, mesh, True))
  return tx, value_tx, step, jax.jit(value_fn)


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


# ----------------------------------------------------------------------------- rollout
def prompt_ids(comp: Components, ex) -> list[int]:
  """The prompt token ids of one example (rendered; BOS added for untemplated prompts)."""
  tok = comp.tokenizer
  ids = tok(comp.render(ex), add_special_tokens=False)["input_ids"]
  if comp.settings.data.name == "arithmetic" or not comp.settings.data.template:
    if tok.bos_token_id is not None:
      ids = [tok.bos_token_id] + ids
  return ids


def encode_prompts(comp: Components, examples) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded prompt tokens and mask [B, max_prompt_len]."""
  tok, P = comp.tokenizer, comp.settings.data.max_prompt_len
  pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
  ids_B = []
  for ex in examples:
    ids = prompt_ids(comp, ex)
    if len(ids) > P:
      raise ValueError(f"prompt of {getattr(ex, 'uid', ex)} has {len(ids)} tokens > "
                       f"config.data.max_prompt_len={P} (or set config.data.skip_long_prompts)")
    ids_B.append(ids)
  out = np.full((len(ids_B), P), pad, np.int32)
  mask = np.zeros((len(ids_B), P), np.int32)
  for i, ids in enumerate(ids_B):
    out[i, P - len(ids):] = ids
    mask[i, P - len(ids):] = 1
  return out, mask


@dataclasses.dataclass
class Rollout:
  prompt_tokens: np.ndarray   # [B, P]
  prompt_mask: np.ndarray     # [B, P]
  tokens: np.ndarray          # [B, G, N]
  logprobs: np.ndarray        # [B, G, N]
  mask: np.ndarray            # [B, G, N]
  lengths: np.ndarray         # [B, G]
  truncated: np.ndarray       # [B, G]
  texts: list                 # B lists of G decoded responses


def rollout(comp: Components, params, examples, key, *, group_size: int,
            temperature: float | None = None) -> Rollout:
  s = comp.settings
  p_tok, p_mask = encode_prompts(comp, examples)
  tok = comp.tokenizer
  out = sampling.generate_groups(
      comp.model, params, p_tok, p_mask, group_size=group_size, key=key,
      max_new_tokens=s.rollout.max_new_tokens,
      temperature=s.rollout.temperature if temperature is None else temperature,
      top_k=s.rollout.top_k, top_p=s.rollout.top_p, eos_id=tok.eos_token_id,
      pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
      mesh=getattr(comp, "mesh", None))  # evaluation passes a view without a mesh
  out = jax.device_get(out)
  B = len(examples)
  texts = []
  for b in range(B):
    row = []
    for g in range(group_size):
      n = int(out.lengths[b, g]) - (0 if out.truncated[b, g] else 1)  # drop the EOS token
      row.append(tok.decode(out.tokens[b, g, :n].tolist(), skip_special_tokens=False))
    texts.append(row)
  return Rollout(p_tok, p_mask, np.asarray(out.tokens), np.asarray(out.logprobs),
                 np.asarray(out.mask), np.asarray(out.lengths), np.asarray(out.truncated), texts)


def score(comp: Components, ro: Rollout, examples) -> tuple[np.ndarray, dict]:
  # Everything a channel may need: metadata, reference, and the conversation (reward models).
  # Plain dicts (not the Example's read-only proxies) so process-pool channels can pickle them.
  ex_dicts = [{**ex.as_mapping(), "messages": [dict(m) for m in ex.messages]} for ex in examples]
  return comp.runner(ro.texts, ex_dicts, ro.lengths.astype(np.int64))


def update_batch(ro: Rollout, A_BG) -> dict:
  """The policy step's batch over N = B*G rows: prompt + response tokens."""
  B, G, N = ro.tokens.shape
  P = ro.prompt_tokens.shape[1]
  rep = lambda a: np.repeat(a, G, axis=0)
  tokens = np.concatenate([rep(ro.prompt_tokens), ro.tokens.reshape(B * G, N)], 1)
  resp = ro.mask.reshape(B * G, N)
  mask = np.concatenate([rep(ro.prompt_mask), resp], 1)
  zeros = np.zeros((B * G, P), np.int32)
  return {"tokens_BT": jnp.asarray(tokens), "mask_BT": jnp.asarray(mask),
          "response_mask_BT": jnp.asarray(np.concatenate([zeros, resp], 1)),
          "old_logp_BT": jnp.asarray(np.concatenate(
              [zeros.astype(np.float32), ro.logprobs.reshape(B * G, N)], 1)),
          "advantages_BG": A_BG}


# ---------------------------------------------------------------------------- evaluate
def evaluate(comp: Components, params, examples, *, samples: int, temperature: float,
             key) -> dict[str, float]:
  """Sampled (temperature > 0) or greedy evaluation through mr_rl.evaluation (METHODS.md 8).

  Returns the flat `eval/...` metrics: per-channel means, `eval/<primary>&<aux>` joint rates,
  pass@k of the primary channel, lengths.
  """
  from mr_rl import evaluation
  greedy = temperature == 0
  cfg = evaluation.EvalConfig(mode="greedy" if greedy else "sampled",
                              num_samples=None if greedy else samples,
                              temperature=None if greedy else temperature)
  return evaluation.evaluate(comp, params, examples, cfg, key).metrics("eval/")


def evaluation_examples(comp: Components, num_prompts: int) -> list:
  """What evaluation runs on: the first `num_prompts` examples of each `data.eval_sets` set
  (pooled), or of the eval split when no sets are configured."""
  if comp.eval_sets:
    return [ex for examples in comp.eval_sets.values() for ex in examples[:num_prompts]]
  return list(comp.eval_examples[:num_prompts])


def run_evaluation(comp: Components, params, key, eval_settings=None) -> dict[str, float]:
  """The configured evaluation: `eval_settings` (default `comp.settings.eval`) on
  `evaluation_examples`.

  With `data.eval_sets`, `eval/<metric>` pools every record and `eval/<set>/<metric>` is per
  set (several sets also give `eval/macro/<metric>`, mr_rl.evaluation).
  """
  e = comp.settings.eval if eval_settings is None else eval_settings
  m = evaluate(comp, params, evaluation_examples(comp, e.num_prompts),
               samples=e.samples_per_prompt, temperature=e.temperature, key=key)
  if len(comp.eval_sets) == 1:  # the evaluator only splits out sets when there are several
    (name,) = comp.eval_sets
    m.update({f"eval/{name}/{k[len('eval/'):]}": v for k, v in list(m.items())})
  return m


# ------------------------------------------------------------------------------- train
@dataclasses.dataclass
class TrainResult:
  params: Any
  aggregator_state: Any
  history: list[dict]


def train(settings: RunSettings, workdir: str | None, *, comp: Components | None = None,
          init_params=None, log: Callable[[str], None] | None = print) -> TrainResult:
  """Runs GRPO-family training for settings.total_steps (resuming from workdir if possible)."""
  comp = build(settings) if comp is None else dataclasses.replace(comp, settings=settings)
  s = settings
  names, K, G = s.rewards.channels, s.num_channels, s.rollout.group_size
  params = comp.base_params if init_params is None else init_params
  ppo = s.advantage == "ppo"
  agg, agg_fn = _aggregate_fn(s.aggregator.name, _hashable(s.aggregator.hp),
                              "grpo" if ppo else s.advantage,
                              () if ppo else _hashable(s.advantage_hp))
  logprob_fn = _logprob_fn(comp.model)
  mesh, M = comp.mesh, s.update.num_micro_batches
  if (s.data.batch_prompts * G) % M:
    raise ValueError(f"config.optim.num_micro_batches={M} must divide the rollout rows "
                     f"data.batch_prompts x rollout.group_size = {s.data.batch_prompts * G}")
  root = jax.random.PRNGKey(s.seed)
  # Copy: the step donates its input state, and params may be pi_0 shared with other runs.
  params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
  if ppo:  # AMRP Table 4: policy and critic both start from the base checkpoint
    tx, value_tx, policy_step, value_fn = _ppo_step(comp.model, s.update, mesh)
    value_params = update_lib.init_value_params(comp.model, params,
                                                jax.random.fold_in(root, 2**30))
    train_state = update_lib.init_train_state(params, tx, value_params, value_tx)
  else:
    tx, policy_step = _policy_step(comp.model, s.update, mesh)
    train_state = update_lib.init_train_state(params, tx)
  place = lambda state: state
  if mesh is not None:  # the step's in/out shardings (the state is donated, so placed exactly)
    _, state_sh, batch_sh = _state_shardings(comp.model, s.update, mesh, ppo)
    place = lambda state: jax.device_put(state, state_sh)
    train_state = place(train_state)
  state = {"train": train_state, "agg": agg.init(K), "key": root}
  data_iter = _iterator(comp, s)
  alarm = metrics_lib.ShortcutAlarm(s.alarm_window)
  start = 0
  ckpt = writer = None
  if workdir is not None:
    os.makedirs(workdir, exist_ok=True)
    ckpt = Checkpointer(workdir) if s.checkpoint_every else None
    latest = ckpt.latest_step() if ckpt else None
    if latest is not None:
      state, meta = ckpt.restore(latest, state)
      state["train"] = place(state["train"])
      start = int(meta["step"])
      data_iter.restore(meta["data"])
      alarm.restore(meta["alarm"])
      if log:
        log(f"resumed from {ckpt.directory} at step {start}")
    writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
  history = []
  for step in range(start, s.total_steps):
    key = jax.random.fold_in(state["key"], step)
    k_roll, k_agg, k_upd = jax.random.split(key, 3)
    t0 = time.perf_counter()
    examples = next(data_iter)
    ro = rollout(comp, state["train"].params, examples, k_roll, group_size=G)
    t1 = time.perf_counter()
    r_BGK, reward_m = score(comp, ro, examples)
    t2 = time.perf_counter()
    R_BG, A_BG, state["agg"], agg_m = agg_fn(state["agg"], jnp.asarray(r_BGK), k_agg)
    batch = update_batch(ro, A_BG)
    forward = lambda fn, p: update_lib.chunked_forward(fn, p, batch["tokens_BT"],
                                                       batch["mask_BT"], num_chunks=M, mesh=mesh)
    if ppo:
      _add_ppo_targets(batch, np.asarray(R_BG), forward(value_fn, state["train"].value_params),
                       s.advantage_hp)
    ref_logp = None  # log pi_0: the KL penalty needs it; else only the kl_ref/* metrics do
    if s.update.loss.kl_coef > 0 or (s.kl_ref_every and step % s.kl_ref_every == 0):
      ref_logp = forward(logprob_fn, comp.base_params)
    if s.update.loss.kl_coef > 0:
      batch["ref_logp_BT"] = ref_logp
    if mesh is not None:
      batch = jax.device_put(batch, {k: batch_sh[k] for k in batch})
    state["train"], upd_m = policy_step(state["train"], batch, k_upd)
    upd_m = jax.device_get(upd_m)
    t3 = time.perf_counter()
    m = _step_metrics(s, r_BGK, R_BG, agg_m, upd_m, reward_m, ro, batch, ref_logp)
    m.update(alarm.update(m["reward/scalar/mean"], m[f"reward/{names[s.rewards.primary]}/mean"]))
    m.update({"time/rollout": t1 - t0, "time/reward": t2 - t1, "time/update": t3 - t2})
    if s.eval.every and (step + 1) % s.eval.every == 0:
      m.update(run_evaluation(comp, state["train"].params,
                              key=jax.random.fold_in(root, 10**9 + step)))
    if not np.isfinite(m.get("loss/policy", 0.0)):
      raise FloatingPointError(f"non-finite policy loss at step {step}: {m.get('loss/policy')}")
    history.append({"step": step, **m})
    if writer:
      writer.write(step, m)
    if log and (step % s.log_every == 0 or step + 1 == s.total_steps):
      log(metrics_lib.console_line(step, s.total_steps, m, names))
    if ckpt and ((step + 1) % s.checkpoint_every == 0 or step + 1 == s.total_steps):
      ckpt.save(step + 1, state, {"step": step + 1, "data": data_iter.state(),
                                  "alarm": alarm.state(),
                                  "reward_errors": dict(comp.runner.error_counts)})
  if ckpt:
    ckpt.close()
  if writer:
    writer.close()
  return TrainResult(state["train"].params, state["agg"], history)


def _add_ppo_targets(batch, R_BG, values_BT, hp) -> None:
  """PPO (METHODS.md 3): outcome reward at the last response token, GAE, batch whitening."""
  from mr_rl.rl import gae
  R_B = jnp.nan_to_num(R_BG.reshape(-1), nan=0.0)
  adv, ret = gae.ppo_advantages(R_B, values_BT, batch["response_mask_BT"],
                                gamma=float(hp.get("gamma", 1.0)), lam=float(hp.get("lam", 1.0)))
  del batch["advantages_BG"]
  batch.update(advantages_BT=adv, returns_BT=ret, old_values_BT=values_BT)


def _iterator(comp: Components, s: RunSettings):
  from mr_rl.data import ResumableIterator
  return ResumableIterator(list(comp.train_examples), s.data.batch_prompts, seed=s.seed)


def _step_metrics(s, r_BGK, R_BG, agg_m, upd_m, reward_m, ro, batch, ref_logp) -> dict:
  names = s.rewards.channels
  m = metrics_lib.channel_summaries(r_BGK, names)
  m.update(metrics_lib.profile_distribution(r_BGK, names))
  R = np.asarray(R_BG)
  m["reward/scalar/mean"] = float(np.nanmean(R)) if np.isfinite(R).any() else float("nan")
  m["reward/scalar/std"] = float(np.nanstd(R)) if np.isfinite(R).any() else float("nan")
  agg_m = jax.device_get(agg_m)
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
      key = {"policy_loss": "loss/policy", "pg_loss": "loss/pg", "entropy": "policy/entropy",
             "kl": "loss/kl"}.get(k, f"update/{k}")
      m[key] = float(v)
  m.update({k.replace("rewards/", "reward_runner/"): float(v) for k, v in reward_m.items()})
  m["response/length_mean"] = float(ro.lengths.mean())
  m["response/truncated_frac"] = float(ro.truncated.mean())
  if ref_logp is None:  # not measured this step (kl_ref_every)
    return m
  resp = np.asarray(batch["response_mask_BT"], np.float32)
  x = np.asarray(ref_logp) - np.asarray(batch["old_logp_BT"])  # log pi_ref - log pi
  x = np.clip(x, -20, 20)
  denom = max(resp.sum(), 1.0)
  m["kl_ref/k1"] = float((-x * resp).sum() / denom)
  m["kl_ref/k3"] = float(((np.exp(x) - 1 - x) * resp).sum() / denom)
  return m
