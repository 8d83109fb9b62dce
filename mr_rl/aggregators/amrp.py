"""AMRP: Adaptive Multi-Reward Projection (paper 001, Algorithm 1, Eqs. 4-7; docs/methods.md §2).

Shape letters (docs/shapes.md): `B` prompts, `G` responses per prompt, `K` reward channels
(`r_BGK`, weights `[K]`).

Per step t, with NaN-aware batch statistics over all `B*G` samples (population
variance, ddof = 0):

1. Eq. 4: `R = sum_i w_i^(t-1) r_i` with the weights held in the state.
2. Eq. 7, EMA statistics (the first step that observes channel i initialises
   `mu_i = mean_B r_i`, `nu_i = var_B r_i`, `Delta_i = 0`; afterwards
   `mu_i <- rho mu_i + (1-rho) mean_B r_i`, `nu_i <- rho nu_i + (1-rho) var_B r_i`),
   `sigma_i = sqrt(nu_i)`, `Delta_i = mu_i(t) - mu_i(t-1)`.
3. If `t mod interval == 0` (the paper's update interval N; Algorithm 1, line 6), the Eq. 5
   gates `S_i = softplus(k_s (mean_j mu_j - mu_i))`, `V_i = 1 + lam sigma_i / (mu_i + eps)`,
   `P_i = softplus(-k_p Delta_i)`, Eq. 6 `U_i = S_i V_i P_i` and, with the prior `a` in
   Eq. 6 ("non-uniform projection priors"), `w_i = K a_i U_i / sum_j a_j U_j`;
   otherwise the weights are kept.

Initial weights `w^(0)` are the prior `a` (all ones by default, so the first step is
the equal-weight sum). Defaults `(lam, k_s, k_p, interval) = (1.0, 5, 5, 1)` are the paper's;
`rho = 0.9` and `eps = 1e-6` are project defaults (not given in the paper). `init`'s
signature is the one place they are written: `DEFAULTS` and the registry's hyperparameters
of `amrp` are read from it.

Ablations (paper Tables 5 and 6), all array-valued flags in the state so `jax.vmap`
over `init` sweeps them and the update stays jit-safe:
  * `use_s`, `use_v`, `use_p`: False replaces that gate by 1.
  * `additive`: `U = S + V + P` instead of the product.
  * `persistent_prior`: True (default) keeps `a` in the weight rule every update
    (the paper's "Prior"); False uses `a` only as the initial weights `w^(0)` and
    then `a = 1` (the paper's "Init").

NaN handling: `R` sums `w_i r_i` over the applicable channels (all-NaN row -> NaN);
a channel with no valid sample in a batch keeps its `mu`, `nu` (its `Delta` is 0), and
a channel never observed has `mu = nu = 0`.

`update` is jitted (shape checks run at trace time); it inlines under an outer
jit, vmap or grad.

`state.weights` always holds the weights the next `update` uses (`w^(t-1)` of Eq. 4);
`metrics['weights']` are the weights this update used and `metrics['new_weights']`
the ones it stores.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.aggregators import _common as C
from mr_rl.aggregators.registry import stateful

Array = jax.Array


@flax.struct.dataclass
class AMRPState(C.ChannelState):
  """AMRP state; every field is an array leaf (hyperparameters included).

  Attributes:
    weights: `[K]` weights the next update uses (`w^(t-1)`).
    mu: `[K]` EMA mean `mu_i`.
    nu: `[K]` EMA variance `nu_i`.
    delta: `[K]` last progress `Delta_i`.
    seen: `[K]` bool, channel has been observed (its statistics are initialised).
    step: scalar int32, number of updates done (t of the last update).
    rho, lam, k_s, k_p, eps: scalar hyperparameters (EMA decay, lambda, k_s, k_p, epsilon).
    interval: scalar int32, the paper's update interval N: weights are recomputed when
      `t mod interval == 0`.
    prior: `[K]` mean-one prior `a`.
    use_s, use_v, use_p, additive, persistent_prior: scalar bool ablation flags.
  """
  weights: Array
  mu: Array
  nu: Array
  delta: Array
  seen: Array
  step: Array
  rho: Array
  lam: Array
  k_s: Array
  k_p: Array
  interval: Array
  eps: Array
  prior: Array
  use_s: Array
  use_v: Array
  use_p: Array
  additive: Array
  persistent_prior: Array


def _check_flag(x: Any, name: str) -> Array:
  v = C.concrete(x)
  if v is not None and (v.ndim != 0 or v.dtype.kind not in "bui" or int(v) not in (0, 1)):
    raise ValueError(f"`{name}` must be a boolean flag; got {x!r}.")
  return jnp.asarray(x, dtype=bool)


def init(num_channels: int, *, rho: Any = 0.9, lam: Any = 1.0, k_s: Any = 5.0, k_p: Any = 5.0,
         interval: Any = 1, eps: Any = 1e-6, prior: Any = None, use_s: Any = True,
         use_v: Any = True, use_p: Any = True, additive: Any = False,
         persistent_prior: Any = True) -> AMRPState:
  """Initial AMRP state (Algorithm 1 inputs; docs/methods.md §2).

  Args:
    num_channels: K.
    rho: EMA decay in [0, 1] (project default 0.9).
    lam: volatility strength lambda >= 0 (Eq. 5).
    k_s: shortfall sharpness k_s >= 0 (Eq. 5).
    k_p: progress sharpness k_p >= 0 (Eq. 5).
    interval: update interval >= 1 (integer; the paper's N).
    eps: epsilon > 0 in V (Eq. 5).
    prior: `[K]` non-negative mean-one prior `a`; None means all ones. It is also
      `w^(0)`.
    use_s, use_v, use_p: ablation flags; False replaces S, V or P by 1.
    additive: ablation flag; True uses `U = S + V + P`.
    persistent_prior: True keeps `a` in the weight rule; False uses it only as `w^(0)`.

  Raises:
    ValueError: a hyperparameter out of range (named in the message), `prior` of
      length != K, negative or not mean-one.
  """
  k = C.check_num_channels_arg(num_channels)
  C.check_range(rho, "rho", lo=0.0, hi=1.0)
  C.check_range(lam, "lam", lo=0.0)
  C.check_range(k_s, "k_s", lo=0.0)
  C.check_range(k_p, "k_p", lo=0.0)
  C.check_range(eps, "eps", lo=0.0, lo_open=True)
  n = C.concrete(interval)
  if n is not None and (n.ndim != 0 or not float(n).is_integer() or n < 1):
    raise ValueError(f"`interval` must be an integer >= 1; got {interval!r}.")
  if prior is None:
    prior = jnp.ones((k,), C.float_dtype())
  prior = C.as_float(prior)
  if prior.shape != (k,):
    raise ValueError(f"`prior` must have shape [K] = ({k},); got shape {prior.shape}.")
  pv = C.concrete(prior)
  if pv is not None:
    if np.any(pv < 0) or not np.all(np.isfinite(pv)):
      raise ValueError(f"`prior` must be finite and non-negative; got {pv.tolist()}.")
    if abs(float(pv.mean()) - 1.0) > 1e-4:
      raise ValueError(f"`prior` must be mean-one (sum = K = {k}); got mean {float(pv.mean())}.")
  zeros = jnp.zeros((k,), C.float_dtype())
  return AMRPState(
      weights=prior, mu=zeros, nu=zeros, delta=zeros, seen=jnp.zeros((k,), bool),
      step=jnp.zeros((), jnp.int32), rho=C.as_float(rho), lam=C.as_float(lam),
      k_s=C.as_float(k_s), k_p=C.as_float(k_p), interval=jnp.asarray(interval, jnp.int32),
      eps=C.as_float(eps), prior=prior, use_s=_check_flag(use_s, "use_s"),
      use_v=_check_flag(use_v, "use_v"), use_p=_check_flag(use_p, "use_p"),
      additive=_check_flag(additive, "additive"),
      persistent_prior=_check_flag(persistent_prior, "persistent_prior"))


# {hyperparameter: default} of `init` (prior None = all ones), read from its signature.
DEFAULTS: dict[str, Any] = C.signature_defaults(init)[0]


def gates(state: AMRPState, mu: Array, sigma: Array, delta: Array) -> dict[str, Array]:
  """Eqs. 5-6: gates S, V, P (ablated ones are 1), score U and mean-one weights."""
  s = jax.nn.softplus(state.k_s * (jnp.mean(mu) - mu))
  v = 1.0 + state.lam * sigma / (mu + state.eps)
  p = jax.nn.softplus(-state.k_p * delta)
  s = jnp.where(state.use_s, s, 1.0)
  v = jnp.where(state.use_v, v, 1.0)
  p = jnp.where(state.use_p, p, 1.0)
  u = jnp.where(state.additive, s + v + p, s * v * p)
  a = jnp.where(state.persistent_prior, state.prior, 1.0)
  au = a * u
  w = mu.shape[-1] * au / jnp.sum(au)
  return {"S": s, "V": v, "P": p, "U": u, "candidate_weights": w}


@stateful("amrp", init=init)
@jax.jit
def update(state: AMRPState, r_BGK: Any) -> tuple[Array, AMRPState, dict[str, Array]]:
  """One AMRP step (Algorithm 1 lines 3-11).

  Args:
    state: `AMRPState`.
    r_BGK: rewards `[..., K]` (any leading shape; statistics use every sample).

  Returns:
    `(R[...], new_state, metrics)`; metrics: `mu, sigma, Delta, S, V, P, U` (`[K]`),
    `weights` (used for R this step), `new_weights` (stored), `recomputed` (bool).

  Raises:
    ValueError: the last axis of `r_BGK` is not K.
  """
  r = C.check_rewards(r_BGK, "r_BGK")
  C.check_num_channels(r, state.num_channels)
  r = r.astype(state.weights.dtype)
  big_r = C.weighted_nansum(r, state.weights)  # Eq. 4, w^(t-1).

  mean_b, var_b, count = C.batch_moments(r)
  has = count > 0
  mu_ema = state.rho * state.mu + (1.0 - state.rho) * mean_b
  nu_ema = state.rho * state.nu + (1.0 - state.rho) * var_b
  mu = jnp.where(has, jnp.where(state.seen, mu_ema, mean_b), state.mu)
  nu = jnp.where(has, jnp.where(state.seen, nu_ema, var_b), state.nu)
  delta = jnp.where(state.seen, mu - state.mu, 0.0)
  sigma = jnp.sqrt(nu)
  step = state.step + 1

  g = gates(state, mu, sigma, delta)
  recompute = jnp.mod(step, state.interval) == 0
  new_w = jnp.where(recompute, g["candidate_weights"], state.weights)
  new_state = state.replace(weights=new_w, mu=mu, nu=nu, delta=delta, seen=state.seen | has,
                            step=step)
  metrics = {"mu": mu, "sigma": sigma, "Delta": delta, "S": g["S"], "V": g["V"], "P": g["P"],
             "U": g["U"], "weights": state.weights, "new_weights": new_w,
             "recomputed": recompute}
  return big_r, new_state, metrics
