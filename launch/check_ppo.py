"""PPO's share of `launch/check.py`: the critic's state and the programs the PPO trainer runs.

With `advantage.name = "ppo"` the trainer's learner (`mr_rl.rl.update.learner(..., ppo=True)`)
keeps a critic in the train state next to the policy: a value head on a copy of the policy's
trunk, or with LoRA adapters of its own on the frozen base (`mr_rl.rl.critic`), with its own
AdamW moments (`optim.value_lr`). Per step it runs, in place of GRPO's `policy_step`:

  * `ppo_step`: the learner's jitted PPO update (`Learner.step.jitted_for(response_start)`, the
    program the trainer calls), policy and critic state donated; the batch carries per-token
    advantages, GAE returns and the rollout's values;
  * `value_forward`: the critic's forward (`Learner.value_fn`) on one chunk of rows /
    `optim.num_micro_batches` rows, as `mr_rl.train_step.learner_batch` calls it
    (`update.chunked_forward(learner.value_fn, learner.critic(state, base), ...)`).

What stays on the device next to each (the check's `resident`): pi_0 (full fine-tuning) during
`ppo_step`, as during `policy_step`; the policy's state, the critic's moments and pi_0 (LoRA:
the base is an argument) during `value_forward`; and the critic's whole state (parameters and
moments) besides what GRPO keeps next to the reference pass and the sampler.
"""

from __future__ import annotations

import dataclasses
import math

# check.py's program that PPO replaces, and the PPO trainer's programs in its place.
REPLACES, PROGRAMS = "policy_step", ("ppo_step", "value_forward")


def is_ppo(c) -> bool:
  """Whether config `c` trains with PPO (its advantage estimator)."""
  return c.advantage.name == "ppo"


def programs(wanted: list[str]) -> list[str]:
  """`wanted` (check.py's program names) with `policy_step` as the PPO trainer's programs."""
  return [n for p in wanted for n in (PROGRAMS if p == REPLACES else (p,))]


def _per_device(tree, shardings) -> int:
  import jax
  return sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
             for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


def lowerings(c, model, ucfg, mesh, rules, *, train_abs, batch_abs, rows: int, micro: int,
              params_in, params_dev: int, state_dev: int, resident: dict, declared: dict, gb):
  """The PPO programs as {name: lower()}, from the trainer's own learner on `mesh`.

  Args:
    c: the config (`optim.value_lr`, `optim.vf_clip`).
    model, ucfg: the policy model and check.py's `UpdateConfig` (`lora` set for LoRA).
    train_abs: abstract trainable params (the policy's params, or its adapters with LoRA).
    batch_abs: check.py's GRPO `LearnerBatch` of ShapeDtypeStructs (rows x T, its
      `response_start`); PPO's fields are added.
    rows, micro: the batch's rows and `optim.num_micro_batches`.
    params_in: the abstract, sharded base params (pi_0; the frozen base with LoRA).
    params_dev, state_dev: per-device bytes of the params and of the policy's train state.
    resident, declared: check.py's per-program residents and declared arguments (bytes per
      device), updated here: the critic's state joins every resident, and the two programs'.
    gb: check.py's byte formatter.
  """
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from mr_rl.models import sharding as shd
  from mr_rl.rl import critic as critic_lib
  from mr_rl.rl import update as update_lib

  ucfg = dataclasses.replace(ucfg, value_lr=float(c.optim.get("value_lr", ucfg.value_lr)),
                             vf_clip=c.optim.get("vf_clip", ucfg.vf_clip))
  learner = update_lib.learner(model, ucfg, mesh, ppo=True)  # the trainer's jits and shardings
  # The learner's abstract state (update.learner's `init_abstract`), on its shardings.
  state_abs = jax.eval_shape(lambda p: update_lib.init_train_state(
      p, learner.tx, critic_lib.init_value_params(model, p, jax.random.PRNGKey(0)),
      learner.value_tx), train_abs)
  st_sh = learner.state_sharding
  state_in = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          state_abs, st_sh)
  value_dev = _per_device(state_abs.value_params, st_sh.value_params)
  moments_dev = _per_device(state_abs.value_opt_state, st_sh.value_opt_state)
  critic_dev = value_dev + moments_dev
  lora = ucfg.lora is not None
  print(f"critic (PPO, {'adapters on the frozen base' if lora else 'a copy of the trunk'} + "
        f"value head): {gb(critic_dev)} per device (params {gb(value_dev)}, Adam moments "
        f"{gb(moments_dev)}), resident next to every program")
  resident["ref_logprob"] += critic_dev   # the whole train state, the critic's included
  resident["sampler"] += critic_dev
  resident["ppo_step"] = resident[REPLACES]                           # pi_0 (LoRA: nothing)
  resident["value_forward"] = state_dev + moments_dev + (0 if lora else params_dev)
  declared["ppo_step"] = declared[REPLACES] + critic_dev
  declared["value_forward"] = value_dev + (params_dev if lora else 0)

  T = batch_abs.tokens.shape[1]
  f32 = lambda: jax.ShapeDtypeStruct((rows, T), jnp.float32)  # per token: PPO's GAE
  batch = batch_abs.replace(advantages=f32(), returns=f32(), old_values=f32())
  b_sh = learner.batch_sharding.replace(response_start=batch.response_start)
  batch_in = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          batch, b_sh)
  key_in = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P()))
  base = (params_in,) if lora else ()

  def lower_ppo_step():
    step = learner.step.jitted_for(batch.response_start)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return step.lower(state_in, batch_in, key_in, *base)

  def lower_value_forward():
    n = rows // micro  # one chunk of update.chunked_forward(..., num_chunks=micro)
    tok = jax.ShapeDtypeStruct((n, T), jnp.int32, sharding=shd.batch_sharding(mesh, (n, T)))
    critic = learner.critic(state_in, params_in if lora else None)
    with shd.activation_sharding(mesh, rules):
      return learner.value_fn.lower(critic, tok, tok)

  return {"ppo_step": lower_ppo_step, "value_forward": lower_value_forward}
