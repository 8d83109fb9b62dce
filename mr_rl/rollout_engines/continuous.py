"""The continuous engine: a pool of `config.rollout.slots` decode slots kept full, a finished
row's slot refilled from the waiting prompts (`mr_rl.sampling.Engine`); each row is handed on
as it finishes. Sampled draws follow its per-row key schedule; greedy tokens equal the static
engine's."""

from __future__ import annotations

import numbers

from mr_rl import rollout_engines
from mr_rl.sampling import engine as engine_lib
from mr_rl.sampling import sampler as sampler_lib


def _slots_check(field: str, value) -> int:
  if not isinstance(value, numbers.Integral) or isinstance(value, bool):
    raise ValueError(f"config.{field} must be an int, got {value!r}")
  if value < 0:
    raise ValueError(f"config.{field} must be >= 0, got {value!r}")
  return int(value)


SLOTS = rollout_engines.EngineOption(
    "slots", 0, _slots_check, "the continuous engine's decode slots (0 = one per row, B * G)")


def _slots(s, rows: int) -> int:
  return rollout_engines.option(s, "slots") or rows


def _generate(model, params, tokens_BP, mask_BP, *, s, key, eos_id, pad_id, mesh,
              on_finished=None):
  return engine_lib.generate_continuous(
      model, params, tokens_BP, mask_BP, group_size=s.group_size, key=key,
      slots=rollout_engines.option(s, "slots"), max_new_tokens=s.max_new_tokens,
      temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, eos_id=eos_id, pad_id=pad_id,
      mesh=mesh, cache_dtype=s.cache_dtype or None, on_finished=on_finished)


def _warm_up(model, params, tokens_BP, mask_BP, *, s, key, eos_id, pad_id, mesh) -> int:
  del key  # the engine's programs take their keys as arguments
  eng = engine_lib.cached_engine(model, _slots(s, len(tokens_BP) * s.group_size),
                                 s.max_new_tokens, s.temperature, s.top_k, s.top_p,
                                 sampler_lib.normalize_eos(eos_id), pad_id, None, mesh,
                                 s.cache_dtype or None)
  return eng.warm_up(params, tokens_BP, mask_BP, group_size=s.group_size)


def _expected_programs(s, prompt_buckets: int, rollout_rows: int, eval_rows: int) -> dict:
  pools = len(engine_lib.Engine(None, slots=_slots(s, rollout_rows),
                                max_new_tokens=s.max_new_tokens).pool_sizes())
  b = prompt_buckets
  return dict(engine_init=b, engine_prefill=b, engine_step=b * pools, engine_gather=b * pools,
              engine_shrink=b * pools, sampler=b * eval_rows)  # evaluation: the static sampler


SPEC = rollout_engines.register(rollout_engines.EngineSpec(
    name="continuous", doc="a pool of `slots` decode slots kept full (sampling.Engine)",
    generate=_generate, warm_up=_warm_up, expected_programs=_expected_programs,
    check_programs=("engine_prefill", "engine_step", "engine_shrink"), options=(SLOTS,),
    splits_rows=False))
