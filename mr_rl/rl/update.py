"""Jitted policy-update steps: GRPO-family and PPO (METHODS.md sections 3-5).

One step signature (STYLE.md 5): ``step(state, batch, rng) -> (state, metrics)``, with
``state`` a ``TrainState`` (flax.struct) and static settings bound by the factories
``make_policy_step`` / ``make_ppo_step``. ``batch`` is a dict over ``N = B * G`` rows:

* ``tokens_BT`` int32 prompt + response, prompts left-padded, responses right-padded;
* ``mask_BT`` 1 on real (prompt or response) tokens;
* ``response_mask_BT`` 1 on the response tokens that enter the loss (never column 0);
* ``old_logp_BT`` the sampler's log-probs of ``tokens_BT[:, t]`` (reused as pi_old);
* ``advantages_BG`` ``[B, G]`` with ``B * G = N`` (row ``b * G + g``), or
  ``advantages_BT`` per token (PPO: whitened GAE, see gae.py);
* ``ref_logp_BT`` reference-policy log-probs, when ``kl_coef > 0``;
* PPO only: ``returns_BT`` and ``old_values_BT``.

Micro-batching: the batch is split into ``num_micro_batches`` strided micro-batches
(row ``i`` goes to micro-batch ``i % M``, so each data shard feeds every micro-batch);
gradients and metrics are summed with ``lax.scan``. Exactness across micro-batches comes
from aggregation weights computed on the full batch (losses.py docstring): every mode
(token-mean, seq-mean-token-mean, seq-mean-token-sum-norm) gives the full-batch loss
and gradient up to float summation order.

Sharding: given a ``mesh`` and logical-axis ``rules``, params (and the optimizer state
mirroring them) use ``NamedSharding`` from the params' logical axis names, batch rows
are sharded over the data axes, and the step is jitted with explicit in/out shardings and
``donate_argnums=0``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mr_rl.rl.losses import (PolicyLossConfig, policy_loss, token_logprobs_and_entropy,
                             token_weights, value_loss)

LogitsFn = Callable[[Any, jax.Array, jax.Array], jax.Array]
ValueFn = Callable[[Any, jax.Array, jax.Array], jax.Array]


@flax.struct.dataclass
class TrainState:
  """Learner state. ``value_*`` are None unless training a PPO critic."""
  step: jax.Array
  params: Any
  opt_state: Any
  value_params: Any = None
  value_opt_state: Any = None


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  """Optimisation settings of one learner step.

  Attributes:
    loss: clipped-surrogate / KL / entropy settings (PolicyLossConfig). For
      ``seq-mean-token-sum-norm`` set ``loss.norm_len`` to the maximum response length;
      its default (None) is the batch's full T, prompt included.
    num_micro_batches: M, gradient-accumulation chunks; must divide the row count.
    lr: AdamW learning rate of the policy (papers: 1e-6).
    warmup_steps: linear warm-up steps from 0 to ``lr`` (0 = constant).
    weight_decay: AdamW decoupled weight decay (verl's default 0.01).
    b1: Adam beta1.
    b2: Adam beta2.
    adam_eps: Adam epsilon.
    max_grad_norm: global-norm gradient clip (None = off).
    value_lr: AdamW learning rate of the PPO critic.
    vf_clip: PPO value clip range (None = unclipped).
  """
  loss: PolicyLossConfig = PolicyLossConfig()
  num_micro_batches: int = 1
  lr: float = 1e-6
  warmup_steps: int = 0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  adam_eps: float = 1e-8
  max_grad_norm: Optional[float] = 1.0
  value_lr: float = 1e-5
  vf_clip: Optional[float] = 0.2

  def __post_init__(self):
    if not isinstance(self.loss, PolicyLossConfig):
      raise TypeError(f'loss must be a PolicyLossConfig, got {type(self.loss).__name__}.')
    if not isinstance(self.num_micro_batches, int) or self.num_micro_batches < 1:
      raise ValueError(f'num_micro_batches must be a positive int, got {self.num_micro_batches!r}.')
    for name in ('lr', 'value_lr'):
      if getattr(self, name) <= 0:
        raise ValueError(f'{name} must be > 0, got {getattr(self, name)}.')
    if self.warmup_steps < 0:
      raise ValueError(f'warmup_steps must be >= 0, got {self.warmup_steps}.')
    if self.weight_decay < 0:
      raise ValueError(f'weight_decay must be >= 0, got {self.weight_decay}.')
    if self.max_grad_norm is not None and self.max_grad_norm <= 0:
      raise ValueError(f'max_grad_norm must be > 0 or None, got {self.max_grad_norm}.')
    if self.vf_clip is not None and self.vf_clip <= 0:
      raise ValueError(f'vf_clip must be > 0 or None, got {self.vf_clip}.')


def make_optimizer(config: UpdateConfig,
                   lr: Optional[float] = None) -> optax.GradientTransformation:
  """Global-norm clipping then AdamW (``lr`` overrides ``config.lr``, e.g. for the critic)."""
  lr = config.lr if lr is None else lr
  sched = lr if config.warmup_steps == 0 else optax.linear_schedule(0.0, lr, config.warmup_steps)
  parts = [] if config.max_grad_norm is None else [optax.clip_by_global_norm(config.max_grad_norm)]
  parts.append(optax.adamw(sched, b1=config.b1, b2=config.b2, eps=config.adam_eps,
                           weight_decay=config.weight_decay))
  return optax.chain(*parts)


def init_train_state(params, tx, value_params=None, value_tx=None) -> TrainState:
  """Fresh state at step 0 (params must be unboxed arrays)."""
  if (value_params is None) != (value_tx is None):
    raise ValueError('value_params and value_tx must be given together.')
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    value_params=value_params,
                    value_opt_state=None if value_tx is None else value_tx.init(value_params))


# ------------------------------------------------------------------------- model glue
def model_logits_fn(model) -> LogitsFn:
  """``(params, tokens_BT, mask_BT) -> logits_BTV`` for an ``mr_rl.models.Transformer``."""
  from mr_rl import models  # local import: rl math does not need the model package
  return functools.partial(models.logits, model)


def init_value_params(model, trunk_params, rng, init_scale: float = 0.02):
  """PPO critic params: a copy of a transformer trunk plus a Dense(1) head on its hidden state.

  The AMRP paper initialises policy and value models from the same checkpoint, so
  ``trunk_params`` is usually the policy's initial params (copied, not shared).
  """
  d = model.config.d_model
  kernel = init_scale * jax.random.normal(rng, (d, 1), jnp.float32)
  head = {'kernel': kernel, 'bias': jnp.zeros((1,), jnp.float32)}
  return {'trunk': jax.tree.map(jnp.array, trunk_params), 'head': head}


VALUE_HEAD_AXES = {'kernel': ('embed', None), 'bias': (None,)}


def model_value_fn(model) -> ValueFn:
  """``(value_params, tokens_BT, mask_BT) -> values_BT``, aligned like log-probs.

  ``values_BT[:, t]`` is the head on the final hidden state at ``t - 1`` (the state
  before token ``t`` is emitted); column 0 is 0.
  """
  from mr_rl import models

  def fn(value_params, tokens_BT, mask_BT):
    _, _, h = model.apply({'params': value_params['trunk']}, tokens_BT,
                          models.positions_from_mask(mask_BT), kv_mask_BS=mask_BT,
                          return_hidden=True)
    head = value_params['head']
    v = jnp.einsum('btd,d->bt', h.astype(jnp.float32), head['kernel'][:, 0]) + head['bias'][0]
    return jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], axis=1)

  return fn


# ----------------------------------------------------------------------------- sharding
def value_param_shardings(model, mesh, rules):
  """Shardings of ``init_value_params`` output: trunk like the policy, head by its logical axes."""
  from mr_rl.models import sharding
  d = model.config.d_model
  return {'trunk': sharding.param_shardings(model, mesh, rules),
          'head': {'kernel': sharding.logical_sharding(mesh, VALUE_HEAD_AXES['kernel'], (d, 1),
                                                       rules),
                   'bias': NamedSharding(mesh, P())}}


def data_axes(mesh, candidates: Sequence[str] = ('data', 'fsdp', 'expert')) -> tuple:
  """The mesh axes batch rows are split over (those of ``candidates`` present in the mesh)."""
  return tuple(a for a in candidates if a in mesh.axis_names)


def state_shardings(state_abstract: TrainState, tx, param_shardings, mesh, value_tx=None,
                    value_param_shardings=None) -> TrainState:
  """Shardings for a TrainState: optimizer moments follow their params, scalars replicate."""
  repl = NamedSharding(mesh, P())

  def opt_sh(opt_tx, opt_state, p_sh):
    return optax.tree_map_params(opt_tx, lambda _, s: s, opt_state, p_sh,
                                 transform_non_params=lambda _: repl)

  return TrainState(
      step=repl, params=param_shardings,
      opt_state=opt_sh(tx, state_abstract.opt_state, param_shardings),
      value_params=value_param_shardings,
      value_opt_state=None if value_tx is None else opt_sh(
          value_tx, state_abstract.value_opt_state, value_param_shardings))


def _batch_shardings(batch_abstract, mesh, batch_axes):
  """Row-sharded ``[N, ...]`` arrays; the small ``[B, G]`` advantages are replicated."""
  if not isinstance(batch_abstract, dict):
    raise TypeError(f'batch must be a dict, got {type(batch_abstract).__name__}.')
  return {k: NamedSharding(mesh, P() if k == 'advantages_BG' else
                           P(batch_axes, *[None] * (jnp.ndim(x) - 1)))
          for k, x in batch_abstract.items()}


# ------------------------------------------------------------------------------- steps
_REQUIRED = ('tokens_BT', 'mask_BT', 'response_mask_BT', 'old_logp_BT')


def _rows(batch, ppo: bool):
  """Validates the batch and returns per-row arrays (advantages flattened to rows)."""
  need = _REQUIRED + (('returns_BT', 'old_values_BT') if ppo else ())
  missing = [k for k in need if k not in batch]
  if missing:
    raise ValueError(f'batch is missing {missing}; it has {sorted(batch)}.')
  N, T = batch['tokens_BT'].shape
  rows = {k: batch[k] for k in need}
  for k in need:
    if rows[k].shape != (N, T):
      raise ValueError(f'batch[{k!r}] has shape {rows[k].shape}, expected {(N, T)}.')
  if 'advantages_BT' in batch:
    rows['adv'] = batch['advantages_BT']
    if rows['adv'].shape != (N, T):
      raise ValueError(f'batch["advantages_BT"] must be {(N, T)}, got {rows["adv"].shape}.')
  elif 'advantages_BG' in batch and not ppo:
    a = batch['advantages_BG']
    if a.ndim != 2 or a.shape[0] * a.shape[1] != N:
      raise ValueError(f'batch["advantages_BG"] must be [B, G] with B * G = {N}, got {a.shape}.')
    rows['adv'] = a.reshape(N)
  else:
    raise ValueError('batch needs "advantages_BT"' + ('' if ppo else ' or "advantages_BG"') + '.')
  if 'ref_logp_BT' in batch:
    rows['ref_logp_BT'] = batch['ref_logp_BT']
  return rows


def _accumulate(grad_fn, num_micro: int, rows, constrain):
  """Sums ``grad_fn(mb) -> (grads, metrics)`` over strided micro-batches."""
  N = rows['tokens_BT'].shape[0]
  if N % num_micro:
    raise ValueError(f'num_micro_batches={num_micro} must divide the batch rows N={N}.')
  if num_micro == 1:
    return grad_fn(rows)
  mbs = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(N // num_micro, num_micro, *x.shape[1:]),
                                            0, 1), rows)
  g_shape, m_shape = jax.eval_shape(grad_fn, jax.tree.map(lambda x: x[0], mbs))
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), (g_shape, m_shape))

  def body(acc, mb):
    out = grad_fn(constrain(mb))
    return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), acc, out), None

  (g, m), _ = jax.lax.scan(body, zeros, mbs)
  g = jax.tree.map(lambda x, s: x.astype(s.dtype), g, g_shape)
  return g, m


def _policy_grad_fn(logits_fn, cfg: PolicyLossConfig):

  def loss_fn(params, mb):
    logits = logits_fn(params, mb['tokens_BT'], mb['mask_BT'])
    logp, ent = token_logprobs_and_entropy(logits, mb['tokens_BT'])
    loss, metrics = policy_loss(logp, mb['old_logp_BT'], mb['adv'], mb['response_mask_BT'], cfg,
                                weights_NT=mb['w'], metric_weights_NT=mb['mw'],
                                ref_logp_NT=mb.get('ref_logp_BT'), entropy_NT=ent)
    return loss, {**metrics, 'policy_loss': loss}

  return jax.value_and_grad(loss_fn, has_aux=True)


def _step_impl(state, batch, rng, *, logits_fn, tx, config, value_fn=None, value_tx=None,
               mesh=None, rules=None, batch_axes=()):
  del rng  # no stochastic layers yet; kept for the uniform step signature
  ppo = value_fn is not None
  rows = _rows(batch, ppo)
  rmask = rows['response_mask_BT']
  rows['w'] = token_weights(rmask, config.loss.loss_agg, config.loss.norm_len)
  rows['mw'] = token_weights(rmask, 'token-mean')
  if mesh is None:
    constrain = lambda mb: mb
  else:
    constrain = lambda mb: jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, P(batch_axes, *[None] * (x.ndim - 1)))), mb)
  pg = _policy_grad_fn(logits_fn, config.loss)

  def grad_fn(mb):
    (_, metrics), grads = pg(state.params, mb)
    if not ppo:
      return grads, metrics
    vg = jax.value_and_grad(
        lambda vp: value_loss(value_fn(vp, mb['tokens_BT'], mb['mask_BT']), mb['old_values_BT'],
                              mb['returns_BT'], mb['w'], config.vf_clip, mb['mw']), has_aux=True)
    (_, vmetrics), vgrads = vg(state.value_params)
    return (grads, vgrads), {**metrics, **vmetrics}

  grads, metrics = _accumulate(grad_fn, config.num_micro_batches, rows, constrain)
  if ppo:
    grads, vgrads = grads
  metrics['grad_norm'] = optax.global_norm(grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                      opt_state=opt_state)
  if ppo:
    metrics['value_grad_norm'] = optax.global_norm(vgrads)
    vupdates, vopt = value_tx.update(vgrads, state.value_opt_state, state.value_params)
    new = new.replace(value_params=optax.apply_updates(state.value_params, vupdates),
                      value_opt_state=vopt)
  metrics['response_tokens'] = rmask.sum().astype(jnp.float32)
  return new, metrics


def _jit(impl, mesh, rules, state_sharding, batch_example, batch_axes):
  if mesh is None:
    return jax.jit(impl, donate_argnums=0)
  if state_sharding is None or batch_example is None:
    raise ValueError('With a mesh, pass state_sharding and batch_example (for the batch '
                     'shardings).')
  if rules is None:
    raise ValueError('With a mesh, pass the logical-axis rules (e.g. '
                     'mr_rl.models.sharding.DEFAULT_RULES); without them the model\'s '
                     'activation constraints would replicate activations.')
  b_sh = _batch_shardings(batch_example, mesh, batch_axes)
  repl = NamedSharding(mesh, P())
  jitted = jax.jit(impl, in_shardings=(state_sharding, b_sh, repl),
                   out_shardings=(state_sharding, repl), donate_argnums=0)

  def step(state, batch, rng):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return jitted(state, batch, rng)

  step.jitted = jitted
  return step


def make_policy_step(logits_fn: LogitsFn, config: UpdateConfig, tx=None, *, mesh=None,
                     rules=None, state_sharding=None, batch_example=None):
  """Builds the jitted GRPO-family step ``step(state, batch, rng) -> (state, metrics)``.

  Args:
    logits_fn: ``(params, tokens_BT, mask_BT) -> logits_BTV`` (see ``model_logits_fn``).
    config: UpdateConfig.
    tx: optimizer (default ``make_optimizer(config)``); must be the one that built the state.
    mesh: optional jax Mesh; then ``rules``, ``state_sharding`` (see ``state_shardings``;
      params from ``mr_rl.models.sharding.param_shardings``) and a ``batch_example``
      (arrays or ShapeDtypeStructs) are required. Batch rows are split over the mesh's
      (data, fsdp, expert) axes, as ``mr_rl.models.sharding.batch_sharding`` does.
    rules: logical-axis rules active while tracing (for the model's constraints).

  Returns:
    The step function; ``metrics`` holds policy_loss, pg_loss, clip fractions,
    approx_kl, ratio_mean, entropy, kl (if beta > 0), grad_norm, response_tokens.
  """
  tx = make_optimizer(config) if tx is None else tx
  batch_axes = () if mesh is None else data_axes(mesh)
  impl = functools.partial(_step_impl, logits_fn=logits_fn, tx=tx, config=config, mesh=mesh,
                           rules=rules, batch_axes=batch_axes)
  return _jit(impl, mesh, rules, state_sharding, batch_example, batch_axes)


def make_ppo_step(logits_fn: LogitsFn, value_fn: ValueFn, config: UpdateConfig, tx=None,
                  value_tx=None, *, mesh=None, rules=None, state_sharding=None,
                  batch_example=None):
  """PPO step: the clipped policy loss on ``advantages_BT`` plus the clipped value loss.

  The critic (``state.value_params``) has its own AdamW (``config.value_lr``); both losses
  use the same aggregation weights. Metrics add vf_loss, vf_clip_frac, value_mean,
  value_grad_norm.
  """
  tx = make_optimizer(config) if tx is None else tx
  value_tx = make_optimizer(config, lr=config.value_lr) if value_tx is None else value_tx
  batch_axes = () if mesh is None else data_axes(mesh)
  impl = functools.partial(_step_impl, logits_fn=logits_fn, tx=tx, config=config,
                           value_fn=value_fn, value_tx=value_tx, mesh=mesh, rules=rules,
                           batch_axes=batch_axes)
  return _jit(impl, mesh, rules, state_sharding, batch_example, batch_axes)


def make_logprob_fn(logits_fn: LogitsFn):
  """Jitted ``(params, tokens_BT, mask_BT) -> logp_BT`` (e.g. reference log-probs)."""

  @jax.jit
  def fn(params, tokens_BT, mask_BT):
    return token_logprobs_and_entropy(logits_fn(params, tokens_BT, mask_BT), tokens_BT)[0]

  return fn


def chunked_forward(fn: Callable, params, *rows, num_chunks: int, mesh=None):
  """`fn(params, *rows)` over `num_chunks` consecutive row chunks of every array in `rows`.

  The reference log-prob and critic forwards of `mr_rl.train` (one chunk per policy-step
  micro-batch, ``UpdateConfig.num_micro_batches``) and TAG's drift forwards
  (`mr_rl.rl.anchor`): equal to one call on all rows, with the activations of
  rows / num_chunks rows at a time. `fn` may return any pytree of ``[rows, ...]`` arrays;
  the chunks' outputs are concatenated along axis 0. With a `mesh`, each chunk's rows are
  sharded over the data axes and the model's activation constraints bind to the mesh.

  Raises:
    ValueError: num_chunks is not a positive divisor of the row count.
  """
  N = rows[0].shape[0]
  if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
    raise ValueError(f'num_chunks must be a positive int, got {num_chunks!r}')
  if N % num_chunks:
    raise ValueError(f'num_chunks={num_chunks} (config.optim.num_micro_batches) must divide the '
                     f'{N} rollout rows (data.batch_prompts x rollout.group_size)')
  n = N // num_chunks
  outs = []
  for i in range(num_chunks):
    chunk = [r[i * n:(i + 1) * n] for r in rows]
    if mesh is None:
      outs.append(fn(params, *chunk))
      continue
    from mr_rl.models import sharding  # local import: rl math does not need the model package
    chunk = jax.device_put(chunk, [sharding.batch_sharding(mesh, c.shape) for c in chunk])
    with sharding.activation_sharding(mesh):
      outs.append(fn(params, *chunk))
  if num_chunks == 1:
    return outs[0]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *outs)
