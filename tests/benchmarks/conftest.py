"""The fixture every benchmark test uses: the benchmark script the test module names, imported."""

import importlib.util
import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks")


@pytest.fixture(scope="module")
def bench(request):
  """benchmarks/<BENCH>.py imported as a module (BENCH: a global of the test module), with the
  benchmarks folder on sys.path while the module's tests run (a reward channel's import path
  such as `async_step:humaneval_canonical` names a module there)."""
  name = request.module.BENCH
  sys.path.insert(0, BENCHMARKS)
  spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  yield mod
  sys.path.remove(BENCHMARKS)
