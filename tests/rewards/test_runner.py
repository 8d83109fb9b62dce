"""Tests for mr_rl.rewards.runner: registry, r[B, G, K], failures -> on_failure, timeouts."""

import concurrent.futures as cf
import os
import sys
import time

import numpy as np
import pytest

from mr_rl.rewards import math as mr
from mr_rl.rewards import runner as rr

RESPONSES_BG = [
    ["<reasoning>r</reasoning><answer>\\frac{1}{2}</answer>", "\\boxed{0.5}", "\\boxed{-2}"],
    ["<reasoning>r</reasoning>\n<answer>-3</answer>", "I think \\boxed{3}", "no answer"],
]
EXAMPLES_B = [{"reference": "\\frac{1}{2}"}, {"reference": "-3"}]
HANG_ALL = False  # the thread-kind test sets it (same process); workers keep False
ONLY_B = np.array([[False, False, True], [False, False, False]])  # response "\\boxed{-2}"
NUM_TOKENS_BG = np.array([[10, 2900, 3500], [199, 200, 0]], np.int32)


# Module-level so "process" channels can pickle them.
def _raise_on_b(response, example, num_tokens):
  del example, num_tokens
  if "boxed" in response:
    raise RuntimeError("bad sample")
  return 1.0


def _sleep_forever_on_b(response, example, num_tokens):
  del example, num_tokens
  if "boxed" in response and (HANG_ALL or "-2" in response):
    time.sleep(600)
  return 2.0


def _exit_worker_on_b(response, example, num_tokens):
  del example, num_tokens
  if "\\boxed{-2}" in response:
    os._exit(3)  # a crashing worker (segfault-like)
  return 3.0


def _token_count(response, example, num_tokens):
  del response, example
  return float(num_tokens)


def test_registry_names_and_errors():
  assert {"accuracy", "format", "length", "brief", "negative"} <= set(rr.available_rewards())
  with pytest.raises(ValueError, match=r"^unknown reward channel 'acuracy'; valid: .*accuracy"):
    rr.get_reward("acuracy")
  with pytest.raises(ValueError, match="reward channel 'format' is already registered"):
    rr.register_reward("format", lambda: None)
  with pytest.raises(ValueError, match="threshold"):
    rr.get_reward("brief", threshold=-1)
  with pytest.raises(ValueError, match="kind"):
    rr.RewardChannel("x", _token_count, "gpu", on_failure=0.0)
  assert rr.get_reward("accuracy").kind == "process"
  assert rr.get_reward("brief", threshold=128).fn("", {}, 127) == 1.0
  assert rr.get_reward("length", max_full=10, zero_at=20).fn("", {}, 15) == 0.5
  # In-process channel bodies (what the workers run), with a custom reference key.
  acc = rr.get_reward("accuracy", reference_key="gold")
  assert acc.fn("\\boxed{\\dfrac{6}{4}}", {"gold": "1.5"}, 0) == 1.0
  assert rr.get_reward("negative").fn("\\boxed{-\\sqrt{3}}", {}, 0) == 1.0


def test_builtin_channels_shape_and_values():
  names = ["accuracy", "format", "length", "negative"]
  runner = rr.RewardRunner(names + [rr.get_reward("brief", threshold=200)], timeout_s=30)
  r_BGK, metrics = runner(RESPONSES_BG, EXAMPLES_B, NUM_TOKENS_BG)
  assert r_BGK.shape == (2, 3, 5) and r_BGK.dtype == np.float32
  for b in range(2):
    for g in range(3):
      resp, nt = RESPONSES_BG[b][g], int(NUM_TOKENS_BG[b, g])
      expected = [mr.accuracy(resp, EXAMPLES_B[b]["reference"]), mr.format_reward(resp),
                  mr.length_reward(nt), mr.negative(resp), mr.brief(nt, 200)]
      np.testing.assert_allclose(r_BGK[b, g], expected, err_msg=f"b={b} g={g}")
  np.testing.assert_array_equal(r_BGK[..., 0], [[1, 1, 0], [1, 0, 0]])  # accuracy
  np.testing.assert_array_equal(r_BGK[..., 3], [[0, 0, 1], [1, 0, 0]])  # negative
  assert metrics["rewards/accuracy/errors"] == 0.0
  assert metrics["rewards/accuracy/mean"] == pytest.approx(0.5)
  assert runner.error_counts == dict.fromkeys(runner.names, 0)


def test_missing_reference_stops_the_run():
  runner = rr.RewardRunner(["accuracy"], timeout_s=30)
  with pytest.raises(rr.RewardConfigError,
                     match=r"^reward channel 'accuracy' cannot run on this data \(3 of its "
                           r"calls in this batch\): MissingFieldError: example has no field "
                           r"'reference' \(keys: \[\]\)$"):
    runner(RESPONSES_BG, [{}, {"reference": "-3"}], NUM_TOKENS_BG)


@pytest.mark.parametrize("kind, on_failure", [("thread", 0.0), ("process", -1.0)])
def test_raising_fn_scores_its_failure_value_and_counts(kind, on_failure):
  runner = rr.RewardRunner([rr.RewardChannel("bad", _raise_on_b, kind, on_failure=on_failure),
                            "format"], timeout_s=30)
  for call in (1, 2):
    r_BGK, metrics = runner(RESPONSES_BG, EXAMPLES_B, NUM_TOKENS_BG)
    bad = np.array([["boxed" in r for r in row] for row in RESPONSES_BG])
    assert (r_BGK[..., 0][bad] == on_failure).all()
    assert (r_BGK[..., 0][~bad] == 1.0).all()
    assert not np.isnan(r_BGK).any()
    assert metrics["rewards/bad/errors"] == bad.sum()
    assert metrics["rewards/bad/timeouts"] == 0
    assert metrics["rewards/bad/not_applicable"] == 0
    assert runner.error_counts == {"bad": call * bad.sum(), "format": 0}
    assert runner.last_errors["bad"] == "RuntimeError('bad sample')"


def test_hanging_thread_fn_is_abandoned_after_timeout(monkeypatch):
  monkeypatch.setattr(sys.modules[__name__], "HANG_ALL", True)
  runner = rr.RewardRunner([rr.RewardChannel("slow", _sleep_forever_on_b, "thread",
                                             on_failure=0.0)],
                           timeout_s=0.5, num_threads=2)
  t0 = time.monotonic()
  r_BGK, metrics = runner(RESPONSES_BG, EXAMPLES_B, NUM_TOKENS_BG)
  assert time.monotonic() - t0 < 5.0  # 3 hung calls, 2 threads: replacements keep it moving
  bad = np.array([["boxed" in r for r in row] for row in RESPONSES_BG])
  assert (r_BGK[..., 0][bad] == 0.0).all() and (r_BGK[..., 0][~bad] == 2.0).all()
  assert metrics["rewards/slow/timeouts"] == bad.sum() == runner.timeout_counts["slow"]


def test_hanging_process_fn_is_killed_and_batch_survives():
  pool = rr.shared_pool()
  restarts = pool.restarts
  runner = rr.RewardRunner([rr.RewardChannel("slow", _sleep_forever_on_b, "process",
                                             on_failure=0.0), "accuracy"],
                           timeout_s=3.0)
  t0 = time.monotonic()
  r_BGK, metrics = runner(RESPONSES_BG, EXAMPLES_B, NUM_TOKENS_BG)
  assert time.monotonic() - t0 < 20.0
  bad = ONLY_B
  assert (r_BGK[..., 0][bad] == 0.0).all() and (r_BGK[..., 0][~bad] == 2.0).all()
  # Only the overrunning call's worker is killed: the accuracy calls are not disturbed.
  np.testing.assert_array_equal(r_BGK[..., 1], [[1, 1, 0], [1, 0, 0]])
  assert metrics["rewards/slow/timeouts"] == bad.sum()
  assert metrics["rewards/accuracy/errors"] == 0
  assert pool.restarts == restarts + 1


def test_crashing_worker_is_blamed_on_its_call_only():
  runner = rr.RewardRunner([rr.RewardChannel("crash", _exit_worker_on_b, "process",
                                             on_failure=0.0), "negative"],
                           timeout_s=30)
  r_BGK, metrics = runner(RESPONSES_BG, EXAMPLES_B, NUM_TOKENS_BG)
  bad = ONLY_B
  assert (r_BGK[..., 0][bad] == 0.0).all() and (r_BGK[..., 0][~bad] == 3.0).all()
  np.testing.assert_array_equal(r_BGK[..., 1], [[0, 0, 1], [1, 0, 0]])
  assert metrics["rewards/crash/errors"] == bad.sum()
  assert metrics["rewards/negative/errors"] == 0
  assert "RewardWorkerError" in runner.last_errors["crash"]
  assert "exit code 3" in runner.last_errors["crash"]


def test_thread_safety_concurrent_calls():
  runner = rr.RewardRunner(["format", "length", rr.RewardChannel("tokens", _token_count,
                                                                 on_failure=0.0),
                            rr.RewardChannel("tokens_p", _token_count, "process",
                                             on_failure=0.0)], timeout_s=30)
  rng = np.random.default_rng(0)

  def one(seed):
    nt_BG = rng_batches[seed]
    r_BGK, _ = runner(RESPONSES_BG, EXAMPLES_B, nt_BG)
    return nt_BG, r_BGK

  rng_batches = [rng.integers(0, 3200, size=(2, 3)) for _ in range(12)]
  with cf.ThreadPoolExecutor(6) as ex:
    results = list(ex.map(one, range(12)))
  fmt = np.array([[mr.format_reward(r) for r in row] for row in RESPONSES_BG])
  for nt_BG, r_BGK in results:
    np.testing.assert_array_equal(r_BGK[..., 0], fmt)
    np.testing.assert_allclose(r_BGK[..., 1], np.vectorize(mr.length_reward)(nt_BG), rtol=1e-6)
    np.testing.assert_array_equal(r_BGK[..., 2], nt_BG)
    np.testing.assert_array_equal(r_BGK[..., 3], nt_BG)
  assert sum(runner.error_counts.values()) == 0


def test_input_validation():
  runner = rr.RewardRunner(["format"])
  with pytest.raises(ValueError, match="responses_BG"):
    runner([["a"], ["b", "c"]], [{}, {}], np.zeros((2, 1), np.int32))
  with pytest.raises(ValueError, match="examples_B"):
    runner(RESPONSES_BG, EXAMPLES_B[:1], NUM_TOKENS_BG)
  with pytest.raises(ValueError, match="num_tokens_BG"):
    runner(RESPONSES_BG, EXAMPLES_B, NUM_TOKENS_BG[:, :2])
  with pytest.raises(ValueError, match="num_tokens_BG"):
    runner(RESPONSES_BG, EXAMPLES_B, NUM_TOKENS_BG.astype(np.float32))
  with pytest.raises(TypeError, match=r"responses_BG\[0\]\[1\]"):
    runner([["a", None]], [{}], np.zeros((1, 2), np.int32))
  with pytest.raises(ValueError, match="unique"):
    rr.RewardRunner(["format", "format"])
  with pytest.raises(ValueError, match="timeout_s"):
    rr.RewardRunner(["format"], timeout_s=0)
  with pytest.raises(ValueError, match="max_workers"):
    rr.HardTimeoutPool(0)


# Rows scored as they come (RewardRunner.start / PendingScores).
def _length_or_none(response, example, num_tokens):
  del example
  return None if "no answer" in response else float(num_tokens % 7)


def _batched_rank(responses, examples, num_tokens):
  """Depends on the whole batch and its order: equal only for the same rows in the same order."""
  del examples
  order = np.argsort(np.asarray(num_tokens), kind="stable")
  return [float(np.flatnonzero(order == i)[0]) + 0.5 * len(r) / 100 for i, r in
          enumerate(responses)]


def test_rows_added_in_any_order_score_as_score():
  channels = lambda: [rr.RewardChannel("len", _length_or_none, on_failure=0.0),
                      rr.RewardChannel("bad", _raise_on_b, "process", on_failure=-1.0),
                      rr.RewardChannel("rank", _batched_rank, batched=True,
                                       on_failure=0.0), "accuracy"]
  rows_BG = np.array([[True, True, False], [True, True, True]])
  whole = rr.RewardRunner(channels(), timeout_s=30)
  r_ref, counts_ref, _ = whole.score(RESPONSES_BG, EXAMPLES_B, NUM_TOKENS_BG, rows_BG=rows_BG)
  rowwise = rr.RewardRunner(channels(), timeout_s=30)
  pending = rowwise.start(EXAMPLES_B, 3)
  for b, g in [(1, 2), (0, 1), (1, 0), (0, 0), (1, 1)]:  # completion order, not row order
    pending.add(b, g, RESPONSES_BG[b][g], int(NUM_TOKENS_BG[b, g]))
  r_BGK, counts, seconds = pending.result()
  np.testing.assert_array_equal(r_BGK, r_ref)  # NaN where not added, in the same places
  assert counts == counts_ref and counts["errors/bad"] == 2 and seconds >= 0
  assert np.isnan(r_BGK[0, 2]).all() and not np.isnan(r_BGK[1, :, 2]).any()
  # finish (applicability per prompt, guards, metrics) gives the same on both.
  full = r_ref.copy()
  full[0, 2] = r_BGK[0, 1]
  (ra, ma), (rb, mb) = (x.finish(full.copy(), counts, 0.0) for x in (whole, rowwise))
  np.testing.assert_array_equal(ra, rb)
  assert ma == mb
  with pytest.raises(ValueError, match="added twice"):
    pending2 = rowwise.start(EXAMPLES_B, 3)
    pending2.add(0, 0, "x", 1)
    pending2.add(0, 0, "x", 1)
  with pytest.raises(ValueError, match="outside the batch"):
    rowwise.start(EXAMPLES_B, 3).add(2, 0, "x", 1)
  with pytest.raises(TypeError, match="num_tokens"):
    rowwise.start(EXAMPLES_B, 3).add(0, 0, "x", 1.0)


def _slow_then_score(response, example, num_tokens):
  del response, example, num_tokens
  time.sleep(0.6)
  EVENTS.append("returned")
  return 1.0


def _hang_until_released(response, example, num_tokens):
  del example, num_tokens
  EVENTS.append(f"started {response}")
  if response == "hang":
    RELEASE.wait(120)
  return 1.0


EVENTS: list = []
RELEASE = __import__("threading").Event()


def test_late_thread_call_is_a_timeout_whenever_the_caller_waits():
  """A "thread" call that ran past timeout_s fails as a timeout even when it returned before
  `result` looked (the verdict does not depend on when the caller waits)."""
  EVENTS.clear()
  runner = rr.RewardRunner([rr.RewardChannel("slow", _slow_then_score, on_failure=0.0)],
                           timeout_s=0.3)
  pending = runner.start([{}], 1)
  pending.add(0, 0, "x", 1)
  deadline = time.monotonic() + 60
  while "returned" not in EVENTS and time.monotonic() < deadline:
    time.sleep(0.05)
  assert EVENTS == ["returned"]
  r_BGK, counts, _ = pending.result()
  assert r_BGK[0, 0, 0] == 0.0 and counts == {"errors/slow": 1, "timeouts/slow": 1,
                                            "unscorable/slow": 0}


def test_hung_thread_call_frees_its_thread_at_the_next_row():
  """With one runner thread, a hung "thread" call is abandoned (and its thread replaced) when
  the next row is added after its timeout, so that row is scored before `result` is called."""
  EVENTS.clear()
  RELEASE.clear()
  runner = rr.RewardRunner([rr.RewardChannel("h", _hang_until_released, on_failure=0.0)],
                           timeout_s=0.3,
                           num_threads=1)
  pending = runner.start([{}], 2)
  pending.add(0, 0, "hang", 1)
  deadline = time.monotonic() + 60
  while "started hang" not in EVENTS and time.monotonic() < deadline:
    time.sleep(0.02)
  time.sleep(0.5)  # past the timeout of the running call
  pending.add(0, 1, "next", 1)
  while "started next" not in EVENTS and time.monotonic() < deadline:
    time.sleep(0.02)
  assert EVENTS == ["started hang", "started next"]  # before result(): the thread was replaced
  r_BGK, counts, _ = pending.result()
  RELEASE.set()
  np.testing.assert_array_equal(r_BGK[0, :, 0], [0.0, 1.0])
  assert counts == {"errors/h": 1, "timeouts/h": 1, "unscorable/h": 0}
