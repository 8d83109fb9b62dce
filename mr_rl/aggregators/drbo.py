"""DRBO dynamic reward weighting (Chen et al. 2025; docs/methods.md §2).

Shape letters (docs/shapes.md): `B` prompts, `G` responses per prompt, `K` reward channels
(`r_BGK`).

Two rules share one state. Both keep, over all samples seen so far, the running
per-channel mean `xbar_k` (NaN-aware), the per-channel count of valid samples `n_k`
and the total sample count `N_tot` (every row of every batch, B*G per step). Weights start
at 1, are used for `R = sum_k w_k r_k` and, every `d` steps (`t mod d == 0`, default
d = 25), are recomputed from the statistics *including* the current batch and
normalised to mean one. As in AMRP (Eq. 4), the reward of step t uses the weights
held before step t (project choice; applies to both rules).

* DRBO-inverse: `a_k = (xbar_k + 1)/K`, `u_k = a_k + sqrt(2 ln N_tot / n_k)`,
  `w_k ∝ 1/(u_k - tau min_j a_j)` (tau default 0). A channel never observed
  (`n_k = 0`) has an infinite bonus and hence weight 0.
* DRBO-delta: `a_k = (xbar_k(t) - xbar_k(t-d))/K`, `w_k ∝ exp((a_k - tau min_j a_j)/(T t))`
  with `t` the step number of the recompute and T default 1. `xbar(t-d)` is the
  running mean stored at the previous recompute, 0 before the first one (project
  choice). Note that the `tau min_j a_j` shift cancels in the normalisation; tau is
  kept for fidelity with the source rule.

NaN handling: `R` sums `w_k r_k` over applicable channels (all-NaN row -> NaN); NaN
entries do not enter `xbar_k` or `n_k`.

Use the namespaces `mr_rl.aggregators.drbo_inverse` / `drbo_delta` (`init`, `update`);
both register under those names with `init`'s defaults (DRBO-inverse without `temperature`).
"""

from __future__ import annotations

import types
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.aggregators import _common as C
from mr_rl.aggregators.registry import stateful

Array = jax.Array


@flax.struct.dataclass
class DRBOState(C.ChannelState):
  """DRBO state; all fields are array leaves.

  Attributes:
    weights: `[K]` weights the next update uses.
    mean: `[K]` running mean `xbar_k` over all valid samples seen.
    count: `[K]` number of valid samples seen per channel `n_k`.
    total: scalar, number of samples seen `N_tot`.
    mean_prev: `[K]` `xbar` at the previous recompute (DRBO-delta).
    step: scalar int32, number of updates done.
    interval: scalar int32 `d`.
    tau: scalar `tau`.
    temperature: scalar `T` (DRBO-delta only).
  """
  weights: Array
  mean: Array
  count: Array
  total: Array
  mean_prev: Array
  step: Array
  interval: Array
  tau: Array
  temperature: Array


def init(num_channels: int, *, interval: Any = 25, tau: Any = 0.0,
         temperature: Any = 1.0) -> DRBOState:
  """Initial DRBO state (uniform weights, empty statistics).

  Args:
    num_channels: K.
    interval: update interval d >= 1 (integer; the authors' default 25).
    tau: shift `tau >= 0` (default 0).
    temperature: T > 0 (DRBO-delta; default 1).

  Raises:
    ValueError: an argument out of range (named in the message).
  """
  k = C.check_num_channels_arg(num_channels)
  n = C.concrete(interval)
  if n is not None and (n.ndim != 0 or not float(n).is_integer() or n < 1):
    raise ValueError(f"`interval` must be an integer >= 1; got {interval!r}.")
  C.check_range(tau, "tau", lo=0.0)
  C.check_range(temperature, "temperature", lo=0.0, lo_open=True)
  zeros = jnp.zeros((k,), C.float_dtype())
  return DRBOState(weights=jnp.ones((k,), C.float_dtype()), mean=zeros, count=zeros,
                   total=jnp.zeros((), C.float_dtype()), mean_prev=zeros,
                   step=jnp.zeros((), jnp.int32), interval=jnp.asarray(interval, jnp.int32),
                   tau=C.as_float(tau), temperature=C.as_float(temperature))


def inverse_weights(state: DRBOState) -> Array:
  """DRBO-inverse weights from the state's statistics (mean-one)."""
  k = state.num_channels
  a = (state.mean + 1.0) / k
  seen = state.count > 0
  log_n = jnp.log(jnp.maximum(state.total, 1.0))
  bonus = jnp.where(seen, jnp.sqrt(2.0 * log_n / jnp.where(seen, state.count, 1.0)), jnp.inf)
  inv = 1.0 / (a + bonus - state.tau * jnp.min(a))
  return k * inv / jnp.sum(inv)


def delta_weights(state: DRBOState) -> Array:
  """DRBO-delta weights from the state's statistics (mean-one); `state.step` is t."""
  k = state.num_channels
  a = (state.mean - state.mean_prev) / k
  z = (a - state.tau * jnp.min(a)) / (state.temperature * state.step.astype(a.dtype))
  return k * jax.nn.softmax(z)


def _update(state: DRBOState, r_BGK: Any, rule: str) -> tuple[Array, DRBOState, dict]:
  r = C.check_rewards(r_BGK, "r_BGK")
  C.check_num_channels(r, state.num_channels)
  r = r.astype(state.weights.dtype)
  big_r = C.weighted_nansum(r, state.weights)
  mean_b, _, cnt = C.batch_moments(r)
  count = state.count + cnt
  mean = jnp.where(count > 0, (state.mean * state.count + mean_b * cnt) / jnp.maximum(count, 1.0),
                   state.mean)
  total = state.total + float(np.prod(r.shape[:-1]))
  step = state.step + 1
  stats = state.replace(mean=mean, count=count, total=total, step=step)
  recompute = jnp.mod(step, state.interval) == 0
  cand = inverse_weights(stats) if rule == "inverse" else delta_weights(stats)
  new_w = jnp.where(recompute, cand, state.weights)
  mean_prev = jnp.where(recompute, mean, state.mean_prev)
  new_state = stats.replace(weights=new_w, mean_prev=mean_prev)
  metrics = {"mean": mean, "count": count, "weights": state.weights, "new_weights": new_w,
             "recomputed": recompute}
  return big_r, new_state, metrics


@stateful("drbo_inverse", init=init, exclude=("temperature",))
@jax.jit
def update_inverse(state: DRBOState, r_BGK: Any) -> tuple[Array, DRBOState, dict]:
  """One DRBO-inverse step: `(R[...], new_state, metrics)`; see the module docstring."""
  return _update(state, r_BGK, "inverse")


@stateful("drbo_delta", init=init)
@jax.jit
def update_delta(state: DRBOState, r_BGK: Any) -> tuple[Array, DRBOState, dict]:
  """One DRBO-delta step: `(R[...], new_state, metrics)`; see the module docstring."""
  return _update(state, r_BGK, "delta")


drbo_inverse = types.SimpleNamespace(init=init, update=update_inverse, State=DRBOState,
                                     weights=inverse_weights)
drbo_delta = types.SimpleNamespace(init=init, update=update_delta, State=DRBOState,
                                   weights=delta_weights)
