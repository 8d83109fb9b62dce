"""HelpSteer2 prompts for open-ended alignment (AMRP appendix B.1).

Hub: nvidia/HelpSteer2, splits `train` / `validation`, columns prompt, response,
helpfulness, correctness, coherence, complexity, verbosity (0-4 ratings). Each prompt
appears with several responses; AMRP trains on prompts, so rows are reduced to unique
prompts (first occurrence order) and the ratings of all responses are kept in
`metadata["ratings"]`. Multi-turn prompts store earlier turns inline, separated by
`<extra_id_1>User` / `<extra_id_1>Assistant` lines; they become chat messages.
"""

from __future__ import annotations

import re

from mr_rl.data import sources
from mr_rl.data.example import Example

HELPSTEER2_HUB = "nvidia/HelpSteer2"
ATTRIBUTES = ("helpfulness", "correctness", "coherence", "complexity", "verbosity")
_TURN = re.compile(r"\n?<extra_id_1>(User|Assistant)\n")


def split_turns(prompt: str) -> tuple[dict[str, str], ...]:
  """HelpSteer2 prompt text -> chat messages (first turn is the user's).

  Raises:
    ValueError: turns do not alternate user/assistant or the last is not the user's.
  """
  parts = _TURN.split(prompt)
  msgs = [{"role": "user", "content": parts[0].strip()}]
  for role, content in zip(parts[1::2], parts[2::2]):
    msgs.append({"role": role.lower(), "content": content.strip()})
  for a, b in zip(msgs, msgs[1:]):
    if a["role"] == b["role"]:
      raise ValueError(f"HelpSteer2 prompt has two consecutive {a['role']} turns: {prompt[:80]!r}")
  if msgs[-1]["role"] != "user":
    raise ValueError(f"HelpSteer2 prompt does not end with a user turn: {prompt[:80]!r}")
  return tuple(msgs)


def load_helpsteer2(*, split: str = "train", path: str | None = None,
                    cache_dir: str | None = None) -> list[Example]:
  """Unique HelpSteer2 prompts of `split`, as chat examples (no reference answer)."""
  name = "helpsteer2"
  ds = sources.read_rows(name, HELPSTEER2_HUB, path=path, split=split, cache_dir=cache_dir)
  sources.require_columns(ds, ("prompt", "response") + ATTRIBUTES, name)
  ratings: dict[str, list[dict[str, float]]] = {}
  for r in ds:
    ratings.setdefault(r["prompt"], []).append({a: float(r[a]) for a in ATTRIBUTES})
  return [Example(uid=f"{name}/{sources.stable_hash(p):016x}", dataset=name,
                  messages=split_turns(p), reference=None,
                  metadata={"ratings": rs, "num_turns": 1 + p.count("<extra_id_1>User")})
          for p, rs in ratings.items()]
