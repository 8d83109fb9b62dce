"""The common record every loader returns (docs/methods.md §7 / issue section 4).

An `Example` is one prompt of one data set, before any model-specific template is
applied: the user-visible turns (`messages`), the reference the reward channels need
(`reference`, plus structured extras in `metadata` such as code tests, ALCE claims,
qa_pairs and passages), and a stable id. Templates (`mr_rl.data.templates`) turn it
into the model's input string.
"""

from __future__ import annotations

import dataclasses
import hashlib
import types
from typing import Any, Mapping, Sequence

_ROLES = ("system", "user", "assistant")


def _freeze(value: Any) -> Any:
  """Recursively turns dicts into read-only mappings and lists into tuples."""
  if isinstance(value, Mapping):
    return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
  if isinstance(value, (list, tuple)):
    return tuple(_freeze(v) for v in value)
  return value


def thaw(value: Any) -> Any:
  """Inverse of the freezing done by `Example`: plain dicts and lists (for JSON)."""
  if isinstance(value, Mapping):
    return {k: thaw(v) for k, v in value.items()}
  if isinstance(value, tuple):
    return [thaw(v) for v in value]
  return value


@dataclasses.dataclass(frozen=True, eq=True)
class Example:
  """One prompt of a data set, model-agnostic.

  Attributes:
    uid: stable id, `"<dataset>/<row id>"` (plus `"#r<k>"` for replicated records).
    dataset: registry name of the loader that produced it.
    messages: conversation so far, a tuple of `{"role", "content"}` mappings with roles
      `user`/`assistant` (no system turn: that belongs to the template); the last
      turn is always `user`.
    reference: the reference answer text (math answer, ALCE long answer, ...) or None.
    metadata: read-only mapping with everything else the reward channels need
      (`tests` for code, `qa_pairs`/`claims`/`docs` for ALCE, source fields, ...).
  """

  uid: str
  dataset: str
  messages: tuple[Mapping[str, str], ...]
  reference: str | None = None
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not isinstance(self.uid, str) or not self.uid:
      raise ValueError(f"uid must be a non-empty string, got {self.uid!r}")
    if not self.messages:
      raise ValueError(f"messages of {self.uid} must hold at least one user turn")
    msgs = []
    for m in self.messages:
      if not isinstance(m, Mapping) or set(m) != {"role", "content"}:
        raise ValueError(f"each message of {self.uid} needs exactly role and content, got {m!r}")
      if m["role"] not in _ROLES or not isinstance(m["content"], str):
        raise ValueError(f"bad message in {self.uid}: role must be one of {_ROLES}, content a str")
      msgs.append(types.MappingProxyType(dict(m)))
    if msgs[-1]["role"] != "user":
      raise ValueError(f"messages of {self.uid} must end with a user turn")
    object.__setattr__(self, "messages", tuple(msgs))
    object.__setattr__(self, "metadata", _freeze(dict(self.metadata)))

  @property
  def prompt(self) -> str:
    """The content of the last user turn (the whole prompt for single-turn data)."""
    return self.messages[-1]["content"]

  def as_mapping(self) -> dict[str, Any]:
    """Flat dict for reward channels (`mr_rl.rewards.runner` examples_B entries):
    the metadata fields plus `uid`, `dataset` and `reference`."""
    out = dict(self.metadata)
    out.update(uid=self.uid, dataset=self.dataset, reference=self.reference)
    return out

  @classmethod
  def single_turn(cls, uid: str, dataset: str, prompt: str, reference: str | None = None,
                  **metadata: Any) -> "Example":
    """Builds a one-user-turn example."""
    return cls(uid=uid, dataset=dataset, messages=({"role": "user", "content": prompt},),
               reference=reference, metadata=metadata)

  def replicate(self, k: int) -> "Example":
    """The k-th replica of this example (uid suffixed with `#r<k>`, metadata["replica"])."""
    meta = dict(self.metadata)
    meta["replica"] = k
    return dataclasses.replace(self, uid=f"{self.uid}#r{k}", metadata=meta)


def replicate(examples: Sequence[Example], times: int) -> list[Example]:
  """Repeats each example `times` times, replicas adjacent (AMRP appendix B.1, Table 8).

  AMRP evaluates AMC and AIME 2024 with every unique problem replicated 32 times and
  one greedy response per record, averaging the metric over all records.
  """
  if not isinstance(times, int) or times < 1:
    raise ValueError(f"replicas must be a positive int, got {times!r}")
  if times == 1:
    return list(examples)
  return [ex.replicate(k) for ex in examples for k in range(times)]


def stable_hash(*parts: Any) -> int:
  """64-bit hash of `parts` that is stable across processes and Python versions."""
  h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8"))
  return int.from_bytes(h.digest()[:8], "big")
