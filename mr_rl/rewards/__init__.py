"""Host-side reward channels (METHODS.md section 7) and the batch reward runner.

Submodules (imported explicitly, nothing is imported here so that the reward
modules stay independent of one another):

* ``mr_rl.rewards.channels``: ``RewardChannel``, the ``REWARDS`` registry
  (``get_reward``, ``register_reward``, import paths ``"module:function"``),
  ``RewardConfigError`` / ``MissingFieldError``, ``batched_reward``.
* ``mr_rl.rewards.runner``: ``RewardRunner`` (r[B, G, K] on threads / worker
  processes; failures score the channel's ``on_failure``, None / NaN = does not
  apply, configuration errors raise; the failure-rate guard) and re-exports of
  the channel API.
* ``mr_rl.rewards.pool``: ``HardTimeoutPool``, ``shared_pool`` (workers forked by
  a ``python -m mr_rl.rewards._worker`` zygote: hard timeouts, never the caller's
  ``__main__``).
* ``mr_rl.rewards.math`` / ``math_channels``: answer extraction, math-verify
  accuracy, AMRP format and length rules, TAG brief and negative rules.
* ``code_channels``, ``alce``, ``reward_model``: the other registered channels.
"""
