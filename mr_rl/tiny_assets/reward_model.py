"""A tiny 3-objective reward model (LlamaForSequenceClassification layout), ArmoRM's stand-in."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from mr_rl.tiny_assets.assets import asset_dir, build_once
from mr_rl.tiny_assets.checkpoints import make_tiny_checkpoint

REWARD_OBJECTIVES = ("helpsteer-helpfulness", "helpsteer-correctness", "helpsteer-coherence")


def make_tiny_reward_model(directory: str, *, seed: int = 1) -> str:
  """A tiny Llama reward model with a 3-objective `score` head (LlamaForSequenceClassification
  layout, objectives = ArmoRM's HelpSteer heads 0-2), loadable by
  `mr_rl.rewards.reward_model` and transformers; idempotent."""

  def build(tmp):
    from safetensors.numpy import load_file, save_file
    src = make_tiny_checkpoint(os.path.join(os.path.dirname(os.path.abspath(directory)),
                                            ".rm-backbone"), "llama", seed=seed)
    shutil.copytree(src, tmp, dirs_exist_ok=True)
    os.remove(os.path.join(tmp, ".done"))
    with open(os.path.join(tmp, "config.json")) as f:
      hf = json.load(f)
    tensors = load_file(os.path.join(tmp, "model.safetensors"))
    rng = np.random.default_rng(seed)
    tensors["score.weight"] = rng.standard_normal(
        (len(REWARD_OBJECTIVES), hf["hidden_size"])).astype(np.float32)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    hf.update(architectures=["LlamaForSequenceClassification"],
              id2label={str(i): n for i, n in enumerate(REWARD_OBJECTIVES)},
              label2id={n: i for i, n in enumerate(REWARD_OBJECTIVES)})
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2)

  return build_once(directory, build)


def tiny_reward_model(root: str | None = None) -> str:
  """The runlocal stand-in for ArmoRM-Llama3-8B-v0.1 (written on first use)."""
  return make_tiny_reward_model(tiny_reward_model_path(root))


def tiny_reward_model_path(root: str | None = None) -> str:
  """Where `tiny_reward_model(root)` puts the reward model; writes nothing."""
  return os.path.join(asset_dir(root), "reward_model")
