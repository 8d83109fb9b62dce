"""The LoRA learner: adapters-only updates on a frozen base, no reference copy in the state,
and the 8-device fake mesh (subprocess) against the single-device step."""

import os
import sys
import textwrap

import jax
import numpy as np
import pytest

from mr_rl import models
from mr_rl.models import lora as lora_lib
from mr_rl.rl import update

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


def test_lora_refuses_ppo():
  with pytest.raises(ValueError, match='GRPO family'):
    update.learner(models.Transformer(CFG), UCFG, None, True)


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
a = s8.params['layers_0']['attn']['q_proj']['a']      # [D, R]: D over fsdp
b = s8.params['layers_0']['attn']['q_proj']['b']      # [R, H, W]: H over tensor
assert a.sharding.spec == jax.sharding.PartitionSpec('fsdp', None), a.sharding
assert b.sharding.spec == jax.sharding.PartitionSpec(None, 'tensor', None), b.sharding
s8, m8 = sharded.update(s8, sharded.place_batch(batch), key, base_sh)
mu = s8.opt_state[1][0].mu['layers_0']['attn']['q_proj']['a']
assert mu.sharding == a.sharding, mu.sharding
for x, y in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s8.params)):
  np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=2e-6)
for k in m1:
  np.testing.assert_allclose(float(m8[k]), float(m1[k]), rtol=1e-4, atol=1e-6, err_msg=k)
print('SHARDED_OK')
''')


def test_sharded_lora_step_matches_single_device():
  run_on_eight_devices(_SHARDED)
