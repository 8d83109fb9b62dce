"""Small trainer runs for tests: the arithmetic-task config and comparisons of two runs'
metrics (resume equals an uninterrupted run, one device equals a mesh, ...)."""

from __future__ import annotations

import numpy as np

from mr_rl import settings as settings_lib


def arith_config(base_policy: str, total_steps: int, aggregator: str = "amrp"):
  """A tiny run on the demo's arithmetic task from the checkpoint `base_policy`: 4 prompts x 4
  responses of <= 24 tokens, three channels (accuracy, negative answer, format), lr 1e-3,
  checkpoints every 3 steps."""
  c = settings_lib.default_config()
  c.plugins = "mr_rl.demo"
  c.data.name = "arithmetic"
  c.model.path = base_policy
  c.data.batch_prompts = 4
  c.data.max_prompt_len = 16
  c.data.options.num_train = 64
  c.data.options.num_eval = 16
  c.rollout.group_size = 4
  c.rollout.max_new_tokens = 24
  c.rewards.channels = "arith_acc,arith_negative,arith_fmt"
  c.aggregator.name = aggregator
  c.total_steps = total_steps
  c.checkpoint_every = 3
  c.optim.lr = 1e-3
  return c


def strip_timings(rec: dict) -> dict:
  """A metrics record without its wall-clock timings."""
  return {k: v for k, v in rec.items()
          if not k.startswith("time/") and k != "reward_runner/seconds"}


def assert_same_metrics(a: list[dict], b: list[dict], rtol: float = 0.0) -> None:
  """Two runs' metrics.jsonl records are equal step by step, timings aside (exactly, or floats
  to `rtol`)."""
  assert [r["step"] for r in a] == [r["step"] for r in b]
  for x, y in zip(a, b):
    x, y = strip_timings(x), strip_timings(y)
    assert x.keys() == y.keys(), (x["step"], sorted(set(x) ^ set(y)))
    for k in x:
      if isinstance(x[k], float) and rtol:
        np.testing.assert_allclose(x[k], y[k], rtol=rtol, atol=1e-7, err_msg=k)
      else:
        assert x[k] == y[k], (x["step"], k, x[k], y[k])
