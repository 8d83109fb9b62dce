"""`load_dataset(name, ...)`: data sets by registry name (docs/style.md §4, issue section 4).

| name                       | hub id                                   | splits        |
|----------------------------|------------------------------------------|---------------|
| big_math_hard              | SynthLabsAI/Big-Math-RL-Verified         | train, test   |
| big_math_llama_calibrated  | SynthLabsAI/Big-Math-RL-Verified         | train, test   |
| numina_math                | AI-MO/NuminaMath-1.5 (10K subset)        | train         |
| math500                    | HuggingFaceH4/MATH-500                   | test          |
| amc                        | AI-MO/aimo-validation-amc (x32)          | train (= eval)|
| aime                       | AI-MO/aimo-validation-aime (2024, x32)   | train (= eval)|
| deepcoder                  | agentica-org/DeepCoder-Preview-Dataset   | train, test   |
| helpsteer2                 | nvidia/HelpSteer2                        | train, validation |
| alce_asqa                  | princeton-nlp/ALCE-data (asqa, 80/20)    | train, test   |
| alce_eli5                  | princeton-nlp/ALCE-data (eli5, 80/20)    | train, test   |

Options are the keyword arguments of the loader (see each loader's docstring); every
loader takes `path=` (a local copy, tried instead of the hub) and `cache_dir=`. Plugin modules
(`config.plugins`) add their own with `@register_dataset(name, ...)` on a loader
`fn(*, split, path, **options) -> list[Example]` (the demo's `arithmetic`, `mr_rl.demo.task`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

from mr_rl.data import alce, code, helpsteer, math
from mr_rl.data.example import Example
from mr_rl.registry import Registry


@dataclasses.dataclass(frozen=True)
class DataSource:
  """A registered data set: its loader, the hub id it reads, and its default split."""
  load: Callable[..., list[Example]]
  hub: str
  default_split: str


DATASETS: Registry[DataSource] = Registry("data set")


def register_dataset(name: str, *, hub: str = "", default_split: str = "train"):
  """Decorator: registers a loader `fn(*, split, path, **options)` as data set `name`."""
  def deco(fn):
    DATASETS.add(name, DataSource(fn, hub, default_split))
    return fn
  return deco


for _name, _load, _hub, _split in (
    ("big_math_hard", functools.partial(math.load_big_math, subset="hard"),
     math.BIG_MATH_HUB, "train"),
    ("big_math_llama_calibrated", functools.partial(math.load_big_math, subset="llama_calibrated"),
     math.BIG_MATH_HUB, "train"),
    ("numina_math", math.load_numina_math, math.NUMINA_HUB, "train"),
    ("math500", math.load_math500, math.MATH500_HUB, "test"),
    ("amc", functools.partial(math.load_aimo_validation, "amc"), math.AMC_HUB, "train"),
    ("aime", functools.partial(math.load_aimo_validation, "aime", years=(2024,)), math.AIME_HUB,
     "train"),
    ("deepcoder", code.load_deepcoder, code.DEEPCODER_HUB, "train"),
    ("helpsteer2", helpsteer.load_helpsteer2, helpsteer.HELPSTEER2_HUB, "train"),
    ("alce_asqa", functools.partial(alce.load_alce, "asqa"), alce.ALCE_HUB, "train"),
    ("alce_eli5", functools.partial(alce.load_alce, "eli5"), alce.ALCE_HUB, "train")):
  DATASETS.add(_name, DataSource(_load, _hub, _split))


def hub_id(name: str) -> str:
  """The hub id behind a registry name."""
  return DATASETS.get(name).hub


def options(name: str) -> tuple[str, ...]:
  """Option names accepted by `load_dataset(name, ...)` besides `split` and `path`."""
  params = inspect.signature(DATASETS.get(name).load).parameters
  return tuple(p for p, v in params.items()
               if v.kind == v.KEYWORD_ONLY and p not in ("split", "path", "subset"))


def load_dataset(name: str, *, path: str | None = None, split: str | None = None,
                 **opts: Any) -> list[Example]:
  """Loads a data set by registry name as a list of `Example`s.

  Args:
    name: a registered name (`DATASETS.names()`).
    path: local copy to read instead of the hub (must exist when given).
    split: split name (None: the data set's default, see the module table).
    **opts: loader options (`options(name)` lists them).

  Raises:
    ValueError: unknown name or option.
    FileNotFoundError: `path` does not exist.
    DatasetUnavailableError: no `path` and the hub copy cannot be read.
  """
  source = DATASETS.get(name)
  unknown = sorted(set(opts) - set(options(name)))
  if unknown:
    raise ValueError(f"unknown option(s) {unknown} for data set {name!r}; valid: "
                     f"{list(options(name))}")
  return source.load(split=split or source.default_split, path=path, **opts)
