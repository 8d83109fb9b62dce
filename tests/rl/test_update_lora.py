"""The LoRA learner: adapters-only updates on a frozen base, no reference copy in the state,
and the 8-device fake mesh (subprocess) against the single-device step."""

import dataclasses
import os
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mr_rl import models
from mr_rl.models import lora as lora_lib
from mr_rl.rl import critic, gae, losses, update

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (--import-mode=importlib)
from test_update_model import (CFG, make_batch, random_params,  # noqa: E402
                               run_on_eight_devices)

LORA = lora_lib.LoraConfig(rank=2, alpha=4.0)
UCFG = update.UpdateConfig(lr=1e-2, lora=LORA, num_micro_batches=2)


@pytest.fixture(scope='module')
def setup():
  model = models.Transformer(CFG)
  base = random_params(model)
  base = jax.tree.map(np.asarray, base)
  batch, _ = make_batch(model, base)
  return model, base, batch


def test_adapters_only_train_and_the_state_holds_no_base(setup):
  model, base_np, batch = setup
  base = jax.tree.map(jax.numpy.asarray, base_np)
  learner = update.learner(model, UCFG)
  state = learner.init(base, jax.random.PRNGKey(0))
  # the state: adapters + AdamW moments (+ counters), nothing the size of the base
  adapters = lora_lib.abstract_adapters(CFG, LORA)
  assert jax.tree.structure(state.params) == jax.tree.structure(adapters)
  ad_bytes, base_bytes = lora_lib.count_bytes(state.params), lora_lib.count_bytes(base)
  assert lora_lib.count_bytes(state) <= 3 * ad_bytes + 64, (lora_lib.count_bytes(state), ad_bytes)
  assert ad_bytes < 0.1 * base_bytes
  logp = jax.jit(update.make_logprob_fn(update.model_logits_fn(model)))
  before = np.asarray(logp(learner.policy(state, base), batch.tokens, batch.mask))
  np.testing.assert_array_equal(before, np.asarray(logp(base, batch.tokens, batch.mask)))
  for i in range(3):
    state, m = learner.update(state, batch, jax.random.PRNGKey(i), base)
    assert np.isfinite(float(m['policy_loss'])) and float(m['grad_norm']) > 0
  assert int(state.step) == 3
  # the base is untouched (not donated, not updated), the adapters moved
  for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(base_np)):
    np.testing.assert_array_equal(np.asarray(a), b)
  assert all(np.abs(np.asarray(x['b'])).max() > 0 for x in
             jax.tree.leaves(state.params, is_leaf=lambda x: isinstance(x, dict) and 'b' in x))
  after = np.asarray(logp(learner.policy(state, base), batch.tokens, batch.mask))
  rm = batch.response_mask > 0
  assert np.abs(after - before)[rm].max() > 1e-4
  # the reference (base, adapters off) is unchanged
  np.testing.assert_array_equal(np.asarray(logp(base, batch.tokens, batch.mask)), before)
  # merged weights give the adapted policy's log-probs
  merged = lora_lib.merge(learner.policy(state, base))
  np.testing.assert_allclose(np.asarray(logp(merged, batch.tokens, batch.mask)), after,
                             atol=2e-5)


def _nonzero_adapters(lc, seed=1):
  ad = lora_lib.init_adapters(CFG, lc, jax.random.PRNGKey(seed))
  return jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(seed + 1),
                                                            x.shape), ad)


def test_dropout_step_gradient_is_the_hand_computed_one(setup):
  """With p > 0 the step's gradient (sgd(1): the parameter change) is that of the loss
  written out here on a forward with the documented masks (row keys fold_in(rng, n), whole
  batch, while the step runs 2 micro-batches); p = 0 is the plain step and differs."""
  model, base_np, batch = setup
  base = jax.tree.map(jnp.asarray, base_np)
  batch = batch.replace(ref_logp=None)
  loss = losses.PolicyLossConfig(eps_low=0.999, eps_high=1e3)  # never clips: -mean(rho A)
  rng, sgd = jax.random.PRNGKey(3), optax.sgd(1.0)
  ad = jax.tree.map(np.asarray, _nonzero_adapters(LORA))
  grads = {}
  # The LM head over the response window only (a static response start) as well: same masks.
  r0 = int(np.argmax(np.asarray(batch.response_mask).any(0)))
  assert r0 > 1
  for p, b in ((0.0, batch), (0.25, batch), ('window', batch.replace(response_start=r0))):
    lc = dataclasses.replace(LORA, dropout=0.25 if p == 'window' else p)
    cfg = update.UpdateConfig(loss=loss, lora=lc, num_micro_batches=2, max_grad_norm=None)
    step = update.make_policy_step(update.model_logits_fn(model), cfg, sgd)
    new, _ = step(update.init_train_state(jax.tree.map(jnp.array, ad), sgd), b, rng, base)
    grads[p] = jax.tree.map(lambda a, c: np.asarray(a) - np.asarray(c), ad, new.params)
  keys = lora_lib.dropout_row_keys(rng, batch.tokens.shape[0])
  w = batch.response_mask / batch.response_mask.sum()

  def hand(a, p):
    pol = lora_lib.Adapted(base, a, LORA.scale, p, keys)
    logp, _ = losses.token_logprobs_and_entropy(models.logits(model, pol, batch.tokens,
                                                              batch.mask), batch.tokens)
    return -jnp.sum(jnp.exp(logp - batch.old_logp) * batch.advantages[:, None] * w)

  for p in (0.0, 0.25, 'window'):
    want = jax.grad(hand)(ad, 0.25 if p == 'window' else p)
    for x, y in zip(jax.tree.leaves(grads[p]), jax.tree.leaves(want)):
      np.testing.assert_allclose(x, np.asarray(y), rtol=1e-4, atol=1e-6)
  diff = max(np.abs(x - y).max() for x, y in zip(jax.tree.leaves(grads[0.0]),
                                                 jax.tree.leaves(grads[0.25])))
  assert diff > 1e-3, diff


def test_ppo_with_lora_trains_critic_adapters_and_head_on_the_same_base(setup):
  """PPO + LoRA: the critic is the frozen base + its own adapters + the value head; one step
  moves the policy's adapters, the critic's adapters and head, not the base; the state holds
  no copy of the base."""
  model, base_np, batch = setup
  base = jax.tree.map(jnp.asarray, base_np)
  learner = update.learner(model, dataclasses.replace(UCFG, value_lr=1e-2), None, True)
  state = learner.init(base, jax.random.PRNGKey(0))
  ad_abs = lora_lib.abstract_adapters(CFG, LORA)
  assert jax.tree.structure(state.value_params['trunk']) == jax.tree.structure(ad_abs)
  critic_bytes = lora_lib.count_bytes(state.value_params)
  assert lora_lib.count_bytes(state) <= 3 * (lora_lib.count_bytes(state.params) + critic_bytes) \
      + 128
  assert lora_lib.count_bytes(state) < lora_lib.count_bytes(base)  # full-FT PPO: ~6 x base
  vp0 = jax.tree.map(np.asarray, state.value_params)
  pp0 = jax.tree.map(np.asarray, state.params)
  old_values = np.asarray(learner.value_fn(learner.critic(state, base), batch.tokens,
                                           batch.mask))
  # the critic's trunk starts as the policy's (base + fresh adapters): the base's hidden states
  ref = np.asarray(jax.jit(critic.model_value_fn(model))(
      {'trunk': base, 'head': state.value_params['head']}, batch.tokens, batch.mask))
  np.testing.assert_allclose(old_values, ref, atol=1e-6)
  R = (np.asarray(batch.advantages) > 0).astype(np.float32)
  adv, ret = jax.jit(gae.ppo_advantages, static_argnums=(3, 4))(R, old_values,
                                                               batch.response_mask, 1.0, 0.95)
  ppo_batch = batch.replace(advantages=np.asarray(adv), returns=np.asarray(ret),
                            old_values=old_values, ref_logp=None).check()
  for i in range(2):
    state, m = learner.update(state, ppo_batch, jax.random.PRNGKey(i), base)
    assert float(m['value_grad_norm']) > 0 and np.isfinite(float(m['policy_loss']))
  moved = lambda t0, t1: max(np.abs(np.asarray(a) - b).max()
                             for a, b in zip(jax.tree.leaves(t1), jax.tree.leaves(t0)))
  assert moved(vp0['trunk'], state.value_params['trunk']) > 0
  assert moved(vp0['head'], state.value_params['head']) > 0
  assert moved(pp0, state.params) > 0
  for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(base_np)):
    np.testing.assert_array_equal(np.asarray(a), b)


_SHARDED = textwrap.dedent('''
import jax, numpy as np
from mr_rl import models
from mr_rl.models import lora as lora_lib, sharding
from mr_rl.rl import update
from test_update_lora import CFG, UCFG, make_batch, random_params
model = models.Transformer(CFG)
base = jax.tree.map(np.asarray, random_params(model))
batch = make_batch(model, base)[0].replace(ref_logp=None)
key = jax.random.PRNGKey(0)
single = update.learner(model, UCFG)
s1 = single.init(base, key)
s1, m1 = single.update(s1, batch, key, base)
mesh = sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})
sharded = update.learner(model, UCFG, mesh)
base_sh = sharding.shard_params(base, model, mesh)
s8 = sharded.init(base_sh, key)
a = s8.params['layers']['attn']['q_proj']['a']      # [L, D, R]: D over fsdp
b = s8.params['layers']['attn']['q_proj']['b']      # [L, R, H, W]: H over tensor
assert a.sharding.spec == jax.sharding.PartitionSpec(None, 'fsdp', None), a.sharding
assert b.sharding.spec == jax.sharding.PartitionSpec(None, None, 'tensor', None), b.sharding
s8, m8 = sharded.update(s8, sharded.place_batch(batch), key, base_sh)
mu = s8.opt_state[1][0].mu['layers']['attn']['q_proj']['a']
assert mu.sharding == a.sharding, mu.sharding
for x, y in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s8.params)):
  np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=2e-6)
for k in m1:
  np.testing.assert_allclose(float(m8[k]), float(m1[k]), rtol=1e-4, atol=1e-6, err_msg=k)
print('SHARDED_OK')
''')


def test_sharded_lora_step_matches_single_device():
  run_on_eight_devices(_SHARDED)
