"""Data sets, prompt templates and resumable iteration.

Public API:
  load_dataset(name, *, path=None, split=None, **options) -> list[Example]
  DATASETS (registry; register_dataset), Example, replicate, CodeTestSpec, parse_tests
  PromptTemplate, make_template, style_for_model
  ResumableIterator (state() / restore(state))
  fingerprint, restore_position, describe_source, DataChangedError (the rows' resume check)
  check_prompt_lengths (every prompt's length at start-up)
  DatasetUnavailableError
"""

from mr_rl.data.code import CodeTestSpec, parse_tests
from mr_rl.data.example import Example, replicate
from mr_rl.data.fingerprint import (FINGERPRINT_KEY, DataChangedError, describe_source,
                                    fingerprint, restore_position)
from mr_rl.data.iterator import ResumableIterator, epoch_order
from mr_rl.data.lengths import check_prompt_lengths
from mr_rl.data.registry import (DATASETS, DataSource, hub_id, load_dataset, options,
                                 register_dataset)
from mr_rl.data.sources import DatasetUnavailableError
from mr_rl.data.templates import PromptTemplate, make_template, style_for_model

__all__ = [
    "CodeTestSpec", "DATASETS", "DataChangedError", "DataSource", "DatasetUnavailableError",
    "Example", "FINGERPRINT_KEY", "PromptTemplate", "check_prompt_lengths", "describe_source",
    "fingerprint", "register_dataset", "restore_position",
    "ResumableIterator", "epoch_order", "hub_id", "load_dataset", "make_template", "options",
    "parse_tests", "replicate", "style_for_model",
]
