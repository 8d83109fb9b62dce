"""Fixtures shared by the test modules."""

import pytest

from mr_rl.demo import warmstart


@pytest.fixture(scope="session")
def base_policy(tmp_path_factory):
  """A tiny base policy for the arithmetic task (3 warm-start steps; `mr_rl.demo.warmstart`)."""
  out = str(tmp_path_factory.mktemp("base_policy"))
  warmstart.train(warmstart.WarmStartConfig(steps=3, batch_size=8, d_model=32, n_layers=1),
                  out, log_every=0)
  return out
