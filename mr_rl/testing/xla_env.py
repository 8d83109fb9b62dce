"""XLA_FLAGS for test processes: fast compiles, and the host CPU split into fake devices.

Nothing here (nor `mr_rl.testing` itself) imports jax, so a test file that runs
itself as a worker script on 8 fake devices sets the flags before its first `import jax`; XLA
reads them when its CPU backend starts:

    if __name__ == "__main__":
      from mr_rl.testing import xla_env
      xla_env.use_cpu_devices(8)

    import jax  # noqa: E402
    ...

    def test_sharded(tmp_path):
      res = xla_env.run_worker(__file__, str(tmp_path), timeout=600)  # JSON of its last line

    if __name__ == "__main__":
      print(json.dumps(_worker(sys.argv[1])))
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mr_rl

# XLA:CPU at optimisation level 0 compiles the tests' many tiny programs about 2x faster and runs
# them as fast at this size (docs/testing.md "Keeping CI fast").
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
# The checkout this mr_rl was imported from: a worker imports the same one.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(mr_rl.__file__)))


def use_fast_compile() -> None:
  """Puts FAST_COMPILE ahead of this process's XLA_FLAGS (children inherit them), unless they hold
  it already; the caller's own flags come after it, so they win. Call before a JAX backend starts.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if FAST_COMPILE not in flags:
    os.environ["XLA_FLAGS"] = f"{FAST_COMPILE} {flags}".strip()


def use_cpu_devices(n: int) -> None:
  """Makes this process's JAX see `n` CPU devices (JAX_PLATFORMS=cpu, the device count behind
  the XLA_FLAGS already set, FAST_COMPILE ahead of them).

  Raises:
    RuntimeError: jax is imported already (its backend may have read XLA_FLAGS).
  """
  if "jax" in sys.modules:
    raise RuntimeError("xla_env.use_cpu_devices must run before jax is imported")
  use_fast_compile()
  os.environ["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={n}"
  os.environ["JAX_PLATFORMS"] = "cpu"


def run_worker(script: str, *args: str, timeout: float) -> dict | list:
  """Runs `python script *args` from the repository root (this mr_rl importable, JAX on the CPU,
  this process's XLA_FLAGS inherited) and returns the JSON its last line of output holds.

  Raises:
    AssertionError: the script failed (its exit status and the end of its stderr).
  """
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
  out = subprocess.run([sys.executable, os.path.abspath(script), *args], capture_output=True,
                       text=True, env=env, cwd=REPO, timeout=timeout)
  if out.returncode != 0:
    raise AssertionError(f"{script} exited with {out.returncode}:\n{out.stderr[-5000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])
