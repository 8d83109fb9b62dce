"""The learning signal of a step: aggregation then advantages, one jitted function.

    r[B, G, K] --aggregator (stateful, jitted)--> R[B, G] (+ channel weights)
               --advantage estimator--> A[B, G]

`signal_fn(aggregator, hp, advantage, advantage_hp)` builds it once per setting (cached, so
the pipelines' sub-runs share a compile) and returns the aggregator (for its `init`) and
`fn(agg_state, r_BGK, key) -> Signal`. Estimators that read the reward profile (GDPO,
MO-GRPO) get the aggregator's channel weights. PPO's advantages are token-level (GAE on the
critic's values, `mr_rl.rl.batch.make_batch`): with `advantage=None` the signal carries R
only. Formulas: docs/methods.md §1-3.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional

import flax
import jax
import jax.numpy as jnp

from mr_rl import aggregators, compilation
from mr_rl.rl import advantages as adv_lib


@flax.struct.dataclass
class Signal:
  """One step's learning signal.

  Attributes:
    R_BG: aggregated scalar reward.
    A_BG: group-relative advantages (None for PPO).
    agg_state: the aggregator's state after this step.
    metrics: the aggregator's metrics (`weights` [K] where it has them) plus
      `frac_zero_std` (groups whose R is constant) and `frac_zero_std_channels` [K].
  """
  R_BG: jax.Array
  A_BG: Optional[jax.Array]
  agg_state: Any
  metrics: Mapping[str, jax.Array]


def _hashable(d: Mapping) -> tuple:
  return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


def signal_fn(aggregator: str, hp: Mapping, advantage: str | None,
              advantage_hp: Mapping | None = None) -> tuple[Any, Callable[..., Signal]]:
  """(aggregator, jitted `fn(agg_state, r_BGK, key) -> Signal`) for these settings.

  Args:
    aggregator: a name of `mr_rl.aggregators.AGGREGATORS`, with hyperparameters `hp`.
    advantage: a name of `mr_rl.rl.advantages.ESTIMATORS`, or None (PPO: no group
      advantage), with hyperparameters `advantage_hp`.
  """
  return _signal_fn(aggregator, _hashable(hp), advantage, _hashable(advantage_hp or {}))


@functools.lru_cache(maxsize=64)
def _signal_fn(name: str, hp_items: tuple, advantage: str | None, adv_hp_items: tuple):
  agg = aggregators.get(name, **dict(hp_items))
  adv_fn = None if advantage is None else adv_lib.get_advantage(advantage, **dict(adv_hp_items))
  channel_weights = advantage is not None and adv_lib.uses_channels(advantage)

  def fn(agg_state, r_BGK, key) -> Signal:
    R_BG, new_state, m = agg.apply(agg_state, r_BGK, key)
    A_BG = None
    if adv_fn is not None:
      A_BG = adv_fn(R_BG, r_BGK, m.get("weights") if channel_weights else None)
    m = dict(m, frac_zero_std=adv_lib.frac_zero_std(R_BG),
             frac_zero_std_channels=adv_lib.frac_zero_std_channels(r_BGK))
    return Signal(R_BG, A_BG, new_state, m)

  return agg, jax.jit(compilation.program("signal", fn))


def pad_groups(sig: Signal, B: int) -> Signal:
  """`sig` over the first b groups, padded to B with zero advantages (dynamic sampling's
  unfilled slots, whose responses are masked out of the loss)."""
  b = sig.R_BG.shape[0]
  if b == B or sig.A_BG is None:
    return sig
  A = jnp.concatenate([sig.A_BG, jnp.zeros((B - b, sig.A_BG.shape[1]), sig.A_BG.dtype)])
  return sig.replace(A_BG=A)
