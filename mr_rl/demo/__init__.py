"""The embedded CPU demo: a synthetic arithmetic task small enough to train on two cores.

`task` generates problems and step-by-step solutions and scores responses; `warmstart` makes the
base policy by supervised training; `run` drives the multi-reward GRPO comparison and its report.
"""
