"""benchmarks/response_parsers.py: every parser of a thread channel, on the 1 MB adversarial
text that is its worst (measured), ends in seconds (a quadratic one takes minutes)."""

import time

import pytest

BENCH = "response_parsers"
WORST = {"code_channels.extract_program": "```\n", "math.extract_answer": "\\boxed{1}",
         "math.format_reward": "\\boxed{", "alce.split_sentences": ". ",
         "alce.remove_citations+normalize_answer": "a. ", "demo.extract_answer": "<a>",
         "demo.fmt": " "}


def test_every_parser_is_listed(bench):
  assert set(bench.PARSERS) == set(WORST) and set(WORST.values()) <= set(bench.ATTACKS)


@pytest.mark.parametrize("name", sorted(WORST))
def test_each_parser_takes_seconds_on_1_mb(bench, name):
  text = bench.adversarial(WORST[name], 1 << 20)
  t0 = time.perf_counter()
  bench.PARSERS[name](text)
  assert time.perf_counter() - t0 < 10.0  # 0.03-3.2 s at load ~13; quadratic: minutes
