"""A multi-turn config's share of `launch/check.py`: the turn programs it rolls out on.

A config with `config.multiturn.env` or `.tools` draws its trajectories with
`mr_rl.multiturn.rollout.TurnRollout` (docs/multiturn.md), whatever `rollout.engine` says: one
slot per trajectory across turns, on the continuous engine's programs without the tail's
`shrink`, plus `append`, which prefills up to R = `append_rows` observations of A =
`multiturn.max_observation_tokens` ids into paused slots. They are built here as
`mr_rl.multiturn.draw.TurnDraws` builds them (`rollout.slots` slots, 0 = one per row; M =
ceil(slots / G) prompts per prefill; the section's limits and workers), on the config's mesh,
and lowered exactly as `TurnRollout.run` calls them (each under the mesh's activation-sharding
context, `slots.MeshProgram`, so Pallas attention kernels sit in their `shard_map`). What is on
the device while each runs, besides its arguments:

  * `engine_init`: the params (its outputs are the slot state and the prompt store);
  * `engine_prefill`: the slot state (params and store are arguments);
  * `engine_step`: nothing more (params, slot state and store are arguments);
  * `engine_gather`: the params and the store (the state is its argument);
  * `engine_append`: the store (params and state are arguments, the state donated);

each + what the trainer keeps next to the sampler (`check.py`'s `resident["sampler"]`).
"""

from __future__ import annotations

import math

import check_engine  # launch/check_engine.py, next to this script


def settings(config):
  """The config's `MultiTurnSettings` when multi-turn is on (env or tools), else None."""
  from mr_rl.multiturn import settings as mt_settings
  if "multiturn" not in config:
    return None
  mt = mt_settings.from_config(config.multiturn)
  return mt if mt.enabled else None


def program_names() -> tuple[str, ...]:
  """The turn programs, by their `mr_rl.compilation.PROGRAMS` names."""
  from mr_rl.multiturn import draw
  return draw.TURN_PROGRAMS


def lowerings(model, mt, *, slots: int, group: int, prompt_cols: int, resp_cols: int,
              cache_dtype, mesh, rules, params_in, key_in, param_bytes: int):
  """The turn programs at `slots` slots as {name: (lower(), resident bytes, argument bytes)}.

  Args:
    model: the sampling model (`rollout.dtype` applied).
    mt: the config's `MultiTurnSettings`.
    slots, group, prompt_cols, resp_cols, cache_dtype, mesh, rules, params_in, key_in,
      param_bytes: as `check_engine.lowerings`.

  Returns:
    (programs, info) as `check_engine.lowerings`; info adds R (`append_rows`) and A.
  """
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from mr_rl.multiturn.rollout import TurnRollout
  from mr_rl.sampling.sampler import prompt_bucket
  from mr_rl.sampling.slots import GATHER_ROWS

  ro = TurnRollout(model, slots=slots, max_new_tokens=resp_cols, end_of_turn_ids=(0,),
                   cache_dtype=cache_dtype, mesh=mesh, rules=rules, **mt.rollout_options())
  m = math.ceil(slots / group)  # as TurnRollout.run
  progs = ro.programs(m)
  bucket = prompt_bucket(prompt_cols, None)
  init = progs.init_program(bucket)
  lowered = init.lower(key_in)
  state, store = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              lowered.out_info, lowered.compile().output_shardings)
  state_b, store_b = check_engine.per_device(state), check_engine.per_device(store)
  repl = NamedSharding(mesh, P())
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=repl)
  rows, width = progs.append_rows, ro.limits.max_observation_tokens
  programs = {
      "engine_init": (lambda: init.lower(key_in), param_bytes, 0),
      "engine_prefill": (lambda: progs.prefill.lower(params_in, store, i32(m, bucket),
                                                     i32(m, bucket), i32()),
                         state_b, param_bytes + store_b),
      "engine_step": (lambda: progs.step.lower(params_in, state, store, i32(2 * slots + 1)),
                      0, param_bytes + state_b + store_b),
      "engine_gather": (lambda: progs.gather.lower(state, i32(GATHER_ROWS)),
                        param_bytes + store_b, state_b),
      "engine_append": (lambda: progs.append.lower(params_in, state, i32(rows),
                                                   i32(rows, width), i32(rows)),
                        store_b, param_bytes + state_b),
  }
  info = dict(prefill_prompts=m, bucket=bucket, pool_sizes=(slots,), state_bytes=state_b,
              store_bytes=store_b, append_rows=rows, observation_width=width)
  return programs, info


def describe(info, slots: int, gb) -> str:
  """The report's line on the turn programs' sizes (`gb` formats bytes)."""
  return (f"  turns        {slots} slots, M={info['prefill_prompts']} prompts per prefill, prompt "
          f"bucket {info['bucket']}, append R={info['append_rows']} rows x A="
          f"{info['observation_width']} ids; per device: slot state {gb(info['state_bytes'])}, "
          f"prompt store {gb(info['store_bytes'])}")
