r"""N processes of one multi-process mr_rl job on this machine, each with its own fake CPU
devices, over localhost (gloo collectives): how a pod runs, for debugging on one machine.

    python launch/local_multiprocess.py N DEVICES_PER_PROCESS CONFIG WORKDIR [mr_rl.main flags]
    python launch/local_multiprocess.py 2 4 configs/demo.py:smoke /tmp/mp --config.pipeline=train

Process i runs `python -m mr_rl.main --multihost --coordinator_address=127.0.0.1:PORT
--num_processes=N --process_id=i` with --xla_force_host_platform_device_count=D added to its
XLA_FLAGS and JAX_PLATFORMS=cpu, its output in WORKDIR/logs/process-<i>.log. It waits for all
of them and exits with the first non-zero status (a failed process stops the others within
mr_rl.distributed.HEARTBEAT_TIMEOUT_S). `launch` is the same for any command (tests use it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Callable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  """A free TCP port on 127.0.0.1."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(num_processes: int, devices: int, command: Callable[[int, int], Sequence[str]],
           logdir: str, timeout_s: float | None = None, env: dict | None = None) -> list[int]:
  """Runs `command(process_id, port)` for each process with `devices` CPU devices, output in
  `logdir`/process-<i>.log; returns their exit statuses (a process still running at
  `timeout_s` is killed: status -9)."""
  os.makedirs(logdir, exist_ok=True)
  env = dict(os.environ if env is None else env)
  # The device count goes after the XLA_FLAGS the caller has (compile options), so it wins.
  env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", XLA_FLAGS=(
      f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}").strip())
  port = free_port()
  procs = []
  for i in range(num_processes):
    with open(os.path.join(logdir, f"process-{i}.log"), "w") as log:
      procs.append(subprocess.Popen(list(command(i, port)), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=REPO))
  deadline = None if timeout_s is None else time.monotonic() + timeout_s
  try:
    for p in procs:
      p.wait(timeout=None if deadline is None else max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    pass
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [p.returncode for p in procs]


def main(argv: Sequence[str]) -> int:
  if len(argv) < 4:
    print(__doc__, file=sys.stderr)
    return 2
  n, devices, config, workdir, *flags = argv
  n, devices = int(n), int(devices)
  command = lambda i, port: [sys.executable, "-m", "mr_rl.main", f"--config={config}",
                             f"--workdir={workdir}", "--multihost",
                             f"--coordinator_address=127.0.0.1:{port}",
                             f"--num_processes={n}", f"--process_id={i}", *flags]
  logdir = os.path.join(workdir, "logs")
  print(f"[local_multiprocess] {n} processes x {devices} CPU devices; logs in {logdir}",
        file=sys.stderr)
  statuses = launch(n, devices, command, logdir)
  return next((s for s in statuses if s), 0)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
