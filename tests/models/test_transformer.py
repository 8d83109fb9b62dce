"""Reference tests of mr_rl.models against transformers (tiny random fp32 checkpoints)."""

import pathlib
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from mr_rl import models as M
from mr_rl.models import hf_io
from mr_rl.models.layers import rope_inv_freq

transformers = pytest.importorskip("transformers")

B, T, P = 3, 12, 7          # batch, sequence, prompt length for the incremental check
COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, intermediate_size=128,
              max_position_embeddings=256, initializer_range=0.1)


def _hf_model(family):
  t = transformers
  if family == "qwen3":
    return t.Qwen3ForCausalLM(t.Qwen3Config(**COMMON, rope_theta=1e6, tie_word_embeddings=True))
  if family == "llama":
    return t.LlamaForCausalLM(t.LlamaConfig(
        **COMMON, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=16)))
  return t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(
      **COMMON, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
      norm_topk_prob=True, tie_word_embeddings=False))


def _batch():
  rng = np.random.default_rng(0)
  tok = rng.integers(0, 256, (B, T)).astype(np.int32)
  mask = np.ones((B, T), np.int32)
  mask[1, :4] = 0
  mask[2, :P + 1] = 0       # row 2 has no real prompt token at all within the prefill
  return tok, mask


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
  """family -> (dir, reference logits [B, T, V] from transformers on the left-padded batch)."""
  torch.manual_seed(0)
  tok, mask = _batch()
  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  out = {}
  for family in ("qwen3", "llama", "qwen3_moe"):
    hf = _hf_model(family).eval()
    with torch.no_grad():
      for n, p in hf.named_parameters():
        if "norm" in n:                       # make the RMSNorm weights matter
          p.add_(0.2 * torch.randn_like(p))
      ref = hf(input_ids=torch.tensor(tok, dtype=torch.long),
               attention_mask=torch.tensor(mask, dtype=torch.long),
               position_ids=torch.tensor(pos, dtype=torch.long)).logits.numpy()
    d = tmp_path_factory.mktemp(family)
    hf.save_pretrained(d)
    out[family] = (str(d), ref)
  return out


@pytest.fixture(scope="module")
def loaded(ckpts):
  return {f: M.load_pretrained(d) for f, (d, _) in ckpts.items()}


_jit_logits = jax.jit(M.logits, static_argnums=0)

CASES = [("qwen3", "ragged"), ("llama", "ragged"), ("qwen3_moe", "ragged"),
         ("qwen3_moe", "dense"), ("qwen3_moe", "ep")]   # 'ep' without a mesh: one device


@pytest.mark.parametrize("family,moe_impl", CASES)
def test_logits_match_transformers_left_padded(ckpts, loaded, family, moe_impl):
  _, ref = ckpts[family]
  model, params = loaded[family]
  if moe_impl != model.config.moe_impl:
    model = M.Transformer(model.config.replace(moe_impl=moe_impl))
  tok, mask = _batch()
  out = np.asarray(_jit_logits(model, params, jnp.asarray(tok), jnp.asarray(mask)))
  assert out.dtype == np.float32 and out.shape == (B, T, 256)
  assert np.all(np.isfinite(out))
  real = mask.astype(bool)
  assert np.abs(ref[real]).max() > 1.0          # the comparison is not vacuous
  np.testing.assert_array_less(np.abs(out - ref)[real].max(), 1e-4)


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe"])
def test_incremental_decode_matches_full_forward(ckpts, loaded, family):
  _, ref = ckpts[family]
  model, params = loaded[family]
  tok, mask = _batch()
  S = T + 4                                     # cache longer than needed: unused slots
  pos = np.asarray(M.positions_from_mask(jnp.asarray(mask)))

  traces = []

  @jax.jit
  def step(params, tok_NT, pos_NT, kv_mask_NC, cache, index):
    traces.append(tok_NT.shape)
    return model.apply({"params": params}, tok_NT, pos_NT, kv_mask_NC=kv_mask_NC, cache=cache,
                       cache_index=index)

  cache = M.init_cache(model.config, B, S)
  kv = np.zeros((B, S), np.int32)
  kv[:, :P] = mask[:, :P]
  lg, cache = step(params, tok[:, :P], pos[:, :P], kv, cache, jnp.int32(0))
  outs = [np.asarray(lg)]
  for t in range(P, T):
    kv[:, t] = mask[:, t]
    lg, cache = step(params, tok[:, t:t + 1], pos[:, t:t + 1], kv, cache, jnp.int32(t))
    outs.append(np.asarray(lg))
  assert traces == [(B, P), (B, 1)]             # prefill + one decode compile, no retraces
  inc = np.concatenate(outs, axis=1)
  real = mask.astype(bool)
  full = np.asarray(_jit_logits(model, params, jnp.asarray(tok), jnp.asarray(mask)))
  np.testing.assert_array_less(np.abs(inc - full)[real].max(), 2e-5)
  np.testing.assert_array_less(np.abs(inc - ref)[real].max(), 1e-4)
  L = model.config.n_layers                    # one stacked cache for the layer scan
  assert cache.k.shape == (L, B, 2, 16, S) and cache.v.shape == (L, B, 2, S, 16)
  assert not np.any(np.asarray(cache.k[..., T:]))   # nothing written past the last token
  assert not np.any(np.asarray(cache.v[:, :, :, T:]))   # nothing written past the last token


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe"])
def test_roundtrip_bit_exact_and_transformers_reloads(ckpts, loaded, family, tmp_path):
  src, ref = ckpts[family]
  model, params = loaded[family]
  M.save_pretrained(model, params, tmp_path, source=src)
  a, b = load_file(os.path.join(src, "model.safetensors")), load_file(tmp_path / "model.safetensors")
  assert set(a) == set(b)
  for k in a:
    assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
    assert a[k].tobytes() == b[k].tobytes(), k
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
  tok, mask = _batch()
  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    again = hf(input_ids=torch.tensor(tok, dtype=torch.long),
               attention_mask=torch.tensor(mask, dtype=torch.long),
               position_ids=torch.tensor(pos, dtype=torch.long)).logits.numpy()
  np.testing.assert_array_equal(again, ref)


def test_sharded_files_roundtrip(ckpts, loaded, tmp_path):
  model, params = loaded["qwen3_moe"]
  M.save_pretrained(model, params, tmp_path, max_shard_bytes=60_000)
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 2 and all("-of-" in f for f in files)
  _, params2 = M.load_pretrained(tmp_path)
  chex.assert_trees_all_equal(params, params2)


def test_bf16_params_give_fp32_logits(ckpts, tmp_path):
  d, ref = ckpts["qwen3"]
  model, params = M.load_pretrained(d, dtype=jnp.bfloat16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(params))
  assert model.config.logits_dtype == jnp.float32
  tok, mask = _batch()
  out = np.asarray(_jit_logits(model, params, jnp.asarray(tok), jnp.asarray(mask)))
  assert out.dtype == np.float32
  real = mask.astype(bool)
  err = np.abs(out - ref)[real]
  assert err.max() < 0.1 * np.abs(ref[real]).max() and err.mean() < 0.02 * np.abs(ref).mean() + 0.02
  M.save_pretrained(model, params, tmp_path)                     # bf16 checkpoint for serving
  assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
  assert hf.model.embed_tokens.weight.dtype == torch.bfloat16
  np.testing.assert_array_equal(hf.model.norm.weight.detach().float().numpy(),
                                np.asarray(params["final_norm"]["scale"], np.float32))


def test_llama3_inv_freq_matches_transformers():
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  cfg = M.get_preset("llama3_1_8b")
  hf_cfg = transformers.LlamaConfig(**{k: v for k, v in hf_io.hf_config_from(cfg).items()
                                       if k not in ("architectures", "model_type")})
  want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
  np.testing.assert_allclose(rope_inv_freq(cfg), want.numpy(), rtol=1e-6)


def test_rope_config_forms_agree(ckpts):
  d, _ = ckpts["llama"]
  hf = json.loads(open(os.path.join(d, "config.json")).read())
  assert "rope_parameters" in hf                     # transformers 5 form
  legacy = {k: v for k, v in hf.items() if k != "rope_parameters"}
  legacy["rope_theta"] = hf["rope_parameters"]["rope_theta"]
  legacy["rope_scaling"] = {k: v for k, v in hf["rope_parameters"].items() if k != "rope_theta"}
  a, b = M.config_from_hf(hf), M.config_from_hf(legacy)
  assert a == b and a.rope_theta == 500000.0 and dict(a.rope_scaling)["factor"] == 8.0


# Published sizes (model cards / hub safetensors metadata), 1% tolerance. Qwen3-1.7B is tied
# (1.72B); the hub's "2.03B" counts the lm_head copy its safetensors store as well.
PUBLISHED = {"qwen3_1_7b": 1.72e9, "qwen3_4b": 4.02e9, "qwen3_30b_a3b": 30.5e9,
             "llama3_2_3b": 3.21e9, "llama3_1_8b": 8.03e9, "deepseek_math_7b": 6.91e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts(name):
  cfg = M.get_preset(name)
  n = M.count_params(cfg)
  assert abs(n / PUBLISHED[name] - 1) < 0.01, (name, n)
  if name == "qwen3_1_7b":
    assert abs((n + cfg.vocab_size * cfg.d_model) / 2.03e9 - 1) < 0.01


def test_tiny_presets_shapes():
  for name in ("tiny_qwen3", "tiny_llama", "tiny_moe"):
    model = M.Transformer(M.get_preset(name))
    params = M.abstract_params(model)
    tok = jax.ShapeDtypeStruct((2, 5), jnp.int32)
    lg, cache, h = jax.eval_shape(
        lambda p, t: model.apply({"params": p}, t, t, return_hidden=True), params, tok)
    assert lg.shape == (2, 5, 256) and lg.dtype == jnp.float32
    assert cache is None and h.shape == (2, 5, 64)


# ------------------------------------------------------------------------------- bad input
def test_unknown_preset_lists_names():
  with pytest.raises(ValueError, match="tiny_qwen3"):
    M.get_preset("qwen9")


def test_config_preset_mismatch(ckpts):
  with pytest.raises(ValueError, match="d_model.*preset"):
    M.load_pretrained(ckpts["qwen3"][0], preset="qwen3_4b")


def _copy_ckpt(src, dst, edit=None):
  t = load_file(os.path.join(src, "model.safetensors"))
  if edit:
    edit(t)
  os.makedirs(dst, exist_ok=True)
  save_file(t, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
    g.write(f.read())
  return dst


def test_missing_unexpected_and_bad_tensors(ckpts, tmp_path):
  src = ckpts["qwen3_moe"][0]
  name = "model.layers.1.mlp.experts.3.up_proj.weight"
  d = _copy_ckpt(src, tmp_path / "a", lambda t: t.pop(name))
  with pytest.raises(ValueError, match="missing.*experts.3.up_proj"):
    M.load_pretrained(d)
  d = _copy_ckpt(src, tmp_path / "b", lambda t: t.update({"model.extra.weight": np.ones(3, np.float32)}))
  with pytest.raises(ValueError, match="unexpected.*model.extra.weight"):
    M.load_pretrained(d)
  d = _copy_ckpt(src, tmp_path / "c", lambda t: t.update({name: t[name].astype(np.int32)}))
  with pytest.raises(TypeError, match="up_proj.*dtype int32"):
    M.load_pretrained(d)
  d = _copy_ckpt(src, tmp_path / "d", lambda t: t.update(
      {"model.layers.0.self_attn.q_proj.weight": np.zeros((32, 64), np.float32)}))
  with pytest.raises(ValueError, match="q_proj.*shape"):
    M.load_pretrained(d)
  with pytest.raises(TypeError, match="dtype must be floating"):
    M.load_pretrained(src, dtype=jnp.int8)


def test_missing_shard_file(loaded, tmp_path):
  model, params = loaded["qwen3"]
  M.save_pretrained(model, params, tmp_path, max_shard_bytes=60_000)
  victim = sorted(os.listdir(tmp_path))[1]
  assert victim.endswith(".safetensors")
  os.remove(tmp_path / victim)
  with pytest.raises(FileNotFoundError, match=victim):
    M.load_pretrained(tmp_path)


def test_hub_id_offline_error_names_the_id(monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(OSError, match="Qwen/Qwen3-0.6B.*local directory"):
    M.load_pretrained("Qwen/Qwen3-0.6B")
  with pytest.raises(FileNotFoundError, match="not a checkpoint directory"):
    M.load_pretrained("/nonexistent/dir")


def test_cache_overflow_errors(loaded):
  model, params = loaded["qwen3"]
  with pytest.raises(ValueError, match="max_seq_len"):
    M.init_cache(model.config, 2, model.config.max_seq_len + 1)
  cache = M.init_cache(model.config, 2, 4)
  tok = jnp.ones((2, 5), jnp.int32)
  kv = jnp.ones((2, 4), jnp.int32)
  with pytest.raises(ValueError, match="longer than the cache"):
    model.apply({"params": params}, tok, tok, kv_mask_NC=kv, cache=cache, cache_index=0)
  with pytest.raises(ValueError, match="beyond max_len"):
    model.apply({"params": params}, tok[:, :2], tok[:, :2], kv_mask_NC=kv, cache=cache,
                cache_index=3)
  with pytest.raises(ValueError, match="kv_mask_NC must have shape"):
    model.apply({"params": params}, tok[:, :2], tok[:, :2], kv_mask_NC=tok, cache=cache,
                cache_index=0)


def test_bad_config_values():
  with pytest.raises(ValueError, match="n_kv_heads"):
    M.ModelConfig(n_heads=4, n_kv_heads=3)
  with pytest.raises(ValueError, match="rope_type"):
    M.ModelConfig(rope_scaling={"rope_type": "yarn", "factor": 4.0})
  with pytest.raises(TypeError, match="param_dtype"):
    M.ModelConfig(param_dtype=jnp.int32)
  with pytest.raises(ValueError, match="model_type"):
    M.config_from_hf({"model_type": "gpt2"})


def test_load_tokenizer_and_source_files_copied(ckpts, loaded, tmp_path):
  from tokenizers import Tokenizer, models as tok_models, pre_tokenizers
  src = tmp_path / "src"
  vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", "two", "plus", "is", "four"])}
  tk = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
  tk.pre_tokenizer = pre_tokenizers.Whitespace()
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>",
                                              eos_token="<eos>")
  d, _ = ckpts["qwen3"]
  _copy_ckpt(d, src)
  fast.save_pretrained(src)
  assert M.load_tokenizer(str(src))("two plus two")["input_ids"] == [2, 3, 2]
  model, params = loaded["qwen3"]
  M.save_pretrained(model, params, tmp_path / "out", source=str(src))
  tok = M.load_tokenizer(str(tmp_path / "out"))
  assert tok("two plus two is four")["input_ids"] == [2, 3, 2, 4, 5]
  assert tok.eos_token == "<eos>"


def test_a_corrupt_config_json_is_named(tmp_path):
  """A checkpoint whose config.json does not parse fails naming the file, in loading and in
  `python -m mr_rl.main --dry_run` (which reads only the config)."""
  import shutil
  from mr_rl import settings as settings_lib
  from mr_rl.config_lib.dry_run import dry_run
  base = os.path.join(str(pathlib.Path(__file__).resolve().parents[2]), "mr_rl",
                      "demo", "assets", "base_policy")
  ckpt = tmp_path / "ckpt"
  shutil.copytree(base, ckpt)
  (ckpt / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 64,\n')
  needle = rf"^{ckpt}/config.json is not valid JSON \(line 2, column 1: "
  with pytest.raises(ValueError, match=needle):
    M.load_pretrained(str(ckpt))
  c = settings_lib.default_config()
  c.plugins = "mr_rl.demo"
  c.data.name = "arithmetic"
  c.model.path = str(ckpt)
  c.rewards.channels = "arith_acc"
  with pytest.raises(ValueError, match=needle):
    dry_run(c)


@pytest.mark.parametrize("tie", [True, False])
def test_head_start_runs_the_head_on_the_last_columns(tie):
  """`head_start`: the trunk sees every column, the lm head runs on [head_start, T) only."""
  cfg = M.ModelConfig(family="qwen3", vocab_size=40, d_model=32, n_layers=1, n_heads=2,
                      n_kv_heads=1, head_dim=16, d_ff=64, max_seq_len=32, tie_embeddings=tie)
  model = M.Transformer(cfg)
  params = M.init_params(model, jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 12), 1, 40)
  mask = (jnp.arange(12)[None] >= jnp.array([[0], [3], [5]])).astype(jnp.int32)
  full = M.logits(model, params, tokens, mask)
  part = M.logits(model, params, tokens, mask, head_start=5)
  assert part.shape == (3, 7, 40)
  np.testing.assert_allclose(part, full[:, 5:], rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="head_start"):
    M.logits(model, params, tokens, mask, head_start=12)
