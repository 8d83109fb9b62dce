"""Model configuration and named presets (Qwen3 dense, Llama 3.x / DeepSeek-Math, Qwen3-MoE).

`ModelConfig` is a frozen, hashable dataclass so it can be a static field of a Flax module and a
static argument of `jax.jit`. Preset values are the published `config.json` values of each model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from mr_rl.models.families import FAMILIES

MOE_IMPLS = ("ragged", "dense", "ep")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def freeze_rope_scaling(scaling: Mapping[str, Any] | tuple | None) -> tuple | None:
  """Turns a llama3 `rope_scaling` dict into the hashable form stored in ModelConfig.

  Args:
    scaling: None, an already frozen tuple of (key, value) pairs, or a dict with `rope_type`
      (or `type`) 'llama3' and the keys factor, low_freq_factor, high_freq_factor,
      original_max_position_embeddings. A dict whose rope_type is 'default' means no scaling.

  Returns:
    None or a sorted tuple of (key, value) pairs.
  """
  if scaling is None:
    return None
  if isinstance(scaling, tuple):
    scaling = dict(scaling)
  if not isinstance(scaling, Mapping):
    raise TypeError(f"rope_scaling must be None, a dict or a tuple of pairs, got {type(scaling)}")
  rope_type = scaling.get("rope_type", scaling.get("type", "default"))
  if rope_type == "default":
    return None
  if rope_type != "llama3":
    raise ValueError(f"rope_scaling: only rope_type 'llama3' is supported, got {rope_type!r}")
  missing = [k for k in _LLAMA3_KEYS if k not in scaling]
  if missing:
    raise ValueError(f"rope_scaling (llama3) is missing keys {missing}; got {dict(scaling)}")
  out = {k: float(scaling[k]) for k in _LLAMA3_KEYS}
  out["original_max_position_embeddings"] = int(scaling["original_max_position_embeddings"])
  if out["high_freq_factor"] <= out["low_freq_factor"]:
    raise ValueError("rope_scaling: high_freq_factor must exceed low_freq_factor")
  out["rope_type"] = "llama3"
  return tuple(sorted(out.items()))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder hyperparameters (names follow the model contract; HF names in parentheses).

  The capital letters are shape letters (docs/shapes.md).

  Attributes:
    family: a `mr_rl.models.families` name: 'qwen3' | 'llama' | 'qwen3_moe' (HF model_type;
      DeepSeek-Math uses 'llama').
    vocab_size: V (vocab_size).
    d_model: D (hidden_size).
    n_layers: L (num_hidden_layers).
    n_heads: H query heads (num_attention_heads).
    n_kv_heads: J key/value heads (num_key_value_heads); each serves Q = H // J query heads
      (grouped-query attention).
    head_dim: W, per-head width (head_dim, default hidden_size // heads).
    d_ff: F, dense MLP width (intermediate_size); unused when every layer is MoE.
    rope_theta: RoPE base.
    rope_scaling: None or the frozen llama3 scaling (see `freeze_rope_scaling`).
    norm_eps: RMSNorm epsilon (rms_norm_eps).
    qk_norm: RMSNorm over head_dim on q and k before RoPE (Qwen3).
    tie_embeddings: lm head shares the embedding matrix (tie_word_embeddings).
    num_experts: E routed experts (0 for dense models).
    num_experts_per_tok: U, experts used per token (the router's top-k).
    moe_d_ff: expert MLP width, F inside moe.py (moe_intermediate_size).
    norm_topk_prob: renormalise the top-k router probabilities to sum to one.
    max_seq_len: longest supported sequence (max_position_embeddings); bounds init_cache.
    param_dtype: storage dtype of parameters (the optimizer's master weights).
    dtype: compute dtype: matmul operands, activations and the default KV cache (bf16 over
      float32 params is mixed precision: each kernel is cast where it is used, so gradients
      and updates reach the float32 master weights; norms, softmax and logits stay float32).
    logits_dtype: dtype of the returned logits (float32 recommended).
    moe_impl: 'ragged' (exact sort + lax.ragged_dot dispatch, compute ~ top-k experts) or
      'dense' (every expert on every token, einsum over the 'expert' axis; simplest to shard)
      or 'ep' (expert-parallel dispatch with per-device routing over the ambient mesh: shard_map
      + all_to_all over the 'expert' axis; exact, no token dropped; see mr_rl/models/moe.py).
    remat: rematerialise each decoder block in the backward pass.
    matmul_precision: None (backend default) or a jax.lax.Precision name such as 'highest'
      (for fp32 parity on accelerators whose default fp32 matmul is reduced precision).
    attention_impl: self-attention kernel of the learner's forwards and the prefill
      (`mr_rl.models.attention.IMPLS`: 'auto' picks by backend; 'reference' is the T x T
      einsum the others are tested against).
  """

  family: str = "qwen3"
  vocab_size: int = 256
  d_model: int = 64
  n_layers: int = 2
  n_heads: int = 4
  n_kv_heads: int = 2
  head_dim: int = 16
  d_ff: int = 128
  rope_theta: float = 10000.0
  rope_scaling: tuple | None = None
  norm_eps: float = 1e-6
  qk_norm: bool = True
  tie_embeddings: bool = True
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_d_ff: int = 0
  norm_topk_prob: bool = True
  max_seq_len: int = 4096
  param_dtype: Any = jnp.float32
  dtype: Any = jnp.float32
  logits_dtype: Any = jnp.float32
  moe_impl: str = "ragged"
  remat: bool = False
  matmul_precision: str | None = None
  attention_impl: str = "auto"

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(f"ModelConfig.family must be one of {FAMILIES.names()}, got "
                       f"{self.family!r}")
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                 "max_seq_len"):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {v!r}")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of "
                       f"n_kv_heads ({self.n_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
    if self.rope_theta <= 0:
      raise ValueError(f"ModelConfig.rope_theta must be positive, got {self.rope_theta}")
    if self.norm_eps <= 0:
      raise ValueError(f"ModelConfig.norm_eps must be positive, got {self.norm_eps}")
    object.__setattr__(self, "rope_scaling", freeze_rope_scaling(self.rope_scaling))
    for name in ("param_dtype", "dtype", "logits_dtype"):
      try:
        dt = jnp.dtype(getattr(self, name))
      except TypeError as e:
        raise TypeError(f"ModelConfig.{name}: not a dtype: {getattr(self, name)!r}") from e
      if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"ModelConfig.{name} must be a floating dtype, got {dt}")
      object.__setattr__(self, name, dt)
    if self.is_moe:
      if self.num_experts <= 0 or not 0 < self.num_experts_per_tok <= self.num_experts:
        raise ValueError(f"{self.family} needs num_experts > 0 and 0 < num_experts_per_tok <= "
                         f"num_experts, got {self.num_experts}, {self.num_experts_per_tok}")
      if self.moe_d_ff <= 0:
        raise ValueError(f"ModelConfig.moe_d_ff must be positive for {self.family}, got "
                         f"{self.moe_d_ff}")
    else:
      if self.num_experts:
        raise ValueError(f"family {self.family!r} is dense but num_experts={self.num_experts}")
      if self.d_ff <= 0:
        raise ValueError(f"ModelConfig.d_ff must be positive, got {self.d_ff}")
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f"ModelConfig.moe_impl must be one of {MOE_IMPLS}, got {self.moe_impl!r}")
    from mr_rl.models.attention import IMPLS  # local import: attention reads no config
    if self.attention_impl not in IMPLS:
      raise ValueError(f"ModelConfig.attention_impl must be one of {IMPLS}, got "
                       f"{self.attention_impl!r}")
    if self.matmul_precision is not None and self.matmul_precision not in (
        "default", "high", "highest", "bfloat16", "tensorfloat32", "float32"):
      raise ValueError(f"ModelConfig.matmul_precision: unknown precision {self.matmul_precision!r}")

  @property
  def is_moe(self) -> bool:
    """Every layer's MLP is a routed mixture of experts (the family's `FamilySpec.moe`)."""
    return FAMILIES.get(self.family).moe

  def replace(self, **kw) -> "ModelConfig":
    """Returns a copy with fields replaced (validated again)."""
    return dataclasses.replace(self, **kw)


def _llama3(factor, orig=8192):
  return freeze_rope_scaling(dict(rope_type="llama3", factor=factor, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=orig))


PRESETS: dict[str, ModelConfig] = {
    # Qwen/Qwen3-0.6B (0.60B, tied; 0.44B without embeddings). With 8B, 14B and 32B below: the
    # Qwen3 dense sizes launch/check.py compares for LoRA against full fine-tuning.
    "qwen3_0_6b": ModelConfig(
        family="qwen3", vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
        head_dim=128, d_ff=3072, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True,
        tie_embeddings=True, max_seq_len=40960),
    # Qwen/Qwen3-1.7B: tied; the model card gives 1.7B total, 1.4B without embeddings.
    "qwen3_1_7b": ModelConfig(
        family="qwen3", vocab_size=151936, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8,
        head_dim=128, d_ff=6144, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True,
        tie_embeddings=True, max_seq_len=40960),
    # Qwen/Qwen3-4B-Instruct-2507 (4.02B, tied, 256K context).
    "qwen3_4b": ModelConfig(
        family="qwen3", vocab_size=151936, d_model=2560, n_layers=36, n_heads=32, n_kv_heads=8,
        head_dim=128, d_ff=9728, rope_theta=5_000_000.0, norm_eps=1e-6, qk_norm=True,
        tie_embeddings=True, max_seq_len=262144),
    # Qwen/Qwen3-8B (8.19B, untied).
    "qwen3_8b": ModelConfig(
        family="qwen3", vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8,
        head_dim=128, d_ff=12288, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True,
        tie_embeddings=False, max_seq_len=40960),
    # Qwen/Qwen3-14B (14.8B, untied).
    "qwen3_14b": ModelConfig(
        family="qwen3", vocab_size=151936, d_model=5120, n_layers=40, n_heads=40, n_kv_heads=8,
        head_dim=128, d_ff=17408, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True,
        tie_embeddings=False, max_seq_len=40960),
    # Qwen/Qwen3-32B (32.8B, untied).
    "qwen3_32b": ModelConfig(
        family="qwen3", vocab_size=151936, d_model=5120, n_layers=64, n_heads=64, n_kv_heads=8,
        head_dim=128, d_ff=25600, rope_theta=1_000_000.0, norm_eps=1e-6, qk_norm=True,
        tie_embeddings=False, max_seq_len=40960),
    # Qwen/Qwen3-30B-A3B-Instruct-2507 (30.5B total, 3.3B active; 128 experts, top-8).
    "qwen3_30b_a3b": ModelConfig(
        family="qwen3_moe", vocab_size=151936, d_model=2048, n_layers=48, n_heads=32,
        n_kv_heads=4, head_dim=128, d_ff=6144, rope_theta=10_000_000.0, norm_eps=1e-6,
        qk_norm=True, tie_embeddings=False, num_experts=128, num_experts_per_tok=8,
        moe_d_ff=768, norm_topk_prob=True, max_seq_len=262144),
    # meta-llama/Llama-3.2-3B(-Instruct) (3.21B, tied, llama3 RoPE factor 32).
    "llama3_2_3b": ModelConfig(
        family="llama", vocab_size=128256, d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8,
        head_dim=128, d_ff=8192, rope_theta=500_000.0, rope_scaling=_llama3(32.0),
        norm_eps=1e-5, qk_norm=False, tie_embeddings=True, max_seq_len=131072),
    # meta-llama/Llama-3.1-8B(-Instruct) (8.03B, untied, llama3 RoPE factor 8).
    "llama3_1_8b": ModelConfig(
        family="llama", vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
        head_dim=128, d_ff=14336, rope_theta=500_000.0, rope_scaling=_llama3(8.0),
        norm_eps=1e-5, qk_norm=False, tie_embeddings=False, max_seq_len=131072),
    # deepseek-ai/deepseek-math-7b-(base|instruct|rl): Llama layout, MHA (6.91B, untied).
    "deepseek_math_7b": ModelConfig(
        family="llama", vocab_size=102400, d_model=4096, n_layers=30, n_heads=32, n_kv_heads=32,
        head_dim=128, d_ff=11008, rope_theta=10000.0, norm_eps=1e-6, qk_norm=False,
        tie_embeddings=False, max_seq_len=4096),
    # Tiny presets for tests and CPU demos.
    "tiny_qwen3": ModelConfig(
        family="qwen3", vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
        head_dim=16, d_ff=128, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True,
        max_seq_len=512),
    "tiny_llama": ModelConfig(
        family="llama", vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
        head_dim=16, d_ff=128, rope_theta=500_000.0, rope_scaling=_llama3(8.0, orig=64),
        norm_eps=1e-5, qk_norm=False, tie_embeddings=False, max_seq_len=512),
    "tiny_moe": ModelConfig(
        family="qwen3_moe", vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
        head_dim=16, d_ff=128, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_d_ff=32, norm_topk_prob=True,
        max_seq_len=512),
}


def get_preset(name: str, **overrides) -> ModelConfig:
  """Returns the named preset, optionally with fields replaced (e.g. dtype='bfloat16').

  Raises:
    ValueError: unknown name (the message lists the valid names).
  """
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; valid presets: {sorted(PRESETS)}")
  cfg = PRESETS[name]
  return cfg.replace(**overrides) if overrides else cfg
