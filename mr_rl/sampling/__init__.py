"""Jitted KV-cache sampler for mr_rl models (prefill + `lax.while_loop` decode)."""

from mr_rl.sampling.processing import (SamplingParams, filtered_log_probs, filtered_logits,
                                       sample_tokens, token_log_probs)
from mr_rl.sampling.sampler import (SampleOutput, Sampler, generate, generate_groups,
                                    prompt_bucket, repeat_groups, segment_ends)

__all__ = [
    "SampleOutput", "Sampler", "SamplingParams", "filtered_log_probs", "filtered_logits",
    "generate", "generate_groups", "prompt_bucket", "repeat_groups", "sample_tokens",
    "segment_ends", "token_log_probs",
]
