"""Host-side reward channels (METHODS.md section 7) and the batch reward runner.

Submodules (imported explicitly, nothing is imported here so that the reward
modules stay independent of one another):

* ``mr_rl.rewards.runner``: ``RewardChannel``, the registry (``get_reward``,
  ``register_reward``), ``RewardRunner`` (r[B, G, K] on thread / process pools,
  failures -> NaN) and ``HardTimeoutPool``.
* ``mr_rl.rewards.math``: answer extraction, math-verify accuracy, AMRP format
  and length rules, TAG brief and negative rules.
"""
