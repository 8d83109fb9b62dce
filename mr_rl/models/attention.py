"""Self-attention over a sequence without a KV cache: the learner's forwards and the prefill.

One contract for every implementation: queries q [N, T, J, Q, W] grouped by key/value head
(H = J * Q query heads), keys and values k, v [N, T, J, W], and segment ids seg [N, T]; query t
attends key c iff c <= t and seg[n, c] == seg[n, t]. A left-padded row has seg = its mask (0 on
padding, 1 on real tokens); packed rows carry 1, 2, ... per sequence and 0 on the row's tail.
For every real query that is exactly "a real key of my own sequence at or before me"; padding
queries attend padding keys, so their outputs are finite and, as before, meaningless (nothing
reads them: real queries never attend a padding key).

Implementations (`ModelConfig.attention_impl`):

  * 'reference': scores for all T x T pairs, softmax in float32 (XLA einsums). The definition
    the others are tested against; holds N x H x T x T float32 scores per layer.
  * 'blockwise': the same function in blocks of `BLOCK` queries x `BLOCK` keys with an online
    softmax (FlashAttention-2's recurrence) in plain JAX, blocks above the causal diagonal
    skipped, and a custom backward that recomputes each block from the saved log-sum-exp. Peak
    memory holds one block's scores; it runs anywhere (XLA:CPU included: `launch/check.py`
    compiles it when it sizes a pod).
  * 'cudnn': `jax.nn.dot_product_attention(implementation='cudnn')`, cuDNN's fused flash
    attention on NVIDIA GPUs (bf16 / fp16). cuDNN masks by sequence length (right padding), so
    each left-padded row is rolled left by its padding first and back after; it cannot take
    packed rows (several segments), which 'auto' sends to 'pallas_gpu'.
  * 'pallas_gpu': the Pallas (Triton) flash-attention kernel of
    `jax.experimental.pallas.ops.gpu.attention` (segment ids, causal; forward and backward
    kernels), key/value heads repeated to H.
  * 'pallas_tpu': the Pallas TPU flash-attention kernel of
    `jax.experimental.pallas.ops.tpu.flash_attention` (segment ids, causal).
  * 'auto': by backend at trace time: TPU 'pallas_tpu'; GPU 'cudnn' for unpacked rows in
    bf16 / fp16, else 'pallas_gpu'; elsewhere (CPU) 'reference' up to `AUTO_REFERENCE_MAX_T`
    columns and 'blockwise' beyond. The backend is the one the program is compiled for: the
    host's, or inside `target_backend(name)` the named one (an ahead-of-time compile for a TPU
    slice from a CPU host, `launch/check.py --topology`, traces the kernel the pod will run).

The Pallas kernels run per (row, head) inside a `shard_map` over the ambient mesh's batch and
head axes (XLA cannot partition a kernel call); cuDNN's call carries its own partitioning rule.
The Pallas kernels also run in Pallas' interpreter on CPU (`interpret=True` for the GPU kernel,
`pltpu.force_tpu_interpret_mode()` around the TPU one), which is how the tests check them
against 'reference'. Design: docs/accelerators.md, "Attention"; memory figures:
docs/benchmarks.md, "Layer scan on XLA:CPU".
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

IMPLS = ("auto", "reference", "blockwise", "cudnn", "pallas_gpu", "pallas_tpu")
# 'auto' on CPU: the reference's T x T scores up to this many columns, blocks beyond.
AUTO_REFERENCE_MAX_T = 1024
# Queries and keys per block of 'blockwise' (a sequence shorter than this is one block).
BLOCK = 256
# Finite mask value: a query with no visible key (padding) gets a uniform, finite row.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# The backend 'auto' resolves for when it is not the host's (set by `target_backend`).
_TARGET_BACKEND: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "attention_target_backend", default=None)


@contextlib.contextmanager
def target_backend(backend: str):
  """Within this context, 'auto' (and the checks of explicit choices) resolve for `backend`
  ('tpu', 'gpu', 'cpu') instead of the host's: programs traced here are compiled ahead of time
  for that backend (launch/check.py --topology compiles for a TPU slice on a CPU host)."""
  if backend not in ("tpu", "gpu", "cuda", "rocm", "cpu"):
    raise ValueError(f"target_backend: unknown backend {backend!r}")
  token = _TARGET_BACKEND.set(backend)
  try:
    yield
  finally:
    _TARGET_BACKEND.reset(token)


def resolve(impl: str, *, dtype, packed: bool, T: int, backend: str | None = None) -> str:
  """The implementation 'auto' (or an explicit choice) runs for this call.

  Raises:
    ValueError: an unknown name, or an explicit choice the backend or call cannot run.
  """
  if impl not in IMPLS:
    raise ValueError(f"attention_impl must be one of {IMPLS}, got {impl!r}")
  backend = backend or _TARGET_BACKEND.get() or jax.default_backend()
  half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  if impl == "auto":
    if backend == "tpu":
      return "pallas_tpu"
    if backend in ("gpu", "cuda", "rocm"):
      return "cudnn" if half and not packed else "pallas_gpu"
    return "reference" if T <= AUTO_REFERENCE_MAX_T else "blockwise"
  if impl == "cudnn":
    if backend not in ("gpu", "cuda"):
      raise ValueError(f"attention_impl='cudnn' needs an NVIDIA GPU; this backend is {backend!r} "
                       "(use 'auto')")
    if not half:
      raise ValueError(f"attention_impl='cudnn' runs bf16 / fp16 only; compute dtype is "
                       f"{jnp.dtype(dtype).name} (set model.compute_dtype='bfloat16' or use "
                       "'pallas_gpu')")
    if packed:
      raise ValueError("attention_impl='cudnn' cannot take packed rows (segment ids); use "
                       "'pallas_gpu' or 'auto'")
  return impl


def attend(q_NTJQW, k_NTJW, v_NTJW, seg_NT, *, impl: str, dtype, precision=None,
           packed: bool = False, interpret: bool = False):
  """Causal, segment-restricted attention (module docstring): out [N, T, J, Q, W] in `dtype`.

  Args:
    q_NTJQW, k_NTJW, v_NTJW: queries (grouped per key/value head), keys, values.
    seg_NT: int segment ids (0 = padding).
    impl: an `IMPLS` name ('auto' resolved by `resolve`).
    dtype: compute dtype of the probabilities @ values product and the output.
    precision: matmul precision of the XLA implementations.
    packed: the rows are packed (several segments); 'cudnn' cannot take them.
    interpret: run the Pallas GPU kernel in interpret mode (tests on CPU; the TPU kernel runs
      interpreted inside `jax.experimental.pallas.tpu.force_tpu_interpret_mode()`).
  """
  T = q_NTJQW.shape[1]
  impl = resolve(impl, dtype=dtype, packed=packed, T=T)
  seg_NT = seg_NT.astype(jnp.int32)
  if impl == "reference":
    return reference(q_NTJQW, k_NTJW, v_NTJW, seg_NT, dtype=dtype, precision=precision)
  if impl == "blockwise":
    return blockwise(q_NTJQW, k_NTJW, v_NTJW, seg_NT, dtype=dtype, precision=precision)
  if impl == "cudnn":
    return _cudnn(q_NTJQW, k_NTJW, v_NTJW, seg_NT, implementation="cudnn")
  return _pallas(q_NTJQW, k_NTJW, v_NTJW, seg_NT, gpu=impl == "pallas_gpu", interpret=interpret)


def _mask(seg_q, seg_k, col_q, col_k):
  """Boolean [N, Tq, Tk]: key column <= query column, same segment."""
  return (col_k[None, None, :] <= col_q[None, :, None]) & (seg_q[:, :, None] == seg_k[:, None, :])


# ----------------------------------------------------------------------------- reference
def reference(q_NTJQW, k_NTJW, v_NTJW, seg_NT, *, dtype, precision=None):
  """All T x T scores at once (the definition; float32 softmax)."""
  T, W = q_NTJQW.shape[1], q_NTJQW.shape[-1]
  cols = jnp.arange(T, dtype=jnp.int32)
  mask_NTC = _mask(seg_NT, seg_NT, cols, cols)
  scores = jnp.einsum("ntjqw,ncjw->njqtc", q_NTJQW, k_NTJW, precision=precision,
                      preferred_element_type=jnp.float32) * (W ** -0.5)
  scores = jnp.where(mask_NTC[:, None, None], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
  return jnp.einsum("njqtc,ncjw->ntjqw", probs, v_NTJW.astype(dtype), precision=precision)


# ----------------------------------------------------------------------------- blockwise
def _blocks(T: int) -> tuple[int, int]:
  """(block size, padded length) for T columns."""
  b = min(BLOCK, -(-T // 8) * 8)
  return b, -(-T // b) * b


def _pad_T(x, Tp: int, value=0):
  pad = Tp - x.shape[1]
  if not pad:
    return x
  return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=value)


def blockwise(q_NTJQW, k_NTJW, v_NTJW, seg_NT, *, dtype, precision=None):
  """The reference's function in blocks (module docstring); memory of one block's scores."""
  T = q_NTJQW.shape[1]
  b, Tp = _blocks(T)
  # Padded keys get segment -1 (seen by no query); padded queries -2 (see nothing; dropped).
  seg_q = _pad_T(seg_NT, Tp, -2)
  seg_k = _pad_T(seg_NT, Tp, -1)
  out = _flash(_pad_T(q_NTJQW, Tp), _pad_T(k_NTJW, Tp), _pad_T(v_NTJW, Tp), seg_q, seg_k,
               b, jnp.dtype(dtype), precision)
  return out[:, :T]


def _block_scores(q_blk, k_blk, sq, sk, i, j, b, scale, precision):
  """Masked float32 scores [N, J, Q, b, b] of query block i against key block j."""
  s = jnp.einsum("ntjqw,ncjw->njqtc", q_blk, k_blk, precision=precision,
                 preferred_element_type=jnp.float32) * scale
  cols = jnp.arange(b, dtype=jnp.int32)
  m = _mask(sq, sk, i * b + cols, j * b + cols)
  return jnp.where(m[:, None, None], s, MASK_VALUE), m


def _slice(x, i, b, axis=1):
  return jax.lax.dynamic_slice_in_dim(x, i * b, b, axis=axis)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, seg_q, seg_k, b, dtype, precision):
  return _flash_fwd(q, k, v, seg_q, seg_k, b, dtype, precision)[0]


def _flash_fwd(q, k, v, seg_q, seg_k, b, dtype, precision):
  N, Tp, J, Q, W = q.shape
  nb, scale = Tp // b, W ** -0.5

  def query_block(i, acc):
    out, lse = acc
    q_blk, sq = _slice(q, i, b), _slice(seg_q, i, b)

    def key_block(j, carry):
      o, m, l = carry
      s, _ = _block_scores(q_blk, _slice(k, j, b), sq, _slice(seg_k, j, b), i, j, b, scale,
                           precision)
      m_new = jnp.maximum(m, s.max(-1))
      alpha = jnp.exp(m - m_new)
      p = jnp.exp(s - m_new[..., None])
      l = alpha * l + p.sum(-1)
      pv = jnp.einsum("njqtc,ncjw->njqtw", p.astype(dtype), _slice(v, j, b).astype(dtype),
                      precision=precision, preferred_element_type=jnp.float32)
      return alpha[..., None] * o + pv, m_new, l

    o0 = jnp.zeros((N, J, Q, b, W), jnp.float32)
    m0 = jnp.full((N, J, Q, b), MASK_VALUE, jnp.float32)
    o, m, l = jax.lax.fori_loop(0, i + 1, key_block, (o0, m0, jnp.zeros_like(m0)))
    o = jnp.transpose(o / l[..., None], (0, 3, 1, 2, 4)).astype(dtype)  # [N, b, J, Q, W]
    out = jax.lax.dynamic_update_slice_in_dim(out, o, i * b, axis=1)
    lse = jax.lax.dynamic_update_slice_in_dim(lse, m + jnp.log(l), i * b, axis=3)
    return out, lse

  out = jnp.zeros((N, Tp, J, Q, W), dtype)
  lse = jnp.zeros((N, J, Q, Tp), jnp.float32)
  out, lse = jax.lax.fori_loop(0, nb, query_block, (out, lse))
  return out, (q, k, v, seg_q, seg_k, out, lse)


def _flash_bwd(b, dtype, precision, res, d_out):
  q, k, v, seg_q, seg_k, out, lse = res
  N, Tp, J, Q, W = q.shape
  nb, scale = Tp // b, W ** -0.5
  # D = rowsum(dO * O): [N, J, Q, Tp]
  D = jnp.einsum("ntjqw,ntjqw->njqt", d_out.astype(jnp.float32), out.astype(jnp.float32))

  def key_block(j, acc):
    dq, dk, dv = acc
    k_blk, v_blk, sk = _slice(k, j, b), _slice(v, j, b), _slice(seg_k, j, b)

    def query_block(i, carry):
      dq, dk_j, dv_j = carry
      q_blk, sq = _slice(q, i, b), _slice(seg_q, i, b)
      s, m = _block_scores(q_blk, k_blk, sq, sk, i, j, b, scale, precision)
      p = jnp.where(m[:, None, None], jnp.exp(s - _slice(lse, i, b, axis=3)[..., None]), 0.0)
      do_blk = _slice(d_out, i, b).astype(jnp.float32)  # [N, b, J, Q, W]
      dv_j = dv_j + jnp.einsum("njqtc,ntjqw->ncjw", p, do_blk, precision=precision)
      dp = jnp.einsum("ntjqw,ncjw->njqtc", do_blk, v_blk.astype(jnp.float32), precision=precision)
      ds = p * (dp - _slice(D, i, b, axis=3)[..., None]) * scale
      dq_i = jnp.einsum("njqtc,ncjw->ntjqw", ds, k_blk.astype(jnp.float32), precision=precision)
      dq = jax.lax.dynamic_update_slice_in_dim(dq, _slice(dq, i, b) + dq_i, i * b, axis=1)
      dk_j = dk_j + jnp.einsum("njqtc,ntjqw->ncjw", ds, q_blk.astype(jnp.float32),
                               precision=precision)
      return dq, dk_j, dv_j

    z = jnp.zeros((N, b, J, W), jnp.float32)
    dq, dk_j, dv_j = jax.lax.fori_loop(j, nb, query_block, (dq, z, z))
    dk = jax.lax.dynamic_update_slice_in_dim(dk, dk_j, j * b, axis=1)
    dv = jax.lax.dynamic_update_slice_in_dim(dv, dv_j, j * b, axis=1)
    return dq, dk, dv

  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)
  dq, dk, dv = jax.lax.fori_loop(0, nb, key_block, (zeros(q), zeros(k), zeros(v)))
  none = lambda s: np.zeros(s.shape, jax.dtypes.float0)
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), none(seg_q), none(seg_k))


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------------------- kernels
def _heads_flat(q_NTJQW, k_NTJW, v_NTJW):
  """[N, T, H, W] queries and keys / values repeated to H heads (head h = j * Q + q)."""
  N, T, J, Q, W = q_NTJQW.shape
  rep = lambda x: jnp.repeat(x, Q, axis=2)
  return q_NTJQW.reshape(N, T, J * Q, W), rep(k_NTJW), rep(v_NTJW)


def _cudnn(q_NTJQW, k_NTJW, v_NTJW, seg_NT, *, implementation="cudnn"):
  """cuDNN flash attention on rows rolled to right padding (module docstring).

  Every row's real tokens must be one contiguous run (left-padded prompt, right-padded
  response): the run moves to column 0, cuDNN masks keys past its length and causally, and the
  outputs move back. `implementation='xla'` runs the same call on XLA (the tests' CPU check).
  """
  N, T, J, Q, W = q_NTJQW.shape
  real = seg_NT > 0
  start_N = jnp.argmax(real, axis=1).astype(jnp.int32)       # first real column
  len_N = real.sum(axis=1, dtype=jnp.int32)
  cols = jnp.arange(T, dtype=jnp.int32)
  fwd = (cols[None, :] + start_N[:, None]) % T                 # rolled column c <- c + start
  back = (cols[None, :] - start_N[:, None]) % T
  roll = lambda x, idx: jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)),
                                            axis=1)
  q = roll(q_NTJQW.reshape(N, T, J * Q, W), fwd)
  k, v = roll(k_NTJW, fwd), roll(v_NTJW, fwd)
  out = jax.nn.dot_product_attention(q, k, v, is_causal=True, query_seq_lengths=len_N,
                                     key_value_seq_lengths=len_N, implementation=implementation)
  return roll(out, back).reshape(N, T, J, Q, W)


def _pallas(q_NTJQW, k_NTJW, v_NTJW, seg_NT, *, gpu: bool, interpret: bool):
  """The Pallas flash kernels on [N, T, H, W] heads, in a shard_map over the ambient mesh."""
  N, T, J, Q, W = q_NTJQW.shape
  dtype = q_NTJQW.dtype
  q, k, v = _heads_flat(q_NTJQW, k_NTJW, v_NTJW)
  # TPU: key blocks of 128 lanes; GPU (Triton): power-of-two blocks of 16 to 128.
  blk = 128 if not gpu else min(128, max(16, 1 << (T - 1).bit_length()))
  Tp = -(-T // blk) * blk
  # Padded columns: segment -1, seen by no real query.
  q, k, v, seg = (_pad_T(q, Tp), _pad_T(k, Tp), _pad_T(v, Tp), _pad_T(seg_NT, Tp, -1))
  scale = W ** -0.5

  def kernel(q, k, v, seg):
    if gpu:
      from jax.experimental.pallas.ops.gpu import attention as gpu_attention
      sizes = gpu_attention.BlockSizes(block_q=blk, block_k=blk, block_q_dkv=min(blk, 64),
                                       block_kv_dkv=min(blk, 64), block_q_dq=min(blk, 64),
                                       block_kv_dq=min(blk, 64))
      return gpu_attention.mha(q, k, v, seg, sm_scale=scale, causal=True, block_sizes=sizes,
                               interpret=interpret)
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_attention
    t = lambda x: jnp.swapaxes(x, 1, 2)  # [N, H, T, W]
    sizes = tpu_attention.BlockSizes(
        block_q=blk, block_k_major=blk, block_k=blk, block_b=1, block_q_major_dkv=blk,
        block_k_major_dkv=blk, block_k_dkv=blk, block_q_dkv=blk, block_k_major_dq=blk,
        block_k_dq=blk, block_q_dq=blk)
    segments = tpu_attention.SegmentIds(seg, seg)
    return t(tpu_attention.flash_attention(t(q), t(k), t(v), segment_ids=segments, causal=True,
                                           sm_scale=scale, block_sizes=sizes))

  out = _in_shard_map(kernel, q, k, v, seg)
  return out[:, :T].reshape(N, T, J, Q, W).astype(dtype)


def _in_shard_map(kernel, q, k, v, seg):
  """`kernel(q, k, v, seg)` per device over the ambient mesh's batch and head axes, or as is
  without a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return kernel(q, k, v, seg)
  P = jax.sharding.PartitionSpec
  logical = nn.logical_to_mesh_axes(("activation_batch", "activation_heads"))
  axes = lambda ax: tuple(a for a in ((ax,) if isinstance(ax, str) else (ax or ()))
                          if mesh.shape[a] > 1)
  batch, heads = axes(logical[0]), axes(logical[1])
  if q.shape[0] % math.prod(mesh.shape[a] for a in batch) or \
      q.shape[2] % math.prod(mesh.shape[a] for a in heads):
    batch, heads = (), ()
  spec = P(batch or None, None, heads or None, None)
  return jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec, P(batch or None, None)),
                       out_specs=spec, check_vma=False)(q, k, v, seg)
