"""Qwen3-MoE sparse block: softmax router, top-k experts, optional top-k renormalisation.

Shape letters in this module: B batch rows, T positions, D model width, N = B * T tokens,
E routed experts (num_experts), C experts chosen per token (the router's top-k,
num_experts_per_tok), F expert MLP width (moe_d_ff). (K is not used: project-wide it is the
reward channels.)

Two exact implementations of the same function (ModelConfig.moe_impl):
  * 'ragged': sort the N*C (token, expert) assignments by expert and run the three expert
    matmuls as grouped matmuls with `jax.lax.ragged_dot`; compute ~ C experts per token.
  * 'dense': every expert on every token (einsum over the 'expert' axis) weighted by a dense
    [N, E] combine matrix that is zero outside the top-C; E/C times the compute, but shards
    over the 'expert' mesh axis with no data-dependent shapes.
Both match transformers' Qwen3MoeSparseMoeBlock (router probabilities in float32, top-k on the
probabilities, renormalised when norm_topk_prob, cast back to the activation dtype).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from mr_rl.models.config import ModelConfig
from mr_rl.models.layers import kernel_init, param_with_axes, precision_of


def route(router_logits_NE: jax.Array, top_k: int, norm_topk_prob: bool):
  """Top-k routing (C = top_k). Returns (weights_NC float32, experts_NC int32)."""
  probs_NE = jax.nn.softmax(router_logits_NE.astype(jnp.float32), axis=-1)
  w_NC, idx_NC = jax.lax.top_k(probs_NE, top_k)
  if norm_topk_prob:
    w_NC = w_NC / jnp.sum(w_NC, axis=-1, keepdims=True)
  return w_NC, idx_NC.astype(jnp.int32)


class MoEBlock(nn.Module):
  """Routed-expert SwiGLU MLP. Params: router [D, E], gate/up [E, D, F], down [E, F, D]."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.config
    E, C, D, F = cfg.num_experts, cfg.num_experts_per_tok, cfg.d_model, cfg.moe_d_ff
    pd, dt = cfg.param_dtype, cfg.dtype
    prec = precision_of(cfg)
    wr = param_with_axes(self, "router", kernel_init, (D, E), ("embed", "router"), pd)
    wg = param_with_axes(self, "gate_proj", kernel_init, (E, D, F), ("expert", "embed", "mlp"), pd)
    wu = param_with_axes(self, "up_proj", kernel_init, (E, D, F), ("expert", "embed", "mlp"), pd)
    wd = param_with_axes(self, "down_proj", kernel_init, (E, F, D), ("expert", "mlp", "embed"), pd)
    B, T, _ = x_BTD.shape
    x_ND = x_BTD.astype(dt).reshape(B * T, D)
    logits_NE = jnp.einsum("nd,de->ne", x_ND, wr.astype(dt), precision=prec)
    w_NC, idx_NC = route(logits_NE, C, cfg.norm_topk_prob)
    w_NC = w_NC.astype(dt)
    wg, wu, wd = wg.astype(dt), wu.astype(dt), wd.astype(dt)

    if cfg.moe_impl == "dense":
      combine_NE = jnp.sum(jax.nn.one_hot(idx_NC, E, dtype=dt) * w_NC[..., None], axis=1)
      g = jnp.einsum("nd,edf->nef", x_ND, wg, precision=prec)
      u = jnp.einsum("nd,edf->nef", x_ND, wu, precision=prec)
      h_NEF = jax.nn.silu(g) * u
      y_NED = jnp.einsum("nef,efd->ned", h_NEF, wd, precision=prec)
      y_ND = jnp.einsum("ned,ne->nd", y_NED, combine_NE, precision=prec)
    else:
      N = B * T
      flat_e = idx_NC.reshape(-1)                              # [N*C]
      order = jnp.argsort(flat_e, stable=True)
      tok = order // C                                         # token of each sorted row
      xs = x_ND[tok]                                           # [N*C, D]
      sizes = jnp.bincount(flat_e, length=E).astype(jnp.int32)
      g = jax.lax.ragged_dot(xs, wg, sizes, precision=prec)
      u = jax.lax.ragged_dot(xs, wu, sizes, precision=prec)
      ys = jax.lax.ragged_dot(jax.nn.silu(g) * u, wd, sizes, precision=prec)
      ys = ys * w_NC.reshape(-1)[order][:, None]
      y_ND = jnp.zeros((N, D), dt).at[tok].add(ys)
    return y_ND.reshape(B, T, D)
