"""Policy-gradient and value losses (docs/methods.md §4 and §5).

Shape letters (docs/shapes.md): ``N`` rows (sequences: a rollout batch of ``B`` prompts x
``G`` responses, flattened, or a micro-batch of them), ``T`` token positions, ``V``
vocabulary. Per-token
quantities are aligned with the tokens they score:
``logp_NT[n, t] = log pi(tokens[n, t] | tokens[n, :t])``; position 0 has no prediction and
is never a response token.

Aggregation is expressed as per-token weights ``w_NT`` (``loss = sum_nt w_nt l_nt``)
computed once on the whole batch by ``token_weights``. Because the normalisers (token
count, sequence count, sequence lengths) live inside the weights, splitting the batch
into micro-batches and summing ``sum(w * l)`` over them reproduces the full-batch loss
and gradient exactly for every mode. Each mode registers itself in ``LOSS_AGGREGATIONS``
(``mr_rl.registry.Registry``) under its function name, with verl's spelling as its alias
(``LOSS_AGG_MODES`` lists those, the names the configs use):

* ``token_mean`` (``token-mean``): ``w = m / sum(m)`` over all valid tokens of the batch;
* ``seq_mean_token_mean`` (``seq-mean-token-mean``, original GRPO):
  ``w_nt = m_nt / (|y_n| * N_nonempty)``;
* ``seq_mean_token_sum_norm`` (``seq-mean-token-sum-norm``, Dr.GRPO): ``w = m / (N * L)``
  with ``L = norm_len`` (the maximum response length; defaults to ``T``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp

from mr_rl import fields
from mr_rl.registry import Registry
from mr_rl.rl.kl import KL_ESTIMATORS, get_kl_estimator

LOG_RATIO_CLAMP = 20.0
LOSS_AGGREGATIONS: Registry = Registry('loss aggregation')


@LOSS_AGGREGATIONS.register(aliases=('token-mean',))
def token_mean(m_NT: jax.Array, norm_len: Optional[int] = None) -> jax.Array:
  """``w = m / sum(m)``: every valid token of the batch weighs the same."""
  del norm_len
  return m_NT / jnp.maximum(m_NT.sum(), 1.0)


@LOSS_AGGREGATIONS.register(aliases=('seq-mean-token-mean',))
def seq_mean_token_mean(m_NT: jax.Array, norm_len: Optional[int] = None) -> jax.Array:
  """``w_nt = m_nt / (|y_n| * N_nonempty)``: the mean over sequences of per-sequence means."""
  del norm_len
  len_N1 = m_NT.sum(-1, keepdims=True)
  n_seq = jnp.maximum((len_N1 > 0).sum(), 1)
  return m_NT / (jnp.maximum(len_N1, 1.0) * n_seq)


@LOSS_AGGREGATIONS.register(aliases=('seq-mean-token-sum-norm',))
def seq_mean_token_sum_norm(m_NT: jax.Array, norm_len: Optional[int] = None) -> jax.Array:
  """``w = m / (N * L)`` with ``L = norm_len`` (None -> T): Dr.GRPO's constant normaliser."""
  L = m_NT.shape[1] if norm_len is None else norm_len
  return m_NT / (m_NT.shape[0] * L)


# verl's spellings, which the configs use (each an alias of the function-named mode).
LOSS_AGG_MODES = tuple(LOSS_AGGREGATIONS.aliases())


def _tis_cap(path, value):
  """C >= 1, or None (off; the config's 0)."""
  if value is None or (not isinstance(value, bool) and value == 0):
    return None
  value = fields.Float()(path, value)
  if value < 1.0:
    raise ValueError(f"config.{path} must be 0 (off) or >= 1, got {value!r}")
  return value


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Clipped policy-gradient loss settings (docs/methods.md §4), `config.optim.loss`.

  Each field is declared once (`mr_rl.fields.setting`: default, help, check) and checked here;
  `mr_rl.settings` derives the config section from these declarations.

  `recompute_old_logp`: pi_old is the training forward's own log-prob (stop-gradient) instead
  of the sampler's. Exact because the trainer makes one optimizer step per rollout (the params
  that sampled are the params of the step's forward, as TRL and verl assume when they skip the
  old-log-prob pass); needed when the sampler computes differently (another dtype, a bf16 KV
  cache, another sharding). The config's 'auto' turns it on when the sampler's dtypes differ
  from the learner's or `tis_cap` is set (`mr_rl.settings.from_config`).
  `tis_cap`: C of truncated importance sampling: each token's policy-gradient term is weighted
  by ``min(pi_train_old / pi_sampler, C)`` (token level, as verl's ``tis_imp_ratio_cap`` and
  TRL's ``vllm_importance_sampling_mode='token_truncate'``; Yao et al. 2025).
  """
  SECTION: ClassVar[str] = "optim.loss"
  eps_low: float = fields.setting(
      0.2, "epsilon_low: lower clip 1 - eps_low of the ratio rho",
      fields.Float(0.0, 1.0, hi_open=True))
  eps_high: float = fields.setting(
      0.28, "epsilon_high: upper clip 1 + eps_high (clip-higher; papers: 0.28)",
      fields.Float(lo=0.0))
  loss_agg: str = fields.setting(
      "token-mean", "token-mean | seq-mean-token-mean | seq-mean-token-sum-norm (or a "
      "registered LOSS_AGGREGATIONS name)", fields.Choice(fields.registered(LOSS_AGGREGATIONS)))
  norm_len: Optional[int] = fields.setting(
      None, "L of seq-mean-token-sum-norm (from_config: rollout.max_new_tokens); None -> T",
      fields.Optional(fields.Int(lo=1)), derived=True)
  kl_coef: float = fields.setting(
      0.0, "beta, weight of the per-token KL penalty to the frozen reference (0 = off)",
      fields.Float(lo=0.0))
  kl_estimator: str = fields.setting(
      "k3", "k1 | k2 | k3 (docs/methods.md §5)",
      fields.Choice(fields.registered(KL_ESTIMATORS)))
  entropy_coef: float = fields.setting(
      0.0, "entropy bonus weight (subtracted from the loss; 0 = off)", fields.Float(lo=0.0))
  recompute_old_logp: bool = fields.setting(
      False, "pi_old from the training forward: auto (on when the sampler's dtype or cache "
      "dtype differs from the learner's compute dtype, or with tis_cap) | on | off",
      fields.boolean, config="auto")
  tis_cap: Optional[float] = fields.setting(
      None, "truncated importance sampling cap C >= 1 of pi_train/pi_sampler (0 = off)",
      _tis_cap, config=0.0)

  def __post_init__(self):
    fields.validate(self)
    if self.tis_cap is not None and not self.recompute_old_logp:
      raise ValueError("config.optim.loss.tis_cap needs config.optim.loss.recompute_old_logp "
                       "'on' (or 'auto'): its weight is pi_train_old / pi_sampler, and without "
                       "the recomputation pi_old is the sampler (weight 1)")


def token_weights(response_mask_NT, loss_agg: str, norm_len: Optional[int] = None) -> jax.Array:
  """Per-token weights implementing an aggregation mode (module docstring).

  Args:
    response_mask_NT: 1 on response tokens that enter the loss, 0 elsewhere.
    loss_agg: one of ``LOSS_AGG_MODES`` (or a registered name of ``LOSS_AGGREGATIONS``).
    norm_len: L for ``seq-mean-token-sum-norm``; None -> T.

  Returns:
    w_NT float32 with ``sum(w * l)`` the aggregated loss.

  Raises:
    UnknownNameError (a ValueError): unknown ``loss_agg`` (the message lists the valid ones).
  """
  m = jnp.asarray(response_mask_NT).astype(jnp.float32)
  if m.ndim != 2:
    raise ValueError(f'response_mask_NT must be [N, T], got shape {m.shape}.')
  return LOSS_AGGREGATIONS.get(loss_agg)(m, norm_len)


def token_logprobs_and_entropy(logits_NTV, tokens_NT):
  """Log-probs of each token under the logits of the previous position, and entropies.

  Args:
    logits_NTV: model logits; position t predicts token t + 1.
    tokens_NT: int tokens.

  Returns:
    (logp_NT, entropy_NT), float32, aligned with ``tokens_NT``; column 0 is 0.
  """
  logits = logits_NTV[:, :-1].astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  tok = jnp.take_along_axis(logits, tokens_NT[:, 1:, None], axis=-1)[..., 0]
  logp = tok - lse
  ent = lse - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
  pad = jnp.zeros((tokens_NT.shape[0], 1), jnp.float32)
  return jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, ent], 1)


def _per_token_adv(advantages, shape) -> jax.Array:
  a = jnp.asarray(advantages, jnp.float32)
  if a.shape == shape[:1]:
    return a[:, None]
  if a.shape == shape:
    return a
  raise ValueError(f'advantages must have shape {shape[:1]} (per sequence) or {shape} '
                   f'(per token), got {a.shape}.')


def policy_loss(logp_NT, old_logp_NT, advantages, response_mask_NT, config: PolicyLossConfig, *,
                weights_NT=None, metric_weights_NT=None, ref_logp_NT=None, entropy_NT=None):
  """Clipped surrogate ``-min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)`` (docs/methods.md §4).

  ``rho = pi / pi_old``; pi_old is ``old_logp_NT`` (the sampler's log-probs), or with
  ``config.recompute_old_logp`` the stop-gradient of ``logp_NT`` itself (so rho = 1 in value
  and the gradient is ``A grad log pi``). With ``config.tis_cap = C`` the policy-gradient term
  of each token is multiplied by ``min(exp(sg(logp) - old_logp), C)`` (truncated importance
  sampling of the sampler/trainer mismatch); KL and entropy terms are not reweighted (as in
  TRL and verl).
  For stale rollouts (`mr_rl.draw_queue`) the same settings are AReaL's decoupled objective,
  the trust region centred on the learner's params and the stale sampler corrected by the
  truncated weight (docs/methods.md §4, "Lag correction").

  Args:
    logp_NT: log-probs of the current policy (differentiated).
    old_logp_NT: the sampler's log-probs of the tokens (pi_old unless recomputed; pi_sampler
      of the mismatch metrics and of the importance weight).
    advantages: ``[N]`` per sequence or ``[N, T]`` per token.
    response_mask_NT: 1 on response tokens.
    config: PolicyLossConfig.
    weights_NT: aggregation weights; None -> ``token_weights(mask, config.loss_agg, ...)``.
      Pass global weights when the batch is a micro-batch.
    metric_weights_NT: token-mean weights for metrics; None -> over this batch.
    ref_logp_NT: reference-policy log-probs; required if ``config.kl_coef > 0`` (the kl
      metric is reported whenever they are given).
    entropy_NT: per-token entropies; required if ``config.entropy_coef > 0``.

  Returns:
    (loss, metrics): metrics are sums over tokens with ``metric_weights_NT`` (so they add
    up over micro-batches): pg_loss, clip_frac, clip_frac_low, clip_frac_high, approx_kl
    (k3 of pi vs pi_old), ratio_mean, the sampler/trainer mismatch ``mismatch_abs``
    (mean |logp_sampler - logp_train|) and ``mismatch_k3`` (k3 estimate of
    KL(pi_sampler || pi_train) on the sampled tokens), with TIS ``tis_weight_mean`` and
    ``tis_clip_frac`` (share of tokens whose ratio exceeded C), and kl / entropy when given.
  """
  shape = logp_NT.shape
  for name, x in (('old_logp_NT', old_logp_NT), ('response_mask_NT', response_mask_NT)):
    if x.shape != shape:
      raise ValueError(f'{name} shape {x.shape} != logp_NT shape {shape}.')
  m = response_mask_NT > 0
  w = token_weights(response_mask_NT, config.loss_agg, config.norm_len) if weights_NT is None \
      else weights_NT
  mw = token_weights(response_mask_NT, 'token-mean') if metric_weights_NT is None \
      else metric_weights_NT
  A = _per_token_adv(advantages, shape)
  logp_train_old = jax.lax.stop_gradient(logp_NT)  # the training forward at the step's params
  pi_old = logp_train_old if config.recompute_old_logp else old_logp_NT
  log_ratio = jnp.clip(jnp.where(m, logp_NT - pi_old, 0.0), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  rho = jnp.exp(log_ratio)
  pg1 = -A * rho
  pg2 = -A * jnp.clip(rho, 1.0 - config.eps_low, 1.0 + config.eps_high)
  pg = jnp.maximum(pg1, pg2)
  metrics = {}

  def wsum(weights, x):
    return jnp.sum(jnp.where(m, weights * x, 0.0))

  # Sampler/trainer mismatch: x = log pi_train - log pi_sampler on the sampled tokens.
  mis = jnp.clip(jnp.where(m, logp_train_old - old_logp_NT, 0.0), -LOG_RATIO_CLAMP,
                 LOG_RATIO_CLAMP)
  metrics['mismatch_abs'] = wsum(mw, jnp.abs(mis))
  metrics['mismatch_k3'] = wsum(mw, jnp.expm1(mis) - mis)
  if config.tis_cap is not None:
    is_ratio = jnp.exp(mis)
    pg = pg * jnp.minimum(is_ratio, config.tis_cap)
    metrics['tis_weight_mean'] = wsum(mw, jnp.minimum(is_ratio, config.tis_cap))
    metrics['tis_clip_frac'] = wsum(mw, (is_ratio > config.tis_cap).astype(jnp.float32))
  per_token = pg

  if config.kl_coef > 0.0 and ref_logp_NT is None:
    raise ValueError('ref_logp_NT is required when kl_coef (beta) > 0.')
  if ref_logp_NT is not None:  # logged whenever a reference is given, penalised if beta > 0
    kl_t = get_kl_estimator(config.kl_estimator)(jnp.where(m, logp_NT, 0.0),
                                                 jnp.where(m, ref_logp_NT, 0.0))
    if config.kl_coef > 0.0:
      per_token = per_token + config.kl_coef * kl_t
    metrics['kl'] = wsum(mw, kl_t)
  if config.entropy_coef > 0.0 and entropy_NT is None:
    raise ValueError('entropy_NT is required when entropy_coef > 0.')
  if entropy_NT is not None:
    per_token = per_token - config.entropy_coef * entropy_NT
    metrics['entropy'] = wsum(mw, jax.lax.stop_gradient(entropy_NT))
  loss = wsum(w, per_token)
  fm = lambda b: b.astype(jnp.float32)
  metrics.update(
      pg_loss=wsum(w, pg),
      clip_frac=wsum(mw, fm(pg2 > pg1)),
      clip_frac_low=wsum(mw, fm((rho < 1.0 - config.eps_low) & (A < 0))),
      clip_frac_high=wsum(mw, fm((rho > 1.0 + config.eps_high) & (A > 0))),
      approx_kl=wsum(mw, jnp.expm1(log_ratio) - log_ratio),
      ratio_mean=wsum(mw, rho),
  )
  metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
  return loss, metrics


def value_loss(values_NT, old_values_NT, returns_NT, weights_NT, clip: Optional[float] = 0.2,
               metric_weights_NT=None):
  """PPO clipped value loss ``0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)``.

  Args:
    values_NT: current value predictions (differentiated).
    old_values_NT: values at rollout time.
    returns_NT: GAE returns (targets).
    weights_NT: aggregation weights (e.g. ``token_weights(mask, 'token-mean')``); zero off
      the response.
    clip: value clip range c; None disables clipping.
    metric_weights_NT: token-mean weights for metrics; None -> ``weights_NT``.

  Returns:
    (loss, metrics) with vf_loss, vf_clip_frac, value_mean.
  """
  mw = weights_NT if metric_weights_NT is None else metric_weights_NT
  on = weights_NT != 0
  err = values_NT - returns_NT
  if clip is None:
    l = 0.5 * err * err
    clipped = jnp.zeros_like(err, bool)
  else:
    v_clip = old_values_NT + jnp.clip(values_NT - old_values_NT, -clip, clip)
    err_c = v_clip - returns_NT
    l = 0.5 * jnp.maximum(err * err, err_c * err_c)
    clipped = err_c * err_c > err * err
  loss = jnp.sum(jnp.where(on, weights_NT * l, 0.0))
  mon = mw != 0
  metrics = dict(vf_loss=jax.lax.stop_gradient(loss),
                 vf_clip_frac=jnp.sum(jnp.where(mon, mw * clipped, 0.0)),
                 value_mean=jax.lax.stop_gradient(jnp.sum(jnp.where(mon, mw * values_NT, 0.0))))
  return loss, metrics
