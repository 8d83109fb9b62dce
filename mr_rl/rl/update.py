"""Jitted policy-update steps: GRPO-family and PPO (docs/methods.md §3-5).

One step signature (docs/style.md): ``step(state, batch, rng) -> (state, metrics)``, with
``state`` a ``TrainState`` and ``batch`` a ``mr_rl.rl.batch.LearnerBatch`` (flax.struct
dataclasses both); static settings are bound by the factories ``make_policy_step`` /
``make_ppo_step``; ``learner`` builds a run's optimizers, step and shardings in one call.
Shape letters: ``docs/shapes.md`` (N update rows, T columns, M micro-batches).

Micro-batching: the batch is split into ``num_micro_batches`` strided micro-batches
(row ``i`` goes to micro-batch ``i % M``, so each data shard feeds every micro-batch);
gradients and metrics are summed with ``lax.scan``. Exactness across micro-batches comes
from aggregation weights computed on the full batch (losses.py docstring): every mode
(token-mean, seq-mean-token-mean, seq-mean-token-sum-norm) gives the full-batch loss
and gradient up to float summation order.

Sharding: given a ``mesh`` and logical-axis ``rules``, params (and the optimizer state
mirroring them) use ``NamedSharding`` from the params' logical axis names, batch rows
are sharded over the data axes (``mr_rl.models.sharding.train_state_shardings`` /
``batch_shardings``), and the step is jitted with explicit in/out shardings and
``donate_argnums=0``. The PPO critic (its params, forward and shardings) is
``mr_rl.rl.critic``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mr_rl import compilation, fields
from mr_rl.models import sharding
from mr_rl.rl import critic as critic_lib
from mr_rl.rl.batch import LearnerBatch, batch_fields, example_batch, response_logprobs
from mr_rl.rl.critic import ValueFn
from mr_rl.rl.losses import (PolicyLossConfig, policy_loss, token_logprobs_and_entropy,
                             token_weights, value_loss)

# (params, tokens_NT, mask_NT[, segment_ids_NT], *, head_start=0) -> logits [N, T - head_start, V]
LogitsFn = Callable[..., jax.Array]


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
  """Optimisation settings of one learner step, `config.optim` (each field declared once with
  `mr_rl.fields.setting` and checked here).

  `loss`: for ``seq-mean-token-sum-norm`` set ``loss.norm_len`` to the maximum response
  length; its default (None) is the batch's T, prompt included, which varies with trimmed
  batches (the trainer always sets it to ``max_new_tokens``). `lora`: None (full fine-tuning)
  or a ``mr_rl.models.lora.LoraConfig`` (`config.model.lora`): the state holds the adapters
  only (PPO: the critic's adapters and head too) and the step takes the frozen base as a
  fourth, not donated, argument (``Learner.update``).
  """
  SECTION: ClassVar[str] = "optim"
  loss: PolicyLossConfig = fields.setting(
      help="clipped-surrogate / KL / entropy settings", factory=PolicyLossConfig)
  num_micro_batches: int = fields.setting(
      1, "M gradient-accumulation chunks of the B*G rows (must divide them)", fields.Int(lo=1))
  lr: float = fields.setting(1e-6, "AdamW learning rate of the policy (papers: 1e-6)",
                             fields.Float(lo=0.0, lo_open=True))
  warmup_steps: int = fields.setting(0, "linear warm-up steps from 0 to lr (0 = constant)",
                                     fields.Int(lo=0))
  weight_decay: float = fields.setting(0.01, "AdamW decoupled weight decay (verl: 0.01)",
                                       fields.Float(lo=0.0))
  b1: float = fields.setting(0.9, "Adam beta1", fields.Float(0.0, 1.0, hi_open=True))
  b2: float = fields.setting(0.999, "Adam beta2", fields.Float(0.0, 1.0, hi_open=True))
  adam_eps: float = fields.setting(1e-8, "Adam epsilon", fields.Float(lo=0.0, lo_open=True))
  max_grad_norm: Optional[float] = fields.setting(
      1.0, "global-norm gradient clip (None = off)",
      fields.Optional(fields.Float(lo=0.0, lo_open=True)))
  value_lr: float = fields.setting(1e-5, "AdamW learning rate of the PPO critic",
                                   fields.Float(lo=0.0, lo_open=True))
  vf_clip: Optional[float] = fields.setting(
      0.2, "PPO value clip range (None = unclipped)",
      fields.Optional(fields.Float(lo=0.0, lo_open=True)))
  pack: bool = fields.setting(
      False, "several sequences per row (segment ids); GRPO family only", fields.boolean)
  lora: Any = fields.setting(None, "the adapters (config.model.lora)", derived=True)

  def __post_init__(self):
    if not isinstance(self.loss, PolicyLossConfig):
      raise TypeError(f'loss must be a PolicyLossConfig, got {type(self.loss).__name__}.')
    fields.validate(self)


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
  """``(params, tokens_NT, mask_NT[, segment_ids_NT], *, head_start=0) -> logits`` for an
  ``mr_rl.models.Transformer`` (the head over columns [head_start, T) only)."""
  from mr_rl import models  # local import: rl math does not need the model package
  return functools.partial(models.logits, model)


# ------------------------------------------------------------------------------- steps
def _accumulate(grad_fn, num_micro: int, rows, constrain):
  """Sums ``grad_fn(mb) -> (grads, metrics)`` over strided micro-batches."""
  N = jax.tree.leaves(rows)[0].shape[0]
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


def policy_grad_fn(logits_fn, cfg: PolicyLossConfig):
  """Gradient of the policy loss; `logits_fn(params, row_keys, tokens, mask[, segments],
  head_start=...)` (`response_logprobs`)."""

  def loss_fn(params, mb: LearnerBatch, row_keys):
    logp, ent = response_logprobs(logits_fn, params, row_keys, mb)
    loss, metrics = policy_loss(logp, mb.old_logp, mb.advantages, mb.response_mask, cfg,
                                weights_NT=mb.weights, metric_weights_NT=mb.metric_weights,
                                ref_logp_NT=mb.ref_logp, entropy_NT=ent)
    return loss, {**metrics, 'policy_loss': loss}

  return jax.value_and_grad(loss_fn, has_aux=True)


def _step_impl(state, batch, rng, base=None, *, logits_fn, tx, config, value_fn=None,
               value_tx=None, mesh=None, rules=None, batch_axes=()):
  if (base is None) != (config.lora is None):
    raise ValueError('a LoRA step (UpdateConfig.lora) takes the frozen base params as its fourth '
                     'argument (Learner.update); a full fine-tuning step takes none')
  row_keys, full_logits_fn = None, logits_fn  # rng: LoRA dropout's masks only
  logits_fn = lambda params, keys, *rows, **kw: full_logits_fn(params, *rows, **kw)
  critic = lambda vp: vp
  if base is not None:  # LoRA: state.params are the adapters on the frozen base
    from mr_rl.models import lora as lora_lib  # local import: rl math does not need models
    lc = config.lora
    if lc.dropout > 0:  # per-row masks (docs/architecture.md "Models": LoRA dropout)
      row_keys = lora_lib.dropout_row_keys(rng, batch.tokens.shape[0])
    logits_fn = lambda ad, keys, *rows, **kw: full_logits_fn(
        lora_lib.Adapted(base, ad, lc.scale, lc.dropout, keys), *rows, **kw)
    critic = lambda vp: {**vp, 'trunk': lora_lib.Adapted(base, vp['trunk'], lc.scale)}
  ppo = value_fn is not None
  rmask = batch.response_mask
  if batch.weights is None:  # over the whole batch, before the micro-batch split
    batch = batch.replace(weights=token_weights(rmask, config.loss.loss_agg, config.loss.norm_len),
                          metric_weights=token_weights(rmask, 'token-mean'))
  if mesh is None:
    constrain = lambda mb: mb
  else:
    constrain = lambda mb: jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, P(batch_axes, *[None] * (x.ndim - 1)))), mb)
  pg = policy_grad_fn(logits_fn, config.loss)

  def grad_fn(rows):
    mb, keys = rows
    (_, metrics), grads = pg(state.params, mb, keys)
    if not ppo:
      return grads, metrics
    vg = jax.value_and_grad(
        lambda vp: value_loss(value_fn(critic(vp), mb.tokens, mb.mask), mb.old_values, mb.returns,
                              mb.weights, config.vf_clip, mb.metric_weights), has_aux=True)
    (_, vmetrics), vgrads = vg(state.value_params)
    return (grads, vgrads), {**metrics, **vmetrics}

  grads, metrics = _accumulate(grad_fn, config.num_micro_batches, (batch, row_keys), constrain)
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


def _jit(impl, mesh, rules, state_sharding, batch_example, base_sharding=None):
  impl = compilation.program('ppo_step' if impl.keywords.get('value_fn') else 'policy_step', impl)
  if mesh is None:
    return jax.jit(impl, donate_argnums=0)
  if state_sharding is None or batch_example is None:
    raise ValueError('With a mesh, pass state_sharding and batch_example (for the batch '
                     'shardings).')
  if rules is None:
    raise ValueError('With a mesh, pass the logical-axis rules (e.g. '
                     'mr_rl.models.sharding.DEFAULT_RULES); without them the model\'s '
                     'activation constraints would replicate activations.')
  b_sh = sharding.batch_shardings(batch_example, mesh)
  repl = NamedSharding(mesh, P())
  base_sh = () if base_sharding is None else (base_sharding,)
  programs = {}

  def jitted_for(response_start):  # batch shardings carry the batch's static response_start
    if response_start not in programs:
      sh = b_sh.replace(response_start=response_start) if isinstance(b_sh, LearnerBatch) \
          else b_sh
      programs[response_start] = jax.jit(
          impl, in_shardings=(state_sharding, sh, repl, *base_sh),
          out_shardings=(state_sharding, repl), donate_argnums=0)
    return programs[response_start]

  def step(state, batch, rng, *base):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return jitted_for(getattr(batch, 'response_start', None))(state, batch, rng, *base)

  step.jitted = jitted_for(getattr(batch_example, 'response_start', None))
  step.jitted_for = jitted_for
  return step


def make_policy_step(logits_fn: LogitsFn, config: UpdateConfig, tx=None, *, mesh=None,
                     rules=None, state_sharding=None, batch_example=None, base_sharding=None):
  """Builds the jitted GRPO-family step ``step(state, batch, rng) -> (state, metrics)``.

  Args:
    logits_fn: ``(params, tokens_NT, mask_NT[, segment_ids_NT], *, head_start=0) ->
      logits`` over columns [head_start, T) (see ``model_logits_fn``); batches with a
      ``response_start`` call it with ``head_start = response_start - 1``.
    config: UpdateConfig.
    tx: optimizer (default ``make_optimizer(config)``); must be the one that built the state.
    mesh: optional jax Mesh; then ``rules``, ``state_sharding`` (see
      ``mr_rl.models.sharding.train_state_shardings``) and a ``batch_example`` (arrays or
      ShapeDtypeStructs) are required. Batch rows are split over the mesh's data axes
      (``mr_rl.models.sharding.batch_shardings``).
    rules: logical-axis rules active while tracing (for the model's constraints).
    base_sharding: with ``config.lora`` and a mesh, the shardings of the frozen base params
      (the step is then ``step(state, batch, rng, base)``).

  Returns:
    The step function; ``metrics`` holds policy_loss, pg_loss, clip fractions,
    approx_kl, ratio_mean, entropy, kl (if beta > 0), the sampler/trainer mismatch
    (mismatch_abs, mismatch_k3; tis_weight_mean, tis_clip_frac with TIS), grad_norm,
    response_tokens.
  """
  tx = make_optimizer(config) if tx is None else tx
  batch_axes = () if mesh is None else sharding.data_axes(mesh)
  impl = functools.partial(_step_impl, logits_fn=logits_fn, tx=tx, config=config, mesh=mesh,
                           rules=rules, batch_axes=batch_axes)
  return _jit(impl, mesh, rules, state_sharding, batch_example, base_sharding)


def make_ppo_step(logits_fn: LogitsFn, value_fn: ValueFn, config: UpdateConfig, tx=None,
                  value_tx=None, *, mesh=None, rules=None, state_sharding=None,
                  batch_example=None, base_sharding=None):
  """PPO step: the clipped policy loss on ``advantages_NT`` plus the clipped value loss.

  The critic (``state.value_params``) has its own AdamW (``config.value_lr``); both losses
  use the same aggregation weights. Metrics add vf_loss, vf_clip_frac, value_mean,
  value_grad_norm. With ``config.lora`` the critic's trunk is adapters on the base (the step's
  fourth argument, as in ``make_policy_step``), ``mr_rl.rl.critic``.
  """
  tx = make_optimizer(config) if tx is None else tx
  value_tx = make_optimizer(config, lr=config.value_lr) if value_tx is None else value_tx
  batch_axes = () if mesh is None else sharding.data_axes(mesh)
  impl = functools.partial(_step_impl, logits_fn=logits_fn, tx=tx, config=config,
                           value_fn=value_fn, value_tx=value_tx, mesh=mesh, rules=rules,
                           batch_axes=batch_axes)
  return _jit(impl, mesh, rules, state_sharding, batch_example, base_sharding)


def make_logprob_fn(logits_fn: LogitsFn):
  """Jitted ``(params, tokens_NT, mask_NT[, segment_ids_NT]) -> logp_NT`` (e.g. reference
  log-probs; segment ids for packed rows)."""

  def fn(params, tokens_NT, mask_NT, segment_ids_NT=None):
    seg = () if segment_ids_NT is None else (segment_ids_NT,)
    return token_logprobs_and_entropy(logits_fn(params, tokens_NT, mask_NT, *seg), tokens_NT)[0]

  return jax.jit(compilation.program('logprob_forward', fn))


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
    chunk = jax.device_put(chunk, [sharding.batch_sharding(mesh, c.shape) for c in chunk])
    with sharding.activation_sharding(mesh):
      outs.append(fn(params, *chunk))
  if num_chunks == 1:
    return outs[0]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *outs)


# ------------------------------------------------------------------------------ learner
@dataclasses.dataclass(frozen=True, eq=False)
class Learner:
  """A run's update machinery, built once per (model, settings, mesh) by ``learner``.

  Attributes:
    tx, value_tx: the policy's and (PPO) the critic's optimizers.
    step: the jitted ``step(state, batch, rng) -> (state, metrics)``.
    value_fn: the jitted critic forward ``(value_params, tokens_NT, mask_NT) -> values_NT``
      (PPO), else None.
    state_sharding, batch_sharding: the step's in/out shardings (None without a mesh).
    fields: the `LearnerBatch` fields the step takes (`batch_fields`).
    lora: the `mr_rl.models.lora.LoraConfig` of a LoRA run (the state's params are its
      adapters; run the step with `update`, get the policy with `policy`), else None.
  """
  model: Any
  tx: optax.GradientTransformation
  value_tx: Optional[optax.GradientTransformation]
  step: Callable
  value_fn: Optional[Callable]
  state_sharding: Any
  batch_sharding: Optional[LearnerBatch]
  fields: Optional[tuple[str, ...]] = None
  lora: Any = None
  mesh: Any = None

  def init(self, params, rng) -> TrainState:
    """A fresh TrainState from ``params`` (a copy: the step donates its state), placed on
    the mesh; PPO's critic starts from the same params (AMRP Table 4; with LoRA a copy of the
    policy's first adapters) and a head from ``rng``.

    With LoRA, ``params`` is the base (fresh adapters from ``rng``, or those of
    ``lora.init_from``) or an ``Adapted`` policy (its adapters continue); the base is
    never copied into the state."""
    if self.lora is not None:
      from mr_rl.models import lora as lora_lib  # local import: rl math does not need models
      shardings = None if self.mesh is None else sharding.adapter_shardings(
          self.model.config, self.lora, self.mesh)
      params = lora_lib.start_adapters(self.model.config, self.lora, params, rng, shardings)
    else:
      params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    if self.value_tx is None:
      state = init_train_state(params, self.tx)
    else:
      state = init_train_state(params, self.tx,
                               critic_lib.init_value_params(self.model, params, rng),
                               self.value_tx)
    return self.place_state(state)

  def critic(self, state: TrainState, base):
    """The PPO critic's params for ``value_fn``: ``state.value_params``, or with LoRA its
    trunk adapters on ``base`` (``Adapted``)."""
    if self.lora is None:
      return state.value_params
    from mr_rl.models import lora as lora_lib  # local import: rl math does not need models
    vp = state.value_params
    return {**vp, 'trunk': lora_lib.Adapted(base, vp['trunk'], self.lora.scale)}

  def policy(self, state: TrainState, base):
    """The policy of ``state``: its params, or with LoRA ``Adapted(base, adapters)``."""
    if self.lora is None:
      return state.params
    from mr_rl.models import lora as lora_lib  # local import: rl math does not need models
    return lora_lib.Adapted(base, state.params, self.lora.scale)

  def update(self, state: TrainState, batch: LearnerBatch, rng, base):
    """``step(state, batch, rng)``; with LoRA ``step(state, batch, rng, base)`` (the frozen
    base params, not donated)."""
    if self.lora is None:
      return self.step(state, batch, rng)
    return self.step(state, batch, rng, base)

  def place_state(self, state: TrainState) -> TrainState:
    """``state`` on the step's shardings (identity without a mesh)."""
    return state if self.state_sharding is None else jax.device_put(state, self.state_sharding)

  def place_batch(self, batch: LearnerBatch) -> LearnerBatch:
    """``batch`` on the step's shardings (identity without a mesh).

    Raises:
      ValueError: the batch's fields are not those the step was built for (`batch_fields`).
    """
    if self.fields is not None and set(batch.fields()) != set(self.fields):
      raise ValueError(f'the step takes LearnerBatch fields {list(self.fields)}, got '
                       f'{list(batch.fields())}')
    if self.batch_sharding is None:
      return batch
    return jax.device_put(batch, self.batch_sharding.replace(response_start=batch.response_start))


@functools.lru_cache(maxsize=16)
def learner(model, config: UpdateConfig, mesh=None, ppo: bool = False) -> Learner:
  """The optimizers, the jitted step (GRPO family, or PPO with its critic) and, on a mesh,
  the state and batch shardings it is compiled for, in one call.

  Cached per (model, settings, mesh, ppo), so the pipelines' sub-runs (TAG probes, the
  demo's methods) share one compile. Parameters follow ``mr_rl.models.sharding``'s logical
  rules; the critic's trunk shards like the policy (``mr_rl.rl.critic``).
  """
  tx = make_optimizer(config)
  value_tx = make_optimizer(config, lr=config.value_lr) if ppo else None
  logits_fn = model_logits_fn(model)
  value_fn = critic_lib.model_value_fn(model) if ppo else None
  mesh_kw, st_sh, b_sh = {}, None, None
  if mesh is not None:
    from mr_rl import models  # local import: rl math does not need the model package
    from mr_rl.models import lora as lora_lib
    rules = sharding.DEFAULT_RULES
    if config.lora is None:
      p_sh, p_abs = sharding.param_shardings(model, mesh, rules), models.abstract_params(model)
    else:
      p_sh = sharding.adapter_shardings(model.config, config.lora, mesh, rules)
      p_abs = lora_lib.abstract_adapters(model.config, config.lora)
      mesh_kw['base_sharding'] = sharding.param_shardings(model, mesh, rules)
    v_sh = critic_lib.value_param_shardings(model, mesh, rules, config.lora) if ppo else None

    def init_abstract(p):
      vp = critic_lib.init_value_params(model, p, jax.random.PRNGKey(0)) if ppo else None
      return init_train_state(p, tx, vp, value_tx)

    state_abs = jax.eval_shape(init_abstract, p_abs)
    st_sh = sharding.train_state_shardings(state_abs, tx, p_sh, mesh, value_tx, v_sh)
    batch_example = example_batch(config, ppo)
    b_sh = sharding.batch_shardings(batch_example, mesh)
    mesh_kw.update(mesh=mesh, rules=rules, state_sharding=st_sh, batch_example=batch_example)
  if ppo:
    step = make_ppo_step(logits_fn, value_fn, config, tx, value_tx, **mesh_kw)
  else:
    step = make_policy_step(logits_fn, config, tx, **mesh_kw)
  value_fn = value_fn and jax.jit(compilation.program('value_forward', value_fn))
  return Learner(model, tx, value_tx, step, value_fn, st_sh, b_sh, batch_fields(config, ppo),
                 config.lora, mesh)
