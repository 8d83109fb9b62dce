"""Fixtures shared by the test modules."""

from mr_rl.testing import xla_env

# The tests compile many tiny programs: XLA:CPU at optimisation level 0 compiles them about 2x
# faster and runs them as fast at this size (`xla_env.FAST_COMPILE`). Set before any JAX backend
# starts; subprocesses inherit it; a caller's own XLA_FLAGS come after, so they win.
xla_env.use_fast_compile()

import pytest  # noqa: E402

from mr_rl.demo import warmstart  # noqa: E402


@pytest.fixture(scope="session")
def base_policy(tmp_path_factory):
  """A tiny base policy for the arithmetic task (3 warm-start steps; `mr_rl.demo.warmstart`)."""
  out = str(tmp_path_factory.mktemp("base_policy"))
  warmstart.train(warmstart.WarmStartConfig(steps=3, batch_size=8, d_model=32, n_layers=1),
                  out, log_every=0)
  return out


def _tiny_hf_config(family: str):
  import transformers
  common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=512, initializer_range=0.1, bos_token_id=None,
                eos_token_id=None, pad_token_id=0)
  if family == "qwen3":
    return transformers.Qwen3Config(**common, tie_word_embeddings=True,
                                    rope_parameters=dict(rope_type="default", rope_theta=1e6))
  return transformers.LlamaConfig(
      **common, tie_word_embeddings=False,
      rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                           high_freq_factor=4.0, original_max_position_embeddings=16))


@pytest.fixture(scope="session")
def tiny_hf_pair(tmp_path_factory):
  """family ('qwen3' | 'llama') -> (transformers model, mr_rl model, params): a random model
  (vocab 128, 2 layers, 4 heads / 2 KV heads; Llama with llama3 RoPE scaling) written by
  transformers and the same weights loaded by mr_rl; built once per session."""
  import torch
  import transformers
  from mr_rl import models
  root = tmp_path_factory.mktemp("sampling_models")
  built = {}

  def get(family: str):
    if family not in built:
      torch.manual_seed({"qwen3": 0, "llama": 1}[family])
      cls = transformers.Qwen3ForCausalLM if family == "qwen3" else transformers.LlamaForCausalLM
      hf = cls(_tiny_hf_config(family)).eval()
      hf.save_pretrained(str(root / family))
      built[family] = (hf,) + tuple(models.load_pretrained(str(root / family)))
    return built[family]

  return get


def hf_greedy_tokens(hf, tokens, mask, max_new_tokens: int):
  """transformers `generate` greedy continuations (no EOS) of left-padded prompts, numpy."""
  import torch
  with torch.no_grad():
    out = hf.generate(torch.as_tensor(tokens, dtype=torch.long),
                      attention_mask=torch.as_tensor(mask, dtype=torch.long), do_sample=False,
                      max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
  assert out.shape[1] == tokens.shape[1] + max_new_tokens
  return out[:, tokens.shape[1]:].numpy()


@pytest.fixture(scope="session")
def hf_greedy():
  """`hf_greedy_tokens` as a fixture (test modules do not import conftest)."""
  return hf_greedy_tokens


def left_padded(lengths, vocab: int = 128, seed: int = 0):
  """Left-padded random prompts of the given real lengths: tokens and mask [B, max(lengths)]."""
  import numpy as np
  rng = np.random.default_rng(seed)
  width = max(lengths)
  tokens = np.zeros((len(lengths), width), np.int32)
  mask = np.zeros_like(tokens)
  for b, n in enumerate(lengths):
    tokens[b, width - n:] = rng.integers(1, vocab, n)
    mask[b, width - n:] = 1
  return tokens, mask


@pytest.fixture(scope="session")
def left_padded_prompts():
  """`left_padded` as a fixture (test modules do not import conftest)."""
  return left_padded
