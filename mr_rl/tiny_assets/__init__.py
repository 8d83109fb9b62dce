"""Tiny assets: local checkpoints, tokenizers, data files and a reward model at toy size, so
every paper config runs on a CPU (`runlocal`), and the tests' fixtures. Not part of the core:
only `mr_rl.config_lib.local` (runlocal), tests and benchmarks import it.

    from mr_rl import tiny_assets
    path = tiny_assets.make_tiny_checkpoint("/tmp/tiny/qwen3", family="qwen3")  # 'llama', ...
    data = tiny_assets.make_tiny_data("numina_math", "/tmp/tiny/data")  # -> path= for loaders
    rm = tiny_assets.make_tiny_reward_model("/tmp/tiny/rm")             # ArmoRM stand-in
    # runlocal records paths under $MR_RL_CACHE (default ~/.cache/mr_rl; `*_path` functions,
    # which write nothing) and builds them when the run starts (`config_lib.local.build_assets`):
    tiny_assets.tiny_checkpoint_for("Qwen3-4B-Instruct-2507", "qwen3")
    tiny_assets.runlocal_data("alce_asqa")

Modules: `assets` (cache directory, atomic builds), `tokenizer`, `checkpoints`,
`reward_model`, `datasets`; everything public is exported here. Importing them imports no
jax (their functions do), so a test may import them before `mr_rl.testing.xla_env` sets its
XLA_FLAGS.

`make_tiny_checkpoint` writes a randomly initialised decoder (`mr_rl.models.save_pretrained`:
safetensors + config.json, loadable by transformers) and a real byte-level BPE tokenizer
trained with the `tokenizers` library on a small built-in corpus (the papers' prompt
instructions plus the tiny data below), saved as a transformers fast tokenizer with a chat
template and pad/eos (and bos for Llama) set as each family's spec says
(`mr_rl.models.families`: ChatML for the Qwen families, Llama-3 headers for Llama).
`make_tiny_data` writes a few records of each data set in its hub schema (the
columns the loaders in `mr_rl.data` read), so `load_dataset(name, path=...)` runs the same
parsing, filtering and splitting code as on the real data. `make_tiny_reward_model` adds a
3-objective `score` head (LlamaForSequenceClassification layout) to a tiny Llama.

All are idempotent: a finished directory is reused (a `.done` marker written before an atomic
rename of a private build directory, so concurrent builders never see a partial one). The
cache directory name carries a hash of this package's files, so editing them invalidates old assets.
Weights are drawn with numpy from fixed seeds (no compile); equal arguments give equal model
configurations, so the trainer's compiled functions, cached per model, are shared by every
config's `runlocal` run in one process.
"""

from mr_rl.tiny_assets.assets import VERSION, asset_dir, build_once, cache_root, family_spec
from mr_rl.tiny_assets.checkpoints import (host_params, make_tiny_checkpoint, numpy_init,
                                           tiny_checkpoint_for, tiny_checkpoint_path,
                                           tiny_model_config)
from mr_rl.tiny_assets.datasets import (RUNLOCAL_DATA_OPTIONS, make_tiny_data, runlocal_data,
                                        runlocal_data_path)
from mr_rl.tiny_assets.reward_model import (REWARD_OBJECTIVES, make_tiny_reward_model,
                                            tiny_reward_model, tiny_reward_model_path)
from mr_rl.tiny_assets.tokenizer import SPECIAL_TOKENS, corpus, make_tokenizer

__all__ = ["host_params", "family_spec", "REWARD_OBJECTIVES",
           "RUNLOCAL_DATA_OPTIONS", "SPECIAL_TOKENS", "VERSION", "asset_dir", "build_once",
           "cache_root", "corpus", "make_tiny_checkpoint", "make_tiny_data",
           "make_tiny_reward_model", "make_tokenizer", "numpy_init", "runlocal_data",
           "runlocal_data_path", "tiny_checkpoint_for", "tiny_checkpoint_path",
           "tiny_model_config", "tiny_reward_model", "tiny_reward_model_path"]
