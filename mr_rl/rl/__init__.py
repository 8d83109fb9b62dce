"""RL math for mr_rl: the learning signal (aggregation + advantages), the learner batch, KL
estimators, pass@k, losses, update steps, the PPO critic and TAG's anchor election
(`mr_rl.rl.anchor`)."""

from mr_rl.rl.advantages import (ADVANTAGE_NAMES, ESTIMATORS, dr_grpo, frac_zero_std,
                                 frac_zero_std_channels, gdpo, get_advantage, grpo, mo_grpo, rloo,
                                 uses_channels)
from mr_rl.rl.kl import KL_ESTIMATORS, exact_kl, get_kl_estimator, k1, k2, k3
from mr_rl.rl.pass_at_k import mean_pass_at_k, pass_at_k, pass_at_k_from_correct
# ``mr_rl.rl.gae`` stays the module; its function is ``mr_rl.rl.gae.gae``.
from mr_rl.rl.gae import outcome_rewards_to_tokens, ppo_advantages, whiten
from mr_rl.rl.losses import (LOSS_AGG_MODES, LOSS_AGGREGATIONS, PolicyLossConfig,
                             policy_loss, token_logprobs_and_entropy,
                             token_weights, value_loss)
from mr_rl.rl.critic import init_value_params, model_value_fn, value_param_shardings
from mr_rl.rl.batch import LearnerBatch, PackSpec, PPOTargets, make_batch
from mr_rl.rl.signal import Signal, signal_fn
from mr_rl.rl.update import (Learner, TrainState, UpdateConfig, batch_fields, init_train_state,
                             learner, make_logprob_fn, make_optimizer, make_policy_step,
                             make_ppo_step, model_logits_fn)
