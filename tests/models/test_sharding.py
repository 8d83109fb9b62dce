"""Sharding tests: 8 fake CPU devices in a subprocess (XLA_FLAGS set before jax is imported).

The worker (this file run as a script) computes every check and prints one JSON dict; the
pytest functions below assert on it. Single-device results are the reference.
"""

import json
import sys

from mr_rl.testing import xla_env

if __name__ == "__main__":
  xla_env.use_cpu_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mr_rl import models as M  # noqa: E402
from mr_rl.models import sharding as shd  # noqa: E402

B, T = 8, 8


def _batch():
  rng = np.random.default_rng(1)
  tok = rng.integers(0, 256, (B, T)).astype(np.int32)
  mask = np.ones((B, T), np.int32)
  for b in range(B):
    mask[b, : b % 5] = 0                     # left padding of 0..4 tokens
  return jnp.asarray(tok), jnp.asarray(mask)


def _spec(x):
  return [None if a is None else (a if isinstance(a, str) else list(a)) for a in x.sharding.spec]


def _numpy_params(model, seed=0):
  """Random params drawn on the host (cheap: jitted random init compiles slowly on CPU)."""
  rng = np.random.default_rng(seed)

  def draw(path, s):
    x = rng.normal(0.0, 0.1, s.shape).astype(np.float32)
    return jnp.asarray(x + 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else x)

  return jax.tree_util.tree_map_with_path(draw, M.abstract_params(model))


def _ep_checks(params, tok, mask):
  """moe_impl='ep' on (data, fsdp, tensor, expert) = (1, 1, 2, 4) against one device's
  'ragged': logits, the gradient of a loss on them, and prefill + one cached decode step on 4
  rows (one row per expert shard: the decode step's single token is padded over tensor 2)."""
  res = {}
  real = np.asarray(mask).astype(bool)
  ragged = M.Transformer(M.get_preset("tiny_moe", moe_impl="ragged"))
  ep = M.Transformer(M.get_preset("tiny_moe", moe_impl="ep"))
  mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 2, "expert": 4})
  p_sh = shd.param_shardings(ep, mesh)
  b_sh = shd.batch_sharding(mesh)
  sharded = jax.device_put(params, p_sh)

  def loss(model):
    def f(p, t, m):
      lg = M.logits(model, p, t, m)
      return jnp.sum(jnp.where(m[..., None] > 0, jax.nn.log_softmax(lg), 0.0) ** 2) * 1e-4
    return jax.value_and_grad(f)

  (ref_l, ref_g) = jax.jit(loss(ragged))(params, tok, mask)
  with shd.activation_sharding(mesh):
    out = jax.jit(lambda p, t, m: M.logits(ep, p, t, m), in_shardings=(p_sh, b_sh, b_sh))(
        sharded, tok, mask)
    l, g = jax.jit(loss(ep), in_shardings=(p_sh, b_sh, b_sh))(sharded, tok, mask)
  ref = np.asarray(jax.jit(lambda p, t, m: M.logits(ragged, p, t, m))(params, tok, mask))
  res["ep_tensor_diff"] = float(np.abs(np.asarray(out) - ref)[real].max())
  res["ep_loss_rel"] = float(abs(l - ref_l) / abs(ref_l))
  res["ep_grad_diff"] = max(float(np.abs(np.asarray(a) - np.asarray(b)).max() /
                                  (np.abs(np.asarray(b)).max() + 1e-12))
                            for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)))
  n, S = 4, T + 2
  t4, m4 = tok[:n], mask[:n]
  pos = M.positions_from_mask(m4)
  kv0 = jnp.zeros((n, S), jnp.int32).at[:, :T].set(m4)

  def two_steps(model):
    def f(p, cache):
      step = lambda t, ps, kv, c, i: model.apply({"params": p}, t, ps, kv_mask_NC=kv, cache=c,
                                                  cache_index=i)
      _, cache = step(t4, pos, kv0, cache, jnp.int32(0))
      lg, _ = step(jnp.arange(n, dtype=jnp.int32)[:, None] + 3, pos[:, -1:] + 1,
                   kv0.at[:, T].set(1), cache, jnp.int32(T))
      return lg
    return f

  ref_lg = jax.jit(two_steps(ragged))(params, M.init_cache(ragged.config, n, S))
  c_sh = shd.cache_shardings(ep.config, mesh, n, S)
  with shd.activation_sharding(mesh):
    lg = jax.jit(two_steps(ep), in_shardings=(p_sh, c_sh))(
        sharded, jax.device_put(M.init_cache(ep.config, n, S), c_sh))
  res["ep_decode_diff"] = float(np.abs(np.asarray(lg) - np.asarray(ref_lg)).max())
  bad = M.Transformer(M.get_preset("tiny_moe", moe_impl="ep", num_experts=6))
  try:
    with shd.activation_sharding(mesh):
      jax.eval_shape(lambda p: M.logits(bad, p, tok, mask), M.abstract_params(bad))
    res["ep_indivisible_error"] = ""
  except ValueError as e:
    res["ep_indivisible_error"] = str(e)
  return res


def _worker(tmpdir):
  """Runs under 8 devices; returns {check name: value}."""
  assert jax.device_count() == 8, jax.devices()
  res = {}
  tok, mask = _batch()
  real = np.asarray(mask).astype(bool)

  def fwd(model):
    return lambda p, t, m: M.logits(model, p, t, m)

  # --- dense Qwen3 under (data, fsdp, tensor, expert) = (2, 2, 2, 1)
  model = M.Transformer(M.get_preset("tiny_qwen3"))
  rng = jax.random.PRNGKey(0)
  ref_params = M.init_params(model, rng)
  ref = np.asarray(jax.jit(fwd(model))(ref_params, tok, mask))
  mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2, "expert": 1})
  params = shd.init_sharded(model, rng, mesh)
  res["init_equal"] = bool(all(np.array_equal(a, b) for a, b in zip(
      jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref_params))))
  res["q_spec"] = _spec(params["layers"]["attn"]["q_proj"])
  res["emb_spec"] = _spec(params["embedding"])
  res["q_shard_shape"] = list(params["layers"]["attn"]["q_proj"].addressable_shards[0].data.shape)
  p_sh = shd.param_shardings(model, mesh)
  b_sh = shd.batch_sharding(mesh)
  with shd.activation_sharding(mesh):
    f = jax.jit(fwd(model), in_shardings=(p_sh, b_sh, b_sh),
                out_shardings=shd.batch_sharding(mesh, (B, T, 256)))
    out = f(params, tok, mask)
  res["dense_out_spec"] = _spec(out)
  res["dense_diff"] = float(np.abs(np.asarray(out) - ref)[real].max())

  # --- loaded straight into shards from a transformers-format checkpoint
  M.save_pretrained(model, ref_params, tmpdir)
  _, loaded = M.load_pretrained(tmpdir, mesh=mesh)
  res["load_equal"] = bool(all(np.array_equal(a, b) for a, b in zip(
      jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(ref_params))))
  res["load_shardings_match"] = bool(all(
      a.sharding == b for a, b in zip(jax.tree_util.tree_leaves(loaded),
                                       jax.tree_util.tree_leaves(p_sh))))

  # --- prefill + one decode step with a sharded KV cache
  S = T + 2
  step = lambda p, t, pos, kv, c, i: model.apply({"params": p}, t, pos, kv_mask_NC=kv, cache=c,
                                                  cache_index=i)
  pos = M.positions_from_mask(mask)
  nxt = jnp.arange(B, dtype=jnp.int32)[:, None] + 3
  kv0 = jnp.zeros((B, S), jnp.int32).at[:, :T].set(mask)
  kv1 = kv0.at[:, T].set(1)
  nxt_pos = pos[:, -1:] + 1

  def two_steps(p, cache):
    _, cache = step(p, tok, pos, kv0, cache, jnp.int32(0))
    lg, cache = step(p, nxt, nxt_pos, kv1, cache, jnp.int32(T))
    return lg, cache

  ref_lg, _ = jax.jit(two_steps)(ref_params, M.init_cache(model.config, B, S))
  c_sh = shd.cache_shardings(model.config, mesh, B, S)
  cache = jax.device_put(M.init_cache(model.config, B, S), c_sh)
  with shd.activation_sharding(mesh):
    lg, new_cache = jax.jit(two_steps, in_shardings=(p_sh, c_sh),
                            out_shardings=(shd.batch_sharding(mesh, (B, 1, 256)), c_sh))(
                                params, cache)
  res["cache_spec"] = _spec(new_cache.v)
  res["cache_k_spec"] = _spec(new_cache.k)
  res["decode_diff"] = float(np.abs(np.asarray(lg) - np.asarray(ref_lg)).max())

  # --- Qwen3-MoE under (1, 2, 1, 4): experts over the expert axis, both implementations
  model = M.Transformer(M.get_preset("tiny_moe", moe_impl="dense"))
  ref_params = _numpy_params(model)
  ref = np.asarray(jax.jit(fwd(model))(ref_params, tok, mask))
  mesh = shd.make_mesh({"data": 1, "fsdp": 2, "tensor": 1, "expert": -1})
  res["moe_mesh_shape"] = [mesh.shape[a] for a in shd.MESH_AXES]
  params = shd.shard_params(ref_params, model, mesh)
  res["expert_spec"] = _spec(params["layers"]["mlp"]["gate_proj"])
  p_sh = shd.param_shardings(model, mesh)
  for impl in ("dense", "ragged", "ep"):   # same params; the single-device reference is 'dense'
    model = M.Transformer(M.get_preset("tiny_moe", moe_impl=impl))
    with shd.activation_sharding(mesh):
      out = jax.jit(fwd(model), in_shardings=(p_sh, shd.batch_sharding(mesh),
                                              shd.batch_sharding(mesh)))(params, tok, mask)
    res[f"moe_{impl}_diff"] = float(np.abs(np.asarray(out) - ref)[real].max())

  # --- 'ep' dispatch with a token-splitting tensor axis: logits, gradients, cached decode
  res.update(_ep_checks(ref_params, tok, mask))

  # --- a tensor axis that does not divide the kv heads fails with a clear error
  mesh = shd.make_mesh({"tensor": 4, "fsdp": -1})
  try:
    shd.param_shardings(M.Transformer(M.get_preset("tiny_qwen3")), mesh)
    res["indivisible_error"] = ""
  except ValueError as e:
    res["indivisible_error"] = str(e)
  return res


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
  return xla_env.run_worker(__file__, str(tmp_path_factory.mktemp("ckpt")), timeout=600)


def test_params_created_sharded(worker_results):
  r = worker_results
  assert r["init_equal"]
  assert r["q_spec"] == [None, "fsdp", "tensor", None]    # [layers, embed, heads, kv]
  assert r["emb_spec"] == ["tensor", "fsdp"]              # [vocab, embed]
  assert r["q_shard_shape"] == [2, 32, 2, 16]             # [2, 64, 4, 16] / (fsdp 2, tensor 2)


def test_dense_forward_matches_single_device(worker_results):
  assert worker_results["dense_out_spec"] == [["data", "fsdp", "expert"], None, None]
  assert worker_results["dense_diff"] < 1e-5


def test_load_pretrained_into_shards(worker_results):
  assert worker_results["load_equal"] and worker_results["load_shardings_match"]


def test_sharded_cache_decode_matches(worker_results):
  # [L, N, J, C, W] / [L, N, J, W, C]: layers replicated, rows over the batch axes
  assert worker_results["cache_spec"] == [None, ["data", "fsdp", "expert"], "tensor", None, None]
  assert worker_results["cache_k_spec"] == [None, ["data", "fsdp", "expert"], "tensor", None,
                                            None]
  assert worker_results["decode_diff"] < 1e-5


@pytest.mark.parametrize("impl", ["dense", "ragged", "ep"])
def test_moe_expert_parallel_matches_single_device(worker_results, impl):
  assert worker_results["moe_mesh_shape"] == [1, 2, 1, 4]
  assert worker_results["expert_spec"] == [None, "expert", "fsdp", "tensor"]  # [L, E, embed, mlp]
  assert worker_results[f"moe_{impl}_diff"] < 1e-5


def test_moe_ep_tensor_split_logits_grads_decode(worker_results):
  r = worker_results
  assert r["ep_tensor_diff"] < 1e-5
  assert r["ep_loss_rel"] < 1e-5
  assert r["ep_grad_diff"] < 1e-5          # relative to each leaf's largest entry
  assert r["ep_decode_diff"] < 1e-5


def test_moe_ep_experts_not_divisible_error(worker_results):
  assert "num_experts 6" in worker_results["ep_indivisible_error"]
  assert "'expert' mesh axis (4)" in worker_results["ep_indivisible_error"]


def test_indivisible_sharding_error(worker_results):
  assert "not divisible" in worker_results["indivisible_error"]
  assert "kv_proj" in worker_results["indivisible_error"] or "k_proj" in worker_results[
      "indivisible_error"]


def test_make_mesh_on_one_device_and_errors():
  mesh = shd.make_mesh({"fsdp": -1})
  assert dict(mesh.shape) == {"data": 1, "fsdp": jax.device_count(), "tensor": 1, "expert": 1}
  with pytest.raises(ValueError, match="at most one axis"):
    shd.make_mesh({"fsdp": -1, "data": -1})
  with pytest.raises(ValueError, match="unknown mesh axes"):
    shd.make_mesh({"model": 1})
  with pytest.raises(ValueError, match="needs 3 devices"):
    shd.make_mesh([3, 1, 1, 1])
  with pytest.raises(ValueError, match="unknown mesh axes"):
    shd.validate_rules([("embed", "model")])
  with pytest.raises(ValueError, match="pair"):
    shd.validate_rules([("embed",)])


if __name__ == "__main__":
  print(json.dumps(_worker(sys.argv[1])))
