r"""Shared pieces of the paper configs in `configs/` (STYLE.md item 2).

Every `configs/<file>.py` has `get_config(arg)` and `sweep(arg)`. `arg` is a short
`key=value,...` string (`configs/amrp_math.py:model=qwen3_4b,method=amrp`); `runlocal` (no value)
shrinks any point to a tiny local model and data set that runs on a CPU (`local.runlocal`).
Unknown keys or values raise ValueError listing the valid choices.

Modules: `args` (argument strings, sweep grids, loading a config file by path), `paper` (the
papers' models, shared GRPO settings, methods, per-table set-ups), `local` (runlocal, blockers),
`estimates` (device-hours).

Command line (loads a config file by path, as `ml_collections.config_flags` does):

    python -m mr_rl.config_lib list configs/tag_math.py                 # every run of the table
    python -m mr_rl.config_lib list configs/tag_math.py:model=qwen3_4b  # a subset
    python -m mr_rl.config_lib show configs/tag_math.py:method=tag      # the resolved config
    python -m mr_rl.config_lib estimate configs/tag_math.py             # chip-hours per run
"""

from mr_rl.config_lib.args import grid, load_config_module, parse_arg, restrict
from mr_rl.config_lib.estimates import (CHIPS, estimate_config, estimate_device_hours,
                                        model_sizes)
from mr_rl.config_lib.local import RUNLOCAL, blocker, runlocal
from mr_rl.config_lib.paper import (ALCE_TEST, ALCE_TRAIN, AMRP_DEFAULTS, ARMORM_CHANNELS,
                                    BRIEF_THRESHOLD, MODELS, TAG_METHODS, PaperModel,
                                    amrp_alce_base, amrp_align_base, amrp_math_base, amrp_method,
                                    epochs_to_steps, paper_base, set_aggregator, set_model,
                                    tag_code_base, tag_math_base, tag_method)

__all__ = [
    "ALCE_TEST", "ALCE_TRAIN", "AMRP_DEFAULTS", "ARMORM_CHANNELS", "BRIEF_THRESHOLD", "CHIPS",
    "MODELS", "PaperModel", "RUNLOCAL", "TAG_METHODS", "amrp_alce_base", "amrp_align_base",
    "amrp_math_base", "amrp_method", "blocker", "epochs_to_steps", "estimate_config",
    "estimate_device_hours", "grid", "load_config_module", "model_sizes", "paper_base",
    "parse_arg", "restrict", "runlocal", "set_aggregator", "set_model", "tag_code_base",
    "tag_math_base", "tag_method",
]
