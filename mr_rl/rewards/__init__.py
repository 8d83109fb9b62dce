"""Host-side reward channels (docs/methods.md §7) and the batch reward runner.

Submodules (imported explicitly, nothing is imported here so that the reward
modules stay independent of one another and the worker zygote loads only itself):

API and runner:

* ``mr_rl.rewards.channels``: ``RewardChannel``, the ``REWARDS`` registry
  (``get_reward``, ``register_reward``, import paths ``"module:function"``),
  ``RewardConfigError`` / ``MissingFieldError``, ``batched_reward``.
* ``mr_rl.rewards.runner``: ``RewardRunner`` (r[B, G, K] on threads / worker
  processes; failures score the channel's ``on_failure``, None / NaN = does not
  apply, configuration errors raise; the failure-rate guard) and re-exports of
  the channel API; ``RewardRunner.start`` scores a batch row by row as rows finish.
* ``mr_rl.rewards.calls``: one reward call and the runner's worker threads (timeouts).

Execution:

* ``mr_rl.rewards.process``: ``pool.HardTimeoutPool``, ``pool.shared_pool`` (workers
  forked by a ``python -m mr_rl.rewards.process.worker`` zygote: hard timeouts, never the
  caller's ``__main__``).
* ``mr_rl.rewards.sandbox``: the code sandbox for untrusted programs (``run``,
  ``CodeTests``, ``SandboxConfig``, ...).

Channel families (each registers its channels with ``REWARDS``):

* ``mr_rl.rewards.math`` / ``math_channels``: answer extraction, math-verify
  accuracy, AMRP format and length rules, TAG brief and negative rules.
* ``code_channels`` (TAG code channels on the sandbox), ``alce`` (package),
  ``reward_model`` (package), ``overlong``.
"""
