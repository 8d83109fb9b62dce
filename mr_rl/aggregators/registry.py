"""Aggregator registry: one uniform interface for every aggregation rule (docs/style.md §4).

Shape letters (docs/shapes.md): `B` prompts, `G` responses per prompt, `K` reward channels
(`r_BGK`, `R_BG`).

Every rule registers itself where it is defined, in the project's one registry style
(`mr_rl.registry.Registry`, here `AGGREGATORS`):

  * a stateless rule (static.py, pareto_ot.py) with `@stateless(rule, ...)` on a small
    adapter next to the rule function; its hyperparameters and their defaults are the rule
    function's own parameters after the rewards (and `key`);
  * a stateful rule (amrp.py, drbo.py, lagrangian.py) with `@stateful(name, init=init)` on
    its `update`; its hyperparameters and defaults are `init`'s keyword parameters.

So each default is written once, in a signature. A registered name is the public attribute
of `mr_rl.aggregators` that implements the rule: the rule function (`weighted_sum`, `tag`,
...) or the namespace holding `init` / `update` (`amrp`, `drbo_inverse`, `drbo_delta`,
`lagrangian`). The short names the configs use are aliases, declared at the registration:
`weighted` (`weighted_sum`), `min` (`min_and`), `lsc` (`lsc_soft_and`).

`get(name, **hp)` returns an `Aggregator` with

  * `init(num_channels) -> state`: a pytree (flax.struct) holding the rule's
    hyperparameters as array leaves and, for stateful rules, its statistics. Stateless
    rules get a `StatelessState` whose only field is a dict of their hyperparameters
    (empty for `additive` and `min_and`), so `jax.vmap` over `init` sweeps those too.
  * `apply(state, r_BGK, key) -> (R_BG, new_state, metrics)`: jittable with the state
    as a pytree argument. `key` is a PRNG key, needed only by `rubric_dropout` (others
    accept None).

For the linear rules (`linear = True`: additive, weighted_sum, rp_only, rubric_dropout,
amrp, drbo_*, lagrangian) `metrics['weights']` holds the `[K]` per-channel
coefficients used this step, i.e. `R = sum_k weights_k r_k` for a row where every
channel applies; GDPO multiplies per-channel normalised advantages by these (for AMRP
they are `w^(t-1)`, mean-one). Non-linear rules (min_and, lsc_soft_and, tag, pg_ot) carry
no `weights` entry. `metrics` of every rule also holds the scalar `frac_nan_R` (share of
samples whose R is NaN).

An unknown rule raises `UnknownNameError` (a ValueError) `unknown aggregator 'x'; valid:
...`; an unknown or missing hyperparameter raises ValueError naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import flax.struct
import jax
import jax.numpy as jnp

from mr_rl.aggregators import _common as C
from mr_rl.registry import Registry

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
    name: registered name (an alias given to `get` resolves to it).
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


@dataclasses.dataclass(frozen=True)
class Rule:
  """A registered rule: what `get` needs to build its `Aggregator`.

  Attributes:
    name: registered name.
    impl: the public function that implements the rule (stateless: the rule itself;
      stateful: its `update`).
    defaults: `{hyperparameter: default}` read from a signature; None for a required one.
    required: the hyperparameters without a default.
    build: `build(hp) -> (init, apply)` for the complete hyperparameters `hp`.
    linear, stateful, needs_key: as in `Aggregator`.
  """
  name: str
  impl: Callable[..., Any]
  defaults: Mapping[str, Any]
  required: tuple[str, ...]
  build: Callable[[dict[str, Any]], tuple[Callable, Callable]]
  linear: bool
  stateful: bool
  needs_key: bool = False


AGGREGATORS: Registry[Rule] = Registry("aggregator")


def _metrics(big_r: Array, extra: dict[str, Array]) -> dict[str, Array]:
  out = dict(extra)
  out["frac_nan_R"] = jnp.mean(jnp.isnan(big_r).astype(C.float_dtype()))
  return out


def _as_float_arrays(num_channels: int, **hp: Any) -> dict[str, Array]:
  del num_channels
  return {name: C.as_float(value) for name, value in hp.items()}


def stateless(rule: Callable[..., Array], *, linear: bool, aliases: Sequence[str] = (),
              needs_key: bool = False, check: Callable[..., None] | None = None,
              arrays: Callable[..., dict[str, Array]] = _as_float_arrays,
              static: Sequence[str] = ()) -> Callable:
  """Decorator on the adapter of a stateless rule: registers `rule` under its own name.

  The decorated adapter is `adapter(h, r, key, **static_hp) -> (R, extra_metrics)`, with
  `h` the hyperparameter arrays of the state; for a linear rule `extra_metrics` holds
  `weights`.

  Args:
    rule: the public rule function `rule(r, [key,] **hp) -> R`; its parameters after the
      rewards (and `key`) are the hyperparameters, their defaults the registry's.
    linear: R is a per-channel linear combination.
    aliases: further accepted names.
    needs_key: `apply` needs a PRNG key.
    check: `check(**hp)`, the checks that need no K, run by `get`.
    arrays: `arrays(num_channels, **hp) -> {name: array}` for the hyperparameters held in
      the state (K-dependent checks); default: each as a float array.
    static: hyperparameters passed to the adapter as Python values, not state leaves.
  """
  defaults, required = C.signature_defaults(rule, skip=1, exclude=("key",))

  def deco(adapter: Callable[..., tuple[Array, dict[str, Array]]]):

    def build(hp: dict[str, Any]):
      if check is not None:
        check(**hp)
      static_hp = {n: hp[n] for n in static}
      array_hp = {n: v for n, v in hp.items() if n not in static_hp}

      def init(num_channels: int) -> StatelessState:
        k = C.check_num_channels_arg(num_channels)
        return StatelessState(hp=arrays(k, **array_hp), num_channels=k)

      def apply(state: StatelessState, r_BGK: Any, key: Any = None):
        r = C.check_rewards(r_BGK, "r_BGK")
        C.check_num_channels(r, state.num_channels)
        big_r, extra = adapter(state.hp, r, key, **static_hp)
        return big_r, state, _metrics(big_r, extra)

      return init, apply

    AGGREGATORS.add(rule.__name__, Rule(rule.__name__, rule, defaults, required, build, linear,
                                        stateful=False, needs_key=needs_key), aliases)
    return adapter

  return deco


def stateful(name: str, *, init: Callable[..., Any], aliases: Sequence[str] = (),
             exclude: Sequence[str] = ()) -> Callable:
  """Decorator on a stateful rule's `update(state, r_BGK) -> (R, new_state, metrics)`.

  Registers the rule under `name` (the namespace that holds `init` and `update`). Its
  hyperparameters and defaults are `init`'s keyword parameters, less `exclude` (which
  keep `init`'s defaults). Stateful rules are linear (`metrics['weights']`).
  """
  defaults, required = C.signature_defaults(init, skip=1, exclude=exclude)

  def deco(update: Callable[..., tuple[Array, Any, dict[str, Array]]]):

    def build(hp: dict[str, Any]):

      def init_fn(num_channels: int):
        return init(num_channels, **hp)

      def apply(state: Any, r_BGK: Any, key: Any = None):
        del key
        big_r, new_state, metrics = update(state, r_BGK)
        return big_r, new_state, _metrics(big_r, metrics)

      return init_fn, apply

    AGGREGATORS.add(name, Rule(name, update, defaults, required, build, linear=True,
                               stateful=True), aliases)
    return update

  return deco


def get(name: str, **hp: Any) -> Aggregator:
  """The aggregator registered under `name`, with hyperparameters `hp` (others default).

  Args:
    name: a registered name or alias (`mr_rl.aggregators.NAMES`).
    **hp: hyperparameters of that rule (see `HYPERPARAMETERS[name]`).

  Raises:
    UnknownNameError (a ValueError): unknown `name` (the message lists the valid ones).
    ValueError: unknown hyperparameter (names it), a missing required one (`w` for
      `weighted_sum`), or one that fails a check that needs no K.
  """
  rule = AGGREGATORS.get(name)
  unknown = sorted(set(hp) - set(rule.defaults))
  if unknown:
    raise ValueError(f"Unknown hyperparameter(s) {unknown} for aggregator {rule.name!r}; "
                     f"valid: {sorted(rule.defaults)}.")
  missing = [n for n in rule.required if hp.get(n) is None]
  if missing:
    raise ValueError(f"Aggregator {rule.name!r} needs the hyperparameter(s) "
                     f"{', '.join(f'`{n}`' for n in missing)}.")
  full = {**rule.defaults, **hp}
  init, apply = rule.build(full)
  return Aggregator(name=rule.name, init=init, apply=apply, linear=rule.linear,
                    stateful=rule.stateful, needs_key=rule.needs_key, hyperparameters=full)


def accepted_names() -> tuple[str, ...]:
  """Every name `get` accepts: the registered names and their aliases, sorted."""
  return tuple(sorted((*AGGREGATORS.names(), *AGGREGATORS.aliases())))


def hyperparameters() -> dict[str, dict[str, Any]]:
  """`{name: {hyperparameter: default}}` for every accepted name (None: required)."""
  return {name: dict(AGGREGATORS.get(name).defaults) for name in accepted_names()}
