"""The static engine: every one of the B * G rows decoded as one batch
(`mr_rl.sampling.generate_groups`: prefill, then a `lax.while_loop` of decode steps)."""

from __future__ import annotations

from mr_rl import rollout_engines
from mr_rl.sampling import sampler as sampler_lib


def _generate(model, params, tokens_BP, mask_BP, *, s, key, eos_id, pad_id, mesh,
              on_finished=None):
  del on_finished  # rows come back together; the rollout hands them on after
  return sampler_lib.generate_groups(
      model, params, tokens_BP, mask_BP, group_size=s.group_size, key=key,
      max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
      eos_id=eos_id, pad_id=pad_id, mesh=mesh, cache_dtype=s.cache_dtype or None)


def _warm_up(model, params, tokens_BP, mask_BP, *, s, key, eos_id, pad_id, mesh) -> int:
  smp = sampler_lib.cached_sampler(model, s.max_new_tokens, s.temperature, s.top_k, s.top_p,
                                   sampler_lib.normalize_eos(eos_id), pad_id, None, mesh,
                                   s.cache_dtype or None)
  t, m = sampler_lib.repeat_groups(tokens_BP, mask_BP, s.group_size)
  smp.lower(params, t, m, key=key).compile()
  return 1


def _expected_programs(s, prompt_buckets: int, rollout_rows: int, eval_rows: int) -> dict:
  del s, rollout_rows
  return {"sampler": prompt_buckets * (1 + eval_rows)}  # one per bucket and row count


SPEC = rollout_engines.register(rollout_engines.EngineSpec(
    name="static", doc="one batch of B * G rows, prefill then decode (sampling.generate_groups)",
    generate=_generate, warm_up=_warm_up, expected_programs=_expected_programs,
    check_programs=("sampler",)))
