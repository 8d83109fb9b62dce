"""Every parser a "thread" reward channel applies to a response, timed on 1 MB of adversarial
text (issue 41, item 4: parsing is linear in the response's length).

  python benchmarks/response_parsers.py [--size_mb 1]

Prints one row per (parser, attack): seconds for one call. A quadratic parser shows here as
minutes (the old code-fence regex took 2.5-4.3 s on 50 KB, so about 20 min on 1 MB).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout

from mr_rl.demo import task as demo_task  # noqa: E402
from mr_rl.rewards import alce, code_channels, math as math_rewards  # noqa: E402

# Parsers run on a response inside thread channels (math-verify itself runs in worker
# processes, killed at their timeout).
PARSERS = {
    "code_channels.extract_program": code_channels.extract_program,
    "math.extract_answer": math_rewards.extract_answer,
    "math.format_reward": math_rewards.format_reward,
    "alce.split_sentences": alce.split_sentences,
    "alce.remove_citations+normalize_answer":
        lambda t: alce.normalize_answer(alce.remove_citations(t)),
    "demo.extract_answer": demo_task.extract_answer,
    "demo.fmt": demo_task.fmt,
}
# Repeated units: unclosed openers, separators, escapes, runs the old regexes retried.
ATTACKS = ("```x\n", "```\n", "```py\nx\n", "\\boxed{", "\\boxed{1}", "{", "\\\\", "<answer>",
           "</answer>", "<reasoning>", ". ", "Mr. ", "a. ", " [1]. A", "[1", "<a>", "</r>=", "<r>",
           ".", " ")


def adversarial(unit: str, size: int) -> str:
  """`unit` repeated to exactly `size` characters."""
  return (unit * (size // len(unit) + 1))[:size]


def time_parser(parser, text: str) -> float:
  """Seconds of one call of `parser(text)`."""
  t0 = time.perf_counter()
  parser(text)
  return time.perf_counter() - t0


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--size_mb", type=float, default=1.0)
  size = int(ap.parse_args().size_mb * 2**20)
  print("parser | attack | seconds")
  for name, parser in PARSERS.items():
    times = [(time_parser(parser, adversarial(a, size)), a) for a in ATTACKS]
    for t, a in times:
      print(f"{name} | {a!r} | {t:.3f}", flush=True)
    print(f"{name} | worst: {max(times)[1]!r} | {max(times)[0]:.3f}", flush=True)


if __name__ == "__main__":
  main()
