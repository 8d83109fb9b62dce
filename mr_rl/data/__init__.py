"""Data sets, prompt templates and resumable iteration.

Public API:
  load_dataset(name, *, path=None, split=None, **options) -> list[Example]
  DATASETS (registry; register_dataset), Example, replicate, CodeTestSpec, parse_tests
  PromptTemplate, make_template, style_for_model
  ResumableIterator (state() / restore(state))
  DatasetUnavailableError
"""

from mr_rl.data.code import CodeTestSpec, parse_tests
from mr_rl.data.example import Example, replicate
from mr_rl.data.iterator import ResumableIterator, epoch_order
from mr_rl.data.registry import (DATASETS, DataSource, hub_id, load_dataset, options,
                                 register_dataset)
from mr_rl.data.sources import DatasetUnavailableError
from mr_rl.data.templates import PromptTemplate, make_template, style_for_model

__all__ = [
    "CodeTestSpec", "DATASETS", "DataSource", "DatasetUnavailableError", "Example",
    "PromptTemplate", "register_dataset",
    "ResumableIterator", "epoch_order", "hub_id", "load_dataset", "make_template", "options",
    "parse_tests", "replicate", "style_for_model",
]
