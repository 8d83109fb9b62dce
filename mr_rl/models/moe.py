"""Qwen3-MoE sparse block: softmax router, top-k experts, optional top-k renormalisation.

Shape letters (docs/shapes.md): N rows, T positions, D model width, X = N * T tokens routed,
E routed experts (num_experts), U experts used per token (the router's top-k,
num_experts_per_tok), F expert MLP width (moe_d_ff).

Two exact implementations of the same function (ModelConfig.moe_impl):
  * 'ragged': sort the X*U (token, expert) assignments by expert and run the three expert
    matmuls as grouped matmuls with `jax.lax.ragged_dot`; compute ~ U experts per token.
  * 'dense': every expert on every token (einsum over the 'expert' axis) weighted by a dense
    [X, E] combine matrix that is zero outside the top-U; E/U times the compute, but shards
    over the 'expert' mesh axis with no data-dependent shapes.
Both match transformers' Qwen3MoeSparseMoeBlock (router probabilities in float32, top-k on the
probabilities, renormalised when norm_topk_prob, cast back to the activation dtype).

Memory checks only (launch/check.py): inside `grouped_matmul_stand_in()` the 'ragged' path's three
grouped matmuls are traced as `stand_in_grouped_matmul` instead of `jax.lax.ragged_dot`. XLA:CPU
expands a ragged dot into dense dots over a group-masked copy of the left operand ([M, groups, K]
temporaries: hundreds of GB per device at paper scale) where TPU runs a grouped-matmul kernel
whose HBM footprint is its result; the stand-in has the ragged dot's operand and result shapes and
shardings and no such temporaries, and its values are WRONG (a plain sum over experts). Nothing
else uses it; outside the context the block is unchanged.
"""

from __future__ import annotations

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from mr_rl.models.config import ModelConfig
from mr_rl.models.layers import kernel_init, param_with_axes, precision_of


def stand_in_grouped_matmul(lhs_MK, rhs_GKN, group_sizes_G, precision=None):
  """Memory stand-in for `jax.lax.ragged_dot` (not its values): [M, K] x [G, K, N] -> [M, N].

  Forward `lhs @ sum_g rhs[g]`; backward d lhs = d out @ (sum_g rhs[g])^T [M, K] and
  d rhs = (lhs^T d out) broadcast to [G, K, N] and materialised (an optimization barrier), as
  the TPU kernel's transpose writes a per-group weight gradient. So the operands, the result,
  both gradients and the saved residuals (lhs, rhs) have the ragged dot's shapes, and under GSPMD
  the group axis sharded over 'expert' is contracted locally and all-reduced (XLA's own
  partitioning of the ragged dot likewise gives each device all M rows against its local groups).
  Extra: one [K, N] temporary per device (the summed weights). `group_sizes_G` is ignored.
  """
  del group_sizes_G
  return _stand_in(lhs_MK, rhs_GKN, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _stand_in(lhs_MK, rhs_GKN, precision):
  return jnp.einsum("mk,gkn->mn", lhs_MK, rhs_GKN, precision=precision)


def _stand_in_fwd(lhs_MK, rhs_GKN, precision):
  return _stand_in(lhs_MK, rhs_GKN, precision), (lhs_MK, rhs_GKN)


def _stand_in_bwd(precision, res, dout_MN):
  lhs_MK, rhs_GKN = res
  dlhs_MK = jnp.einsum("mn,gkn->mk", dout_MN, rhs_GKN, precision=precision)
  dw_KN = jnp.einsum("mk,mn->kn", lhs_MK, dout_MN, precision=precision)
  drhs_GKN = jax.lax.optimization_barrier(rhs_GKN * 0 + dw_KN[None])
  return dlhs_MK, drhs_GKN


_stand_in.defvjp(_stand_in_fwd, _stand_in_bwd)


_GROUPED_MATMUL = [jax.lax.ragged_dot]


@contextlib.contextmanager
def grouped_matmul_stand_in():
  """Within this context the 'ragged' MoE path traces `stand_in_grouped_matmul` (memory checks)."""
  _GROUPED_MATMUL.append(stand_in_grouped_matmul)
  try:
    yield
  finally:
    _GROUPED_MATMUL.pop()


def route(router_logits_XE: jax.Array, top_k: int, norm_topk_prob: bool):
  """Top-k routing (U = top_k). Returns (weights_XU float32, experts_XU int32)."""
  probs_XE = jax.nn.softmax(router_logits_XE.astype(jnp.float32), axis=-1)
  w_XU, idx_XU = jax.lax.top_k(probs_XE, top_k)
  if norm_topk_prob:
    w_XU = w_XU / jnp.sum(w_XU, axis=-1, keepdims=True)
  return w_XU, idx_XU.astype(jnp.int32)


class MoEBlock(nn.Module):
  """Routed-expert SwiGLU MLP. Params: router [D, E], gate/up [E, D, F], down [E, F, D]."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_NTD):
    cfg = self.config
    E, U, D, F = cfg.num_experts, cfg.num_experts_per_tok, cfg.d_model, cfg.moe_d_ff
    pd, dt = cfg.param_dtype, cfg.dtype
    prec = precision_of(cfg)
    wr = param_with_axes(self, "router", kernel_init, (D, E), ("embed", "router"), pd)
    wg = param_with_axes(self, "gate_proj", kernel_init, (E, D, F), ("expert", "embed", "mlp"), pd)
    wu = param_with_axes(self, "up_proj", kernel_init, (E, D, F), ("expert", "embed", "mlp"), pd)
    wd = param_with_axes(self, "down_proj", kernel_init, (E, F, D), ("expert", "mlp", "embed"), pd)
    N, T, _ = x_NTD.shape
    x_XD = x_NTD.astype(dt).reshape(N * T, D)
    logits_XE = jnp.einsum("xd,de->xe", x_XD, wr.astype(dt), precision=prec)
    w_XU, idx_XU = route(logits_XE, U, cfg.norm_topk_prob)
    w_XU = w_XU.astype(dt)
    wg, wu, wd = wg.astype(dt), wu.astype(dt), wd.astype(dt)

    if cfg.moe_impl == "dense":
      combine_XE = jnp.sum(jax.nn.one_hot(idx_XU, E, dtype=dt) * w_XU[..., None], axis=1)
      g = jnp.einsum("xd,edf->xef", x_XD, wg, precision=prec)
      u = jnp.einsum("xd,edf->xef", x_XD, wu, precision=prec)
      h_XEF = jax.nn.silu(g) * u
      y_XED = jnp.einsum("xef,efd->xed", h_XEF, wd, precision=prec)
      y_XD = jnp.einsum("xed,xe->xd", y_XED, combine_XE, precision=prec)
    else:
      X = N * T
      flat_e = idx_XU.reshape(-1)                              # [X*U]
      order = jnp.argsort(flat_e, stable=True)
      tok = order // U                                         # token of each sorted row
      xs = x_XD[tok]                                           # [X*U, D]
      sizes = jnp.bincount(flat_e, length=E).astype(jnp.int32)
      gmm = _GROUPED_MATMUL[-1]                                # jax.lax.ragged_dot
      g = gmm(xs, wg, sizes, precision=prec)
      u = gmm(xs, wu, sizes, precision=prec)
      ys = gmm(jax.nn.silu(g) * u, wd, sizes, precision=prec)
      ys = ys * w_XU.reshape(-1)[order][:, None]
      y_XD = jnp.zeros((X, D), dt).at[tok].add(ys)
    return y_XD.reshape(N, T, D)
