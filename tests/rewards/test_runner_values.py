"""What one response, or one channel, can do to the other rows of a batch (issue 33 items 7-9).

* A value a response makes a scorer return (inf, 1e7 outside the range, a 400-digit int)
  fails that row only; the run goes on.
* Channels get a read-only example: one channel cannot change what another scores against.
* A channel applies to a prompt only where it says so (`applies`); a whole group of None is
  unscorable (the failure value), never "does not apply", under every aggregator.
"""

import jax
import numpy as np
import pytest

from mr_rl import aggregators
from mr_rl.rewards import runner as rr

AGG_HP = {"weighted_sum": {"w": [0.5, 0.5]}}
TARGET = 42


# ------------------------------------------------------------------ values (item 7)
def numeric_error(response, example, num_tokens):
  """An ordinary user reward: minus the absolute error of a numeric answer."""
  del num_tokens
  try:
    x = int(response)
  except ValueError:
    x = float(response)
  return -abs(x - example["target"])


@rr.batched_reward
def numeric_error_batched(responses, examples, num_tokens):
  return [numeric_error(r, e, n) for r, e, n in zip(responses, examples, num_tokens)]


ATTACKS = ["1e7", "1e999", "9" * 400, "-1e999"]  # out of range, +inf, no float, -inf


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_value_no_reward_can_be_fails_its_row_not_the_run(kind, batched):
  fn = numeric_error_batched if batched else numeric_error
  ch = rr.RewardChannel("err", fn, kind, on_failure=-1e6, batched=batched)
  runner = rr.RewardRunner([ch], timeout_s=30, max_failure_share=1.0)
  responses = [["41", "42"] + ATTACKS]
  r_BGK, metrics = runner(responses, [{"target": TARGET}], np.ones((1, 6), np.int64))
  np.testing.assert_array_equal(r_BGK[0, :, 0], [-1, 0] + [-1e6] * len(ATTACKS))
  assert metrics["rewards/err/errors"] == len(ATTACKS)
  assert "RewardValueError" in runner.last_errors["err"]
  # The run goes on: the next batch scores as usual.
  r_BGK, _ = runner([["40", "42"]], [{"target": TARGET}], np.ones((1, 2), np.int64))
  np.testing.assert_array_equal(r_BGK[0, :, 0], [-2, 0])


def test_a_channel_whose_every_value_is_out_of_range_trips_the_failure_guard():
  """What stops a run: a channel that is broken (every row), not one response."""
  runner = rr.RewardRunner([rr.RewardChannel("unit", lambda r, e, n: 1.5, value_range=(0, 1))],
                           timeout_s=30, failure_patience=2)
  runner([["a", "b"]], [{}], np.ones((1, 2), np.int64))
  with pytest.raises(rr.RewardFailureError, match=r"'unit' failed on 100% .*RewardValueError\("
                                                  r"\"returned 1.5, outside the channel's "
                                                  r"value_range \[0, 1\]\"\)"):
    runner([["a", "b"]], [{}], np.ones((1, 2), np.int64))


def test_a_value_beyond_float32_fails_its_row():
  ch = rr.RewardChannel("wide", lambda r, e, n: float(r), value_range=(0, 1e300))
  r_BGK, _ = rr.RewardRunner([ch], max_failure_share=1.0)([["1e30", "1e100"]], [{}],
                                                         np.ones((1, 2), np.int64))
  np.testing.assert_array_equal(r_BGK[0, :, 0], [np.float32(1e30), 0.0])


# ------------------------------------------------------------ one example (item 8)
def rewrites_reference(response, example, num_tokens):
  """A buggy channel: remembers the response it saw in the example."""
  del num_tokens
  example["reference"] = response
  return 0.0


def rewrites_nested(response, example, num_tokens):
  del num_tokens
  example["docs"][0]["text"] = response
  return 0.0


def exact(response, example, num_tokens):
  del num_tokens
  return float(response == example["reference"])


def copies_then_edits(response, example, num_tokens):
  """An honest channel that needs a changed example works on its own copy."""
  del num_tokens
  mine = dict(example)
  mine["reference"] = response
  docs = [dict(d) for d in example["docs"]]
  docs[0]["text"] = "x"
  return float(mine["reference"] == response and example["docs"][0]["text"] == "passage")


def _example():
  return {"reference": "7", "docs": [{"title": "t", "text": "passage"}], "ids": (1, [2, 3])}


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("buggy", [rewrites_reference, rewrites_nested])
def test_a_channel_cannot_change_the_example_another_channel_scores_against(kind, buggy):
  runner = rr.RewardRunner([rr.RewardChannel("bug", buggy, kind, on_failure=0.0),
                            rr.RewardChannel("exact", exact, on_failure=0.0)],
                           timeout_s=30, num_threads=1)
  example = _example()
  with pytest.raises(rr.RewardConfigError, match=r"^reward channel 'bug' cannot run on this data "
                     r"\(2 of its calls .*ReadOnlyExampleError: the example is read-only"):
    runner([["8", "7"]], [example], np.ones((1, 2), np.int64))
  assert example == _example()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_channels_read_the_example_and_change_their_own_copies(kind):
  runner = rr.RewardRunner([rr.RewardChannel("copy", copies_then_edits, kind, on_failure=0.0),
                            rr.RewardChannel("exact", exact, on_failure=0.0)], timeout_s=30)
  r_BGK, _ = runner([["8", "7"]], [_example()], np.ones((1, 2), np.int64))
  np.testing.assert_array_equal(r_BGK[0], [[1, 0], [1, 1]])


def test_read_only_examples_stay_plain_data():
  import json
  import pickle
  ex = rr.ExampleFields.of(_example())
  assert json.loads(json.dumps(ex)) == {**_example(), "ids": [1, [2, 3]]}
  assert isinstance(ex["docs"], list) and isinstance(ex["docs"][0], dict)
  back = pickle.loads(pickle.dumps(ex))
  assert back == ex and type(back) is rr.ExampleFields
  for change in (lambda e: e.update(a=1), lambda e: e["ids"][1].append(4),
                 lambda e: e.setdefault("b", 2), lambda e: back["docs"].pop()):
    with pytest.raises(rr.ReadOnlyExampleError):
      change(ex)
  with pytest.raises(rr.MissingFieldError, match="example has no field 'gold'"):
    back["gold"]  # pylint: disable=pointless-statement


# ------------------------------------------------------------ applicability (item 9)
def parsed_answer(response, example, num_tokens):
  """A user reward that cannot score what it cannot parse (TRL's None)."""
  del num_tokens
  try:
    return float(int(response) == int(example["reference"]))
  except ValueError:
    return None


def always_one(response, example, num_tokens):
  del response, example, num_tokens
  return 1.0


# Prompt 0: "I don't know" twice; prompt 1: exact answers; prompt 2: wrong answers.
IDK = [["I don't know", "I don't know"], ["7", "7"], ["8", "8"]]


@pytest.fixture(scope="module")
def idk_rewards():
  runner = rr.RewardRunner([rr.RewardChannel("parsed", parsed_answer, on_failure=0.0),
                            rr.RewardChannel("other", always_one, on_failure=0.0)], timeout_s=30)
  return runner(IDK, [{"reference": "7"}] * 3, np.ones((3, 2), np.int64))


def test_a_group_the_channel_cannot_score_is_unscorable_not_exempt(idk_rewards):
  r_BGK, metrics = idk_rewards
  np.testing.assert_array_equal(r_BGK[..., 0], [[0, 0], [1, 1], [0, 0]])
  assert metrics["rewards/parsed/unscorable"] == 2
  assert metrics["rewards/parsed/not_applicable"] == 0


@pytest.mark.parametrize("name", aggregators.NAMES)
def test_i_dont_know_twice_scores_like_wrong_answers_under_every_aggregator(idk_rewards, name):
  r_BGK = np.asarray(idk_rewards[0])
  wrong = r_BGK.copy()
  wrong[0] = r_BGK[2]  # what the wrong answers score
  agg = aggregators.get(name, **AGG_HP.get(aggregators.AGGREGATORS.canonical(name), {}))
  state = agg.init(2)
  key = jax.random.PRNGKey(0)
  R = np.asarray(agg.apply(state, r_BGK, key)[0])
  np.testing.assert_array_equal(R, np.asarray(agg.apply(state, wrong, key)[0]))
  # rubric_dropout: a random per-sample mask; pg_ot: relative within a group (identical
  # responses all lie on their group's front). The equality above covers both.
  if name not in ("rubric_dropout", "pg_ot"):
    assert (R[0] == R[2]).all() and (R[0] < R[1]).all(), R


def test_a_declared_prompt_is_left_out_and_never_called():
  seen = []

  def parsed_and_seen(response, example, num_tokens):
    seen.append(example["reference"])
    return parsed_answer(response, example, num_tokens)

  ch = rr.RewardChannel("parsed", parsed_and_seen, applies=lambda ex: ex["reference"] != "-",
                        on_failure=0.0)
  r_BGK, metrics = rr.RewardRunner([ch])([["7", "x"], ["7", "7"]], [{"reference": "7"},
                                                                     {"reference": "-"}],
                                         np.ones((2, 2), np.int64))
  np.testing.assert_array_equal(r_BGK[..., 0], [[1, 0], [np.nan, np.nan]])
  assert seen == ["7", "7"] and metrics["rewards/parsed/not_applicable"] == 2


def test_applies_is_checked_and_named():
  with pytest.raises(TypeError, match="applies of channel 'c' must be None or a function"):
    rr.RewardChannel("c", always_one, applies="yes", on_failure=0.0)
  bad = rr.RewardChannel("c", always_one, applies=lambda ex: ex["task"], on_failure=0.0)
  with pytest.raises(rr.RewardConfigError, match=r"'c': applies\(example\) must return a bool, "
                                                 r"got str 'math'"):
    rr.RewardRunner([bad])([["a"]], [{"task": "math"}], np.ones((1, 1), np.int64))
  with pytest.raises(rr.RewardConfigError, match=r"'c': applies\(example\) raised "
                                                 r"MissingFieldError: .*'task'"):
    rr.RewardRunner([bad])([["a"]], [{}], np.ones((1, 1), np.int64))
  with pytest.raises(rr.RewardConfigError, match=r"'brief': parameter applies: module "
                                                 r"'no_module_xyz' did not import"):
    rr.get_reward("brief", applies="no_module_xyz:f")
  assert rr.get_reward("brief", applies=always_one).applies is always_one
