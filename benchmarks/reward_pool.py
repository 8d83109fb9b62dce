"""Start-up cost of the reward worker pool: what a run pays for a fresh
pool and for the worker replaced after a timeout.

Measures, through the public `mr_rl.rewards.math.accuracy` only (so it runs on any version
of the pool): the first call of a process (zygote / pool start, math-verify preloaded), the
median warm call, and the median first call after a call that timed out (its worker killed
and replaced). Run it from a directory without an `mr_rl` checkout in it.

  python benchmarks/reward_pool.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from mr_rl.rewards import math as mr
from mr_rl.rewards.process import pool as pl

OK = "\\boxed{\\frac{2}{4}}"
HANGS = "\\boxed{9^{9^{9^{9}}}}"  # sympy evaluates the tower in C: only a kill stops it


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  t0 = time.perf_counter()
  assert mr.accuracy(OK, "0.5") == 1.0
  cold = time.perf_counter() - t0
  warm = []
  for _ in range(20):
    t0 = time.perf_counter()
    mr.accuracy(OK, "0.5")
    warm.append(time.perf_counter() - t0)
  after_kill = []
  for _ in range(args.repeats):
    try:
      mr.accuracy(HANGS, "1", timeout_s=0.5)
      raise AssertionError("expected a timeout")
    except pl.RewardTimeoutError:
      pass
    t0 = time.perf_counter()
    assert mr.accuracy(OK, "0.5") == 1.0
    after_kill.append(time.perf_counter() - t0)
  print(f"cold first call {cold:.3f} s; warm call median {statistics.median(warm) * 1e3:.1f} ms; "
        f"first call after a kill median {statistics.median(after_kill):.3f} s "
        f"(all {[round(x, 3) for x in after_kill]})")


if __name__ == "__main__":
  main()
