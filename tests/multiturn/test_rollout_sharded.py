"""Multi-turn rollouts on a mesh (mr_rl/multiturn/rollout.py with `mesh`): on (data 2, tensor 2)
of 4 fake CPU devices the trajectories' tokens, log-probs and turns equal the unsharded ones,
the slot caches are split over the batch axes, and `append` (traced under the mesh, like the
engine's programs) and `step` compile once. The worker (this file run as a script, XLA_FLAGS
set before jax is imported) prints one JSON dict; pytest asserts on it."""

import json

from mr_rl.testing import xla_env

if __name__ == "__main__":
  xla_env.use_cpu_devices(4)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mr_rl import models, tiny_assets  # noqa: E402
from mr_rl.demo import task  # noqa: E402
from mr_rl.models import sharding as shd  # noqa: E402
from mr_rl.multiturn import env as env_lib  # noqa: E402
from mr_rl.multiturn import render as render_lib  # noqa: E402
from mr_rl.multiturn import rollout as mt  # noqa: E402

PROMPT_LENS, G, S = (7, 3, 12, 5), 2, 48
END_IDS = tuple(range(5, 256, 8))  # common under the random tiny model: turns of ~8 tokens


class Counter:
  """Answers each turn with its index; done after 3 turns."""

  def reset(self, example):
    return [{"role": "user", "content": "Q:1+2="}]

  def step(self, turn):
    if turn.index >= 2:
      return env_lib.StepResult(rewards={"steps": 1.0}, done=True)
    return env_lib.StepResult(messages=[{"role": "tool", "content": str(turn.index)}],
                              rewards={"steps": 1.0})


def _run(model, params, tokens, mask, mesh):
  ro = mt.TurnRollout(model, slots=4, max_new_tokens=S, end_of_turn_ids=END_IDS,
                      limits=mt.TurnLimits(max_turns=4, max_observation_tokens=8,
                                           step_timeout_s=10.0),
                      workers=2, steps_per_call=4, mesh=mesh)
  render = render_lib.PlainRenderer(task.make_tokenizer(), template="={content};", marker="--")
  trajs = ro.run(params, tokens, mask, [Counter() for _ in range(len(tokens) * G)],
                 key=jax.random.PRNGKey(5), group_size=G, render=render)
  return ro, trajs


def _worker():
  assert jax.device_count() == 4, jax.devices()
  model = models.Transformer(models.get_preset("tiny_qwen3"))
  rng = np.random.default_rng(0)
  params = tiny_assets.host_params(model, rng)
  width = max(PROMPT_LENS)
  tokens = rng.integers(1, 256, (len(PROMPT_LENS), width)).astype(np.int32)
  mask = (np.arange(width)[None, :] >= width - np.array(PROMPT_LENS)[:, None]).astype(np.int32)
  _, ref = _run(model, jax.device_put(params, jax.devices()[0]), tokens, mask, None)
  mesh = shd.make_mesh(dict(data=2, fsdp=1, tensor=2, expert=1))
  ro, got = _run(model, shd.shard_params(params, model, mesh), tokens, mask, mesh)
  progs = ro.programs(2)
  state, _ = progs.init(jax.random.PRNGKey(0), 16)
  return dict(
      ref_tokens=[t.tokens.tolist() for t in ref], tokens=[t.tokens.tolist() for t in got],
      ref_turns=[t.turn_ends for t in ref], turns=[t.turn_ends for t in got],
      ref_status=[t.status for t in ref], status=[t.status for t in got],
      logprob_diff=max(float(np.abs(a.logprobs - b.logprobs).max()) for a, b in zip(ref, got)),
      appends=ro.last_stats.appends, mismatches=ro.last_stats.token_mismatches,
      append_compiles=progs.append._cache_size(),  # pylint: disable=protected-access
      step_compiles=progs.step._cache_size(),  # pylint: disable=protected-access
      cache_spec=str(state.cache.k.sharding.spec))


@pytest.fixture(scope="module")
def worker_results():
  return xla_env.run_worker(__file__, timeout=600)


def test_sharded_multiturn_rollout_equals_the_unsharded_one(worker_results):
  r = worker_results
  assert r["appends"] > 0 and r["mismatches"] == 0
  assert sum(len(t) > 1 for t in r["turns"]) >= 4, r["turns"]  # observations were inserted
  assert r["tokens"] == r["ref_tokens"]
  assert r["turns"] == r["ref_turns"] and r["status"] == r["ref_status"]
  assert r["logprob_diff"] < 1e-4
  assert "data" in r["cache_spec"], r["cache_spec"]  # slots split over the batch axes
  assert r["append_compiles"] == 1 and r["step_compiles"] == 1


if __name__ == "__main__":
  print(json.dumps(_worker()))
