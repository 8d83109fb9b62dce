"""Registry: one uniform interface for every aggregation rule (STYLE.md item 4).

`get(name, **hp)` returns an `Aggregator` with

  * `init(num_channels) -> state`: a pytree (flax.struct) holding the rule's
    hyperparameters as array leaves and, for stateful rules, its statistics. Stateless
    rules get a `StatelessState` whose only field is a dict of their hyperparameters
    (empty for `additive` and `min`), so `jax.vmap` over `init` sweeps those too.
  * `apply(state, r_BGK, key) -> (R_BG, new_state, metrics)`: jittable with the state
    as a pytree argument. `key` is a PRNG key, needed only by `rubric_dropout` (others
    accept None).

For the linear rules (`linear = True`: additive, weighted, rp_only, rubric_dropout,
amrp, drbo_*, lagrangian) `metrics['weights']` holds the `[K]` per-channel
coefficients used this step, i.e. `R = sum_k weights_k r_k` for a row where every
channel applies; GDPO multiplies per-channel normalised advantages by these (for AMRP
they are `w^(t-1)`, mean-one). Non-linear rules (min, lsc, tag, pg_ot) carry no
`weights` entry. `metrics` of every rule also holds the scalar `frac_nan_R` (share of
samples whose R is NaN).

Hyperparameter names per rule are in `HYPERPARAMETERS`; an unknown name or rule raises
ValueError naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from mr_rl.aggregators import _common as C
from mr_rl.aggregators import amrp as amrp_lib
from mr_rl.aggregators import drbo as drbo_lib
from mr_rl.aggregators import lagrangian as lagrangian_lib
from mr_rl.aggregators import pareto_ot
from mr_rl.aggregators import static

Array = jax.Array


@flax.struct.dataclass
class StatelessState:
  """State of a stateless rule: its hyperparameters as array leaves.

  Attributes:
    hp: hyperparameters as arrays (e.g. `{'anchor': int32[], 'lam': [K]}` for TAG).
    num_channels: K (static), checked against the rewards in `apply`.
  """
  hp: Mapping[str, Array]
  num_channels: int = flax.struct.field(pytree_node=False, default=0)


@dataclasses.dataclass(frozen=True)
class Aggregator:
  """A named aggregation rule with a uniform functional interface.

  Attributes:
    name: registry name.
    init: `init(num_channels) -> state`.
    apply: `apply(state, r_BGK, key=None) -> (R_BG, new_state, metrics)`.
    linear: True when R is a per-channel linear combination (`metrics['weights']`).
    stateful: True when the state evolves across steps.
    needs_key: True when `apply` needs a PRNG key.
    hyperparameters: the resolved hyperparameters (defaults filled in).
  """
  name: str
  init: Callable[[int], Any]
  apply: Callable[..., tuple[Array, Any, dict[str, Array]]]
  linear: bool
  stateful: bool
  needs_key: bool
  hyperparameters: Mapping[str, Any]


HYPERPARAMETERS: dict[str, dict[str, Any]] = {
    "additive": {},
    "weighted": {"w": None},
    "min": {},
    "rp_only": {"primary": 0},
    "lsc": {"tau": 0.1},
    "tag": {"anchor": 0, "lam": 1.0},
    "rubric_dropout": {"p": 0.5},
    "pg_ot": {"eps": pareto_ot.DEFAULT_EPS, "num_iters": pareto_ot.DEFAULT_NUM_ITERS},
    "amrp": dict(amrp_lib.DEFAULTS),
    "drbo_inverse": {"interval": 25, "tau": 0.0},
    "drbo_delta": {"interval": 25, "tau": 0.0, "temperature": 1.0},
    "lagrangian": {"objective": 0, "thresholds": 0.5, "constrained": None, "lr": 0.1,
                   "init_multiplier": 0.0},
}
NAMES = tuple(HYPERPARAMETERS)


def _metrics(big_r: Array, extra: dict[str, Array]) -> dict[str, Array]:
  out = dict(extra)
  out["frac_nan_R"] = jnp.mean(jnp.isnan(big_r).astype(C.float_dtype()))
  return out


def _stateless(name: str, hp: dict[str, Any], make_hp: Callable[[int], dict[str, Array]],
               fn: Callable[..., tuple[Array, dict[str, Array]]], linear: bool,
               needs_key: bool = False) -> Aggregator:
  """Wraps `fn(hp_arrays, r, key) -> (R, extra_metrics)` into an Aggregator."""

  def init(num_channels: int) -> StatelessState:
    if not isinstance(num_channels, (int, np.integer)) or num_channels < 1:
      raise ValueError(f"`num_channels` must be a positive int; got {num_channels!r}.")
    return StatelessState(hp=make_hp(int(num_channels)), num_channels=int(num_channels))

  def apply(state: StatelessState, r_BGK: Any, key: Any = None):
    r = C.check_rewards(r_BGK, "r_BGK")
    C.check_num_channels(r, state.num_channels)
    big_r, extra = fn(state.hp, r, key)
    return big_r, state, _metrics(big_r, extra)

  return Aggregator(name=name, init=init, apply=apply, linear=linear, stateful=False,
                    needs_key=needs_key, hyperparameters=hp)


def _stateful(name: str, hp: dict[str, Any], init_fn: Callable[..., Any],
              update_fn: Callable[..., Any]) -> Aggregator:

  def init(num_channels: int):
    return init_fn(num_channels, **hp)

  def apply(state: Any, r_BGK: Any, key: Any = None):
    del key
    big_r, new_state, metrics = update_fn(state, r_BGK)
    return big_r, new_state, _metrics(big_r, metrics)

  return Aggregator(name=name, init=init, apply=apply, linear=True, stateful=True,
                    needs_key=False, hyperparameters=hp)


def _ones(r: Array) -> Array:
  return jnp.ones((r.shape[-1],), r.dtype)


def _check_k_free(name: str, hp: dict[str, Any]) -> None:
  """Range checks that do not need K, run when the aggregator is built."""
  if name == "lsc":
    C.check_range(hp["tau"], "tau", lo=0.0, lo_open=True)
  elif name == "tag":
    C.check_range(hp["lam"], "lam", lo=0.0)
  elif name == "rubric_dropout":
    C.check_range(hp["p"], "p", lo=0.0, hi=1.0, hi_open=True)
  elif name == "pg_ot":
    C.check_range(hp["eps"], "eps", lo=0.0, lo_open=True)


def get(name: str, **hp: Any) -> Aggregator:
  """The aggregator registered under `name`, with hyperparameters `hp` (others default).

  Args:
    name: one of `NAMES`.
    **hp: hyperparameters of that rule (see `HYPERPARAMETERS[name]`).

  Raises:
    ValueError: unknown `name` (lists the valid ones), unknown hyperparameter (names
      it), or a missing required one (`w` for `weighted`).
  """
  if name not in HYPERPARAMETERS:
    raise ValueError(f"Unknown aggregator name {name!r}; valid names: {', '.join(NAMES)}.")
  allowed = HYPERPARAMETERS[name]
  unknown = sorted(set(hp) - set(allowed))
  if unknown:
    raise ValueError(f"Unknown hyperparameter(s) {unknown} for aggregator {name!r}; "
                     f"valid: {sorted(allowed)}.")
  full = {**allowed, **hp}
  _check_k_free(name, full)

  if name == "additive":
    return _stateless(name, full, lambda k: {},
                      lambda h, r, key: (static.additive(r), {"weights": _ones(r) / r.shape[-1]}),
                      linear=True)
  if name == "weighted":
    if full["w"] is None:
      raise ValueError("Aggregator 'weighted' needs the hyperparameter `w` ([K] weights).")

    def make_w(k):
      return {"w": C.check_vector(full["w"], k, "w")}

    return _stateless(name, full, make_w,
                      lambda h, r, key: (static.weighted_sum(r, h["w"]), {"weights": h["w"]}),
                      linear=True)
  if name == "min":
    return _stateless(name, full, lambda k: {}, lambda h, r, key: (static.min_and(r), {}),
                      linear=False)
  if name == "rp_only":
    def rp(h, r, key):
      onehot = (jnp.arange(r.shape[-1]) == h["primary"]).astype(r.dtype)
      return static.rp_only(r, h["primary"]), {"weights": onehot}

    return _stateless(name, full,
                      lambda k: {"primary": C.check_index(full["primary"], k, "primary")}, rp,
                      linear=True)
  if name == "lsc":
    def make_lsc(k):
      C.check_range(full["tau"], "tau", lo=0.0, lo_open=True)
      return {"tau": C.as_float(full["tau"])}

    return _stateless(name, full, make_lsc,
                      lambda h, r, key: (static.lsc_soft_and(r, h["tau"]), {}), linear=False)
  if name == "tag":
    def make_tag(k):
      anchor = C.check_index(full["anchor"], k, "anchor")
      return {"anchor": anchor, "lam": static._tag_gates(full["lam"], anchor, k)}

    return _stateless(name, full, make_tag,
                      lambda h, r, key: (static.tag(r, h["anchor"], h["lam"]), {}),
                      linear=False)
  if name == "rubric_dropout":
    def make_rd(k):
      C.check_range(full["p"], "p", lo=0.0, hi=1.0, hi_open=True)
      return {"p": C.as_float(full["p"])}

    def rd(h, r, key):
      mask = static.rubric_dropout_mask(key, r.shape[-1], h["p"])
      big_r = static.additive(jnp.where(mask, r, jnp.nan))
      return big_r, {"weights": mask / jnp.sum(mask).astype(r.dtype), "keep_mask": mask}

    return _stateless(name, full, make_rd, rd, linear=True, needs_key=True)
  if name == "pg_ot":
    num_iters = full["num_iters"]
    if not isinstance(num_iters, int) or num_iters < 1:
      raise ValueError(f"`num_iters` must be a positive int; got {num_iters!r}.")

    def make_ot(k):
      C.check_range(full["eps"], "eps", lo=0.0, lo_open=True)
      return {"eps": C.as_float(full["eps"])}

    return _stateless(name, full, make_ot,
                      lambda h, r, key: (pareto_ot.pg_ot(r, h["eps"], num_iters), {}),
                      linear=False)
  if name == "amrp":
    return _stateful(name, full, amrp_lib.init, amrp_lib.update)
  if name == "drbo_inverse":
    return _stateful(name, full, drbo_lib.init, drbo_lib.update_inverse)
  if name == "drbo_delta":
    return _stateful(name, full, drbo_lib.init, drbo_lib.update_delta)
  assert name == "lagrangian"
  return _stateful(name, full, lagrangian_lib.init, lagrangian_lib.update)
