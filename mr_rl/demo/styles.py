"""Which solution style a policy writes, per chain length (the demo's regimes rest on it).

    python -m mr_rl.demo.styles mr_rl/demo/assets/base_policy --min_terms 3 --max_terms 6

Samples `--samples` responses at temperature 1 under the demo's 48-token cap on generated
problems and prints, per chain length and style (`response_style`), the share of responses,
their accuracy and their mean length in tokens (EOS included). The `brief` task needs
the base policy to answer the same problems both long (restated) and short (chained), mostly
long, with both styles about equally accurate (docs/demo.md "Design").
"""

from __future__ import annotations

import argparse
import re

import jax
import numpy as np

from mr_rl import models, sampling
from mr_rl.demo import task, warmstart

STYLE_NAMES = ("direct", "chained", "concise", "restated", "verbose", "tool", "runaway", "other")
_QUESTION = re.compile(r"\d(?:[+-]\d)+")
_STEP = re.compile(r"-?\d+[+-]\d=-?\d+")
_CHAIN = re.compile(r"\d[+-]\d=-?\d+(?:[+-]\d=-?\d+)+")


def response_style(response: str) -> str:
  """The style of a response (`task.Problem.solution`'s names): 'direct' (empty reasoning),
  'chained' (two or more operations in one chain), 'concise' (steps, each once; a 2-term
  chained answer is one step, so 'concise'), 'restated' (the question, then steps),
  'verbose' (each step twice), 'tool' (the question alone: a calculator call), 'runaway' (no closing `</r>`: a loop or a response cut by the
  cap), else 'other'."""
  head, sep, _ = response.partition("</r>")
  if not sep:
    return "runaway"
  if not head.startswith("<r>"):
    return "other"
  reasoning = head[len("<r>"):]
  if not reasoning:
    return "direct"
  if _CHAIN.fullmatch(reasoning):
    return "chained"
  if _QUESTION.fullmatch(reasoning):
    return "tool"
  steps = reasoning.split(";")
  if len(steps) > 1 and _QUESTION.fullmatch(steps[0]) and all(_STEP.fullmatch(s)
                                                              for s in steps[1:]):
    return "restated"
  if all(_STEP.fullmatch(s) for s in steps):
    doubled = len(steps) % 2 == 0 and steps[::2] == steps[1::2]
    return "verbose" if doubled and len(steps) > 1 else "concise"
  return "other"


def style_table(path: str, *, min_terms: int, max_terms: int, samples: int = 1024,
                seed: int = 0, max_new_tokens: int = 48) -> dict:
  """{num_terms: {style: (share, accuracy, mean length)}} of the checkpoint at `path`."""
  model, params = models.load_pretrained(path)
  tok = models.load_tokenizer(path)
  rng = np.random.default_rng([seed, 2])  # neither the train (0) nor the test (1) draw
  probs = task.sample_problems(rng, samples, min_terms=min_terms, max_terms=max_terms)
  p_tok, p_mask = warmstart.encode_batch(tok, [p.prompt for p in probs])
  out = sampling.generate(model, params, p_tok, p_mask, key=jax.random.PRNGKey(seed),
                          max_new_tokens=max_new_tokens, eos_id=tok.eos_token_id,
                          pad_id=tok.pad_token_id)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  rows = {}
  for p, t, n in zip(probs, tokens, lengths):
    text = tok.decode(t[:n], skip_special_tokens=False).replace(tok.eos_token, "")
    rows.setdefault(len(p.terms), []).append(
        (response_style(text), task.accuracy(text, p.answer), int(n)))
  table = {}
  for k, rs in sorted(rows.items()):
    table[k] = {}
    for s in STYLE_NAMES:
      sel = [(a, n) for st, a, n in rs if st == s]
      if sel:
        acc, n = np.mean(sel, axis=0)
        table[k][s] = (len(sel) / len(rs), float(acc), float(n))
  return table


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("path", help="checkpoint directory (a warm start's --out)")
  ap.add_argument("--min_terms", type=int, default=2)
  ap.add_argument("--max_terms", type=int, default=7)
  ap.add_argument("--samples", type=int, default=1024)
  ap.add_argument("--seed", type=int, default=0)
  a = ap.parse_args(argv)
  table = style_table(a.path, min_terms=a.min_terms, max_terms=a.max_terms, samples=a.samples,
                      seed=a.seed)
  print("| terms | " + " | ".join(STYLE_NAMES) + " |")
  print("|---|" + "---|" * len(STYLE_NAMES))
  for k, row in table.items():
    cells = [f"{row[s][0]:.2f} (acc {row[s][1]:.2f}, {row[s][2]:.1f} tok)" if s in row else "-"
             for s in STYLE_NAMES]
    print(f"| {k} | " + " | ".join(cells) + " |")
  return table


if __name__ == "__main__":
  main()
