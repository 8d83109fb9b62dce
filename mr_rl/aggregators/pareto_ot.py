"""PG-OT transfer: Pareto frontier + entropic optimal transport **(project definition)**.

docs/methods.md §2, "PG-OT transfer": within each group of `G` responses, the
non-dominated reward vectors form the Pareto frontier and score 1; every dominated
sample scores `1 - c_i / max_j c_j`, where `c_i` is its transport cost to the
frontier under an entropic OT plan (Sinkhorn in the log domain, squared-Euclidean
cost, eps = 0.05, 50 iterations) from the dominated samples (uniform mass) to the
frontier samples (uniform mass). `c_i` is the cost per unit of mass sent from sample
`i`: `c_i = sum_j P_ij C_ij / sum_j P_ij`; the max runs over the dominated samples of
the group (if that max is 0 every dominated sample scores 1).

NaN handling (project choice): a channel that is NaN in either of two samples is
ignored when comparing them (dominance and cost use the channels both samples have);
a sample whose channels are all NaN takes no part and scores NaN.

Shape letters (docs/shapes.md): `G` responses of one group, `K` reward channels; a transport
plan is `[G, G]` (source sample by target sample; the masks pick the dominated sources and the
frontier targets); leading axes of `pg_ot`'s input (e.g. `B` prompts) index independent groups.

Pure jnp; `pg_ot_group` works on one group `[G, K]` and `pg_ot` vmaps it over all
leading axes. `pg_ot` registers itself as the stateless aggregator `pg_ot` (its defaults
`DEFAULT_EPS`, `DEFAULT_NUM_ITERS` are the registry's).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from mr_rl.aggregators import _common as C
from mr_rl.aggregators.registry import stateless

Array = jax.Array

DEFAULT_EPS = 0.05
DEFAULT_NUM_ITERS = 50


@jax.jit
def pareto_front(r_GK: Array) -> tuple[Array, Array, Array]:
  """Pareto dominance within one group.

  Sample `j` dominates `i` when `r_j >= r_i` on every channel both apply to and
  `r_j > r_i` on at least one of them.

  Args:
    r_GK: rewards of one group.

  Returns:
    (frontier_G, dominated_G, valid_G) boolean masks; `valid` is False for all-NaN rows.
  """
  ok = C.valid_mask(r_GK)
  valid = jnp.any(ok, axis=-1)
  both = ok[:, None, :] & ok[None, :, :]  # [i, j, K]
  ri = r_GK[:, None, :]
  rj = r_GK[None, :, :]
  geq = jnp.all(jnp.where(both, rj >= ri, True), axis=-1)
  gt = jnp.any(jnp.where(both, rj > ri, False), axis=-1)
  dom = geq & gt & valid[:, None] & valid[None, :]  # dom[i, j]: j dominates i
  dominated = jnp.any(dom, axis=1)
  frontier = valid & ~dominated
  return frontier, dominated, valid


@functools.partial(jax.jit, static_argnames=("num_iters",))
def sinkhorn_plan(cost_GG: Array, src_G: Array, dst_G: Array, eps: Any = DEFAULT_EPS,
                  num_iters: int = DEFAULT_NUM_ITERS) -> Array:
  """Entropic OT plan between uniform masses on the masked rows and columns.

  Log-domain Sinkhorn: `P_ij = exp((f_i + g_j - C_ij) / eps)` on the support, with
  `f` and `g` updated alternately (`num_iters` times each, f first) to match the row
  marginal `1/|src|` and the column marginal `1/|dst|`.

  Args:
    cost_GG: cost matrix.
    src_G: boolean mask of source rows.
    dst_G: boolean mask of target columns.
    eps: entropic regularisation (> 0).
    num_iters: number of (f, g) update pairs.

  Returns:
    The plan `[G, G]`, zero outside `src x dst` (all zero when either mask is empty).
  """
  eps = C.as_float(eps)
  n_src = jnp.sum(src_G)
  n_dst = jnp.sum(dst_G)
  log_a = -jnp.log(jnp.maximum(n_src, 1).astype(cost_GG.dtype))
  log_b = -jnp.log(jnp.maximum(n_dst, 1).astype(cost_GG.dtype))
  support = src_G[:, None] & dst_G[None, :]

  def body(_, fg):
    f, g = fg
    lse_j = jax.nn.logsumexp((g[None, :] - cost_GG) / eps, axis=1, where=support)
    f = jnp.where(src_G, eps * (log_a - lse_j), 0.0)
    lse_i = jax.nn.logsumexp((f[:, None] - cost_GG) / eps, axis=0, where=support)
    g = jnp.where(dst_G, eps * (log_b - lse_i), 0.0)
    return f, g

  zeros = (jnp.zeros(cost_GG.shape[0], cost_GG.dtype), jnp.zeros(cost_GG.shape[1], cost_GG.dtype))
  f, g = jax.lax.fori_loop(0, num_iters, body, zeros)
  logp = (f[:, None] + g[None, :] - cost_GG) / eps
  return jnp.where(support, jnp.exp(jnp.where(support, logp, -jnp.inf)), 0.0)


@functools.partial(jax.jit, static_argnames=("num_iters",))
def pg_ot_group(r_GK: Any, eps: Any = DEFAULT_EPS,
                num_iters: int = DEFAULT_NUM_ITERS) -> tuple[Array, dict[str, Array]]:
  """PG-OT scores of one group **(project definition, docs/methods.md §2)**.

  Args:
    r_GK: rewards of one group `[G, K]`.
    eps: Sinkhorn regularisation (> 0).
    num_iters: Sinkhorn iterations.

  Returns:
    (R_G, aux) with `aux = {'frontier': [G] bool, 'cost': [G] transport cost c_i}`.
  """
  r_GK = C.check_rewards(r_GK, "r_GK", min_ndim=2)
  frontier, dominated, valid = pareto_front(r_GK)
  ok = C.valid_mask(r_GK)
  both = ok[:, None, :] & ok[None, :, :]
  diff = jnp.where(both, C.nan_to_zero(r_GK)[:, None, :] - C.nan_to_zero(r_GK)[None, :, :], 0.0)
  cost = jnp.sum(diff * diff, axis=-1)
  plan = sinkhorn_plan(cost, dominated, frontier, eps, num_iters)
  mass = jnp.sum(plan, axis=1)
  c = jnp.where(dominated, jnp.sum(plan * cost, axis=1) / jnp.where(mass > 0, mass, 1.0), 0.0)
  c_max = jnp.max(jnp.where(dominated, c, 0.0))
  # (c_max - c) / c_max rather than 1 - c / c_max: exactly 0 at the max under jit too.
  score = jnp.where(c_max > 0, (c_max - c) / jnp.where(c_max > 0, c_max, 1.0), 1.0)
  out = jnp.where(frontier, 1.0, jnp.where(dominated, score, jnp.nan))
  return out, {"frontier": frontier, "cost": c}


def pg_ot(r_BGK: Any, eps: Any = DEFAULT_EPS, num_iters: int = DEFAULT_NUM_ITERS) -> Array:
  """PG-OT transfer over a batch of groups **(project definition, docs/methods.md §2)**.

  Args:
    r_BGK: rewards `[..., G, K]`; every leading axis indexes an independent group.
    eps: Sinkhorn regularisation (> 0), default 0.05.
    num_iters: Sinkhorn iterations, default 50.

  Returns:
    `R[..., G]`: 1 on each group's Pareto frontier, `1 - c_i / max_j c_j` for the
    dominated samples, NaN for all-NaN samples.

  Raises:
    ValueError: `r_BGK` has fewer than 2 dims, `eps <= 0` or `num_iters < 1`.
  """
  r = C.check_rewards(r_BGK, "r_BGK", min_ndim=2)
  _check_pg_ot(eps, num_iters)
  return _pg_ot_batched(r, C.as_float(eps), num_iters)


def _check_pg_ot(eps: Any, num_iters: Any) -> None:
  C.check_range(eps, "eps", lo=0.0, lo_open=True)
  if not isinstance(num_iters, int) or num_iters < 1:
    raise ValueError(f"`num_iters` must be a positive int; got {num_iters!r}.")


@functools.partial(jax.jit, static_argnames=("num_iters",))
def _pg_ot_batched(r: Array, eps: Array, num_iters: int) -> Array:
  # Jitted so eager calls compile the Sinkhorn loop once per shape (it inlines under jit).
  lead = r.shape[:-2]
  flat = r.reshape((-1,) + r.shape[-2:])
  out = jax.vmap(lambda x: pg_ot_group(x, eps, num_iters)[0])(flat)
  return out.reshape(lead + r.shape[-2:-1])


@stateless(pg_ot, linear=False, static=("num_iters",), check=_check_pg_ot)
def _pg_ot_rule(h, r, key, num_iters):
  del key
  return pg_ot(r, h["eps"], num_iters), {}
