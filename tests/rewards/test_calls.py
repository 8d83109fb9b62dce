"""Tests for mr_rl.rewards.calls: the runner's worker threads."""

import threading

from mr_rl.rewards.calls import Call, ThreadWorkers
from mr_rl.rewards.channels import RewardChannel

ORDER: list = []
RELEASE, STARTED = threading.Event(), threading.Event()


def _record(response, example, num_tokens):
  del example, num_tokens
  ORDER.append(response)  # the order calls start in
  if response == "block":
    STARTED.set()
    assert RELEASE.wait(60)
  return 1.0


def test_calls_queued_first_run_before_the_others():
  """One thread, busy: calls submitted with first=True run before those already queued, the
  rest in submission order."""
  ORDER.clear()
  RELEASE.clear()
  STARTED.clear()
  workers = ThreadWorkers(1, pool_getter=None, timeout_s=120)
  ch = RewardChannel("record", _record, on_failure=0.0)
  calls = [Call(ch, 0, (r, {}, 1), (0, i)) for i, r in enumerate(["block", "a", "b", "c"])]
  workers.submit(calls[0])
  assert STARTED.wait(60)  # the one thread is busy from here on
  for c in calls[1:3]:
    workers.submit(c)
  workers.submit(calls[3], first=True)
  RELEASE.set()
  workers.wait(calls)
  assert ORDER == ["block", "c", "a", "b"]
  assert all(c.done and c.error is None and c.value == 1.0 for c in calls)
