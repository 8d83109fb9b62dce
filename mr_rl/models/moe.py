"""Qwen3-MoE sparse block: softmax router, top-k experts, optional top-k renormalisation.

Shape letters (docs/shapes.md): N rows, T positions, D model width, X = N * T tokens routed,
E routed experts (num_experts), U experts used per token (the router's top-k,
num_experts_per_tok), F expert MLP width (moe_d_ff).

Three exact implementations of the same function (ModelConfig.moe_impl):
  * 'ragged': sort the X*U (token, expert) assignments by expert and run the three expert
    matmuls as grouped matmuls with `jax.lax.ragged_dot`; compute ~ U experts per token.
  * 'dense': every expert on every token (einsum over the 'expert' axis) weighted by a dense
    [X, E] combine matrix that is zero outside the top-U; E/U times the compute, but shards
    over the 'expert' mesh axis with no data-dependent shapes.
  * 'ep': expert-parallel dispatch with per-device routing (`ep_moe`, a shard_map over the
    ambient mesh): each device routes only its own tokens, sends each (token, expert) row to
    the device of the 'expert' mesh axis that holds that expert (all_to_all), runs its local
    experts as grouped matmuls and sends the results back. Mesh axes that do not split the
    token batch (the 'tensor' axis) split the device's tokens further, so each of those devices
    holds full-width weights of its local experts (all-gathered) and 1/size of the rows. No
    token is dropped: the buffers are sized for the worst case (see `ep_capacity`). Without a
    mesh it is the 'ragged' computation on one device.
Both match transformers' Qwen3MoeSparseMoeBlock (router probabilities in float32, top-k on the
probabilities, renormalised when norm_topk_prob, cast back to the activation dtype).

Memory checks only (launch/check.py): inside `grouped_matmul_stand_in()` the 'ragged' and 'ep'
paths' grouped matmuls are traced as `stand_in_grouped_matmul` instead of `jax.lax.ragged_dot`. XLA:CPU
expands a ragged dot into dense dots over a group-masked copy of the left operand ([M, groups, K]
temporaries: hundreds of GB per device at paper scale) where TPU runs a grouped-matmul kernel
whose HBM footprint is its result; the stand-in has the ragged dot's operand and result shapes and
shardings and no such temporaries, and its values are WRONG (a plain sum over experts). Nothing
else uses it; outside the context the block is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec as P

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
  return _sum_to_vma(dlhs_MK, lhs_MK), _sum_to_vma(drhs_GKN, rhs_GKN)


def _sum_to_vma(ct, primal):
  """Inside shard_map: sums a cotangent over the mesh axes it varies along and its primal does
  not (a weight replicated over 'tensor' used by tokens split over 'tensor', as in 'ep'), the
  psum JAX's own transpose of the implicit broadcast inserts. Outside shard_map: unchanged."""
  vma = lambda x: jax.typeof(x).manual_axis_type.varying
  extra = tuple(sorted(vma(ct) - vma(primal)))
  return jax.lax.psum(ct, extra) if extra else ct


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


def ep_capacity(tokens: int, top_k: int, local_experts: int) -> int:
  """Rows one device can receive from one other device in 'ep' dispatch, exact (no dropping).

  Each of the sender's `tokens` tokens has `top_k` distinct experts, so at most
  min(top_k, local_experts) of its rows go to one device, and every token may pick that device.
  A device's receive buffer is ep size x this (the rows of all tokens of its EP group, times
  min(U, E / ep size)), the same as its send buffer.
  """
  return tokens * min(top_k, local_experts)


def _ep_local(x_XD, wr_DE, wg, wu, wd, *, top_k, norm_topk_prob, prec, ep_axis, ep_size,
              split_axes, split_size):
  """One device's part of `ep_moe`: x_XD its [X, D] tokens (shared with the `split_axes`
  devices), wg / wu [E / ep_size, D, F] and wd [E / ep_size, F, D] its experts. Returns [X, D]."""
  X, D = x_XD.shape
  E_l, U = wg.shape[0], top_k
  dt = x_XD.dtype
  x_dev = -(-X // split_size)                       # this device's share of the X tokens
  if split_size > 1:
    x_pad = jnp.pad(x_XD, ((0, x_dev * split_size - X), (0, 0)))
    x_XD = jax.lax.dynamic_slice_in_dim(x_pad, jax.lax.axis_index(split_axes) * x_dev, x_dev)
  logits_XE = jnp.einsum("xd,de->xe", x_XD, wr_DE, precision=prec)
  w_XU, idx_XU = route(logits_XE, U, norm_topk_prob)
  w_XU = w_XU.astype(dt)
  cap = ep_capacity(x_dev, U, E_l)
  rows = ep_size * cap                              # send / receive buffer rows
  # Send side: assignments sorted by expert = by destination device, then local expert.
  flat_e = idx_XU.reshape(-1)                       # [X*U]
  order = jnp.argsort(flat_e, stable=True)
  sorted_e = flat_e[order]
  dest = sorted_e // E_l
  counts = jnp.zeros((ep_size,), jnp.int32).at[dest].add(1)
  starts = jnp.cumsum(counts) - counts
  slot_sorted = dest * cap + jnp.arange(flat_e.shape[0], dtype=jnp.int32) - starts[dest]
  slot_XU = jnp.zeros_like(flat_e).at[order].set(slot_sorted).reshape(x_dev, U)
  send_tok = jnp.full((rows,), x_dev, jnp.int32).at[slot_sorted].set(order // U)
  send_ids = jnp.full((rows,), E_l, jnp.int32).at[slot_sorted].set(sorted_e % E_l)
  send_rows = jnp.concatenate([x_XD, jnp.zeros((1, D), dt)])[send_tok]   # [rows, D], 0 if empty
  a2a = ((lambda a: jax.lax.all_to_all(a, ep_axis, 0, 0, tiled=True)) if ep_size > 1
         else (lambda a: a))
  recv_rows, recv_ids = a2a(send_rows), a2a(send_ids)          # block j: from device j
  # Receive side: rows by local expert (empty slots, id E_l, last), three grouped matmuls.
  order2 = jnp.argsort(recv_ids, stable=True)
  sizes = jnp.zeros((E_l,), jnp.int32).at[recv_ids].add(1, mode="drop")
  xs = recv_rows[order2]
  gmm = _GROUPED_MATMUL[-1]                                      # jax.lax.ragged_dot
  g = gmm(xs, wg, sizes, precision=prec)
  u = gmm(xs, wu, sizes, precision=prec)
  ys = gmm(jax.nn.silu(g) * u, wd, sizes, precision=prec)
  inv2 = jnp.zeros_like(order2).at[order2].set(jnp.arange(rows, dtype=order2.dtype))
  back = a2a(ys[inv2])                              # results in this device's send slots
  y_XD = jnp.einsum("xud,xu->xd", back[slot_XU], w_XU, precision=prec)
  if split_size > 1:  # every device of the split axes gets all X (a psum: the result is
    # replicated over those axes, as out_specs says; all_gather's would count as varying)
    full = jnp.zeros((x_dev * split_size, D), dt)
    full = jax.lax.dynamic_update_slice_in_dim(full, y_XD, jax.lax.axis_index(split_axes) * x_dev, 0)
    y_XD = jax.lax.psum(full, split_axes)[:X]
  return y_XD


def _mesh_axes(logical: str, mesh) -> tuple[str, ...]:
  """Mesh axes (of size > 1) that the ambient logical rules map `logical` to."""
  ax = nn.logical_to_mesh_axes((logical,))[0]
  axes = () if ax is None else ((ax,) if isinstance(ax, str) else tuple(ax))
  return tuple(a for a in axes if mesh.shape[a] > 1)


def ep_moe(x_NTD, wr_DE, wg, wu, wd, cfg: ModelConfig):
  """'ep' dispatch (module docstring) over the ambient mesh (`jax.set_mesh`, with the logical
  rules of `nn.logical_axis_rules`): tokens split as 'activation_batch', experts as 'expert'.

  Per device: the X tokens of its batch shard, split again over the remaining mesh axes (X/s
  each, padded); routing; a send buffer of ep x `ep_capacity(X/s, U, E/ep)` rows; all_to_all
  over the expert axis; grouped matmuls over its E/ep experts at full width F; all_to_all back;
  a sum over the remaining axes to give each of them all X outputs. Weights arrive all-gathered over every axis but 'expert'.
  Without a mesh: the same computation on one device (ep = s = 1).
  """
  N, T, D = x_NTD.shape
  kw = dict(top_k=cfg.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob,
            prec=precision_of(cfg))
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    y = _ep_local(x_NTD.reshape(N * T, D), wr_DE, wg, wu, wd, ep_axis=None, ep_size=1,
                  split_axes=(), split_size=1, **kw)
    return y.reshape(N, T, D)
  batch = _mesh_axes("activation_batch", mesh)
  experts = _mesh_axes("expert", mesh)
  if len(experts) > 1:
    raise ValueError(f"moe_impl='ep' needs the 'expert' logical axis on one mesh axis, the "
                     f"rules map it to {experts}")
  ep_axis = experts[0] if experts else None
  ep_size = mesh.shape[ep_axis] if ep_axis else 1
  if cfg.num_experts % ep_size:
    raise ValueError(f"moe_impl='ep': num_experts {cfg.num_experts} is not divisible by the "
                     f"'{ep_axis}' mesh axis ({ep_size})")
  n_batch = math.prod(mesh.shape[a] for a in batch)
  if N % n_batch:
    raise ValueError(f"moe_impl='ep': {N} rows are not divisible by the batch mesh axes "
                     f"{batch} ({n_batch})")
  split = tuple(a for a in mesh.axis_names if a not in batch and mesh.shape[a] > 1)
  split_size = math.prod(mesh.shape[a] for a in split)

  def local(x, r, g, u, d):
    n = x.shape[0]
    y = _ep_local(x.reshape(n * T, D), r, g, u, d, ep_axis=ep_axis, ep_size=ep_size,
                  split_axes=split, split_size=split_size, **kw)
    return y.reshape(n, T, D)

  tok = P(batch or None, None, None)
  ex = P(ep_axis, None, None)
  return jax.shard_map(local, mesh=mesh, in_specs=(tok, P(), ex, ex, ex), out_specs=tok)(
      x_NTD, wr_DE, wg, wu, wd)


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
    if cfg.moe_impl == "ep":
      return ep_moe(x_NTD.astype(dt), wr.astype(dt), wg.astype(dt), wu.astype(dt),
                    wd.astype(dt), cfg)
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
