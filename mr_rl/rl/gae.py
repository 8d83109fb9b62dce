"""Generalised advantage estimation over response tokens (docs/methods.md §3, PPO).

Token ``t`` is a step iff ``response_mask_NT[b, t]``; positions off the mask (prompt,
padding) are skipped: they neither receive an advantage nor break the recursion, so the
next step of a response token is the next *response* token. After the last response
token the episode ends (bootstrap value 0):

  delta_t = r_t + gamma V_{t'} - V_t,   A_t = delta_t + gamma lambda A_{t'},   R_t = A_t + V_t

with ``t'`` the next response position. ``values_NT[b, t]`` is the critic's value of the
state before token ``t`` is emitted (aligned like log-probs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards_NT, values_NT, response_mask_NT, gamma: float = 1.0, lam: float = 1.0):
  """GAE with ``lax.scan`` backwards over time.

  Args:
    rewards_NT: per-token rewards (e.g. ``outcome_rewards_to_tokens`` plus a KL penalty).
    values_NT: critic values, aligned with tokens.
    response_mask_NT: 1 on response tokens.
    gamma: discount.
    lam: GAE lambda.

  Returns:
    (advantages_NT, returns_NT), zero off the response mask.
  """
  if not 0.0 <= gamma <= 1.0:
    raise ValueError(f'gamma must be in [0, 1], got {gamma}.')
  if not 0.0 <= lam <= 1.0:
    raise ValueError(f'lam (lambda) must be in [0, 1], got {lam}.')
  rewards_NT = jnp.asarray(rewards_NT, jnp.float32)
  values_NT = jnp.asarray(values_NT, jnp.float32)
  m_NT = jnp.asarray(response_mask_NT) > 0
  if not rewards_NT.shape == values_NT.shape == m_NT.shape or rewards_NT.ndim != 2:
    raise ValueError(f'rewards_NT {rewards_NT.shape}, values_NT {values_NT.shape} and '
                     f'response_mask_NT {m_NT.shape} must be equal [N, T] shapes.')

  def step(carry, xs):
    next_v, next_a = carry
    r, v, m = xs
    a = r + gamma * next_v - v + gamma * lam * next_a
    new_carry = (jnp.where(m, v, next_v), jnp.where(m, a, next_a))
    return new_carry, jnp.where(m, a, 0.0)

  zeros = jnp.zeros(rewards_NT.shape[:1], jnp.float32)
  _, adv_TB = jax.lax.scan(step, (zeros, zeros), (rewards_NT.T, values_NT.T, m_NT.T),
                           reverse=True)
  adv_NT = adv_TB.T
  return adv_NT, jnp.where(m_NT, adv_NT + values_NT, 0.0)


def outcome_rewards_to_tokens(R_N, response_mask_NT) -> jax.Array:
  """Places each sequence's scalar reward on its last response token; NaN rewards -> 0."""
  m = jnp.asarray(response_mask_NT) > 0
  R_N = jnp.nan_to_num(jnp.asarray(R_N, jnp.float32), nan=0.0)
  T = m.shape[1]
  last = T - 1 - jnp.argmax(m[:, ::-1], axis=1)
  onehot = (jnp.arange(T)[None, :] == last[:, None]) & m.any(1, keepdims=True)
  return jnp.where(onehot, R_N[:, None], 0.0)


def whiten(x_NT, mask_NT, shift_mean: bool = True, eps: float = 1e-8) -> jax.Array:
  """Batch whitening over masked entries (Bessel variance); zero off the mask.

  With ``shift_mean=False`` the mean is added back (only the scale changes).
  """
  m = jnp.asarray(mask_NT) > 0
  x = jnp.asarray(x_NT, jnp.float32)
  n = jnp.maximum(m.sum(), 1)
  mean = jnp.where(m, x, 0.0).sum() / n
  var = jnp.where(m, (x - mean) ** 2, 0.0).sum() / jnp.maximum(n - 1, 1)
  out = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return jnp.where(m, out, 0.0)


def ppo_advantages(R_N, values_NT, response_mask_NT, gamma: float = 1.0, lam: float = 1.0,
                   token_penalty_NT=None, whiten_advantages: bool = True):
  """PPO advantages for outcome rewards (docs/methods.md §3): GAE then batch whitening.

  Args:
    R_N: aggregated scalar reward per sequence (NaN -> 0).
    values_NT: critic values at rollout time (aligned with tokens).
    response_mask_NT: 1 on response tokens.
    gamma: discount.
    lam: GAE lambda.
    token_penalty_NT: optional per-token penalty subtracted from the rewards (e.g.
      ``beta * k1`` to the reference policy, the in-reward KL form).
    whiten_advantages: whiten over the batch's response tokens.

  Returns:
    (advantages_NT, returns_NT); returns are not whitened.
  """
  rewards = outcome_rewards_to_tokens(R_N, response_mask_NT)
  if token_penalty_NT is not None:
    rewards = rewards - jnp.where(jnp.asarray(response_mask_NT) > 0, token_penalty_NT, 0.0)
  adv, ret = gae(rewards, values_NT, response_mask_NT, gamma, lam)
  if whiten_advantages:
    adv = whiten(adv, response_mask_NT)
  return adv, ret
