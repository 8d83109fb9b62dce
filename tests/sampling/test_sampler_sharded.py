"""Sharded sampling: greedy decoding on a (data 2, fsdp 2, tensor 2, expert 1) mesh of 8 fake
CPU devices equals the single-device result, for the static sampler and the continuous engine
(its slots and caches split over the batch axes, sampled draws too). The worker (this file run as a script, with
XLA_FLAGS set before jax is imported) prints one JSON dict; pytest asserts on it."""

import json

from mr_rl.testing import xla_env

if __name__ == "__main__":
  xla_env.use_cpu_devices(8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mr_rl import models, tiny_assets  # noqa: E402
from mr_rl.models import sharding as shd  # noqa: E402
from mr_rl.sampling import Engine, Sampler  # noqa: E402

ROWS, WIDTH, N_NEW = 8, 9, 12  # rows decoded together (R in sampler.py)


def _worker():
  assert jax.device_count() == 8, jax.devices()
  model = models.Transformer(models.get_preset("tiny_qwen3"))
  rng = np.random.default_rng(0)
  # Host-drawn weights (std 0.1 so greedy continuations are not one repeated token).
  params = tiny_assets.host_params(model, rng)
  tokens = rng.integers(1, 256, (ROWS, WIDTH)).astype(np.int32)
  mask = (np.arange(WIDTH)[None, :] >= (np.arange(ROWS) % 4)[:, None]).astype(np.int32)
  key = jax.random.PRNGKey(0)

  single = Sampler(model, max_new_tokens=N_NEW, temperature=0.0, segment_tokens=6)
  ref = single(jax.device_put(params, jax.devices()[0]), tokens, mask, key=key)

  mesh = shd.make_mesh((2, 2, 2, 1))
  sharded_params = shd.shard_params(params, model, mesh)
  sampler = Sampler(model, max_new_tokens=N_NEW, temperature=0.0, segment_tokens=6, mesh=mesh)
  out = sampler(sharded_params, tokens, mask, key=key)

  # The continuous engine: 4 prompts x G = 2 through 4 slots (one per batch shard), sampled
  # with EOS so rows end early, against the single-device static sampler's per-row schedule.
  kw = dict(max_new_tokens=N_NEW, temperature=1.0, eos_id=(3, 7, 11, 20))
  eng_ref = Sampler(model, key_schedule="row", **kw)(
      jax.device_put(params, jax.devices()[0]), np.repeat(tokens[:4], 2, 0),
      np.repeat(mask[:4], 2, 0), key=key)
  engine = Engine(model, slots=4, mesh=mesh, steps_per_call=4, **kw)
  eng = engine(sharded_params, tokens[:4], mask[:4], key=key, group_size=2)
  state, _ = engine.programs(4, engine.prefill_size(2)).init(key, 16)
  return dict(
      engine_ref_tokens=np.asarray(eng_ref.tokens).tolist(),
      engine_tokens=eng.tokens.tolist(),
      engine_lengths=eng.lengths.tolist(),
      engine_logprob_diff=float(np.abs(eng.logprobs - np.asarray(eng_ref.logprobs)).max()),
      engine_cache_spec=str(state.cache.k.sharding.spec),
      ref_tokens=np.asarray(ref.tokens).tolist(),
      tokens=np.asarray(out.tokens).tolist(),
      logprob_diff=float(np.abs(np.asarray(out.logprobs) - np.asarray(ref.logprobs)).max()),
      distinct=len(set(np.asarray(ref.tokens).ravel().tolist())),
      q_spec=str(sharded_params["layers"]["attn"]["q_proj"].sharding.spec),
      out_devices=len(out.tokens.sharding.device_set),
  )


@pytest.fixture(scope="module")
def worker_results():
  return xla_env.run_worker(__file__, timeout=600)


def test_sharded_greedy_matches_single_device(worker_results):
  r = worker_results
  assert r["tokens"] == r["ref_tokens"]
  assert r["distinct"] > 5  # a non-degenerate reference
  assert r["logprob_diff"] < 1e-4
  assert "tensor" in r["q_spec"] and "fsdp" in r["q_spec"]  # params really were sharded
  assert r["out_devices"] == 8


def test_sharded_engine_matches_single_device(worker_results):
  r = worker_results
  assert r["engine_tokens"] == r["engine_ref_tokens"]
  assert r["engine_logprob_diff"] < 1e-4
  assert 1 < len(set(r["engine_lengths"]))  # rows ended at different steps
  assert "data" in r["engine_cache_spec"] and "tensor" in r["engine_cache_spec"]


if __name__ == "__main__":
  print(json.dumps(_worker()))
