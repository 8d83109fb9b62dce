"""The programs a training run compiles, predicted from its settings (docs/accelerators.md,
"Compile model").

Every shape a program compiles for is fixed by the settings: the learner's widths by
`batch.trim_columns` / `column_buckets` (`mr_rl.rl.batch.learner_shapes`; packed rows
add a row-count grid), the sampler's prompt widths by its prompt buckets (powers of two up to
`data.max_prompt_len`'s), the engine's pools by its slot ladder. `expected_programs` turns them
into an upper bound per program name (`mr_rl.compilation.PROGRAMS`), which tests hold a run to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import checkpointing, rollout_engines
from mr_rl.models import sharding
from mr_rl.rl import batch as batch_lib
from mr_rl.sampling.sampler import prompt_bucket

# Evaluation during training (`eval.every`) samples its own batches: at most this many more
# row counts (full calls and a last, smaller one).
EVAL_ROW_SHAPES = 2


def prompt_buckets(max_prompt_len: int) -> tuple[int, ...]:
  """The sampler's default prompt widths up to the bucket of `max_prompt_len`."""
  out, b = [], prompt_bucket(1)
  while b <= prompt_bucket(max_prompt_len):
    out.append(b)
    b *= 2
  return tuple(out)


def learner_widths(settings) -> int:
  """How many batch shapes the learner's programs take (`mr_rl.rl.batch`)."""
  s = settings
  P, S = s.data.max_prompt_len, s.rollout.max_new_tokens
  if s.update.pack:  # packed rows: any width on the column grid x any row count
    rows = s.data.batch_prompts * s.rollout.group_size
    return len({batch_lib.column_bucket(n, P + S) for n in range(1, P + S + 1)}) * \
        len({batch_lib.fine_bucket(n, batch_lib.PACKED_ROWS_PER_OCTAVE)
             for n in range(1, rows + 1)})
  return len(batch_lib.learner_shapes(P, S, s.batch.trim_columns, s.batch.column_buckets))


def expected_programs(settings) -> dict[str, int]:
  """Upper bounds on the programs of each name a training run with `settings` compiles: the
  learner's one per batch shape, the rollout's one per prompt bucket and row count (rollout
  rows, evaluation's) or per prompt bucket and engine pool (the engine's
  `EngineSpec.expected_programs`; a multi-turn run's turn programs instead,
  `mr_rl.multiturn.draw.expected_programs`), the signal's one per group count."""
  s = settings
  widths = learner_widths(s)
  buckets = len(prompt_buckets(s.data.max_prompt_len))
  rollout_rows = s.data.batch_prompts * s.rollout.group_size
  eval_rows = EVAL_ROW_SHAPES if s.eval.every else 0
  # The signal runs on the groups kept: all B, or with dynamic sampling any count up to B.
  groups = s.data.batch_prompts if s.dynamic.mode != "off" else 1
  out = {"policy_step": widths, "ppo_step": widths, "value_forward": widths,
         "logprob_forward": widths, "signal": groups, "lora_merge": 1,
         "finite_check": 1}
  if s.multiturn.enabled:  # trajectories on the turn programs (mr_rl.multiturn.draw), any engine
    from mr_rl.multiturn import draw as turn_draw  # pylint: disable=import-outside-toplevel
    out.update(turn_draw.expected_programs(s, buckets))
  else:
    engine = rollout_engines.ENGINES.get(s.rollout.engine)
    out.update(engine.expected_programs(s.rollout, buckets, rollout_rows, eval_rows))
  return out


# ------------------------------------------------------------------------------- warm-up
def _rollout_of(policy, B: int, G: int, S: int, p_len: int, s_len: int):
  """A rollout of padding with the shapes and dtypes of a real one: B prompts of `p_len`
  tokens, G responses of `s_len` tokens each (what `make_batch` needs to land on a shape)."""
  from mr_rl.rollout import Rollout
  P = policy.max_prompt_len
  p_mask = np.zeros((B, P), np.int32)
  p_mask[:, P - p_len:] = 1
  mask = np.zeros((B, G, S), np.int32)
  mask[..., :s_len] = 1
  return Rollout(np.full((B, P), policy.pad_id, np.int32), p_mask,
                 np.full((B, G, S), policy.pad_id, np.int32), np.zeros((B, G, S), np.float32),
                 mask, np.full((B, G), s_len, np.int32), np.zeros((B, G), bool),
                 [[""] * G for _ in range(B)], np.ones((B, G), bool))


def _lengths_for(shape, P: int, S: int, column_buckets: int) -> tuple[int, int]:
  """(prompt length, response length) whose batch takes learner shape (T, response_start)."""
  T, start = shape
  if column_buckets:
    return 1, T - P
  s_len = max(1, T - start)  # the fine grid: the prompt side [.., start), responses after it
  return max(1, min(P, start)), min(S, s_len)


def warm_up(comp, settings, learner, train_state) -> int:
  """Compiles, before step 0, the programs a run's settings predict (`expected_programs`): the
  policy step and the reference / critic forwards at every learner shape, and the rollout
  (the engine's `EngineSpec.warm_up`: the static sampler, or the continuous engine's programs
  at every pool size) at every prompt bucket, with
  the arguments and shardings the steps will pass. Each executable lands in the persistent
  cache (`mr_rl.compilation.enable_cache`), where the steps find it. Returns the number of
  programs compiled. Packed batches (data-dependent row counts) are not warmed up."""
  s = settings
  if s.update.pack:
    raise ValueError("config.compile.warmup cannot predict packed batches' row counts "
                     "(config.optim.pack); turn one of them off")
  n = _warm_learner(comp, s, learner, train_state)
  checkpointing.nonfinite_leaves(train_state)  # the check before each save
  n += 1
  return n + _warm_rollout(comp, s, learner.policy(train_state, comp.base_params))


def _lowered(fn, mesh, *args):
  """`fn.lower(*args).compile()` in the mesh context the trainer calls `fn` in."""
  if mesh is None:
    return fn.lower(*args).compile()
  with sharding.activation_sharding(mesh):
    return fn.lower(*args).compile()


def _warm_learner(comp, s, learner, train_state) -> int:
  from mr_rl.rl import update as update_lib
  P, S, B, G = s.data.max_prompt_len, s.rollout.max_new_tokens, s.data.batch_prompts, \
      s.rollout.group_size
  M, mesh, ppo = s.update.num_micro_batches, comp.mesh, s.advantage == "ppo"
  base = () if learner.lora is None else (comp.base_params,)
  rng = jax.random.PRNGKey(0)
  n = 0
  for shape in sorted(batch_lib.learner_shapes(P, S, s.batch.trim_columns,
                                               s.batch.column_buckets)):
    ro = _rollout_of(comp.policy, B, G, S, *_lengths_for(shape, P, S, s.batch.column_buckets))
    zeros = lambda tok, mask: np.zeros(np.shape(tok), np.float32)
    batch = batch_lib.make_batch(
        ro, None if ppo else np.zeros((B, G), np.float32), trim=s.batch.trim_columns,
        column_buckets=s.batch.column_buckets,
        ppo=batch_lib.PPOTargets(zeros, np.zeros((B, G), np.float32)) if ppo else None)
    if (batch.shape[1], batch.response_start) != shape:
      raise AssertionError(f"warm-up built a batch of shape {batch.shape}, start "
                           f"{batch.response_start} for {shape}")
    if s.update.loss.kl_coef > 0:
      batch = batch.replace(ref_logp=np.zeros(batch.shape, np.float32))
    placed = learner.place_batch(batch)
    step = learner.step if mesh is None else learner.step.jitted_for(placed.response_start)
    _lowered(step, mesh, train_state, placed, rng, *base)
    n += 1
    chunk = [jnp.asarray(x[:batch.shape[0] // M]) for x in (batch.tokens, batch.mask)]
    if mesh is not None:
      chunk = jax.device_put(chunk, [sharding.batch_sharding(mesh, c.shape) for c in chunk])
    if s.update.loss.kl_coef > 0 or s.kl_ref_every:  # (the trainer's forward: same program)
      forward = update_lib.make_logprob_fn(update_lib.model_logits_fn(comp.model))
      _lowered(forward, mesh, comp.base_params, *chunk)
      n += 1
    if ppo:
      _lowered(learner.value_fn, mesh, learner.critic(train_state, comp.base_params), *chunk)
      n += 1
  return n


def _warm_rollout(comp, s, policy_params) -> int:
  from mr_rl.models import lora
  from mr_rl.rollout import sampling_model
  r, policy = s.rollout, comp.policy
  engine = rollout_engines.ENGINES.get(r.engine)
  params = lora.merge(policy_params)
  model = sampling_model(policy.model, r.dtype)
  P, B = policy.max_prompt_len, s.data.batch_prompts
  key = jax.random.PRNGKey(0)
  n, previous = 0, 0
  for bucket in prompt_buckets(P):
    length = min(bucket, P)
    if length <= previous:
      break
    previous = length
    tokens = np.full((B, P), policy.pad_id, np.int32)
    mask = np.zeros((B, P), np.int32)
    mask[:, P - length:] = 1
    n += engine.warm_up(model, params, tokens, mask, s=r, key=key,
                        eos_id=policy.tokenizer.eos_token_id, pad_id=policy.pad_id,
                        mesh=policy.mesh)
  return n
