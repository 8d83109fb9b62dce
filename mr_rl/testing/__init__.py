"""Test helpers, imported by tests and benchmarks only (never by a module of mr_rl outside this
package), each module on its own: `xla_env` (XLA_FLAGS for test processes: fast compiles, fake
CPU devices, worker scripts; imports no jax), `runs` (small trainer runs and comparisons of
their metrics) and `tpu_compile` (the static sampler compiled by XLA:TPU without a TPU). The
tiny checkpoints, tokenizers, data files and reward model they run on are `mr_rl.tiny_assets`.
"""
