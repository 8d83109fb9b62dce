"""Learner steps on the real mr_rl Transformer: numpy recomputation, micro-batching, PPO,
and an 8-device fake mesh (subprocess) against the single-device result."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mr_rl import models
from mr_rl.rl import advantages, critic, gae, losses, update
from mr_rl.rl.batch import LearnerBatch

CFG = models.ModelConfig(family='qwen3', vocab_size=64, d_model=32, n_layers=2, n_heads=4,
                         n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=64)


def random_params(model, seed=0, scale=0.2):
  """Random params on the host (norm scales 1): cheaper than compiling the model's init."""
  rng = np.random.default_rng(seed)

  def leaf(path, s):
    if 'scale' in jax.tree_util.keystr(path):
      return np.ones(s.shape, np.float32)
    return (scale * rng.normal(size=s.shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(leaf, models.abstract_params(model))


def np_token_logp(logits, tokens):
  """log pi(tokens[t] | tokens[<t]) from logits at t - 1, in float64; column 0 is 0."""
  z = logits.astype(np.float64)
  z = z - z.max(-1, keepdims=True)
  ls = z - np.log(np.exp(z).sum(-1, keepdims=True))
  logp = np.zeros(tokens.shape)
  logp[:, 1:] = np.take_along_axis(ls[:, :-1], tokens[:, 1:, None], -1)[..., 0]
  return logp


def make_batch(model, params, seed=0, B=2, G=4, P=4, T=12):
  """A left-padded rollout batch with old/ref log-probs near the model's own.

  Returns:
    (batch, logits_NTV of the model on the batch, as numpy).
  """
  rng = np.random.default_rng(seed)
  N = B * G
  tokens = rng.integers(1, CFG.vocab_size, size=(N, T)).astype(np.int32)
  mask = np.zeros((N, T), np.int32)
  rmask = np.zeros((N, T), np.int32)
  for i in range(N):
    plen, rlen = rng.integers(2, P + 1), rng.integers(1, T - P + 1)
    mask[i, P - plen:P + rlen] = 1
    rmask[i, P:P + rlen] = 1
  tokens = np.where(mask > 0, tokens, 0).astype(np.int32)
  logits = np.asarray(jax.jit(update.model_logits_fn(model))(params, tokens, mask))
  logp = np_token_logp(logits, tokens)
  noise = lambda s: np.where(rmask > 0, logp + rng.normal(scale=s, size=logp.shape), 0.0)
  R = rng.binomial(1, 0.5, size=(B, G)).astype(np.float32)
  R[0, 0], R[0, 1] = 1.0, 0.0
  batch = LearnerBatch(tokens=tokens, mask=mask, response_mask=rmask,
                       old_logp=noise(0.2).astype(np.float32),
                       ref_logp=noise(0.2).astype(np.float32),
                       advantages=np.asarray(advantages.grpo(R)).reshape(-1))
  return batch.check(), logits


@pytest.fixture(scope='module')
def setup():
  model = models.Transformer(CFG)
  params = random_params(model)
  batch, logits = make_batch(model, params)
  return model, params, batch, logits


def _np_loss_from_logits(logits, batch, beta):
  """token-mean clipped loss + beta * k3, recomputed in numpy from the model's logits."""
  logp = np_token_logp(logits, batch.tokens)
  m = batch.response_mask > 0
  A = batch.advantages[:, None]
  rho = np.exp(logp - batch.old_logp)
  pg = np.maximum(-A * rho, -A * np.clip(rho, 0.8, 1.28))
  x = batch.ref_logp - logp
  per = pg + beta * (np.exp(x) - 1 - x)
  return per[m].mean()


def test_transformer_step_loss_equals_numpy_from_logits(setup):
  """The step's loss equals a numpy recomputation from the model's logits, and under sgd(1)
  the parameter change has the reported gradient norm."""
  model, params, batch, logits = setup
  want = _np_loss_from_logits(logits, batch, 0.05)
  cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(kl_coef=0.05))
  state = update.init_train_state(jax.tree.map(jnp.array, params), optax.sgd(1.0))
  step = update.make_policy_step(update.model_logits_fn(model), cfg, optax.sgd(1.0))
  new, metrics = step(state, batch, jax.random.PRNGKey(0))
  np.testing.assert_allclose(float(metrics['policy_loss']), want, rtol=1e-4, atol=1e-6)
  delta = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params, new.params)
  gnorm = np.sqrt(sum((d.astype(np.float64) ** 2).sum() for d in jax.tree.leaves(delta)))
  np.testing.assert_allclose(float(metrics['grad_norm']), gnorm, rtol=1e-3)
  assert gnorm > 1e-3


def test_ppo_step(setup):
  model, params, batch, _ = setup
  value_fn = critic.model_value_fn(model)
  vparams = critic.init_value_params(model, params, jax.random.PRNGKey(1))
  rmask = batch.response_mask
  old_values = np.asarray(jax.jit(value_fn)(vparams, batch.tokens, batch.mask))
  R = np.asarray(batch.advantages) > 0
  adv, ret = jax.jit(gae.ppo_advantages, static_argnums=(3, 4))(R.astype(np.float32), old_values,
                                                               rmask, 1.0, 0.95)
  ppo_batch = batch.replace(advantages=np.asarray(adv), returns=np.asarray(ret),
                            old_values=old_values).check()
  cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(kl_coef=0.05), value_lr=1e-3)
  tx, vtx = update.make_optimizer(cfg), update.make_optimizer(cfg, lr=cfg.value_lr)
  state = update.init_train_state(jax.tree.map(jnp.array, params), tx, vparams, vtx)
  step = update.make_ppo_step(update.model_logits_fn(model), value_fn, cfg, tx, vtx)
  head_before = np.asarray(vparams['head']['kernel'])
  new, metrics = step(state, ppo_batch, jax.random.PRNGKey(0))
  # At rollout time values == old values, so the clipped value loss is 0.5 (V - R)^2.
  m = rmask > 0
  np.testing.assert_allclose(float(metrics['vf_loss']),
                             np.mean(0.5 * (old_values - np.asarray(ret))[m] ** 2), rtol=1e-4)
  assert float(metrics['vf_clip_frac']) == 0.0
  assert float(metrics['value_grad_norm']) > 0
  assert not np.allclose(np.asarray(new.value_params['head']['kernel']), head_before)
  assert int(new.step) == 1 and np.isfinite(float(metrics['policy_loss']))
  assert old_values[:, 0].max() == 0.0


_SHARDED = textwrap.dedent('''
import jax, jax.numpy as jnp, numpy as np, optax, dataclasses
assert jax.device_count() == 8, jax.devices()
from mr_rl import models
from mr_rl.models import sharding
from mr_rl.rl import losses, update
sys_path_test = __import__('test_update_model')
model = models.Transformer(sys_path_test.CFG)
params = sys_path_test.random_params(model)
batch, _ = sys_path_test.make_batch(model, params)
host = jax.tree.map(np.asarray, params)
cfg = update.UpdateConfig(loss=losses.PolicyLossConfig(loss_agg='seq-mean-token-mean',
                                                       kl_coef=0.05),
                          lr=1.0, adam_eps=1.0, weight_decay=0.0, max_grad_norm=1.0)
tx = update.make_optimizer(cfg)
logits_fn = update.model_logits_fn(model)
key = jax.random.PRNGKey(0)
ref_state, ref_m = update.make_policy_step(logits_fn, cfg, tx)(
    update.init_train_state(params, tx), batch, key)
mesh = sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})
p_sh = sharding.param_shardings(model, mesh)
state_abs = jax.eval_shape(lambda p: update.init_train_state(p, tx), host)
st_sh = sharding.train_state_shardings(state_abs, tx, p_sh, mesh)
state = jax.device_put(update.init_train_state(jax.tree.map(jnp.asarray, host), tx), st_sh)
cfg2 = dataclasses.replace(cfg, num_micro_batches=2)
step = update.make_policy_step(logits_fn, cfg2, tx, mesh=mesh, rules=sharding.DEFAULT_RULES,
                               state_sharding=st_sh, batch_example=batch)
new, m = step(state, batch, key)
emb = new.params['embedding']
assert len(emb.sharding.device_set) == 8 and not emb.sharding.is_fully_replicated, emb.sharding
mu = new.opt_state[1][0].mu['embedding']
assert mu.sharding == p_sh['embedding'], (mu.sharding, p_sh['embedding'])
for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(new.params)):
  np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=2e-6)
for k in ref_m:
  np.testing.assert_allclose(float(m[k]), float(ref_m[k]), rtol=1e-4, atol=1e-6, err_msg=k)
assert int(new.step) == 1
# Packed rows (segment ids) on the mesh equal the unpacked single-device step too.
from mr_rl.rl import batch as batch_lib
packed = batch_lib.pack_rows(batch, batch_lib.PackSpec(cfg.loss.loss_agg, None, row_multiple=8))
assert batch_lib.packed_sequences(packed) == 8 and int(packed.segment_ids.max()) >= 2
cfg3 = dataclasses.replace(cfg2, pack=True)
state = jax.device_put(update.init_train_state(jax.tree.map(jnp.asarray, host), tx), st_sh)
step = update.make_policy_step(logits_fn, cfg3, tx, mesh=mesh, rules=sharding.DEFAULT_RULES,
                               state_sharding=st_sh, batch_example=packed)
new_p, m_p = step(state, packed, key)
for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(new_p.params)):
  np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=2e-6)
for k in ref_m:
  np.testing.assert_allclose(float(m_p[k]), float(ref_m[k]), rtol=1e-4, atol=1e-6, err_msg=k)
print('SHARDED_OK', float(m['policy_loss']), float(m['grad_norm']))
''')


def run_on_eight_devices(code: str) -> None:
  """Runs `code` in a subprocess on 8 fake CPU devices (this directory importable); it must
  print SHARDED_OK."""
  env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
      + " --xla_force_host_platform_device_count=8",
             JAX_PLATFORMS='cpu', PYTHONPATH=os.pathsep.join(
                 [os.path.dirname(__file__), os.environ.get('PYTHONPATH', '')]))
  out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0 and 'SHARDED_OK' in out.stdout, out.stdout + out.stderr[-4000:]


def test_sharded_step_matches_single_device():
  run_on_eight_devices(_SHARDED)


def test_lr_1e6_moves_fp32_master_weights_under_bf16_compute(setup):
  """Mixed precision (docs/accelerators.md, "Precision model"): with float32 parameters and
  bf16 matmuls, AdamW at the papers' lr 1e-6 moves nearly every weight by ~1e-6, in the
  direction the float32 step takes; stored in bf16 the same update rounds away (the reason
  paper configs keep float32 master weights)."""
  _, params, batch, _ = setup
  cfg = update.UpdateConfig(lr=1e-6, loss=losses.PolicyLossConfig(kl_coef=0.05))

  def step(param_dtype, dtype):
    model = models.Transformer(CFG.replace(param_dtype=param_dtype, dtype=dtype))
    before = jax.tree.map(lambda x: np.asarray(jnp.asarray(x, param_dtype), np.float64), params)
    p = jax.tree.map(lambda x: jnp.asarray(x, param_dtype), params)  # (donated by the step)
    tx = update.make_optimizer(cfg)
    new, m = update.make_policy_step(update.model_logits_fn(model), cfg, tx)(
        update.init_train_state(p, tx), batch, jax.random.PRNGKey(0))
    assert all(x.dtype == param_dtype for x in jax.tree.leaves(new.params))
    assert m['policy_loss'].dtype == jnp.float32
    return jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, new.params, before)

  mixed = np.concatenate([d.ravel() for d in jax.tree.leaves(step(jnp.float32, jnp.bfloat16))])
  full = np.concatenate([d.ravel() for d in jax.tree.leaves(step(jnp.float32, jnp.float32))])
  moved = np.abs(mixed) > 1e-7
  assert moved.mean() > 0.9, moved.mean()
  assert 5e-7 < np.median(np.abs(mixed[moved])) < 2e-6
  both = moved & (np.abs(full) > 1e-7)
  assert (np.sign(mixed[both]) == np.sign(full[both])).mean() > 0.9
  stored_bf16 = np.concatenate([d.ravel() for d in
                                jax.tree.leaves(step(jnp.bfloat16, jnp.bfloat16))])
  assert (np.abs(stored_bf16) > 0).mean() < 0.05  # bf16 storage: the step rounds away
