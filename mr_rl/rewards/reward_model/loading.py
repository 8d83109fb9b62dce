"""Loading a reward model checkpoint: the Llama backbone and its regression head.

ArmoRM's ``regression_layer`` or a ``LlamaForSequenceClassification`` ``score`` head (see the
package docstring); the gating tensors and the LM head are read past.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax.numpy as jnp
import numpy as np

from mr_rl.models import hf_io
from mr_rl.models.transformer import Transformer

ARMORM_HUB = "RLHFlow/ArmoRM-Llama3-8B-v0.1"
ARMORM_OBJECTIVES = (  # model card order; AMRP's help / corr / coh are 0 / 1 / 2
    "helpsteer-helpfulness", "helpsteer-correctness", "helpsteer-coherence",  # 0-2
    "helpsteer-complexity", "helpsteer-verbosity", "ultrafeedback-overall_score",  # 3-5
    "ultrafeedback-instruction_following", "ultrafeedback-truthfulness",
    "ultrafeedback-honesty", "ultrafeedback-helpfulness", "beavertails-is_safe",
    "prometheus-score", "argilla-overall_quality", "argilla-judge_lm", "code-complexity",
    "code-style", "code-explanation", "code-instruction-following", "code-readability")
HEAD_LAYOUTS = ("regression_layer", "score")  # ArmoRM / LlamaForSequenceClassification
# Tensors of the ArmoRM checkpoint that only feed the overall preference score (or an LM
# head a reward model does not use); read past.
_IGNORED_PREFIXES = ("gating.", "reward_transform_matrix", "lm_head.")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class LoadedRewardModel(NamedTuple):
  model: Transformer
  params: Any
  w_DK: np.ndarray
  b_K: np.ndarray
  layout: str
  objectives: tuple[str, ...]


def _head_tensors(index: Mapping[str, str], head: str, read) -> tuple[np.ndarray, np.ndarray, str]:
  """Reads the regression head: (w_DK float32, b_K float32, layout)."""
  present = [h for h in HEAD_LAYOUTS if f"{h}.weight" in index]
  if head == "auto":
    if len(present) != 1:
      raise ValueError(f"head='auto' needs exactly one of regression_layer.weight / score.weight "
                       f"in the checkpoint, found {present or 'neither'}; pass head=")
    head = present[0]
  elif head not in HEAD_LAYOUTS:
    raise ValueError(f"head must be 'auto' or one of {sorted(HEAD_LAYOUTS)}, got {head!r}")
  elif head not in present:
    raise ValueError(f"head={head!r} but the checkpoint has no {head}.weight")
  w = np.asarray(read(f"{head}.weight"), np.float32)
  if w.ndim != 2:
    raise ValueError(f"{head}.weight must be [num_objectives, hidden], got shape {w.shape}")
  b = (np.asarray(read(f"{head}.bias"), np.float32) if f"{head}.bias" in index
       else np.zeros(w.shape[0], np.float32))
  if b.shape != (w.shape[0],):
    raise ValueError(f"{head}.bias has shape {b.shape}, expected ({w.shape[0]},)")
  return np.ascontiguousarray(w.T), b, head


def load_reward_model(path_or_hub_id: str, *, dtype=jnp.float32, mesh=None, rules=None,
                      head: str = "auto", **config_overrides):
  """Loads backbone + regression head from a transformers checkpoint.

  Backbone tensors are mapped with ``hf_io.param_mapping`` (one tensor at a time, straight
  into its NamedSharding when ``mesh`` is given). The backbone config is built with
  ``tie_embeddings=True`` so that no LM head parameter is needed; the (unused) logits are
  dead code that XLA removes under ``jit``.

  Args:
    path_or_hub_id: local directory (config.json, safetensors) or hub id.
    dtype: backbone parameter / activation dtype; the head is kept in float32.
    mesh, rules: optional mesh and logical axis rules (``mr_rl.models.sharding``).
    head: 'auto', 'regression_layer' (ArmoRM) or 'score' (LlamaForSequenceClassification).
    **config_overrides: other ModelConfig fields (e.g. max_seq_len).

  Returns:
    LoadedRewardModel(model, params, w_DK, b_K, layout, objectives): objectives are
    ARMORM_OBJECTIVES for a 19-output regression_layer, the config's id2label for a score
    head, else ``objective_<k>``.

  Raises:
    ValueError / FileNotFoundError / TypeError naming the problem (missing or unexpected
    tensors, shapes, unknown head layout).
  """
  dt = jnp.dtype(dtype)
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"dtype must be a floating dtype, got {dt}")
  path = hf_io.resolve_path(path_or_hub_id, ["*.json", "*.safetensors", "tokenizer*", "*.txt",
                                             "*.model", "*.tiktoken", "*.jinja"])
  hf_cfg = hf_io.read_config(path)
  overrides = dict(config_overrides, tie_embeddings=True)
  config = hf_io.config_from_hf(hf_cfg, param_dtype=dt, dtype=dt, **overrides)
  model = Transformer(config)
  index = hf_io.tensor_index(path)
  read = hf_io.tensor_reader(index)

  w_DK, b_K, layout = _head_tensors(index, head, read)
  if w_DK.shape[0] != config.d_model:
    raise ValueError(f"{layout}.weight has hidden size {w_DK.shape[0]}, backbone has {config.d_model}")
  n_obj = hf_cfg.get("num_objectives")
  if n_obj is not None and n_obj != w_DK.shape[1]:
    raise ValueError(f"config.json num_objectives={n_obj} but {layout}.weight has "
                     f"{w_DK.shape[1]} rows")
  mapping = hf_io.param_mapping(config)
  expected = hf_io.expected_names(mapping)
  head_names = {f"{layout}.weight", f"{layout}.bias"}
  missing = sorted(expected - set(index))
  unexpected = sorted(n for n in set(index) - expected - head_names
                      if not n.startswith(_IGNORED_PREFIXES) and not n.endswith(_IGNORED_SUFFIXES))
  if missing:
    raise ValueError(f"checkpoint {path} is missing {len(missing)} backbone tensor(s): {missing[:8]}")
  if unexpected:
    raise ValueError(f"checkpoint {path} has {len(unexpected)} unexpected tensor(s) for a "
                     f"reward model with a {layout} head: {unexpected[:8]}")
  params = hf_io.load_params(model, mapping, read, dt, mesh, rules)
  K = w_DK.shape[1]
  id2label = hf_cfg.get("id2label") or {}
  if layout == "regression_layer" and K == len(ARMORM_OBJECTIVES):
    objectives = ARMORM_OBJECTIVES
  elif layout == "score" and len(id2label) == K and all(str(k) in id2label for k in range(K)):
    objectives = tuple(str(id2label[str(k)]) for k in range(K))
  else:
    objectives = tuple(f"objective_{k}" for k in range(K))
  return LoadedRewardModel(model, params, w_DK, b_K, layout, objectives)
