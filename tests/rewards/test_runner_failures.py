"""Failure semantics of the reward runner.

A failed verification (raised, timed out, worker died) scores the channel's failure value,
never NaN ("does not apply"), so a policy earns nothing by breaking the verifier; NaN comes
only where a channel declares it does not apply to a prompt (``applies``). Errors that are not about the
response (a missing example field, a broken scorer set-up) stop the run at the first batch.
"""

import functools
import os

import jax
import numpy as np
import pytest

from mr_rl import aggregators
from mr_rl.rewards.process import pool as pl
from mr_rl.rewards import runner as rr

# The table: answer 7; math-verify cannot finish the power tower in time.
TABLE_RESPONSES = [["\\boxed{7}", "\\boxed{8}", "\\boxed{10^{10^{10^{10}}}}"]]
TABLE_EXAMPLES = [{"reference": "7"}]
TABLE_TOKENS = np.array([[5, 5, 5]])
AGG_HP = {"weighted_sum": {"w": [0.5, 0.5]}}  # by registered name (aliases resolve to it)


@pytest.fixture(scope="module")
def table():
  runner = rr.RewardRunner(["accuracy", rr.get_reward("brief", threshold=50)], timeout_s=2.0)
  return runner(TABLE_RESPONSES, TABLE_EXAMPLES, TABLE_TOKENS)


def test_timed_out_verification_scores_as_a_wrong_answer(table):
  r_BGK, metrics = table
  np.testing.assert_array_equal(r_BGK[0], [[1, 1], [0, 1], [0, 1]])
  assert metrics["rewards/accuracy/timeouts"] == 1 and metrics["rewards/accuracy/errors"] == 1
  assert metrics["rewards/accuracy/not_applicable"] == 0


@pytest.mark.parametrize("name", aggregators.NAMES)
def test_timed_out_row_is_wrong_under_every_aggregator(table, name):
  r_BGK = np.asarray(table[0])
  wrong = r_BGK.copy()
  wrong[0, 2] = wrong[0, 1]  # what a plainly wrong, brief answer scores
  agg = aggregators.get(name, **AGG_HP.get(aggregators.AGGREGATORS.canonical(name), {}))
  state = agg.init(2)
  key = jax.random.PRNGKey(0)
  R = np.asarray(agg.apply(state, r_BGK, key)[0])
  np.testing.assert_array_equal(R, np.asarray(agg.apply(state, wrong, key)[0]))
  if name != "rubric_dropout":  # a random per-sample mask; the equality above covers it
    assert R[0, 2] == R[0, 1] < R[0, 0], R
  # The attack this closes: scored NaN ("does not apply"), the same row was paid as correct.
  gamed = r_BGK.copy()
  gamed[0, 2, 0] = np.nan
  if aggregators.AGGREGATORS.canonical(name) in ("additive", "min_and"):
    assert np.asarray(agg.apply(state, gamed, key)[0])[0, 2] == R[0, 0]


# ------------------------------------------------------------- does not apply vs failed
def _applies_to_even(response, example, num_tokens):
  del response, example
  if num_tokens % 2:
    return None  # on purpose: this channel does not apply to odd lengths
  return float("nan") if num_tokens == 4 else 1.0


def _crash_on_odd(response, example, num_tokens):
  del response, example
  if num_tokens % 2:
    raise ZeroDivisionError("the scorer broke on this response")
  return 1.0


def _die_on_odd(response, example, num_tokens):
  del response, example
  if num_tokens % 2:
    os._exit(9)
  return 1.0


def _not_about_the_example(response, example, num_tokens):
  del example, num_tokens
  return {"yes": 1.0, "no": 0.0}[response]  # a KeyError caused by the response


TOKENS = np.array([[1, 2, 3], [4, 5, 6]])
RESPONSES = [["yes", "no", "maybe"], ["no", "yes", "yes"]]
EXAMPLES = [{"reference": "1"}, {"reference": "2"}]
ODD = TOKENS % 2 == 1


def _uses(example):
  return example["use"]


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_none_and_nan_are_unscorable_and_only_a_declaration_makes_a_prompt_not_apply(kind):
  # Groups 0 and 1 mix scores and None / NaN; group 2 is None throughout: all unscorable
  # (on_failure). Group 3 is one the channel declares it does not apply to: NaN, not called.
  tokens = np.array([[1, 2, 3], [4, 5, 6], [1, 3, 5], [1, 1, 1]])
  responses = [["a", "b", "c"]] * 4
  examples = [{"use": True}] * 3 + [{"use": False}]
  runner = rr.RewardRunner([rr.RewardChannel("even", _applies_to_even, kind, on_failure=-0.5,
                                             applies=_uses)], timeout_s=30)
  r_BGK, metrics = runner(responses, examples, tokens)
  nan = np.nan
  np.testing.assert_array_equal(r_BGK[..., 0], [[-0.5, 1, -0.5], [-0.5, -0.5, 1], [-0.5] * 3,
                                                [nan] * 3])
  assert metrics["rewards/even/not_applicable"] == 3 and metrics["rewards/even/unscorable"] == 7
  assert metrics["rewards/even/errors"] == 0
  assert runner.error_counts["even"] == 0 and "even" not in runner.last_errors


def _parsed(response, example, num_tokens):
  """1 / 0 for a parseable answer, None for one it cannot read (the attack of issue 24)."""
  del example, num_tokens
  return {"good": 1.0, "bad": 0.0}.get(response)


def _always_one(response, example, num_tokens):
  del response, example, num_tokens
  return 1.0


@pytest.mark.parametrize("name", aggregators.NAMES)
def test_an_unparseable_response_earns_no_more_than_a_bad_one_under_every_aggregator(name):
  # The primary channel (first: rp_only and TAG's anchor read it) cannot read 'garbage'.
  runner = rr.RewardRunner([rr.RewardChannel("parsed", _parsed, on_failure=0.0),
                            rr.RewardChannel("acc", _always_one, on_failure=0.0)], timeout_s=30)
  r_BGK, metrics = runner([["good", "bad", "garbage"]], [{}], np.array([[5, 5, 5]]))
  np.testing.assert_array_equal(r_BGK[0], [[1, 1], [0, 1], [0, 1]])
  assert metrics["rewards/parsed/unscorable"] == 1
  assert metrics["rewards/parsed/not_applicable"] == 0
  agg = aggregators.get(name, **AGG_HP.get(aggregators.AGGREGATORS.canonical(name), {}))
  state = agg.init(2)
  key = jax.random.PRNGKey(0)
  R = np.asarray(agg.apply(state, np.asarray(r_BGK), key)[0])
  assert R[0, 2] == R[0, 1], R
  if name != "rubric_dropout":  # a random per-sample mask
    assert R[0, 1] < R[0, 0], R


def test_a_channel_that_applies_to_no_prompt_stops_the_run_after_its_patience():
  runner = rr.RewardRunner(["format", rr.RewardChannel("parsed", _parsed, on_failure=0.0)],
                           timeout_s=30,
                           not_applicable_patience=2)
  nt = np.array([[1, 1]])
  never = [["x", "y"]]  # 'parsed' is None on every response: scores no response
  runner(never, [{}], nt)                   # streak 1
  runner([["good", "y"]], [{}], nt)         # scores one: resets the streak
  r_BGK, _ = runner(never, [{}], nt)        # streak 1 again
  assert (r_BGK[..., 1] == 0).all()         # unscorable: on_failure
  with pytest.raises(rr.RewardFailureError,
                     match=r"^reward channel 'parsed' scored no response for 2 consecutive "
                           r"batches \(not_applicable_patience=2; this batch: 0 of 2 where it "
                           r"does not apply, 2 unscorable \(None / NaN\), 0 failed\)"):
    runner(never, [{}], nt)
  nowhere = rr.RewardRunner([rr.RewardChannel("none", _parsed, applies=lambda ex: False,
                                              on_failure=0.0)],
                            not_applicable_patience=1)
  with pytest.raises(rr.RewardFailureError, match=r"'none' scored no response .* 2 of 2 where"):
    nowhere(never, [{}], nt)
  for bad in (0, 1.5, True):
    with pytest.raises(ValueError, match="not_applicable_patience must be a positive int"):
      rr.RewardRunner(["format"], not_applicable_patience=bad)


# ------------------------------------------------------------------------ value ranges
def _huge(response, example, num_tokens):
  del response, example, num_tokens
  return 1e30


def _one_and_a_half(response, example, num_tokens):
  del response, example, num_tokens
  return 1.5


def test_a_score_outside_the_channel_range_fails_its_row_naming_channel_and_value():
  runner = rr.RewardRunner([rr.RewardChannel("huge", _huge, on_failure=-1e6)],
                           max_failure_share=1.0)
  assert runner([["a"]], [{}], np.array([[1]]))[0][0, 0, 0] == -1e6  # on_failure
  assert runner.last_errors["huge"] == ("RewardValueError(\"returned 1e+30, outside the "
                                        "channel's value_range [-1e+06, 1e+06]\")")
  unit = rr.RewardChannel("unit", _one_and_a_half, value_range=(0, 1))
  runner = rr.RewardRunner([unit], max_failure_share=1.0)
  assert runner([["a"]], [{}], np.array([[1]]))[0][0, 0, 0] == 0.0  # the floor
  assert "returned 1.5, outside the channel's value_range [0, 1]" in runner.last_errors["unit"]
  assert rr.RewardRunner([rr.RewardChannel("wide", _huge, value_range=(0, 1e31))])(
      [["a"]], [{}], np.array([[1]]))[0][0, 0, 0] == np.float32(1e30)


def test_value_range_and_on_failure_are_checked_when_built():
  for bad in ((1, 0), (0, float("inf")), (0,), "01", (None, 1)):
    with pytest.raises(ValueError, match="value_range of channel 'c' must be finite"):
      rr.RewardChannel("c", _huge, value_range=bad)
  with pytest.raises(ValueError, match=r"on_failure=0.25 of channel 'c' is above its "
                                       r"value_range's floor 0: a failure would outscore"):
    rr.RewardChannel("c", _huge, on_failure=0.25, value_range=(0, 1))
  with pytest.raises(ValueError, match="declares no value_range, so it must give on_failure"):
    rr.RewardChannel("c", _huge)
  assert rr.RewardChannel("c", _huge, value_range=(-2, 1)).on_failure == -2.0  # the floor
  assert rr.RewardChannel("c", _huge, on_failure=-3, value_range=(-2, 1)).on_failure == -3.0
  assert rr.RewardChannel("c", _huge, on_failure=-3).value_range == (-3.0, 1e6)


@pytest.mark.parametrize("name, params, lo, hi", [
    ("accuracy", {}, 0, 1), ("format", {}, 0, 1), ("length", {}, 0, 1), ("brief", {}, 0, 1),
    ("negative", {}, 0, 1), ("code_correct", {}, 0, 1), ("code_fast", {}, 0, 1),
    ("code_noop", {}, 0, 1), ("alce_correctness", {}, 0, 1), ("alce_citation", {}, 0, 1),
    ("overlong", {"max_len": 10, "cache_len": 5}, -1, 0)])
def test_builtin_channels_declare_their_range(name, params, lo, hi):
  channel = rr.get_reward(name, **params)
  assert channel.value_range == (lo, hi) and channel.on_failure == lo  # failures: the floor


@pytest.mark.parametrize("fn, kind, err", [
    (_crash_on_odd, "thread", "ZeroDivisionError('the scorer broke on this response')"),
    (_crash_on_odd, "process", "ZeroDivisionError('the scorer broke on this response')"),
    (_die_on_odd, "process", "exit code 9"),
    (_not_about_the_example, "thread", "KeyError('maybe')"),
])
def test_failures_score_the_failure_value_and_stay_visible(fn, kind, err):
  ch = rr.RewardChannel("c", fn, kind, on_failure=-0.5)
  runner = rr.RewardRunner([ch], timeout_s=30, max_failure_share=1.0)
  r_BGK, metrics = runner(RESPONSES, EXAMPLES, TOKENS)
  if fn is _not_about_the_example:
    failed = np.array([[False, False, True], [False, False, False]])
    np.testing.assert_array_equal(r_BGK[..., 0][~failed], [1, 0, 0, 1, 1])
  else:
    failed = ODD
    assert (r_BGK[..., 0][~failed] == 1.0).all()
  assert (r_BGK[..., 0][failed] == -0.5).all() and not np.isnan(r_BGK).any()
  assert metrics["rewards/c/errors"] == failed.sum() == runner.error_counts["c"]
  assert err in runner.last_errors["c"]


def test_on_failure_must_be_a_finite_number():
  for bad in (float("nan"), float("inf"), "0", True):
    with pytest.raises(ValueError, match="on_failure of channel 'c' must be a finite number"):
      rr.RewardChannel("c", _crash_on_odd, on_failure=bad)
  assert rr.RewardChannel("c", _crash_on_odd, on_failure=np.float32(-1)).on_failure == -1.0


# ----------------------------------------------------------------- failure-rate guard
def _fail_when(response, example, num_tokens):
  del example, num_tokens
  if response.startswith("fail"):
    raise RuntimeError(f"verifier broke on {response!r}")
  return 1.0


def test_guard_stops_a_channel_that_keeps_failing():
  runner = rr.RewardRunner(["format", rr.RewardChannel("flaky", _fail_when, on_failure=0.0)],
                           timeout_s=30,
                           max_failure_share=0.5, failure_patience=2)
  many = [["fail 1", "fail 2", "ok"]]  # 2 of 3 fail: over the limit
  half = [["fail 1", "ok"]]            # exactly half: not over it
  nt1, nt2 = np.array([[1, 1, 1]]), np.array([[1, 1]])
  runner(many, [{}], nt1)              # streak 1
  runner(half, [{}], nt2)              # resets the streak
  runner(many, [{}], nt1)              # streak 1 again
  with pytest.raises(rr.RewardFailureError,
                     match=r"^reward channel 'flaky' failed on 67% of this batch \(2 of 3 "
                           r"responses, 0 timeouts\), more than max_failure_share=0.5 for 2 "
                           r"consecutive batches \(failure_patience=2\); last error: "
                           r"RuntimeError\(\"verifier broke on 'fail \d'\"\)$"):
    runner(many, [{}], nt1)


def test_guard_arguments_are_checked():
  for kw in ({"max_failure_share": 1.5}, {"max_failure_share": -0.1}, {"failure_patience": 0},
             {"failure_patience": 1.5}):
    with pytest.raises(ValueError, match=next(iter(kw))):
      rr.RewardRunner(["format"], **kw)


# ------------------------------------------------------------------ configuration errors
def _reads_field(response, example, num_tokens):
  del response, num_tokens
  return float(example["gold"] == "1")


def _tolerates_missing(response, example, num_tokens):
  del response, num_tokens
  try:
    return float(example["gold"] == "1")
  except KeyError:  # MissingFieldError is a KeyError: code that expects it keeps working
    return None


def _raises_config(response, example, num_tokens):
  del response, example, num_tokens
  raise rr.RewardConfigError("threshold 'x' is not a number")


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_missing_example_field_stops_the_run_naming_channel_field_and_keys(kind):
  runner = rr.RewardRunner([rr.RewardChannel("gold", _reads_field, kind, on_failure=0.0)],
                           timeout_s=30)
  with pytest.raises(rr.RewardConfigError,
                     match=r"^reward channel 'gold' cannot run on this data \(6 of its calls in "
                           r"this batch\): MissingFieldError: example has no field 'gold' "
                           r"\(keys: \['reference'\]\)$"):
    runner(RESPONSES, EXAMPLES, TOKENS)
  tolerant = rr.RewardRunner([rr.RewardChannel("gold", _tolerates_missing, kind,
                                               on_failure=0.0)], timeout_s=30)
  r_BGK, metrics = tolerant(RESPONSES, EXAMPLES, TOKENS)
  assert (r_BGK == 0).all() and metrics["rewards/gold/unscorable"] == 6


@pytest.mark.parametrize("fn, match", [
    (_raises_config, r"RewardConfigError: threshold 'x' is not a number \(example keys: "
                     r"\['reference'\]\)$"),
    (lambda r, e, n: "1.0", r"RewardConfigError: returned str '1.0': a reward is a real number"),
    (lambda r, e, n: [1.0], r"returned list \[1.0\].*mark batched functions batched=True"),
])
def test_broken_scorers_stop_the_run(fn, match):
  runner = rr.RewardRunner([rr.RewardChannel("broken", fn, on_failure=0.0)], timeout_s=30)
  with pytest.raises(rr.RewardConfigError, match=r"^reward channel 'broken' cannot run .*" + match):
    runner(RESPONSES, EXAMPLES, TOKENS)


def test_unparseable_reference_stops_the_run():
  runner = rr.RewardRunner(["accuracy"], timeout_s=30)
  with pytest.raises(rr.RewardConfigError, match=r"'accuracy' cannot run on this data \(3 of "
                     r"its calls.*reference '\$\$' could not be parsed"):
    runner([["\\boxed{1}"] * 3], [{"reference": ""}], np.array([[1, 1, 1]]))
  with pytest.raises(rr.RewardConfigError, match=r"example\['reference'\] must be a str"):
    runner([["\\boxed{1}"] * 3], [{"reference": 1}], np.array([[1, 1, 1]]))


def test_process_channel_that_cannot_reach_a_worker_fails_when_built_or_run():
  def local(response, example, num_tokens):
    return 1.0
  with pytest.raises(TypeError, match="fn of process channel 'local' must be importable"):
    rr.RewardChannel("local", local, "process", on_failure=0.0)
  main_fn = functools.partial(_reads_field)
  assert rr.RewardChannel("ok", main_fn, "process",
                          on_failure=0.0).kind == "process"  # a module's: fine
  _reads_field.__module__ = "__main__"
  try:
    with pytest.raises(TypeError, match="_reads_field is defined in __main__"):
      rr.RewardChannel("main", functools.partial(_reads_field), "process", on_failure=0.0)
  finally:
    _reads_field.__module__ = __name__
  broken_pool = pl.HardTimeoutPool(1, preload=("no_such_reward_plugin_xyz",))
  try:
    runner = rr.RewardRunner([rr.RewardChannel("p", _reads_field, "process", on_failure=0.0)],
                             pool=broken_pool)
    with pytest.raises(rr.RewardConfigError, match=r"'p' cannot run on this data .*"
                       r"WorkerSetupError: worker pool failed to start: ModuleNotFoundError"):
      runner(RESPONSES, [{"gold": "1"}] * 2, TOKENS)
  finally:
    broken_pool.close()


def test_non_mapping_examples_are_refused():
  with pytest.raises(TypeError, match=r"examples_B\[1\] must be a mapping"):
    rr.RewardRunner(["format"])(RESPONSES, [{}, "x"], TOKENS)
