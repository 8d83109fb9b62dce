"""The sandbox against a policy that draws on what the whole machine shares (issue 33 items 1-4).

Each attack runs for real beside an honest control: pseudo-terminals (one kernel count for
every devpts instance), per-uid kernel accounting (descriptors in flight over Unix sockets,
pipe pages), the page cache as an oracle across runs, and an interpreter a run cannot find
when the trainer runs from a virtual environment.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from mr_rl.rewards import sandbox

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="per-slot uids and the full sandbox need root")
RELAXED = {"require_privilege_drop": False, "memory_limit": "per-process", "cpus": None}


def _config(**kw):
  return sandbox.SandboxConfig(**({} if ROOT else RELAXED), **kw)


# ------------------------------------------------------------- the interpreter (item 4)
_REEXEC = textwrap.dedent("""
    import multiprocessing, os, subprocess, sys
    def f():
      out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True,
                           text=True, check=True).stdout.strip()
      ctx = multiprocessing.get_context("spawn")
      with ctx.Pool(2) as pool:
        got = pool.map(abs, [-1, -2, 3])
      p = ctx.Process(target=os.getpid)
      p.start()
      p.join()
      return [out, got, p.exitcode, os.path.exists(sys.executable)]
    """)


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory):
  """A fresh virtual environment's interpreter, as `python -m venv` makes it (a symlink)."""
  d = tmp_path_factory.mktemp("venv")
  base = getattr(sys, "_base_executable", sys.executable)
  subprocess.run([base, "-m", "venv", "--without-pip", str(d)], check=True, timeout=120)
  return str(d / "bin" / "python")


def test_a_program_that_starts_python_passes_when_the_trainer_runs_from_a_venv(venv_python):
  tests = sandbox.CodeTests.call("f", [[]], [["42", [1, 2, 3], 0, True]])
  for python in (sys.executable, venv_python):
    r = sandbox.run(_REEXEC, tests, timeout_s=30, config=_config(python=python))
    assert r.passed, (python, r.error)
