"""Conditional-mean GRPO dynamics of the two-channel decision (docs/methods.md §9).

`expected_drift` (GRPO / Dr.GRPO, any scalar aggregator) and `expected_drift_gdpo`
are exact for finite group size G and in closed form for G -> inf; `integrate`,
`amrp_trajectory` and `phase_diagram` turn them into trajectories and (rho, eta)
phase diagrams.  `python -m mr_rl.theory --out DIR` draws the figures.
"""

from mr_rl.theory.drift import (GDPO_EPS, GRPO_EPS, REWARD_VECTORS_YK, aggregate_rewards,
                                bucket_probs, closed_form_drift_inf, compositions,
                                expected_drift, expected_drift_gdpo,
                                table_aggregator)
from mr_rl.theory.dynamics import (METHOD_NAMES, STATELESS_METHODS, aggregator_for,
                                   amrp_trajectory, expected_batch, integrate, method_drift,
                                   method_trajectory, phase_diagram)

__all__ = [
    "GDPO_EPS", "GRPO_EPS", "METHOD_NAMES", "REWARD_VECTORS_YK", "STATELESS_METHODS",
    "aggregate_rewards", "aggregator_for", "amrp_trajectory", "bucket_probs",
    "closed_form_drift_inf", "compositions", "expected_batch", "expected_drift",
    "expected_drift_gdpo", "integrate", "method_drift", "method_trajectory",
    "phase_diagram", "table_aggregator",
]
