"""ModelConfig.remat (`config.model.remat`): a rematerialised decoder gives the same logits,
gradients and cached decode as the plain one, and its gradient keeps far fewer bytes alive,
compiled with or without launch/check.py's `KEEP_REMAT_FLAG`."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

from mr_rl import models
from mr_rl.tiny_assets.checkpoints import numpy_init, tiny_model_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "launch"))
import check  # noqa: E402  (launch/check.py)


def _models(n_layers=3):
  cfg = tiny_model_config("qwen3", 97, d_model=32, n_layers=n_layers)
  return models.Transformer(cfg), models.Transformer(dataclasses.replace(cfg, remat=True))


def test_remat_gives_the_same_logits_gradients_and_cached_decode():
  plain, remat = _models()
  params = numpy_init(plain, std=0.3)
  rng = np.random.default_rng(0)
  tok = jnp.asarray(rng.integers(1, 97, (2, 12)), jnp.int32)
  mask = jnp.asarray(np.r_[[[0] * 3 + [1] * 9], [[1] * 12]], jnp.int32)

  def loss(model):
    return lambda p: jax.nn.log_softmax(models.logits(model, p, tok, mask))[..., 5].sum()

  l0, g0 = jax.value_and_grad(loss(plain))(params)
  l1, g1 = jax.value_and_grad(loss(remat))(params)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # The sampler's path: a prefill and one cached decode step.
  outs = []
  for model in (plain, remat):
    cache = models.init_cache(model.config, 2, 16)
    kv = jnp.zeros((2, 16), jnp.int32).at[:, :12].set(mask)
    pos = models.positions_from_mask(mask)
    lg, cache = model.apply({"params": params}, tok, pos, kv_mask_NC=kv, cache=cache,
                            cache_index=jnp.int32(0))
    kv = kv.at[:, 12].set(1)
    lg2, _ = model.apply({"params": params}, tok[:, -1:], pos[:, -1:] + 1, kv_mask_NC=kv,
                         cache=cache, cache_index=jnp.int32(12))
    outs.append((np.asarray(lg), np.asarray(lg2)))
  for a, b in zip(outs[0], outs[1]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


_MEMORY = textwrap.dedent("""
    import dataclasses, sys, jax, jax.numpy as jnp
    from mr_rl import models
    from mr_rl.tiny_assets.checkpoints import tiny_model_config
    out = []
    for remat in (False, True):
      cfg = dataclasses.replace(tiny_model_config("qwen3", 64, d_model=64, n_layers=4),
                                remat=remat, max_seq_len=512)
      model = models.Transformer(cfg)
      params = jax.eval_shape(lambda: models.init_params(model, jax.random.PRNGKey(0)))
      tok = jax.ShapeDtypeStruct((2, 256), jnp.int32)
      loss = lambda p, t: jax.nn.log_softmax(models.logits(model, p, t)).mean()
      c = jax.jit(jax.grad(loss)).lower(params, tok).compile()
      out.append(c.memory_analysis().temp_size_in_bytes)
    print(*out)
""")


def test_remat_keeps_fewer_bytes_alive_when_compiled_as_the_pod_check_does():
  """Four layers' [heads, T, T] attention scores stay alive for the backward without remat; with
  remat one block's. Under the layer scan the saving shows with or without KEEP_REMAT_FLAG
  (XLA:CPU merged the recomputation back into the forward of the unrolled stack only, the
  reason the check sets the flag)."""
  results = {}
  for name, flags in (("check", check.KEEP_REMAT_FLAG), ("default", "")):
    out = subprocess.run([sys.executable, "-c", _MEMORY], capture_output=True, text=True,
                         timeout=600, cwd=REPO,
                         env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags,
                                  PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    results[name] = [int(v) for v in out.stdout.split()]
  plain, remat = results["check"]
  assert remat < 0.5 * plain, results
  plain_default, remat_default = results["default"]
  assert remat_default < 0.5 * plain_default, results
