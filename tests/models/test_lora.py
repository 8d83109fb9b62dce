"""mr_rl.models.lora against peft (tiny random fp32 checkpoints), merge, PEFT IO, targets."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from mr_rl import models as M
from mr_rl.models import lora as L

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, intermediate_size=128,
              max_position_embeddings=256, initializer_range=0.1)
TOK = np.random.default_rng(0).integers(0, 256, (2, 9)).astype(np.int32)
MASK = np.ones_like(TOK)
MASK[1, :3] = 0


def _hf(family):
  t = transformers
  if family == "qwen3":
    return t.Qwen3ForCausalLM(t.Qwen3Config(**COMMON, rope_theta=1e6, tie_word_embeddings=True))
  return t.LlamaForCausalLM(t.LlamaConfig(**COMMON, rope_theta=5e5, tie_word_embeddings=False))


def _hf_logits(hf):
  pos = np.maximum(np.cumsum(MASK, -1) - 1, 0)
  with torch.no_grad():
    return hf(input_ids=torch.tensor(TOK, dtype=torch.long),
              attention_mask=torch.tensor(MASK, dtype=torch.long),
              position_ids=torch.tensor(pos, dtype=torch.long)).logits.numpy()


def _ours(model, params):
  return np.asarray(jax.jit(M.logits, static_argnums=0)(model, params, TOK, MASK))


def _real(a, b):  # a real mask row: padded positions are meaningless
  np.testing.assert_allclose(a[0], b[0], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(a[1, 3:], b[1, 3:], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def base_dirs(tmp_path_factory):
  torch.manual_seed(0)
  out = {}
  for family in ("qwen3", "llama"):
    d = tmp_path_factory.mktemp(family)
    _hf(family).save_pretrained(d)
    out[family] = str(d)
  return out


def _random_adapters(model, cfg, seed=1):
  """Adapters with b non-zero too (a fresh b is zero, which would test nothing), in the
  adapted layers only (the others hold zeros, as every adapter tree of a run does)."""
  ad = L.init_adapters(model.config, cfg, jax.random.PRNGKey(seed))
  on = {}
  for layer, block, name in L.target_paths(model.config, cfg):
    on.setdefault((block, name), np.zeros(model.config.n_layers, np.float32))[
        int(layer.split("_")[1])] = 1.0
  return jax.tree_util.tree_map_with_path(
      lambda p, x: x + 0.05 * on[(p[1].key, p[2].key)].reshape((-1,) + (1,) * (x.ndim - 1)) *
      jax.random.normal(jax.random.PRNGKey(seed + 1), x.shape, x.dtype), ad)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_peft_export_and_logits_match_peft(family, base_dirs, tmp_path):
  """Our adapted logits == peft's on the same weights; the merge gives the same too."""
  model, base = M.load_pretrained(base_dirs[family])
  cfg = L.LoraConfig(rank=4, alpha=8.0, targets=("*/attn/*", "gate_proj", "down_proj",
                                                 "layers_1/mlp/up_proj"))
  ad = _random_adapters(model, cfg)
  pol = L.Adapted(base, ad, cfg.scale)
  ours = _ours(model, pol)
  _real(_ours(model, L.merge(pol)), ours)
  L.save_peft(str(tmp_path), ad, model.config, cfg, base_dirs[family])
  hf = transformers.AutoModelForCausalLM.from_pretrained(base_dirs[family])
  pm = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
  _real(ours, _hf_logits(pm))
  # and back: the PEFT directory loads into the same adapters
  back, back_cfg = L.load_peft(str(tmp_path), model.config)
  chex.assert_trees_all_close(back, ad, atol=0, rtol=0)
  assert back_cfg.scale == cfg.scale
  assert L.target_paths(model.config, back_cfg) == L.target_paths(model.config, cfg)


def test_adapter_trained_by_peft_loads(base_dirs, tmp_path):
  """An adapter peft made (its own init, then perturbed as training would) gives our model
  peft's logits."""
  hf = transformers.AutoModelForCausalLM.from_pretrained(base_dirs["qwen3"])
  pc = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"],
                       lora_dropout=0.0, task_type="CAUSAL_LM")
  pm = peft.get_peft_model(hf, pc)
  torch.manual_seed(3)
  with torch.no_grad():
    for n, p in pm.named_parameters():
      if "lora_" in n:
        p.add_(0.05 * torch.randn_like(p))
  pm.save_pretrained(str(tmp_path))
  ref = _hf_logits(pm.eval())
  model, base = M.load_pretrained(base_dirs["qwen3"])
  ad, cfg = L.load_peft(str(tmp_path), model.config)
  assert cfg.rank == 8 and cfg.scale == 2.0 and len(L.target_paths(model.config, cfg)) == 6
  _real(_ours(model, L.Adapted(base, ad, cfg.scale)), ref)


def test_fresh_adapters_are_the_base_and_no_collection_is_the_reference():
  model = M.Transformer(M.get_preset("tiny_qwen3"))
  base = M.init_params(model, jax.random.PRNGKey(0))
  cfg = L.LoraConfig(rank=2)
  ad = L.init_adapters(model.config, cfg, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(_ours(model, L.Adapted(base, ad, cfg.scale)), _ours(model, base))
  chex.assert_trees_all_equal_shapes_and_dtypes(ad, L.abstract_adapters(model.config, cfg))
  # 7 kernels x 2 layers, stacked: a [L, *in, R] and b [L, R, *out]
  assert len(L.target_paths(model.config, cfg)) == 14
  assert ad["layers"]["attn"]["o_proj"]["a"].shape == (2, 4, 16, 2)
  assert ad["layers"]["attn"]["q_proj"]["b"].shape == (2, 2, 4, 16)
  assert L.merge(base) is base


def test_targets_are_checked():
  c = M.get_preset("tiny_qwen3")
  with pytest.raises(ValueError, match="match no kernel"):
    L.target_paths(c, L.LoraConfig(targets=("q_prj",)))
  with pytest.raises(ValueError, match="MoE expert"):
    L.target_paths(M.get_preset("tiny_moe"), L.LoraConfig())
  assert len(L.target_paths(M.get_preset("tiny_moe"), L.LoraConfig(targets=("*/attn/*",)))) == 8
  with pytest.raises(ValueError, match="rank"):
    L.LoraConfig(rank=0)


class _FixedMask(torch.nn.Module):
  """PEFT's lora_dropout replaced by a given mask (inverted scaling, as nn.Dropout)."""

  def __init__(self, mask, keep):
    super().__init__()
    self.mask, self.keep = mask, keep

  def forward(self, x):
    return x * self.mask / self.keep


def test_dropout_forward_and_gradient_equal_peft_with_the_same_masks(base_dirs, tmp_path):
  """LoRA dropout = PEFT's lora_dropout (train mode, the adapter branch's input only): with
  the masks drawn by hand from the documented keys (row n, kernel k of layer l:
  bernoulli(fold_in(fold_in(rng, n), l * 7 + KERNELS.index(k)), 1 - p)), peft's logits and its
  adapter gradients
  equal ours; p = 0 or no row keys is the plain adapted forward."""
  p, rng = 0.3, jax.random.PRNGKey(7)
  model, base = M.load_pretrained(base_dirs["qwen3"])
  cfg = L.LoraConfig(rank=4, alpha=8.0, dropout=p)
  ad = _random_adapters(model, cfg)
  N, T = TOK.shape
  keys = L.dropout_row_keys(rng, N)
  pol = L.Adapted(base, ad, cfg.scale, p, keys)
  C = np.random.default_rng(5).normal(size=(N, T, 256)).astype(np.float32) * MASK[..., None]

  def f(a):
    return jnp.sum(M.logits(model, L.Adapted(base, a, cfg.scale, p, keys), TOK, MASK) * C)

  ours, grads = _ours(model, pol), jax.jit(jax.grad(f))(ad)
  plain = _ours(model, L.Adapted(base, ad, cfg.scale))
  assert np.abs(ours - plain)[0].max() > 1e-3  # the masks act
  np.testing.assert_array_equal(_ours(model, L.Adapted(base, ad, cfg.scale, 0.0, keys)), plain)
  L.save_peft(str(tmp_path), ad, model.config, cfg, base_dirs["qwen3"])
  assert json.load(open(tmp_path / L.ADAPTER_CONFIG))["lora_dropout"] == p
  hf = transformers.AutoModelForCausalLM.from_pretrained(base_dirs["qwen3"])
  pm = peft.PeftModel.from_pretrained(hf, str(tmp_path), is_trainable=True).train()
  paths = sorted(L.target_paths(model.config, cfg))
  a_of, b_of = {}, {}
  for name, mod in pm.named_modules():
    if not hasattr(mod, "lora_dropout"):
      continue
    _, i, block, kernel = name.rsplit(".", 3)
    path = (f"layers_{i}", "attn" if block == "self_attn" else "mlp", kernel)
    k = int(i) * len(L.KERNELS) + L.KERNELS.index(kernel)
    width = mod.in_features
    masks = [np.asarray(jax.random.bernoulli(
        jax.random.fold_in(jax.random.fold_in(rng, n), k), 1 - p,
        (T,) + ad["layers"][path[1]][kernel]["a"].shape[1:-1])).reshape(T, width)
             for n in range(N)]
    mod.lora_dropout["default"] = _FixedMask(torch.tensor(np.stack(masks), dtype=torch.float32),
                                             1 - p)
    a_of[path], b_of[path] = mod.lora_A["default"].weight, mod.lora_B["default"].weight
  assert len(a_of) == len(paths)
  pos = np.maximum(np.cumsum(MASK, -1) - 1, 0)
  logits = pm(input_ids=torch.tensor(TOK, dtype=torch.long),
              attention_mask=torch.tensor(MASK, dtype=torch.long),
              position_ids=torch.tensor(pos, dtype=torch.long)).logits
  _real(ours, logits.detach().numpy())
  (logits * torch.tensor(C)).sum().backward()
  for path in paths:
    g = grads["layers"][path[1]][path[2]]
    layer, R = int(path[0].split("_")[1]), cfg.rank
    np.testing.assert_allclose(np.asarray(g["a"][layer]).reshape(-1, R).T,
                               a_of[path].grad.numpy(), rtol=2e-4, atol=2e-4, err_msg=str(path))
    np.testing.assert_allclose(np.asarray(g["b"][layer]).reshape(R, -1).T,
                               b_of[path].grad.numpy(), rtol=2e-4, atol=2e-4, err_msg=str(path))
