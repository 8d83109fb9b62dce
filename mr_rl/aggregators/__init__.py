"""Reward aggregation rules (docs/methods.md §1-2): pure jnp, jittable, vmappable.

Shape letters (docs/shapes.md): `B` prompts, `G` responses per prompt, `K` reward channels
(`r_BGK -> R_BG`).

Stateless rules map `r[..., K] -> R[...]`: `additive`, `weighted_sum`, `min_and`,
`rp_only`, `lsc_soft_and`, `tag`, `rubric_dropout`, `pg_ot`.
Stateful rules are namespaces with `init(num_channels, **hp) -> state` and
`update(state, r_BGK) -> (R_BG, new_state, metrics)`: `amrp`, `drbo_inverse`,
`drbo_delta`, `lagrangian`.
Each rule registers itself in `AGGREGATORS` under the name above (config aliases:
`weighted`, `min`, `lsc`); `get(name, **hp)` returns a uniform `Aggregator` for any of
them (see `registry`). `NAMES` lists every accepted name, `HYPERPARAMETERS` their
defaults, both read from the registry.
"""

from mr_rl.aggregators import amrp
from mr_rl.aggregators import lagrangian
from mr_rl.aggregators import registry
from mr_rl.aggregators.amrp import AMRPState
from mr_rl.aggregators.drbo import DRBOState, drbo_delta, drbo_inverse
from mr_rl.aggregators.lagrangian import LagrangianState
from mr_rl.aggregators.pareto_ot import pareto_front, pg_ot, pg_ot_group, sinkhorn_plan
from mr_rl.aggregators.registry import AGGREGATORS, Aggregator, StatelessState, get
from mr_rl.aggregators.static import (additive, lsc_soft_and, min_and, rp_only, rubric_dropout,
                                      rubric_dropout_mask, tag, weighted_sum)

# Every rule module above has registered itself; these are read from the registry.
NAMES: tuple[str, ...] = registry.accepted_names()
HYPERPARAMETERS: dict[str, dict] = registry.hyperparameters()

__all__ = [
    "AGGREGATORS", "AMRPState", "Aggregator", "DRBOState", "HYPERPARAMETERS", "LagrangianState",
    "NAMES", "StatelessState", "additive", "amrp", "drbo_delta", "drbo_inverse", "get",
    "lagrangian", "lsc_soft_and", "min_and", "pareto_front", "pg_ot", "pg_ot_group",
    "rp_only", "rubric_dropout", "rubric_dropout_mask", "sinkhorn_plan", "tag", "weighted_sum",
]
