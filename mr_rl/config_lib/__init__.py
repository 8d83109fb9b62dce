r"""Shared pieces of the paper configs in `configs/` (docs/style.md §2).

Every `configs/<file>.py` has `get_config(arg)` and `sweep(arg)`. `arg` is a short
`key=value,...` string (`configs/amrp_math.py:model=qwen3_4b,method=amrp`); `runlocal` (no value)
shrinks any point to a tiny local model and data set that runs on a CPU (`local.runlocal`).
Unknown keys or values raise ValueError listing the valid choices.

Each table's own fields (data, template, lengths, channels, steps, evaluation) are set in its
config file (`base_config` of amrp_math, amrp_alce, amrp_align, tag_math, tag_code; the tables
that vary one of these load it with `load_sibling`). Modules: `args` (argument strings, sweep
grids, loading config files by path), `paper` (what several tables share: the papers' models,
both papers' GRPO settings, the AMRP and TAG methods, TAG's probes), `local` (runlocal,
blockers), `estimates` (device-hours).

Command line (loads a config file by path, as `ml_collections.config_flags` does):

    python -m mr_rl.config_lib list configs/tag_math.py                 # every run of the table
    python -m mr_rl.config_lib list configs/tag_math.py:model=qwen3_4b  # a subset
    python -m mr_rl.config_lib show configs/tag_math.py:method=tag      # the resolved config
    python -m mr_rl.config_lib estimate configs/tag_math.py             # chip-hours per run
"""

from mr_rl.config_lib.args import (grid, load_config_module, load_sibling, parse_arg,
                                   restrict)
from mr_rl.config_lib.estimates import (CHIPS, estimate_config, estimate_device_hours,
                                        model_sizes)
from mr_rl.config_lib.local import RUNLOCAL, blocker, runlocal
from mr_rl.config_lib.paper import (LORA_RANKS, MODELS, TAG_METHODS, PaperModel, amrp_method,
                                    epochs_to_steps, paper_base, set_aggregator, set_amrp,
                                    set_lora, set_model, tag_method, tag_probes)

__all__ = [
    "CHIPS", "LORA_RANKS", "MODELS", "PaperModel", "RUNLOCAL", "TAG_METHODS", "amrp_method",
    "blocker",
    "epochs_to_steps", "estimate_config", "estimate_device_hours", "grid", "load_config_module",
    "load_sibling", "model_sizes", "paper_base", "parse_arg", "restrict", "runlocal",
    "set_aggregator", "set_amrp", "set_lora", "set_model", "tag_method", "tag_probes",
]
