"""Model families: one module per decoder family, each registering a `FamilySpec` by name.

A family is what differs between transformers' model types that share mr_rl's decoder
(`mr_rl.models.transformer`): which HF `model_type`s it reads, how their config.json maps to
`ModelConfig` and back, the per-layer weight names, the template style of the family's
models, and the tiny test fixture (`mr_rl.tiny_assets`). Everything else (RoPE, attention,
sharding, the layer scan) is shared and reads `ModelConfig` fields, never the family's name.

    from mr_rl.models import families
    spec = families.FAMILIES.get("qwen3")        # the FamilySpec
    families.for_model_type("qwen3_moe")         # the spec that reads that HF model_type
    families.FAMILIES.names()                    # ('llama', 'qwen3', 'qwen3_moe')

The built-in families are the modules of this package (`qwen3.py`, `llama.py`,
`qwen3_moe.py`), imported on the first lookup; adding a family is adding a module here (and
a test), nothing else: see docs/extending.md. A family outside the package registers the
same way from a `config.plugins` module.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from typing import Any, Callable, Mapping

import numpy as np

from mr_rl.registry import Registry

# (our path inside a decoder block, HF names inside `model.layers.{i}.`, to_ours, to_hf):
# to_ours maps one layer's HF arrays (a list) to our array, to_hf back (`mr_rl.models.hf_io`).
BlockEntry = tuple[tuple[str, ...], list[str], Callable, Callable]


@dataclasses.dataclass(frozen=True)
class FamilySpec:
  """One decoder family.

  Attributes:
    name: the family's name (`ModelConfig.family`; the registry key).
    model_types: the transformers `model_type`s it reads; the first is the one it writes.
    architecture: the transformers class written to config.json `architectures`.
    moe: every decoder layer's MLP is a routed mixture of experts (`ModelConfig.is_moe`).
    config_from_hf: HF config.json dict -> the family's own `ModelConfig` fields (the shared
      ones are read by `hf_io.config_from_hf`); raises ValueError for what it cannot load.
    hf_config_extra: `ModelConfig` -> the family's own config.json fields.
    mlp_mapping: `ModelConfig` -> the MLP's `BlockEntry`s (the attention and norm entries are
      shared; q/k norms come with `ModelConfig.qk_norm`).
    model_styles: the prompt template style ('chat' | 'plain') of the family's known models,
      by model key (`mr_rl.data.templates`: the hub name lower-cased, punctuation as '_').
    tiny_config: d_model -> the tiny test fixture's `ModelConfig` fields beyond the shared
      toy sizes (`mr_rl.tiny_assets.tiny_model_config`).
    tiny_tokens: the tiny tokenizer's (bos, eos, pad) special tokens, as in the real one.
    tiny_chat_template: the tiny tokenizer's chat template (Jinja).
  """
  name: str
  model_types: tuple[str, ...]
  architecture: str
  moe: bool
  config_from_hf: Callable[[Mapping[str, Any]], dict]
  hf_config_extra: Callable[[Any], dict]
  mlp_mapping: Callable[[Any], list]
  model_styles: Mapping[str, str]
  tiny_config: Callable[[int], dict]
  tiny_tokens: tuple[str | None, str, str]
  tiny_chat_template: str


def _builtin_modules() -> tuple[str, ...]:
  return tuple(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)
               if not m.name.startswith("_"))


FAMILIES: Registry[FamilySpec] = Registry("model family", plugins=_builtin_modules())


def register(spec: FamilySpec) -> FamilySpec:
  """Adds `spec` under its name; a model_type another family reads is an error."""
  taken = {t: n for n in FAMILIES.names() for t in FAMILIES.get(n).model_types}
  for t in spec.model_types:
    if t in taken:
      raise ValueError(f"model family {spec.name!r}: model_type {t!r} is already read by "
                       f"{taken[t]!r}")
  return FAMILIES.add(spec.name, spec)


def for_model_type(model_type: str) -> FamilySpec:
  """The family that reads HF `model_type`.

  Raises:
    ValueError: no family reads it (the message lists the model types that load).
  """
  specs = [FAMILIES.get(n) for n in FAMILIES.names()]
  for spec in specs:
    if model_type in spec.model_types:
      return spec
  raise ValueError(f"config.json model_type {model_type!r} is not supported; expected one of "
                   f"{sorted(t for s in specs for t in s.model_types)}")


def model_styles() -> dict[str, str]:
  """{model key: template style} over every family's known models."""
  return {k: v for n in FAMILIES.names() for k, v in FAMILIES.get(n).model_styles.items()}


# ----------------------------------------------------------------- weight conversions
def linear(shape_out: tuple) -> tuple[Callable, Callable]:
  """HF Linear [out, in] <-> ours [in, *shape_out]."""
  def to_ours(ts):
    t = ts[0].T
    return t.reshape(t.shape[0], *shape_out) if shape_out else t
  return to_ours, lambda a: [np.ascontiguousarray(a.reshape(a.shape[0], -1).T)]


def linear_in(shape_in: tuple) -> tuple[Callable, Callable]:
  """HF Linear [out, in] <-> ours [*shape_in, out] (o_proj)."""
  return (lambda ts: ts[0].T.reshape(*shape_in, -1),
          lambda a: [np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T)])


SAME = (lambda ts: ts[0], lambda a: [a])
STACK_T = (lambda ts: np.stack([t.T for t in ts]),
           lambda a: [np.ascontiguousarray(x.T) for x in a])


def dense_mlp(config) -> list:
  """The SwiGLU MLP's entries (`mlp.{gate,up,down}_proj`), shared by the dense families."""
  del config
  return [(("mlp", n), [f"mlp.{n}.weight"], *linear(())) for n in ("gate_proj", "up_proj",
                                                                     "down_proj")]


# The tiny tokenizers' chat templates (the real tokenizers' turn markers).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content']"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")
