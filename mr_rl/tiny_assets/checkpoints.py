"""Tiny random checkpoints (one layer, d = 32) of the paper models' families."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from mr_rl.tiny_assets.assets import asset_dir, build_once, family_spec
from mr_rl.tiny_assets.tokenizer import make_tokenizer


def tiny_model_config(family: str, vocab_size: int, *, d_model: int = 32, n_layers: int = 1,
                      max_seq_len: int = 4096):
  """A `ModelConfig` of the family's layout at toy size (1 layer, d=32 by default): shared toy
  sizes and the family's own fields (`FamilySpec.tiny_config`)."""
  from mr_rl import models
  spec = family_spec(family)
  common = dict(family=family, vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                n_heads=2, n_kv_heads=1, head_dim=16, d_ff=2 * d_model, max_seq_len=max_seq_len)
  return models.ModelConfig(**common, **spec.tiny_config(d_model))


def numpy_init(model, seed: int = 0, std: float = 0.02):
  """Random params without compiling anything: N(0, std) weights, RMSNorm scales 1.

  Shapes come from `jax.eval_shape` (`models.abstract_params`); drawing them with numpy
  avoids a jitted `model.init`, which costs seconds of compile time per family on a CPU.
  Drawn layer by layer in the per-layer order, then stacked (as `host_params`).
  """
  import jax
  from mr_rl import models
  from mr_rl.models.transformer import stack_layers, unstack_layers
  rng = np.random.default_rng(seed)
  L = model.config.n_layers
  shapes = unstack_layers(models.abstract_params(model), L)

  def draw(path, x):
    if jax.tree_util.keystr(path).endswith("['scale']"):
      return np.ones(x.shape, np.float32)
    return (std * rng.standard_normal(x.shape)).astype(np.float32)

  return jax.tree.map(np.asarray, stack_layers(jax.tree_util.tree_map_with_path(draw, shapes), L))


def make_tiny_checkpoint(directory: str, family: str = "qwen3", *, d_model: int = 32,
                         n_layers: int = 1, vocab_size: int = 2048, seed: int = 0) -> str:
  """Writes a tiny random `family` checkpoint with its tokenizer to `directory` (idempotent).

  Args:
    directory: output directory (reused if it already holds a finished checkpoint).
    family: a `mr_rl.models.families` name ('qwen3' | 'llama' | 'qwen3_moe').
    d_model, n_layers: model size (defaults: 1 layer, d=32).
    vocab_size: BPE vocabulary cap; the built-in corpus yields ~1,300 tokens, enough for
      whole-word tokens of the prompt instructions (the tiny ALCE prompts stay under 512).
      The model's vocabulary is the tokenizer's actual size.
    seed: initialisation seed.

  Returns:
    The absolute directory path.
  """
  family_spec(family)

  def build(tmp):
    from mr_rl import models
    tokenizer = make_tokenizer(tmp, family, vocab_size)
    cfg = tiny_model_config(family, len(tokenizer), d_model=d_model, n_layers=n_layers)
    model = models.Transformer(cfg)
    models.save_pretrained(model, numpy_init(model, seed), tmp, write=True)
    with open(os.path.join(tmp, "config.json")) as f:
      hf = json.load(f)
    for name in ("bos", "eos", "pad"):
      hf[f"{name}_token_id"] = getattr(tokenizer, f"{name}_token_id")
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2)

  return build_once(directory, build)


def tiny_checkpoint_for(model_name: str, family: str, root: str | None = None) -> str:
  """A tiny `family` checkpoint in a directory named `model_name` (e.g. 'Qwen3-4B-Instruct-2507').

  With `config.data.style=''` the trainer takes a paper model's listed prompt style from the
  model's name (`mr_rl.data.templates.run_style`), so the stand-in carries the name of the
  model it replaces.
  All names of one family get byte-identical copies of one checkpoint.
  """
  source = make_tiny_checkpoint(os.path.join(asset_dir(root), "families", family), family)
  return build_once(tiny_checkpoint_path(model_name, family, root),
                    lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))


def tiny_checkpoint_path(model_name: str, family: str, root: str | None = None) -> str:
  """Where `tiny_checkpoint_for(model_name, family, root)` puts its checkpoint; writes nothing."""
  family_spec(family)
  return os.path.join(asset_dir(root), "models", family, model_name)


def host_params(model, rng: np.random.Generator, std: float = 0.1):
  """`model`'s parameters drawn on the host from `rng` (normal with `std`; norm scales around
  1): no jax init, so tests and their subprocess workers build equal weights cheaply. Drawn
  layer by layer in the per-layer order (`models.transformer.unstack_layers`), then stacked
  for the layer scan: the same weights for the same rng as before the scan."""
  import jax
  from mr_rl.models import abstract_params
  from mr_rl.models.transformer import stack_layers, unstack_layers
  L = model.config.n_layers
  drawn = jax.tree_util.tree_map_with_path(
      lambda path, s: (rng.normal(0.0, std, s.shape) +
                       (1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0)
                       ).astype(np.float32),
      unstack_layers(abstract_params(model), L))
  return jax.tree.map(np.asarray, stack_layers(drawn, L))
