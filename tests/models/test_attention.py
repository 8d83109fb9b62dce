"""mr_rl.models.attention: every implementation equals the reference (the T x T einsum) on real
queries, in value and gradient, for left-padded and packed rows; the Pallas kernels run in
interpret mode here (the same kernel code as on the accelerator); 'blockwise' holds no T x T
scores; the model under each implementation matches transformers' logits."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from mr_rl import models as M
from mr_rl.models import attention as A
from mr_rl.tiny_assets.checkpoints import numpy_init

N, J, Q, W = 3, 2, 2, 16


def _inputs(T, packed, seed=0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(N, T, J, Q, W)), dtype)
  k = jnp.asarray(rng.normal(size=(N, T, J, W)), dtype)
  v = jnp.asarray(rng.normal(size=(N, T, J, W)), dtype)
  seg = np.ones((N, T), np.int32)
  seg[1, :T // 3] = 0                         # left padding
  seg[2, :2] = 0
  seg[2, T - 3:] = 0                          # ... and right padding (a response's tail)
  if packed:                                  # several sequences per row, then the tail
    seg[0, T // 2:] = 2
    seg[1, T // 3:] = np.r_[[1] * (T // 3), [2] * (T - 2 * (T // 3))]
    seg[2, T - 3:] = 0
  return q, k, v, jnp.asarray(seg)


def _real(seg):
  return np.asarray(seg)[:, :, None, None, None] > 0


def _check(out, ref, seg, tol):
  real = np.broadcast_to(_real(seg), np.shape(ref))
  assert np.abs(np.asarray(ref))[real].max() > 0.1
  np.testing.assert_allclose(np.asarray(out, np.float32)[real], np.asarray(ref, np.float32)[real],
                             rtol=tol, atol=tol)


@pytest.mark.parametrize("T", [24, 300])       # one block; several blocks with a ragged tail
@pytest.mark.parametrize("packed", [False, True])
def test_blockwise_equals_reference_in_value_and_gradient(T, packed, monkeypatch):
  monkeypatch.setattr(A, "BLOCK", 128)
  q, k, v, seg = _inputs(T, packed)
  ref = A.reference(q, k, v, seg, dtype=jnp.float32)
  out = A.blockwise(q, k, v, seg, dtype=jnp.float32)
  _check(out, ref, seg, 2e-5)
  # Gradients of a loss that reads real queries only (padding outputs are meaningless).
  c = jnp.asarray(np.random.default_rng(1).normal(size=ref.shape), jnp.float32) * _real(seg)
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v, seg, dtype=jnp.float32) * c)
  g_ref = jax.grad(loss(A.reference), argnums=(0, 1, 2))(q, k, v)
  g_blk = jax.jit(jax.grad(loss(A.blockwise), argnums=(0, 1, 2)))(q, k, v)
  for a, b in zip(g_blk, g_ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


def _interpreted(kernel):
  """Pallas' interpreter for a kernel: the GPU kernel's flag, the TPU kernel's context."""
  return pltpu.force_tpu_interpret_mode() if kernel == "pallas_tpu" else contextlib.nullcontext()


@pytest.mark.parametrize("kernel", ["pallas_gpu", "pallas_tpu"])
def test_pallas_kernels_equal_reference_in_interpret_mode(kernel):
  """The Pallas flash kernels (GPU Triton / TPU Mosaic) on our segment layout, run by Pallas'
  interpreter on CPU: forward and backward kernels."""
  T = 40
  q, k, v, seg = _inputs(T, packed=True)
  ref = A.reference(q, k, v, seg, dtype=jnp.float32)
  run = lambda q, k, v: A._pallas(q, k, v, seg, gpu=kernel == "pallas_gpu", interpret=True)
  c = jnp.asarray(np.random.default_rng(1).normal(size=ref.shape), jnp.float32) * _real(seg)
  with _interpreted(kernel):
    out = run(q, k, v)
    g = jax.grad(lambda q, k, v: jnp.sum(run(q, k, v) * c), argnums=(0, 1, 2))(q, k, v)
  _check(out, ref, seg, 2e-5)
  g_ref = jax.grad(lambda q, k, v: jnp.sum(A.reference(q, k, v, seg, dtype=jnp.float32) * c),
                   argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


def test_cudnn_layout_rolls_left_padded_rows_to_sequence_lengths():
  """The cuDNN path's own work (each row rolled to right padding, masked by length, rolled
  back), run through the same `jax.nn.dot_product_attention` call on XLA; only the kernel
  differs on a GPU."""
  q, k, v, seg = _inputs(20, packed=False)
  ref = A.reference(q, k, v, seg, dtype=jnp.float32)
  _check(A._cudnn(q, k, v, seg, implementation="xla"), ref, seg, 2e-5)


def test_resolve_picks_by_backend_and_refuses_what_cannot_run():
  bf16, f32 = jnp.bfloat16, jnp.float32
  assert A.resolve("auto", dtype=bf16, packed=False, T=4096, backend="tpu") == "pallas_tpu"
  assert A.resolve("auto", dtype=bf16, packed=False, T=4096, backend="gpu") == "cudnn"
  assert A.resolve("auto", dtype=bf16, packed=True, T=4096, backend="gpu") == "pallas_gpu"
  assert A.resolve("auto", dtype=f32, packed=False, T=4096, backend="gpu") == "pallas_gpu"
  assert A.resolve("auto", dtype=f32, packed=False, T=64, backend="cpu") == "reference"
  assert A.resolve("auto", dtype=f32, packed=False, T=4096, backend="cpu") == "blockwise"
  with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
    A.resolve("cudnn", dtype=bf16, packed=False, T=64, backend="cpu")
  with pytest.raises(ValueError, match="bf16 / fp16 only"):
    A.resolve("cudnn", dtype=f32, packed=False, T=64, backend="gpu")
  with pytest.raises(ValueError, match="packed rows"):
    A.resolve("cudnn", dtype=bf16, packed=True, T=64, backend="gpu")
  with pytest.raises(ValueError, match="attention_impl must be one of"):
    A.resolve("flash", dtype=f32, packed=False, T=64)
  with pytest.raises(ValueError, match="attention_impl"):
    M.ModelConfig(attention_impl="flash")


@pytest.mark.parametrize("impl", ["blockwise", "pallas_gpu", "pallas_tpu"])
def test_model_logits_and_gradients_equal_the_reference_model(impl, monkeypatch):
  """A decoder run with `attention_impl` gives the reference decoder's logits (the reference
  is checked against transformers in test_transformer.py) and gradients, packed rows too."""
  monkeypatch.setattr(A, "BLOCK", 16)
  orig = A._pallas
  monkeypatch.setattr(A, "_pallas", lambda *a, **kw: orig(*a, **{**kw, "interpret": True}))
  cfg = M.ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=16, d_ff=64, max_seq_len=64)
  ref_model = M.Transformer(cfg.replace(attention_impl="reference"))
  model = M.Transformer(cfg.replace(attention_impl=impl))
  params = numpy_init(ref_model, std=0.2)
  rng = np.random.default_rng(0)
  tok = jnp.asarray(rng.integers(1, 64, (2, 40)), jnp.int32)
  mask = jnp.asarray(np.r_[[[0] * 9 + [1] * 31], [[1] * 36 + [0] * 4]], jnp.int32)
  seg = jnp.asarray(np.r_[[[1] * 20 + [2] * 20], [[1] * 12 + [2] * 24 + [0] * 4]], jnp.int32)
  for segments in (None, seg):
    m = mask if segments is None else (seg > 0).astype(jnp.int32)
    real = np.asarray(m, bool)
    loss = lambda mod: lambda p: jnp.sum(
        jax.nn.log_softmax(M.logits(mod, p, tok, m, segments)) * m[..., None]) / 100
    l_ref, g_ref = jax.value_and_grad(loss(ref_model))(params)
    b = np.asarray(M.logits(ref_model, params, tok, m, segments))
    with _interpreted(impl):
      l, g = jax.value_and_grad(loss(model))(params)
      a = np.asarray(M.logits(model, params, tok, m, segments))
    np.testing.assert_allclose(a[real], b[real], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(l, l_ref, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-3, atol=2e-4)


def test_blockwise_holds_no_T_by_T_scores():
  """The policy step's forward and backward at the papers' length: 'reference' keeps
  N x H x T x T float32 scores alive (more than the bound below); 'blockwise' one block's
  (compiled only, on abstract params)."""
  T, H = 4096, 4
  out = {}
  for impl in ("reference", "blockwise"):
    cfg = M.ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=H, n_kv_heads=2,
                        head_dim=8, d_ff=64, max_seq_len=T, attention_impl=impl)
    model = M.Transformer(cfg)
    params = M.abstract_params(model)
    tok = jax.ShapeDtypeStruct((1, T), jnp.int32)
    loss = lambda p, t: jnp.mean(jax.nn.log_softmax(M.logits(model, p, t)))
    out[impl] = jax.jit(jax.grad(loss)).lower(params, tok).compile() \
        .memory_analysis().temp_size_in_bytes
  scores = H * T * T * 4  # one layer's float32 scores of one row
  assert out["reference"] > scores
  assert out["blockwise"] < scores / 4, out
