"""benchmarks/accelerator.py --small: every part runs in its own process and reports numbers
(the same code the accelerator runs at full size; transformers' `generate`, a speed peer, is
left to the benchmark itself)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTS = "hardware,compile_cold,compile_warm,decode_static_64,decode_engine_64,policy,e2e"


def test_small_run_reports_every_part():
  out = subprocess.run([sys.executable, "benchmarks/accelerator.py", "--small", "--parts", PARTS],
                       capture_output=True, text=True, timeout=900, cwd=REPO,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  rows = [line.split(" | ") for line in out.stdout.splitlines() if " | " in line]
  by_part = {}
  for part, figure, value in rows[1:]:
    by_part.setdefault(part.strip(), []).append((figure.strip(), value.strip()))
  assert set(by_part) == set(PARTS.split(",")), out.stdout
  for part, figures in by_part.items():
    assert all(fig != "-" for fig, _ in figures), (part, figures)  # no error, no skip
  cold = dict(by_part["compile_cold"])
  assert {"policy_step", "logprob_forward", "sampler", "engine_step"} <= set(cold)
  assert "0 from the cache" in cold["all programs"]
  warm = dict(by_part["compile_warm"])["all programs"]
  compiles = warm.split(", ")[1].split()[0]
  assert f"{compiles} from the cache" in warm                   # warm: everything loaded
  assert "tok/s" in dict(by_part["policy"])["small"]
  assert len(by_part["e2e"]) == 2
