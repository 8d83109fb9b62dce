"""The PPO critic (docs/methods.md §3): a copy of the policy's trunk with a scalar head.

AMRP (Table 4) initialises the policy and the value model from the same checkpoint, so the
critic's trunk starts as a copy (not a view) of the policy's initial parameters; the head is
`Dense(1)` on the trunk's final hidden state. With LoRA the policy's trainable parameters are
its adapters, so the critic's trunk is the same frozen base with adapters of its own (a copy of
the policy's initial adapters), trained with the head: no second copy of the base
(`mr_rl.models.lora.Adapted`; the step wraps them around the base it is given).
Values are aligned like log-probs: `values_NT[:, t]` is the head on the hidden state at
`t - 1` (the state before token `t` is emitted); column 0 is 0. Shape letters (docs/shapes.md):
N rows (B*G responses), T token columns, D model width.
The value loss is `mr_rl.rl.losses.value_loss`; the critic's update is part of the PPO step
(`mr_rl.rl.update.make_ppo_step`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

ValueFn = Callable[[Any, jax.Array, jax.Array], jax.Array]

VALUE_HEAD_AXES = {'kernel': ('embed', None), 'bias': (None,)}


def init_value_params(model, trunk_params, rng, init_scale: float = 0.02):
  """Critic params `{'trunk': copy of trunk_params, 'head': {'kernel' [D, 1], 'bias' [1]}}`
  (with LoRA `trunk_params` are the policy's initial adapters)."""
  d = model.config.d_model
  kernel = init_scale * jax.random.normal(rng, (d, 1), jnp.float32)
  head = {'kernel': kernel, 'bias': jnp.zeros((1,), jnp.float32)}
  return {'trunk': jax.tree.map(jnp.array, trunk_params), 'head': head}


def model_value_fn(model) -> ValueFn:
  """`(value_params, tokens_NT, mask_NT) -> values_NT` for an `mr_rl.models.Transformer`; the
  trunk may be a LoRA trunk (`mr_rl.models.lora.Adapted`: the base plus the critic's adapters)."""
  from mr_rl import models  # local import: rl math does not need the model package
  from mr_rl.models import lora

  def fn(value_params, tokens_NT, mask_NT):
    _, _, h_NTD = model.apply(lora.variables_of(value_params['trunk']), tokens_NT,
                              models.positions_from_mask(mask_NT), kv_mask_NC=mask_NT,
                              return_hidden=True)
    head = value_params['head']
    v_NT = (jnp.einsum('ntd,d->nt', h_NTD.astype(jnp.float32), head['kernel'][:, 0])
            + head['bias'][0])
    return jnp.concatenate([jnp.zeros_like(v_NT[:, :1]), v_NT[:, :-1]], axis=1)

  return fn


def value_param_shardings(model, mesh, rules, lora_config=None):
  """Shardings of `init_value_params`' output: trunk like the policy (its params, or with a
  `lora_config` its adapters), head by its logical axes."""
  from mr_rl.models import sharding
  d = model.config.d_model
  trunk = sharding.param_shardings(model, mesh, rules) if lora_config is None else \
      sharding.adapter_shardings(model.config, lora_config, mesh, rules)
  return {'trunk': trunk,
          'head': {'kernel': sharding.logical_sharding(mesh, VALUE_HEAD_AXES['kernel'], (d, 1),
                                                       rules),
                   'bias': NamedSharding(mesh, P())}}
