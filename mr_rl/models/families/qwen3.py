"""Qwen3 dense (transformers `Qwen3ForCausalLM`): q/k RMSNorm, SwiGLU MLP, ChatML prompts."""

from __future__ import annotations

from mr_rl.models import families


def qwen_hf_extra(config) -> dict:
  """config.json fields of the Qwen3 families (no sliding window)."""
  return dict(use_sliding_window=False, sliding_window=None, max_window_layers=config.n_layers)


SPEC = families.register(families.FamilySpec(
    name="qwen3", model_types=("qwen3",), architecture="Qwen3ForCausalLM", moe=False,
    config_from_hf=lambda hf: dict(qk_norm=True),
    hf_config_extra=qwen_hf_extra,
    mlp_mapping=families.dense_mlp,
    model_styles={"qwen3_4b_instruct_2507": "chat", "qwen3_1_7b_base": "plain",
                  "qwen3_1_7b": "plain"},
    tiny_config=lambda d_model: dict(rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True),
    tiny_tokens=(None, "<|im_end|>", "<|endoftext|>"),
    tiny_chat_template=families.CHATML_TEMPLATE))
