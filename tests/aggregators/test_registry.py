"""The aggregator registry: names, aliases, unknown names and one place per default."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mr_rl import aggregators as A
from mr_rl.aggregators import registry

K = 3
RNG = np.random.default_rng(4)
R = RNG.uniform(0, 1, (3, 4, K)).astype(np.float32)
R[RNG.uniform(size=R.shape) < 0.2] = np.nan
KEY = jax.random.key(7)
REQUIRED_HP = {"weighted_sum": {"w": [0.5, 1.0, 1.5]}}
STATEFUL = ("amrp", "drbo_delta", "drbo_inverse", "lagrangian")


def test_names_aliases_and_accepted_names():
  assert A.AGGREGATORS.names() == (
      "additive", "amrp", "drbo_delta", "drbo_inverse", "lagrangian", "lsc_soft_and", "min_and",
      "pg_ot", "rp_only", "rubric_dropout", "tag", "weighted_sum")
  assert A.AGGREGATORS.aliases() == {"weighted": "weighted_sum", "min": "min_and",
                                     "lsc": "lsc_soft_and"}
  assert A.NAMES == tuple(sorted((*A.AGGREGATORS.names(), *A.AGGREGATORS.aliases())))
  assert set(A.HYPERPARAMETERS) == set(A.NAMES)
  for alias, name in A.AGGREGATORS.aliases().items():
    assert A.HYPERPARAMETERS[alias] == A.HYPERPARAMETERS[name]


@pytest.mark.parametrize("name", A.NAMES)
def test_every_accepted_name_resolves(name):
  canonical = A.AGGREGATORS.canonical(name)
  agg = A.get(name, **REQUIRED_HP.get(canonical, {}))
  assert agg.name == canonical and agg.stateful == (canonical in STATEFUL)
  big_r, _, metrics = jax.jit(agg.apply)(agg.init(K), R, KEY)
  assert big_r.shape == R.shape[:-1] and "frac_nan_R" in metrics


@pytest.mark.parametrize("name", A.AGGREGATORS.names())
def test_registered_names_are_the_public_functions(name):
  rule = A.AGGREGATORS.get(name)
  if name in STATEFUL:  # the namespace of that name holds the registered update
    assert getattr(A, name).update is rule.impl
  else:
    assert getattr(A, name) is rule.impl and rule.impl.__name__ == name


def test_alias_is_the_same_rule():
  for alias, name in (("weighted", "weighted_sum"), ("min", "min_and"), ("lsc", "lsc_soft_and")):
    a, b = A.get(alias, **REQUIRED_HP.get(name, {})), A.get(name, **REQUIRED_HP.get(name, {}))
    np.testing.assert_array_equal(a.apply(a.init(K), R)[0], b.apply(b.init(K), R)[0])
    assert a.name == b.name == name


def test_unknown_name_and_hyperparameter_messages():
  with pytest.raises(ValueError, match=r"^unknown aggregator 'wieghted'; valid: additive, amrp, "
                                       r"drbo_delta, .*, weighted_sum$"):
    A.get("wieghted")
  with pytest.raises(ValueError, match=r"Unknown hyperparameter\(s\) \['temperature'\] for "
                                       r"aggregator 'drbo_inverse'; valid: \['interval', 'tau'\]"):
    A.get("drbo_inverse", temperature=2.0)
  with pytest.raises(ValueError, match="aggregator 'tag' is already registered"):
    registry.stateless(A.tag, linear=False)(lambda h, r, key: (r[..., 0], {}))


def _signature_defaults(fn, skip):
  params = list(inspect.signature(fn).parameters.values())[skip:]
  return {p.name: None if p.default is p.empty else p.default for p in params
          if p.name != "key"}


def test_defaults_come_from_the_rule_signatures():
  """One place per default: the registry's defaults are those of the rule's own signature."""
  for name in A.AGGREGATORS.names():
    if name in STATEFUL:
      want = _signature_defaults(getattr(A, name).init, 1)
      if name == "drbo_inverse":
        del want["temperature"]  # DRBO-delta only
    else:
      want = _signature_defaults(getattr(A, name), 1)
    assert A.HYPERPARAMETERS[name] == want, name
  assert A.amrp.DEFAULTS == A.HYPERPARAMETERS["amrp"]
  # The paper's (lambda, k_s, k_p, N) = (1, 5, 5, 1) and the project's rho, eps (docstring).
  d = A.amrp.DEFAULTS
  assert (d["lam"], d["k_s"], d["k_p"], d["interval"], d["rho"], d["eps"]) == (
      1.0, 5.0, 5.0, 1, 0.9, 1e-6)


def test_registry_defaults_give_the_functions_defaults():
  """`get(name)` with no hyperparameters computes what the public rule computes by default."""
  r = jnp.asarray(R)
  for name, direct in (("lsc_soft_and", A.lsc_soft_and(r)), ("tag", A.tag(r)),
                       ("rp_only", A.rp_only(r)), ("pg_ot", A.pg_ot(r)),
                       ("rubric_dropout", A.rubric_dropout(r, KEY)),
                       ("additive", A.additive(r)), ("min_and", A.min_and(r))):
    agg = A.get(name)
    np.testing.assert_array_equal(agg.apply(agg.init(K), r, KEY)[0], direct, err_msg=name)
  for name in STATEFUL:
    agg = A.get(name)
    via_registry, direct = agg.init(K), getattr(A, name).init(K)
    jax.tree.map(np.testing.assert_array_equal, via_registry, direct)
    np.testing.assert_array_equal(agg.apply(via_registry, r)[0],
                                  getattr(A, name).update(direct, r)[0])


def test_grad_reaches_hyperparameters_through_the_registry_state():
  r = jnp.asarray(np.nan_to_num(R, nan=0.3))
  agg = A.get("tag", anchor=0)
  state = agg.init(K)

  def f(lam):
    return jnp.sum(agg.apply(state.replace(hp={**state.hp, "lam": lam}), r)[0])

  lam = jnp.array([0.0, 0.5, 2.0])
  g = jax.grad(f)(lam)
  eps = 1e-3
  for i in (1, 2):
    e = jnp.zeros(K).at[i].set(eps)
    assert float(g[i]) == pytest.approx(float((f(lam + e) - f(lam - e)) / (2 * eps)), rel=1e-2)
  assert float(g[0]) == 0.0  # the anchor's gate is fixed at 0
