"""Data sets, prompt templates and resumable iteration (issue section 4).

Public API:
  load_dataset(name, *, path=None, split=None, **options) -> list[Example]
  DATASET_NAMES, Example, replicate, CodeTestSpec, parse_tests
  PromptTemplate, make_template, style_for_model
  ResumableIterator (state() / restore(state))
  DatasetUnavailableError
"""

from mr_rl.data.code import CodeTestSpec, parse_tests
from mr_rl.data.example import Example, replicate
from mr_rl.data.iterator import ResumableIterator, epoch_order
from mr_rl.data.registry import DATASET_NAMES, hub_id, load_dataset, options
from mr_rl.data.sources import DatasetUnavailableError
from mr_rl.data.templates import PromptTemplate, make_template, style_for_model

__all__ = [
    "CodeTestSpec", "DATASET_NAMES", "DatasetUnavailableError", "Example", "PromptTemplate",
    "ResumableIterator", "epoch_order", "hub_id", "load_dataset", "make_template", "options",
    "parse_tests", "replicate", "style_for_model",
]
