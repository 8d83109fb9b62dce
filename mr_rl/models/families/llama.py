"""Llama 3.x and DeepSeek-Math (transformers `LlamaForCausalLM`): no q/k norm, llama3 RoPE
scaling where the config has it, Llama-3 header prompts."""

from __future__ import annotations

from mr_rl.models import families

SPEC = families.register(families.FamilySpec(
    name="llama", model_types=("llama",), architecture="LlamaForCausalLM", moe=False,
    config_from_hf=lambda hf: dict(qk_norm=False),
    hf_config_extra=lambda config: dict(mlp_bias=False, pretraining_tp=1),
    mlp_mapping=families.dense_mlp,
    model_styles={"llama_3_1_8b_instruct": "chat", "llama_3_2_3b": "plain",
                  "llama_3_1_8b": "plain", "deepseek_math_7b_base": "plain"},
    tiny_config=lambda d_model: dict(
        rope_theta=500_000.0, norm_eps=1e-5, qk_norm=False, tie_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=256)),
    tiny_tokens=("<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"),
    tiny_chat_template=families.LLAMA3_TEMPLATE))
