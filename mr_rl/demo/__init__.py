"""The embedded CPU demo: a synthetic arithmetic task small enough to train on two cores.

`task` generates problems and step-by-step solutions and scores responses; `warmstart` makes the
base policy by supervised training; `run` drives the multi-reward GRPO comparison and its report.

The demo is a plugin of the core (`config.plugins = "mr_rl.demo"`): importing this package
registers the `arithmetic` data set and the `arith_*` reward channels (`task`) and the `demo`
pipeline (`run`). Nothing in the core imports it.
"""

from mr_rl.demo import run, task  # noqa: F401  (registrations)
