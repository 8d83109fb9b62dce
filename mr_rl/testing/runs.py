"""Small trainer runs for tests: the arithmetic-task and tiny NuminaMath configs and
comparisons of two runs' metrics (resume equals an uninterrupted run, one device equals a
mesh, ...)."""

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


def numina_config(checkpoint: str, data_path: str, total_steps: int):
  """A tiny run on NuminaMath rows (`make_tiny_data("numina_math", ...)`, its train split also
  the eval split) from a `make_tiny_checkpoint` checkpoint: 2 prompts x 2 responses of <= 8
  tokens, the accuracy and format channels."""
  c = settings_lib.default_config()
  c.model.path = checkpoint
  c.data.name = "numina_math"
  c.data.path = data_path
  c.data.eval_split = "train"
  c.data.template = "amrp_math"
  c.data.batch_prompts = 2
  c.rollout.group_size = 2
  c.rollout.max_new_tokens = 8
  c.rewards.channels = "accuracy,format"
  c.total_steps = total_steps
  return c


def strip_timings(rec: dict) -> dict:
  """A metrics record without its wall-clock timings and compile records (which programs a
  process compiled or loaded from the cache depends on what ran before it, not on the run),
  and without the multi-turn metrics that follow when environment steps finished."""
  from mr_rl.multiturn import trajectories  # pylint: disable=import-outside-toplevel
  return {k: v for k, v in rec.items()
          if not k.startswith(("time/", "compile/")) and k != "reward_runner/seconds"
          and k not in trajectories.TIMING_METRICS}


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


def write_random_policy(out: str, n_layers: int = 1) -> str:
  """The demo policy's architecture (4 heads, 2 KV heads, d 32, vocab a multiple of 8, so
  every dimension splits over tensor = fsdp = 2; `n_layers` layers) with random weights and its
  tokenizer, written to `out` (returned)."""
  import jax
  from mr_rl import models
  from mr_rl.demo import task, warmstart
  tokenizer = task.make_tokenizer()
  vocab = int(np.ceil(len(tokenizer) / 8) * 8)
  model = models.Transformer(warmstart.model_config(
      vocab, warmstart.WarmStartConfig(d_model=32, n_layers=n_layers)))
  rng = np.random.default_rng(0)  # host-drawn (init_params compiles for ~10 s on 2 cores)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: (np.ones(x.shape) if jax.tree_util.keystr(path).endswith("['scale']")
                       else rng.normal(0.0, 0.05, x.shape)).astype(np.float32),
      models.abstract_params(model))
  models.save_pretrained(model, params, out, write=True)
  tokenizer.save_pretrained(out)
  return out


def length_config(policy_path: str, total_steps: int):
  """`arith_config` with length-based channels for a `write_random_policy` policy: its
  responses vary in length, so rewards (and the policy gradient) are not all zero."""
  c = arith_config(policy_path, total_steps, aggregator="additive")
  c.data.options.num_train = 32
  c.data.options.num_eval = 8
  c.rollout.max_new_tokens = 12
  c.rewards.channels = "arith_len,arith_brief"
  c.rewards.params.arith_len = dict(full_until=4, zero_at=12)
  c.rewards.params.arith_brief = dict(threshold=9)
  c.checkpoint_every = 0
  return c
