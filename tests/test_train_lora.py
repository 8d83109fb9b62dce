"""LoRA runs through the trainer: resume bit-exact, checkpoints of adapters only, and both
export formats (merged weights through transformers, a PEFT adapter through peft)."""

import os

import jax
import numpy as np
import pytest
import torch

from mr_rl import export as export_lib
from mr_rl import metrics as metrics_lib
from mr_rl import models
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.models import lora as lora_lib
from mr_rl.testing.runs import arith_config
from mr_rl.testing.runs import assert_same_metrics

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _config(base, steps, init_from="", dropout=0.0):
  c = arith_config(base, steps)
  c.model.lora.rank = 4
  c.model.lora.alpha = 8.0
  c.model.lora.init_from = init_from
  c.model.lora.dropout = dropout
  c.optim.lr = 1e-2
  return c


def _resumed_equals_straight(s_half, s_full, comp, tmp_path):
  """Trains `s_half` and resumes it to `s_full` in one work directory, `s_full` straight in
  another; both must agree bit for bit (metrics, adapters), and the last checkpoint must hold
  the adapters, not the base. Returns the straight run's result and work directory."""
  resumed, straight = str(tmp_path / "resumed"), str(tmp_path / "straight")
  train_lib.train(s_half, resumed, comp=comp, log=None)
  res = train_lib.train(s_full, resumed, comp=comp, log=None)
  assert [h["step"] for h in res.history] == list(range(s_half.total_steps, s_full.total_steps))
  full = train_lib.train(s_full, straight, comp=comp, log=None)
  assert_same_metrics(metrics_lib.read_jsonl(os.path.join(resumed, "metrics.jsonl")),
                      metrics_lib.read_jsonl(os.path.join(straight, "metrics.jsonl")))
  for a, b in zip(jax.tree.leaves(res.params.lora), jax.tree.leaves(full.params.lora)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  saved = export_lib.params_metadata(straight, s_full.total_steps)
  expected = lora_lib.abstract_adapters(comp.model.config, s_full.update.lora)
  assert jax.tree.map(lambda x: tuple(x.shape), saved) == \
      jax.tree.map(lambda x: tuple(x.shape), expected)
  return full, straight


def test_lora_resume_is_bit_exact_and_exports_both_formats(base_policy, tmp_path):
  comp = train_lib.build(settings_lib.from_config(_config(base_policy, 6)))
  # Start from a PEFT adapter with b != 0 (model.lora.init_from): the tiny task's rewards may
  # give no signal in 6 steps, and a zero b would make the exports' parity checks vacuous.
  cfg = lora_lib.LoraConfig(rank=4, alpha=8.0)
  start = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(7), x.shape),
                       lora_lib.init_adapters(comp.model.config, cfg, jax.random.PRNGKey(6)))
  init_from = lora_lib.save_peft(str(tmp_path / "start"), start, comp.model.config, cfg)
  # with LoRA dropout: its masks come from the step's rng, so the resume stays bit-exact
  s3 = settings_lib.from_config(_config(base_policy, 3, init_from, dropout=0.1))
  s6 = settings_lib.from_config(_config(base_policy, 6, init_from, dropout=0.1))
  assert s6.update.lora == lora_lib.LoraConfig(rank=4, alpha=8.0, init_from=init_from,
                                               dropout=0.1)
  comp = train_lib.build(s6)
  full, straight = _resumed_equals_straight(s3, s6, comp, tmp_path)
  # the policy is not the base, and training moved the adapters
  assert any(np.abs(np.asarray(a) - np.asarray(b)).max() > 0
             for a, b in zip(jax.tree.leaves(full.params.lora), jax.tree.leaves(start)))
  tok = np.asarray(comp.policy.encode(comp.eval_examples[:2])[0])
  mask = (tok != comp.policy.pad_id).astype(np.int32)
  mask[:, -1] = 1
  ours = np.asarray(models.logits(comp.model, full.params, tok, mask))
  assert np.abs(ours - np.asarray(models.logits(comp.model, comp.base_params, tok, mask))).max() \
      > 1e-4
  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  hf_in = dict(input_ids=torch.tensor(tok, dtype=torch.long),
               attention_mask=torch.tensor(mask, dtype=torch.long),
               position_ids=torch.tensor(pos, dtype=torch.long))
  real = mask > 0

  merged = export_lib.main(["--workdir", straight, "--out", str(tmp_path / "merged")])
  with torch.no_grad():
    hf = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
    np.testing.assert_allclose(hf(**hf_in).logits.numpy()[real], ours[real], atol=1e-4)
  adapter = export_lib.export(straight, str(tmp_path / "peft"), format="peft", log=None)
  assert sorted(os.listdir(adapter)) == ["adapter_config.json", "adapter_model.safetensors"]
  with torch.no_grad():
    pm = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base_policy), adapter).eval()
    np.testing.assert_allclose(pm(**hf_in).logits.numpy()[real], ours[real], atol=1e-5)
  # and the adapter starts a new run (model.lora.init_from) at the trained policy
  c = _config(base_policy, 1)
  c.model.lora.init_from = adapter
  s = settings_lib.from_config(c)
  learner = train_lib.update_lib.learner(comp.model, s.update)
  st = learner.init(comp.base_params, jax.random.PRNGKey(0))
  np.testing.assert_allclose(
      np.asarray(models.logits(comp.model, learner.policy(st, comp.base_params), tok, mask)),
      ours, atol=1e-6)
  with pytest.raises(ValueError, match="format=peft needs a LoRA run"):
    export_lib.export(base_policy, str(tmp_path / "x"), format="peft", log=None)


def test_tag_probes_train_fresh_adapters_from_the_base(base_policy, tmp_path):
  """TAG with LoRA: each probe trains fresh adapters on the same base, the drift table and
  the election run on the adapted probes, and the final run is a LoRA policy too."""
  import json
  from mr_rl import pipelines
  c = _config(base_policy, 1)
  c.pipeline, c.checkpoint_every = "tag", 0
  c.anchor.probe_steps, c.anchor.probe_batch_prompts = 1, 4
  c.anchor.held_out_prompts, c.anchor.samples_per_prompt = 4, 2
  wd = str(tmp_path / "tag")
  res, _ = pipelines.run_tag(settings_lib.from_config(c), wd)
  assert isinstance(res.params, lora_lib.Adapted)
  drift = json.load(open(os.path.join(wd, "drift.json")))
  assert [row["channel"] for row in drift["channels"]] == ["arith_acc", "arith_negative",
                                                          "arith_fmt"]
  assert all(np.isfinite(row["rev_kl_per_token"]) for row in drift["channels"])
  assert drift["anchor"] in ("arith_acc", "arith_negative", "arith_fmt")


def test_ppo_with_lora_resumes_bit_exact(base_policy, tmp_path):
  """PPO + LoRA through the trainer: the critic is adapters + head on the shared base (GAE
  values from it), the checkpoint holds both adapter sets, and a resumed run equals a straight
  one bit for bit."""
  def config(steps):
    c = _config(base_policy, steps, dropout=0.1)
    c.advantage.name = "ppo"
    c.advantage.gamma = 1.0
    c.advantage.lam = 0.95
    c.checkpoint_every = 2
    return c

  s2, s4 = (settings_lib.from_config(config(n)) for n in (2, 4))
  comp = train_lib.build(s4)
  _, straight = _resumed_equals_straight(s2, s4, comp, tmp_path)
  rec = metrics_lib.read_jsonl(os.path.join(straight, "metrics.jsonl"))
  assert all(r["update/value_grad_norm"] > 0 for r in rec)
