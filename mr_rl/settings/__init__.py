"""Validated, frozen run settings built from an ml_collections ConfigDict (docs/style.md §3).

The config file is the user's surface; everything downstream reads these dataclasses. Each
setting is declared once, in its section's dataclass (`mr_rl.fields.setting`: default, help,
check), and checked where it is declared (`__post_init__`): `sections` (model, data, rewards,
aggregator), `loop` (anchor, eval, logging, export, compile, resume, batch, dynamic), the
runtime modules' own (`mr_rl.rl.update.UpdateConfig` and `mr_rl.rl.losses.PolicyLossConfig`:
config.update; `mr_rl.rollout.SamplingSettings`: config.rollout; `mr_rl.draw_queue.AsyncSettings`:
config.asynchrony; `mr_rl.models.lora.LoraConfig`: config.model.lora), and `run.RunSettings`
(the top-level fields and the checks across sections). `config` derives `default_config()`
from the declarations and builds the settings back (`from_config`); bad values fail there, at
start-up, with a message naming `config.<field>` and, for names, the valid choices. Names are
checked against their registries after the run's `config.plugins` modules are imported, so a
plugin's names validate like the built-in ones.
"""

from mr_rl.settings.config import (ALIASES, CONFIG_ONLY, check_field_path, default_config,
                                   deprecation, field_help, free_form, from_config,
                                   resolve_alias)
from mr_rl.settings.loop import (AnchorSettings, BatchSettings, CompileSettings,
                                 DynamicSamplingSettings, EvalSettings, ExportSettings,
                                 LoggingSettings, ResumeSettings)
from mr_rl.settings.run import RunSettings
from mr_rl.settings.sections import (AggregatorSettings, DataSettings, ModelSettings,
                                     RewardSettings)

__all__ = [
    "ALIASES", "CONFIG_ONLY", "AggregatorSettings", "AnchorSettings",
    "BatchSettings", "CompileSettings", "DataSettings", "DynamicSamplingSettings",
    "EvalSettings", "ExportSettings", "LoggingSettings", "ModelSettings", "ResumeSettings",
    "RewardSettings", "RunSettings", "check_field_path", "default_config", "deprecation",
    "field_help", "free_form", "from_config", "resolve_alias",
]


def __getattr__(name):
  if name == "FREE_FORM":  # computed when first read (`config.free_form`)
    return free_form()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
