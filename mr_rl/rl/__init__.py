"""RL math for mr_rl: advantages, KL estimators, pass@k, losses and update steps."""

from mr_rl.rl.advantages import (ADVANTAGE_NAMES, dr_grpo, frac_zero_std, frac_zero_std_channels,
                                 gdpo, get_advantage, grpo, mo_grpo, rloo, uses_channels)
from mr_rl.rl.kl import KL_ESTIMATORS, exact_kl, get_kl_estimator, k1, k2, k3
from mr_rl.rl.pass_at_k import mean_pass_at_k, pass_at_k, pass_at_k_from_correct
