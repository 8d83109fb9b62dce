"""Adding a model family or a rollout engine is one module (docs/extending.md): a module that
registers one, imported as a run's plugin, is picked up end to end by code that names
neither. Each runs in a subprocess, so the registries of this test process stay as shipped."""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOY_FAMILY = '''
import dataclasses
from mr_rl.models import families
from mr_rl.models.families import qwen3

# Qwen3's layout under another HF model_type: its own name, config.json type and known model.
SPEC = families.register(dataclasses.replace(
    qwen3.SPEC, name="toy_qwen", model_types=("toy_qwen",), architecture="ToyQwenForCausalLM",
    model_styles={"toy_qwen_chat": "chat"}))
'''

TOY_ENGINE = '''
import numpy as np
from mr_rl import rollout_engines
from mr_rl.rollout_engines import static
from mr_rl.sampling import SampleOutput


def _check(field, value):
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"config.{field} must be an int >= 1, got {value!r}")
  return value


def _generate(model, params, tokens_BP, mask_BP, *, s, key, on_finished=None, **kw):
  """The static engine over chunks of `chunk_prompts` prompts, concatenated."""
  n = rollout_engines.option(s, "chunk_prompts")
  outs = [static.SPEC.generate(model, params, tokens_BP[i:i + n], mask_BP[i:i + n], s=s,
                               key=key, **kw) for i in range(0, len(tokens_BP), n)]
  cat = lambda f: np.concatenate([np.asarray(getattr(o, f)) for o in outs])
  return SampleOutput(tokens=cat("tokens"), logprobs=cat("logprobs"), mask=cat("mask"),
                      lengths=cat("lengths"), truncated=cat("truncated"), steps=outs[0].steps)


rollout_engines.register(rollout_engines.EngineSpec(
    name="chunked", doc="the static engine, chunk_prompts prompts at a time", generate=_generate,
    warm_up=static.SPEC.warm_up, expected_programs=static.SPEC.expected_programs,
    check_programs=("sampler",),
    options=(rollout_engines.EngineOption("chunk_prompts", 1, _check, "prompts per chunk"),)))
'''


def _run(tmp_path, module: str, source: str, script: str):
  (tmp_path / f"{module}.py").write_text(source)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]), JAX_PLATFORMS="cpu",
             MR_RL_CACHE=str(tmp_path / "cache"))
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
  return out.stdout


def test_a_family_module_is_picked_up_end_to_end(tmp_path):
  """A family registered by a plugin: its tiny fixture, config.json round trip, weight
  loading and template style all come from its spec."""
  out = _run(tmp_path, "toy_family", TOY_FAMILY, f"""
      import json, os
      import numpy as np
      from mr_rl import models, registry, tiny_assets
      from mr_rl.data import templates
      from mr_rl.models import families
      registry.import_plugins("toy_family")
      assert families.FAMILIES.names() == ("llama", "qwen3", "qwen3_moe", "toy_qwen")
      toy = tiny_assets.make_tiny_checkpoint("{tmp_path}/toy", "toy_qwen")
      ref = tiny_assets.make_tiny_checkpoint("{tmp_path}/ref", "qwen3")
      hf = json.load(open(os.path.join(toy, "config.json")))
      assert hf["model_type"] == "toy_qwen" and hf["architectures"] == ["ToyQwenForCausalLM"]
      assert open(os.path.join(toy, "model.safetensors"), "rb").read() == \\
          open(os.path.join(ref, "model.safetensors"), "rb").read()  # qwen3's layout, same seed
      (m_toy, p_toy), (m_ref, p_ref) = models.load_pretrained(toy), models.load_pretrained(ref)
      assert m_toy.config.family == "toy_qwen" and not m_toy.config.is_moe
      assert m_toy.config == m_ref.config.replace(family="toy_qwen")
      tokens = np.array([[5, 6, 7, 8]], np.int32)
      np.testing.assert_array_equal(models.logits(m_toy, p_toy, tokens),
                                    models.logits(m_ref, p_ref, tokens))
      models.save_pretrained(m_toy, p_toy, "{tmp_path}/export")
      again, _ = models.load_pretrained("{tmp_path}/export")
      assert again.config == m_toy.config
      assert templates.style_for_model("org/Toy-Qwen-Chat") == "chat"
      tok = models.load_tokenizer(toy)
      assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
      print("ok")
  """)
  assert out.strip().endswith("ok")


def test_an_engine_module_is_picked_up_end_to_end(tmp_path):
  """An engine registered by a plugin: its option becomes `config.rollout.chunk_prompts`
  (defaulted, validated, recorded in the settings), and the rollout decodes with it: greedy
  tokens equal the static engine's."""
  out = _run(tmp_path, "toy_engine", TOY_ENGINE, f"""
      import dataclasses
      import jax, numpy as np
      import ml_collections
      from ml_collections.config_flags import config_flags
      from mr_rl import metrics, models, registry, rollout, rollout_engines, settings, tiny_assets
      registry.import_plugins("toy_engine")  # before the config is built: its option is a field
      assert settings.default_config().rollout.chunk_prompts == 1
      c = config_flags.ConfigFileFlagParser(name="config").parse("configs/demo.py:smoke")
      c = ml_collections.ConfigDict(c.to_dict(), type_safe=False)
      c.plugins = c.plugins + ",toy_engine"
      c.rollout.engine, c.rollout.chunk_prompts = "chunked", 2
      s = settings.from_config(c)
      assert s.rollout.engine == "chunked"
      assert s.rollout.engine_options == {{"slots": 0, "chunk_prompts": 2}}
      assert metrics.settings_dict(s)["rollout"]["engine_options"]["chunk_prompts"] == 2
      c.rollout.chunk_prompts = 0
      try:
        settings.from_config(c)
        raise AssertionError("chunk_prompts=0 was accepted")
      except ValueError as e:
        assert "config.rollout.chunk_prompts must be an int >= 1, got 0" in str(e), e
      c.rollout.engine = "paged"
      try:
        settings.from_config(c)
        raise AssertionError("an unknown engine was accepted")
      except ValueError as e:
        assert "'chunked', 'continuous', 'static'" in str(e), e

      path = tiny_assets.make_tiny_checkpoint("{tmp_path}/policy", "qwen3")
      model, params = models.load_pretrained(path)
      tok = models.load_tokenizer(path)
      policy = rollout.Policy(model, tok, render=lambda ex: ex, max_prompt_len=8, add_bos=False)
      examples = ["1 + 2 =", "3 + 4 =", "x", "The answer is"]
      greedy = rollout.SamplingSettings(group_size=2, max_new_tokens=6, temperature=0.0,
                                        top_k=0, top_p=1.0)
      key = jax.random.PRNGKey(0)
      ref = rollout.rollout(policy, params, examples, key, greedy)
      rows = []
      chunked = dataclasses.replace(greedy, engine="chunked",
                                    engine_options={{"chunk_prompts": 3}})
      got = rollout.rollout(policy, params, examples, key, chunked,
                            on_row=lambda b, g, text, n: rows.append((b, g)))
      np.testing.assert_array_equal(got.tokens, ref.tokens)
      np.testing.assert_array_equal(got.lengths, ref.lengths)
      assert got.texts == ref.texts and sorted(rows) == [(b, g) for b in range(4) for g in range(2)]
      print("ok")
  """)
  assert out.strip().endswith("ok")


def test_a_record_from_before_engine_options_resumes():
  """Runs recorded `rollout.slots` before the engines owned their options; such a record
  compares equal to today's `rollout.engine_options.slots` (checkpointing.MOVED), and a
  changed slot count is still refused."""
  import ml_collections
  import pytest
  from ml_collections.config_flags import config_flags
  from mr_rl import checkpointing, metrics, settings
  c = config_flags.ConfigFileFlagParser(name="config").parse(
      os.path.join(REPO, "configs", "demo.py") + ":smoke")
  c = ml_collections.ConfigDict(c.to_dict(), type_safe=False)
  c.rollout.engine, c.rollout.slots = "continuous", 4
  record = metrics.settings_dict(settings.from_config(c))
  assert record["rollout"]["engine_options"] == {"slots": 4}
  rollout = {k: v for k, v in record["rollout"].items() if k != "engine_options"}
  older = dict(record, rollout=dict(rollout, slots=4))
  checkpointing.check_resume(older, record, "wd")
  with pytest.raises(ValueError, match=r"rollout.engine_options.slots: 8 -> 4"):
    checkpointing.check_resume(dict(record, rollout=dict(rollout, slots=8)), record, "wd")
