"""Runs untrusted programs in the sandbox: ``run``, ``run_many``, ``sandbox_capabilities``.

See the package docstring (``mr_rl.rewards.sandbox``) for the isolation each run gets and what
``runtime_s`` measures.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import secrets
import time
from typing import Sequence

from mr_rl.rewards.sandbox import capabilities as caps_lib
from mr_rl.rewards.sandbox.capabilities import (SandboxCapabilities, cgroup_spec, harness_cfg,
                                                make_workdir, plan, slot_uids)
from mr_rl.rewards.sandbox.host import ForkServer, SandboxError, exchange, rmtree, scrubbed_env
from mr_rl.rewards.sandbox.spec import (SMALL_TEST_TIMEOUT_S, CodeResult, CodeTests, SandboxConfig,
                                        require_str, require_timeout)


def sandbox_capabilities(config: SandboxConfig | None = None) -> SandboxCapabilities:
  """Probes (once per config) which isolation ``run`` can use here (see ``capabilities``).

  Tries, in order: as root, a user namespace mapping only the sandbox uid plus new network,
  pid, mount, IPC and UTS namespaces and a uid drop; as a normal user, an unprivileged user
  namespace with the same namespaces; finally no namespaces. Each attempt runs the real
  harness, and with ``memory_limit="cgroup"`` also creates, joins and removes a memory cgroup.
  """
  return caps_lib.capabilities(config or SandboxConfig())


# ----------------------------------------------------------------------------- runs
def server_pool(config: SandboxConfig, caps: SandboxCapabilities) -> tuple:
  """The ``ForkServer.acquire`` arguments of ``config``'s runs (one pool of servers)."""
  return (config.python, cgroup_spec(config), (config.uid, config.gid),
          slot_uids(config, caps.privilege_drop))


def run(program: str, tests: CodeTests, *, timeout_s: float = SMALL_TEST_TIMEOUT_S,
        config: SandboxConfig | None = None) -> CodeResult:
  """Runs ``program`` against ``tests`` in a fresh sandbox.

  Args:
    program: Python source (for HumanEval: prompt + completion).
    tests: the problem's tests.
    timeout_s: per-test wall-clock limit (TAG: 10 s small, 30 s medium tests);
      loading the program has its own ``timeout_s``, HumanEval's ``check`` is
      one test.
    config: sandbox limits and policy.

  Returns:
    The verdict; failures of the program are verdicts, never exceptions. Every run
    returns within ``timeout_s * (n_tests + 1) + config.startup_grace_s`` (plus process
    start-up of a new fork server), whatever the program returns or prints.

  Raises:
    SandboxError: the sandbox cannot provide the isolation ``config`` requires.
  """
  require_str("program", program)
  if not isinstance(tests, CodeTests):
    raise TypeError(f"tests must be a CodeTests, got {type(tests).__name__}")
  require_timeout("timeout_s", timeout_s)
  config = config or SandboxConfig()
  caps = plan(config)
  n_tests = tests.num_tests
  budget = timeout_s * (n_tests + 1)
  limits = {"memory_bytes": config.memory_bytes, "max_processes": config.max_processes,
            "max_file_bytes": config.max_file_bytes, "max_open_files": config.max_open_files,
            "cpu_s": int(math.ceil(budget)) + 1,
            "max_pending_signals": config.max_pending_signals, "max_mq_bytes": config.max_mq_bytes}
  nonce = secrets.token_hex(16)
  job = json.dumps({"nonce": nonce, "program": program, "tests": tests.payload(),
                    "n_tests": n_tests, "timeout_s": float(timeout_s)}).encode()
  wall_s = config.startup_grace_s + budget  # whatever the program returns or prints
  with ForkServer.acquire(*server_pool(config, caps)) as server:
    workdir = make_workdir(config, caps.privilege_drop, server.uid)
    try:
      cfg = harness_cfg(config, "run", caps.namespaces, caps.privilege_drop, workdir, limits,
                        uid=server.uid)
      home = "/tmp" if caps.namespaces else workdir
      spawned = server.spawn(cfg, scrubbed_env(home), workdir)
      out, err, timed_out, wall = exchange(*spawned, job, wall_s)
      if caps.namespaces is None:  # no pid namespace: let stragglers die before removing it
        time.sleep(0.01)
    finally:
      rmtree(workdir)
  if timed_out:
    return CodeResult(False, wall, f"wall-clock limit of {wall_s:.1f} s exceeded", 0, n_tests, True)
  try:
    verdict = json.loads(out)
  except ValueError:
    verdict = None
  if not isinstance(verdict, dict):
    return CodeResult(False, wall, "supervisor exited without a verdict; stderr: "
                      + err.decode(errors="replace")[-500:], 0, n_tests)
  if "setup_error" in verdict:
    raise SandboxError(f"sandbox set-up failed: {verdict['setup_error']}")
  if verdict.get("nonce") != nonce:
    return CodeResult(False, wall, "verdict without the run's nonce", 0, n_tests)
  n_passed = int(verdict.get("n_passed", 0))
  passed = verdict.get("passed") is True and n_passed == n_tests == verdict.get("n_tests")
  error = verdict.get("error") if not passed else None
  if not passed and error is None:
    error = "not every test passed"
  return CodeResult(passed, float(verdict["runtime_s"]), error, n_passed, n_tests,
                    bool(verdict.get("timed_out")))


def run_many(programs: Sequence[str], tests: Sequence[CodeTests] | CodeTests, *,
             timeout_s: float = SMALL_TEST_TIMEOUT_S, config: SandboxConfig | None = None,
             max_workers: int | None = None) -> list[CodeResult]:
  """``run`` over many programs on a pool of ``max_workers`` threads (default: CPU count).

  ``tests`` is one ``CodeTests`` per program, or one shared by all. Each run is
  its own sandbox, so at most ``max_workers`` sandboxes exist at a time.
  """
  programs = list(programs)
  tests_list = [tests] * len(programs) if isinstance(tests, CodeTests) else list(tests)
  if len(tests_list) != len(programs):
    raise ValueError(f"tests must match programs in length, got {len(tests_list)} and {len(programs)}")
  max_workers = max_workers or os.cpu_count() or 1
  if not isinstance(max_workers, int) or max_workers <= 0:
    raise ValueError(f"max_workers must be a positive int, got {max_workers!r}")
  config = config or SandboxConfig()
  plan(config)  # fail once, up front
  with cf.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox") as pool:
    return list(pool.map(lambda pt: run(pt[0], pt[1], timeout_s=timeout_s, config=config),
                         zip(programs, tests_list)))
