"""Lagrangian constraint aggregation (Moskovitz et al. 2024, transferred; docs/methods.md §2).

Objective channel `o`, constrained channels `i` (by default every other channel)
with thresholds `theta_i` and multipliers `lambda_i` (state):

  `R = (M_c - sum_i s(lambda_i)) r_o + sum_i s(lambda_i) r_i`,  `s = sigmoid`,

with `M_c` the number of constraints. After each batch the dual step
`lambda_i <- lambda_i + lr (theta_i - mean_B r_i)` (default lr 0.1) raises the
multiplier of a constraint that is violated on average. `R` uses the multipliers
held before the step (as AMRP's Eq. 4 uses `w^(t-1)`).

Shape letters (docs/shapes.md): `B` prompts, `G` responses per prompt, `K` reward channels
(`r_BGK`).
`init`'s signature holds the defaults (the registry's hyperparameters of `lagrangian`).

NaN handling: `R` sums the applicable terms (a NaN channel's term is dropped, no
renormalisation; all-NaN row -> NaN). `mean_B r_i` is NaN-aware; a constraint with no
valid sample in the batch keeps its multiplier.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.aggregators import _common as C
from mr_rl.aggregators.registry import stateful

Array = jax.Array


@flax.struct.dataclass
class LagrangianState(C.ChannelState):
  """Lagrangian state; all fields are array leaves.

  Attributes:
    multipliers: `[K]` lambda_i (entries of the objective and unconstrained channels stay 0).
    objective: scalar int32 index `o`.
    thresholds: `[K]` theta_i (ignored where not constrained).
    constrained: `[K]` bool mask of constrained channels (False at `o`).
    lr: scalar dual step size.
    step: scalar int32 update count.
  """
  CHANNEL_FIELD: ClassVar[str] = "multipliers"
  multipliers: Array
  objective: Array
  thresholds: Array
  constrained: Array
  lr: Array
  step: Array


def init(num_channels: int, *, objective: Any = 0, thresholds: Any = 0.5,
         constrained: Any = None, lr: Any = 0.1, init_multiplier: Any = 0.0) -> LagrangianState:
  """Initial Lagrangian state.

  Args:
    num_channels: K (>= 2: one objective and at least one constraint).
    objective: index `o` of the objective channel.
    thresholds: theta, a scalar or `[K]` (the objective's entry is ignored).
    constrained: `[K]` bool mask of constrained channels; None means every channel
      except `o`. The objective's entry is forced to False.
    lr: dual step size >= 0 (default 0.1).
    init_multiplier: initial lambda, scalar or `[K]` (default 0, i.e. s(lambda) = 0.5).

  Raises:
    ValueError: a wrong length, `objective` out of range, `lr < 0`, or no constraint.
  """
  if not isinstance(num_channels, (int, np.integer)) or num_channels < 2:
    raise ValueError(f"`num_channels` must be an int >= 2 (objective + constraints); "
                     f"got {num_channels!r}.")
  k = int(num_channels)
  objective = C.check_index(objective, k, "objective")
  thresholds = C.check_vector(thresholds, k, "thresholds")
  C.check_range(lr, "lr", lo=0.0)
  is_obj = jnp.arange(k) == objective
  if constrained is None:
    constrained = ~is_obj
  else:
    constrained = jnp.asarray(constrained)
    if constrained.shape != (k,):
      raise ValueError(f"`constrained` must have shape [K] = ({k},); got {constrained.shape}.")
    constrained = constrained.astype(bool) & ~is_obj
  cv = C.concrete(constrained)
  if cv is not None and not cv.any():
    raise ValueError("`constrained` selects no constraint channel besides the objective.")
  lam0 = C.check_vector(init_multiplier, k, "init_multiplier")
  return LagrangianState(multipliers=jnp.where(constrained, lam0, 0.0), objective=objective,
                         thresholds=thresholds, constrained=constrained, lr=C.as_float(lr),
                         step=jnp.zeros((), jnp.int32))


def coefficients(state: LagrangianState) -> Array:
  """`[K]` linear coefficients of R: `M_c - sum s(lambda)` at `o`, `s(lambda_i)` at constraints."""
  s = jnp.where(state.constrained, jax.nn.sigmoid(state.multipliers), 0.0)
  m = jnp.sum(state.constrained).astype(s.dtype)
  is_obj = jnp.arange(state.num_channels) == state.objective
  return jnp.where(is_obj, m - jnp.sum(s), s)


@stateful("lagrangian", init=init)
@jax.jit
def update(state: LagrangianState, r_BGK: Any) -> tuple[Array, LagrangianState, dict]:
  """One step: `R` with the current multipliers, then the dual step.

  Returns:
    `(R[...], new_state, metrics)`; metrics: `weights` (coefficients used),
    `multipliers` (after the step), `batch_mean`, `violation` (`theta - mean_B r`).
  """
  r = C.check_rewards(r_BGK, "r_BGK")
  C.check_num_channels(r, state.num_channels)
  r = r.astype(state.multipliers.dtype)
  w = coefficients(state)
  big_r = C.weighted_nansum(r, w)
  mean_b, _, cnt = C.batch_moments(r)
  violation = state.thresholds - mean_b
  move = state.constrained & (cnt > 0)
  lam = jnp.where(move, state.multipliers + state.lr * violation, state.multipliers)
  new_state = state.replace(multipliers=lam, step=state.step + 1)
  metrics = {"weights": w, "multipliers": lam, "batch_mean": mean_b,
             "violation": jnp.where(state.constrained, violation, 0.0)}
  return big_r, new_state, metrics
