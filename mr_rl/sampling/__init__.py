"""Jitted KV-cache samplers for mr_rl models: the static sampler (prefill + `lax.while_loop`
decode of all rows at once) and the continuous engine (a pool of decode slots that stays full),
with the slot-memory planning of `memory.py`."""

from mr_rl.sampling.engine import Engine, EngineStats, FinishedRow, generate_continuous
from mr_rl.sampling.processing import (SamplingParams, filtered_log_probs, filtered_logits,
                                       sample_tokens, token_log_probs)
from mr_rl.sampling.sampler import (SampleOutput, Sampler, generate, generate_groups,
                                    prompt_bucket, repeat_groups, segment_ends)

__all__ = [
    "Engine", "EngineStats", "FinishedRow", "generate_continuous",
    "SampleOutput", "Sampler", "SamplingParams", "filtered_log_probs", "filtered_logits",
    "generate", "generate_groups", "prompt_bucket", "repeat_groups", "sample_tokens",
    "segment_ends", "token_log_probs",
]
