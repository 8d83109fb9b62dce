"""The trainer at paper scale, on tiny models: chunked reference / critic forwards, the
`kl_ref_every` switch, sharded training on a mesh of 8 fake CPU devices (equal to one device),
benchmark evaluation sets (`data.eval_sets`), `data.skip_long_prompts`, and an anchor
election that never elects a probe whose rewards were all NaN.

The mesh test runs this file as a script in a subprocess (XLA_FLAGS set before jax is
imported) and compares the sharded run's metrics with a single-device run of the same
settings in that process.
"""

import dataclasses
import json
import logging
import sys
import warnings

from mr_rl.testing import xla_env

if __name__ == "__main__":
  xla_env.use_cpu_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mr_rl import evaluation  # noqa: E402
from mr_rl import models  # noqa: E402
from mr_rl import settings as settings_lib  # noqa: E402
from mr_rl.testing import runs  # noqa: E402
from mr_rl import train as train_lib  # noqa: E402
from mr_rl import train_step  # noqa: E402
from mr_rl.rl import anchor as anchor_lib  # noqa: E402
from mr_rl.rl import critic  # noqa: E402
from mr_rl.rl import update as update_lib  # noqa: E402


# ------------------------------------------------------------------------------ fixtures
write_random_policy = runs.write_random_policy
arith_config = runs.length_config


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  return write_random_policy(str(tmp_path_factory.mktemp("policy")))


def test_drift_measured_in_row_chunks_equals_one_pass(policy):
  """TAG's drift (anchor.measure_drift) in micro-batch-sized row chunks equals one pass."""
  from mr_rl.rl import anchor as anchor_lib
  c = arith_config(policy, 0)
  s = settings_lib.from_config(c)
  comp = train_lib.build(s)
  noise = jax.random.normal(jax.random.PRNGKey(7), (), jnp.float32)
  probe = jax.tree.map(lambda x: x * (1.0 + 0.05 * noise) + 0.01, comp.base_params)
  res = {}
  for m in (1, 8):  # 16 rollout rows: micro-batches of 16 and of 2 rows
    c.optim.num_micro_batches = m
    sm = settings_lib.from_config(c)
    mb_rows = sm.data.batch_prompts * sm.rollout.group_size // m
    assert anchor_lib.drift_chunk_rows(mb_rows, 4 * 4) == {1: 16, 8: 2}[m]  # 16 drift rows
    assert anchor_lib.drift_chunk_rows(mb_rows, 4 * 3) == {1: 4, 8: 2}[m]   # divisors of 12
    res[m] = anchor_lib.measure_drift(
        comp.policy, probe, comp.base_params, comp.eval_examples[:8], jax.random.PRNGKey(1),
        sampling=dataclasses.replace(sm.rollout, group_size=4),
        batch_prompts=sm.data.batch_prompts, micro_batch_rows=mb_rows)
  assert res[1]["rev_kl_exact_per_token"] > 0
  for k in res[1]:
    np.testing.assert_allclose(res[8][k], res[1][k], rtol=1e-5, err_msg=k)



# ------------------------------------------------------------------ chunked forwards
def test_chunked_forward_equals_one_call(policy):
  model, params = models.load_pretrained(policy)
  rng = np.random.default_rng(0)
  N, T = 8, 10
  tokens = jnp.asarray(rng.integers(3, model.config.vocab_size, (N, T)), jnp.int32)
  mask = jnp.asarray(np.arange(T)[None, :] >= (np.arange(N) % 3)[:, None], jnp.int32)
  logp_fn = train_step.logprob_forward(model)
  value_fn = jax.jit(critic.model_value_fn(model))
  vparams = critic.init_value_params(model, params, jax.random.PRNGKey(1))
  for fn, p, splits in ((logp_fn, params, (2, 4)), (value_fn, vparams, (4,))):
    whole = np.asarray(fn(p, tokens, mask))
    for m in splits:
      chunked = np.asarray(update_lib.chunked_forward(fn, p, tokens, mask, num_chunks=m))
      assert chunked.shape == whole.shape
      np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match="num_chunks=3 .* must divide the 8 rollout rows"):
    update_lib.chunked_forward(logp_fn, params, tokens, mask, num_chunks=3)
  # The settings check the split (RunSettings), before any rollout.
  c = arith_config(policy, 1)
  c.optim.num_micro_batches = 3
  with pytest.raises(ValueError, match="num_micro_batches=3 must divide the rollout rows"):
    train_lib.train(settings_lib.from_config(c), None, log=None)


# ---------------------------------------------------------------------- kl_ref_every
def _strip(h):
  return {k: v for k, v in h.items()
          if not k.startswith(("time/", "compile/", "kl_ref/")) and k != "reward_runner/seconds"}


def test_kl_ref_every(policy):
  c = arith_config(policy, 3)
  comp = train_lib.build(settings_lib.from_config(c))
  every_step = train_lib.train(settings_lib.from_config(c), None, comp=comp, log=None).history
  c.kl_ref_every = 2
  sparse = train_lib.train(settings_lib.from_config(c), None, comp=comp, log=None).history
  assert [("kl_ref/k3" in h) for h in every_step] == [True, True, True]
  assert [("kl_ref/k3" in h, "kl_ref/k1" in h) for h in sparse] == [(True, True), (False, False),
                                                                    (True, True)]
  # Skipping the reference forward changes nothing else.
  assert [_strip(h) for h in sparse] == [_strip(h) for h in every_step]
  assert sparse[2]["kl_ref/k3"] == every_step[2]["kl_ref/k3"]
  c.kl_ref_every = 0
  c.total_steps = 2
  never = train_lib.train(settings_lib.from_config(c), None, comp=comp, log=None).history
  assert not any(k.startswith("kl_ref/") for h in never for k in h)
  # (With loss.kl_coef > 0 they are logged every step even so: the mesh test runs that.)
  c.kl_ref_every = -1
  with pytest.raises(ValueError, match="config.kl_ref_every must be >= 0"):
    settings_lib.from_config(c)


# --------------------------------------------------------------------- mesh training
MESH = dict(data=2, fsdp=2, tensor=2, expert=1)


def _mesh_worker(policy_path: str) -> dict:
  assert jax.device_count() == 8, jax.devices()
  c = arith_config(policy_path, 2)
  c.mesh = MESH
  c.optim.num_micro_batches = 2      # 16 rows: chunks of 8 rows, 2 per data shard
  c.optim.loss.kl_coef = 0.05              # ref log-probs go into the step's batch too
  c.kl_ref_every = 0                 # ... and so kl_ref/* is logged every step regardless
  s = settings_lib.from_config(c)
  comp = train_lib.build(s)
  assert dict(comp.mesh.shape) == MESH
  q = comp.base_params["layers"]["attn"]["q_proj"]
  sharded = train_lib.train(s, None, comp=comp, log=None)
  # pi_0 as host arrays: uncommitted, as a single-device build loads it.
  single = dataclasses.replace(comp, policy=dataclasses.replace(comp.policy, mesh=None),
                               base_params=jax.tree.map(
      jnp.asarray, jax.device_get(comp.base_params)))
  ref = train_lib.train(s, None, comp=single, log=None)
  leaf = sharded.params["layers"]["attn"]["q_proj"]
  ref_leaf = ref.params["layers"]["attn"]["q_proj"]
  # Evaluation samples on the mesh too: 5 prompts x 3 samples asked in calls of 3 prompts
  # (9 rows) run as calls of 4 prompts (12 rows over data x fsdp = 4), and equal one device
  # evaluating in calls of 4 prompts (same calls, same keys).
  from mr_rl import evaluation
  ecfg = lambda b: evaluation.EvalConfig(mode="sampled", num_samples=3, ks=(1,), batch_prompts=b)
  evals = [evaluation.evaluate(c_.policy, c_.runner, c_.base_params, comp.eval_examples[:5],
                               ecfg(b).resolve(s, s.num_channels),
                               jax.random.PRNGKey(3)).metrics("eval/")
           for c_, b in ((comp, 3), (single, 4))]
  # TAG's drift on the mesh: 3 prompts x 1 sample (3 rows over data x fsdp = 4) run as calls
  # of 4 prompts whose extra rows are dropped. The continuous engine draws row n's tokens from
  # (key, n) whatever the call's size, so the result equals one device's unpadded calls.
  drift_sampling = dataclasses.replace(s.rollout, group_size=1, engine="continuous")
  probe_mesh = jax.device_put(jax.device_get(ref.params),
                              jax.tree.map(lambda x: x.sharding, sharded.params))
  drifts = [anchor_lib.measure_drift(c_.policy, probe, c_.base_params,
                                     comp.eval_examples[:6], jax.random.PRNGKey(5),
                                     sampling=drift_sampling, batch_prompts=3,
                                     micro_batch_rows=4)
            for c_, probe in ((comp, probe_mesh), (single, ref.params))]
  return dict(sharded=sharded.history, single=ref.history, eval_mesh=evals[0], eval_one=evals[1],
              drift_mesh=drifts[0], drift_one=drifts[1],
              base_spec=str(q.sharding.spec), param_devices=len(leaf.sharding.device_set),
              param_diff=float(np.abs(np.asarray(leaf) - np.asarray(ref_leaf)).max()))


def test_sharded_training_matches_one_device(policy):
  res = xla_env.run_worker(__file__, policy, timeout=600)
  assert res["param_devices"] == 8
  assert "tensor" in res["base_spec"] or "fsdp" in res["base_spec"], res["base_spec"]
  a, b = res["sharded"], res["single"]
  assert [h["step"] for h in a] == [h["step"] for h in b] == [0, 1]
  for x, y in zip(a, b):
    assert np.isfinite(x["kl_ref/k3"]) and np.isfinite(x["loss/kl"])  # kl_ref_every = 0
    for k in ("reward/arith_len/mean", "reward/arith_brief/mean", "reward/scalar/mean",
              "response/length_mean"):
      assert x[k] == y[k], (x["step"], k, x[k], y[k])
    for k in ("loss/policy", "loss/kl", "kl_ref/k3", "policy/entropy", "update/grad_norm"):
      np.testing.assert_allclose(x[k], y[k], rtol=1e-4, atol=1e-6, err_msg=k)
  assert res["param_diff"] < 1e-5
  dm, d1 = res["drift_mesh"], res["drift_one"]
  assert dm["mean_len_probe"] == d1["mean_len_probe"] and d1["rev_kl_exact_per_token"] > 0
  for k in d1:  # atol: rev_kl_per_token (~1e-3) is a difference of log-probs of size ~1, so
    # float32 rounding of either side (~1e-7 absolute) is ~1e-5 of it
    np.testing.assert_allclose(dm[k], d1[k], rtol=1e-5, atol=1e-7, err_msg=k)
  em, e1 = res["eval_mesh"], res["eval_one"]
  assert em.keys() == e1.keys() and "eval/arith_len" in em
  for k in em:
    if not k.startswith("eval/time"):
      np.testing.assert_allclose(em[k], e1[k], rtol=1e-6, err_msg=k)


# ------------------------------------------------------------ eval sets, long prompts
@pytest.fixture(scope="module")
def math_files(tmp_path_factory):
  """A tiny Qwen3-layout checkpoint (byte-level BPE, chat template; mr_rl.tiny_assets) and tiny
  NuminaMath / MATH-500 / AMC files in their hub schemas."""
  from mr_rl import tiny_assets
  root = tmp_path_factory.mktemp("math")
  ckpt = tiny_assets.make_tiny_checkpoint(str(root / "Qwen3-4B-Instruct-2507"), "qwen3")
  files = {n: tiny_assets.make_tiny_data(n, str(root / "data"))
           for n in ("numina_math", "math500", "amc")}
  return ckpt, files


def math_config(math_files):
  ckpt, files = math_files
  c = runs.numina_config(ckpt, files["numina_math"], 0)
  c.data.options.num_examples = 8
  c.data.max_prompt_len = 512
  c.checkpoint_every = 0
  c.eval.num_prompts = 3
  c.eval.samples_per_prompt = 1
  c.eval.temperature = 0.0
  return c


def test_eval_sets_report_per_set_and_overall(math_files, tmp_path, monkeypatch):
  from mr_rl import pipelines
  c = math_config(math_files)
  c.data.eval_sets = "math500,amc"
  c.data.eval_set_options = dict(math500=dict(path=math_files[1]["math500"]),
                                 amc=dict(path=math_files[1]["amc"], replicas=2))
  s = settings_lib.from_config(c)
  assert s.data.eval_sets == ("math500", "amc")
  comp = train_lib.build(s)
  assert list(comp.eval_sets) == ["math500", "amc"]
  assert len(comp.eval_sets["amc"]) == 2 * len(comp.eval_sets["math500"])  # replicas=2
  examples = evaluation.evaluation_examples(comp.eval_data, s.eval.num_prompts)
  assert [ex.dataset for ex in examples] == ["math500"] * 3 + ["amc"] * 3
  real_eval = evaluation.final_eval

  def final_eval_with_a_nan(*args, **kwargs):  # a metric with no value (a NaN) in the report
    return dict(real_eval(*args, **kwargs), **{"eval/undefined": float("nan")})

  monkeypatch.setattr(evaluation, "final_eval", final_eval_with_a_nan)
  pipelines.run_train(s, str(tmp_path), comp=comp)
  with open(tmp_path / "eval.json") as f:  # strict JSON: NaN written as null
    ev = json.load(f, parse_constant=lambda name: pytest.fail(f"eval.json holds {name}"))
  assert ev["eval/undefined"] is None
  for group in ("", "math500/", "amc/", "macro/"):
    assert f"eval/{group}accuracy" in ev and f"eval/{group}format" in ev, (group, sorted(ev))
  assert ev["eval/math500/num_examples"] == ev["eval/amc/num_examples"] == 3
  assert ev["eval/num_examples"] == 6
  np.testing.assert_allclose(ev["eval/format"],
                             (ev["eval/math500/format"] + ev["eval/amc/format"]) / 2)
  # One set: per-set keys as well (the evaluator itself only splits several sets).
  m = evaluation.run_evaluation(comp.policy, comp.runner, s,
                                {"math500": comp.eval_sets["math500"]}, comp.base_params,
                                jax.random.PRNGKey(0))
  assert m["eval/math500/format"] == m["eval/format"] == ev["eval/math500/format"]
  # Bad names and options fail at start-up.
  for field, value, needle in (("eval_sets", "math500,bogus", "data.eval_sets='bogus'"),
                               ("eval_sets", "amc,amc", "duplicates"),
                               ("eval_set_options", dict(aime=dict(path="x")), "not among"),
                               ("eval_set_options", dict(amc=dict(bogus=1)), "unknown option")):
    bad = math_config(math_files)
    bad.data.eval_sets = "amc"
    bad.data[field] = value
    with pytest.raises(ValueError, match=needle):
      settings_lib.from_config(bad)


def test_skip_long_prompts(math_files, caplog):
  c = math_config(math_files)
  comp = train_lib.build(settings_lib.from_config(c))
  lengths = sorted(len(comp.policy.prompt_ids(ex)) for ex in comp.train_examples)
  cut = lengths[len(lengths) // 2]
  n_ok = sum(n <= cut for n in lengths)
  assert 0 < n_ok < len(lengths)
  c.data.max_prompt_len = cut
  # Default: an error at start-up, before step 0, naming them (not when a step draws one).
  with pytest.raises(ValueError, match=f"{len(lengths) - n_ok} of the {len(lengths)} prompts of "
                     f"the train split 'train' .* longer than config.data.max_prompt_len={cut}"
                     ".*skip_long_prompts=True"):
    train_lib.build(settings_lib.from_config(c))
  c.data.eval_sets = "math500"
  c.data.eval_set_options = dict(math500=dict(path=math_files[1]["math500"]))
  c.data.skip_long_prompts = True
  with caplog.at_level(logging.WARNING, logger="mr_rl.data.lengths"):
    skipping = train_lib.build(settings_lib.from_config(c))
  assert len(skipping.train_examples) == n_ok
  assert 0 < len(skipping.eval_sets["math500"]) < 8
  assert "prompts of the eval set 'math500' longer than" in caplog.text
  assert all(len(skipping.policy.prompt_ids(ex)) <= cut for ex in skipping.train_examples)
  assert (f"dropped {len(lengths) - n_ok} of {len(lengths)} prompts of the train split"
          in caplog.text)
  tok, mask = skipping.policy.encode(skipping.train_examples)
  assert tok.shape == (n_ok, cut) and mask[:, -1].all()
  too_long = [ex for ex in comp.train_examples if len(comp.policy.prompt_ids(ex)) > cut]
  with pytest.raises(ValueError, match="max_prompt_len.*skip_long_prompts"):
    skipping.policy.encode(too_long[:1])  # (and on use, should one get there)
  c.data.max_prompt_len = lengths[0] - 1
  with pytest.raises(ValueError, match="every one of the 8 prompts of the train split"):
    train_lib.build(settings_lib.from_config(c))


# ------------------------------------------------------------------------- anchor
def _drift(channel, rev, reward):
  return anchor_lib.Drift(channel=channel, rev_kl_per_token=rev, rev_kl_exact_per_token=rev,
                          fwd_kl_per_token=rev, fwd_kl_exact_per_token=rev, mean_len_probe=5.0,
                          mean_len_base=5.0, probe_reward=reward)


def test_probe_with_all_nan_rewards_is_never_elected(tmp_path):
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no "Mean of empty slice"
    assert np.isnan(anchor_lib.probe_reward([float("nan")] * 3))
    assert anchor_lib.probe_reward([float("nan"), 0.5, 1.0]) == 0.75
    # The NaN-reward probe drifted least (weight decay only) but cannot be the anchor.
    table = [_drift("accuracy", 0.3, 0.6), _drift("broken", 0.001, float("nan")),
             _drift("brief", 0.1, 0.9), _drift("diverged", float("nan"), 0.5)]
    assert anchor_lib.elect(table) == 2
    anchor_lib.write_table(table, 2, str(tmp_path))
  md = (tmp_path / "drift.md").read_text()
  assert "broken (not eligible)" in md and "brief (anchor)" in md and "3.00x" in md
  saved = json.loads((tmp_path / "drift.json").read_text())
  assert saved["anchor"] == "brief" and np.isnan(saved["channels"][1]["probe_reward"])
  with pytest.raises(ValueError, match="no channel can be elected"):
    anchor_lib.elect([_drift("broken", 0.001, float("nan"))])


if __name__ == "__main__":
  print(json.dumps(_mesh_worker(sys.argv[1])))
