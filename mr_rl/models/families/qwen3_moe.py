"""Qwen3-MoE (transformers `Qwen3MoeForCausalLM`): Qwen3 attention, every layer's MLP a
top-k routed mixture of experts (`mr_rl.models.moe`)."""

from __future__ import annotations

from mr_rl.models import families
from mr_rl.models.families import qwen3


def _config_from_hf(hf) -> dict:
  if hf.get("mlp_only_layers") or hf.get("decoder_sparse_step", 1) != 1:
    raise ValueError("qwen3_moe with dense layers (mlp_only_layers / decoder_sparse_step != 1)"
                     " is not supported")
  return dict(qk_norm=True, num_experts=hf.get("num_experts", hf.get("num_local_experts")),
              num_experts_per_tok=hf["num_experts_per_tok"],
              moe_d_ff=hf["moe_intermediate_size"],
              norm_topk_prob=bool(hf.get("norm_topk_prob", False)))


def _hf_extra(config) -> dict:
  return dict(qwen3.qwen_hf_extra(config), num_experts=config.num_experts,
              num_experts_per_tok=config.num_experts_per_tok, moe_intermediate_size=config.moe_d_ff,
              norm_topk_prob=config.norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[],
              output_router_logits=False, router_aux_loss_coef=0.001)


def _mlp(config) -> list:
  """The router and the experts' weights, stacked over experts."""
  ex = range(config.num_experts)
  return [(("mlp", "router"), ["mlp.gate.weight"], *families.linear(())),
          *[(("mlp", n), [f"mlp.experts.{e}.{n}.weight" for e in ex], *families.STACK_T)
            for n in ("gate_proj", "up_proj", "down_proj")]]


SPEC = families.register(families.FamilySpec(
    name="qwen3_moe", model_types=("qwen3_moe",), architecture="Qwen3MoeForCausalLM", moe=True,
    config_from_hf=_config_from_hf, hf_config_extra=_hf_extra, mlp_mapping=_mlp,
    model_styles={"qwen3_30b_a3b_instruct_2507": "chat"},
    tiny_config=lambda d_model: dict(
        rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=False, num_experts=4,
        num_experts_per_tok=2, moe_d_ff=d_model, norm_topk_prob=True),
    tiny_tokens=qwen3.SPEC.tiny_tokens, tiny_chat_template=families.CHATML_TEMPLATE))
