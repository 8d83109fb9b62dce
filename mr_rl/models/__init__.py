"""Decoder models (Qwen3, Llama 3.x / DeepSeek-Math, Qwen3-MoE), HF IO, presets, sharding.

Public API (the model contract): ModelConfig, PRESETS, get_preset, Transformer, init_cache,
positions_from_mask, load_pretrained, save_pretrained, logits, load_tokenizer; also exported:
LayerCache, config_from_hf, hf_config_from, abstract_params, count_params, init_params.
Shape letters are defined in each module's docstring (B batch rows, J kv heads, ...).
"""

from mr_rl.models.config import PRESETS, ModelConfig, get_preset
from mr_rl.models.hf_io import (config_from_hf, hf_config_from, load_pretrained, load_tokenizer,
                                save_pretrained)
from mr_rl.models.layers import LayerCache, init_cache
from mr_rl.models.transformer import (Transformer, abstract_params, count_params, init_params,
                                      logits, positions_from_mask)

__all__ = [
    "ModelConfig", "PRESETS", "get_preset", "Transformer", "LayerCache", "init_cache",
    "positions_from_mask", "load_pretrained", "save_pretrained", "logits", "load_tokenizer",
    "config_from_hf", "hf_config_from", "abstract_params", "count_params", "init_params",
    "load_tokenizer",
]
