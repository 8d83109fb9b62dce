"""Reward functions in worker processes with hard wall-clock timeouts.

* ``mr_rl.rewards.process.pool``: ``HardTimeoutPool``, ``shared_pool`` (the process-wide
  pool), ``dumps_importable`` and the errors ``RewardTimeoutError``, ``RewardWorkerError``,
  ``WorkerSetupError``.
* ``mr_rl.rewards.process.pickling``: ``dumps_importable``, what is sent to a worker, pickled
  (re-exported by the pool).
* ``mr_rl.rewards.process.worker``: the zygote and worker side, started as
  ``python -m mr_rl.rewards.process.worker FD``, and the socket message format both sides use.

This package is the trusted half of process execution: our own reward code (math-verify,
sympy) that may hang is killed on a deadline. Untrusted programs go to
``mr_rl.rewards.sandbox`` instead.

Nothing is imported here: the zygote runs ``python -m mr_rl.rewards.process.worker``, which
imports this ``__init__`` first, and it must load only the worker module (not the pool, nor
anything the caller's process holds). Import the submodules by name.
"""
