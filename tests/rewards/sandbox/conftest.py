"""Fixtures shared by the sandbox tests."""

import os
import shutil
import tempfile

import pytest


@pytest.fixture
def host_dir():
  """A fresh world-writable host directory that the sandbox sees (not under its private /tmp,
  /var/tmp, /dev/shm, nor the hidden /root and /home; the checkout may be under either), removed
  afterwards; the test is skipped where there is none."""
  private = ("/tmp", "/var/tmp", "/dev/shm", "/root", "/home")
  for base in ("/var/lib", "/srv", "/opt", "/mnt", os.path.dirname(os.path.abspath(__file__))):
    real = os.path.realpath(base)
    if any(real == h or real.startswith(h + "/") for h in private):
      continue
    if os.path.isdir(real) and os.access(real, os.W_OK):
      d = tempfile.mkdtemp(prefix=".mr_rl_sandbox_test_", dir=real)
      os.chmod(d, 0o1777)
      yield d
      shutil.rmtree(d)
      return
  pytest.skip("no host directory outside the sandbox's private and hidden mounts is writable here")
