"""Your own reward functions by import path.

`get_reward("my_pkg.rewards:concise", **params)`: a real module written to tmp_path and put
on sys.path (and PYTHONPATH), scored by the runner on threads and in worker processes,
per-sample and batched; bad paths and signatures fail when the channel is built.
"""

import os
import textwrap

import numpy as np
import pytest

from mr_rl.rewards import runner as rr

MODULE = textwrap.dedent("""
    import os
    from mr_rl.rewards.channels import applies_when, batched_reward

    NOT_A_FUNCTION = 3

    def is_math(example):
      return example["topic"] == "math"

    def concise(response, example, num_tokens, max_tokens=10):
      return float(num_tokens <= max_tokens)

    @applies_when(is_math)  # declared: never called on the other prompts
    def only_math(response, example, num_tokens):
      assert example["topic"] == "math"
      return 1.0

    def worker_pid(response, example, num_tokens):
      return float(os.getpid())

    @batched_reward
    def shortest_in_batch(responses, examples, num_tokens):
      # Needs the whole batch at once: 1 for the shortest response(s) of the batch.
      best = min(num_tokens)
      return [float(n == best) for n in num_tokens]

    def relative_length(responses, examples, num_tokens, scale=1.0):  # batched by parameter
      longest = max(len(r) for r in responses)
      return [scale * len(r) / longest if ex["topic"] == "math" else None  # None: unscorable
              for r, ex in zip(responses, examples)]

    @batched_reward
    def too_short(responses, examples, num_tokens):
      return [1.0]

    @batched_reward
    def breaks(responses, examples, num_tokens):
      raise RuntimeError("the batch broke the scorer")

    def no_example(response):
      return 1.0

    def distance_to_42(response, example, num_tokens):  # 0 for the answer, negative otherwise
      return -abs((int(response) if response.isdigit() else float(response)) - 42)
""")

RESPONSES = [["a", "bbbb", "cc"], ["dddddddd", "e", "ffff"]]
EXAMPLES = [{"topic": "math"}, {"topic": "poetry"}]
TOKENS = np.array([[1, 4, 2], [8, 1, 4]])


@pytest.fixture
def mod(tmp_path, monkeypatch):
  name = f"my_rewards_{os.getpid()}_{tmp_path.name}".replace("-", "_")
  (tmp_path / f"{name}.py").write_text(MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH",
                                                                                  "")]))
  return name


def test_channel_name_of_an_import_path():
  assert rr.channel_name("my_pkg.rewards:concise") == "concise"
  assert rr.channel_name("my_pkg.rewards:Scorers.concise") == "concise"
  assert rr.channel_name("accuracy") == "accuracy"
  assert rr.is_import_path("a:b") and not rr.is_import_path("accuracy")
  for bad in ("my_pkg.rewards:", ":concise", "my_pkg.rewards:con cise", "my pkg:f", "a:b:c"):
    with pytest.raises(ValueError, match="not a valid import path"):
      rr.channel_name(bad)


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_per_sample_import_path_channels(mod, kind):
  concise = rr.get_reward(f"{mod}:concise", max_tokens=2, kind=kind, value_range=[0, 1])
  assert (concise.name, concise.kind, concise.batched) == ("concise", kind, False)
  runner = rr.RewardRunner(["format", concise, rr.get_reward(f"{mod}:only_math", kind=kind,
                                                                on_failure=0.0)],
                           timeout_s=30)
  assert runner.names == ("format", "concise", "only_math")
  r_BGK, metrics = runner(RESPONSES, EXAMPLES, TOKENS)
  np.testing.assert_array_equal(r_BGK[..., 1], TOKENS <= 2)
  np.testing.assert_array_equal(r_BGK[..., 2], [[1, 1, 1], [np.nan] * 3])
  assert metrics["rewards/only_math/not_applicable"] == 3
  assert metrics["rewards/only_math/errors"] == 0


def test_value_range_of_an_import_path_channel(mod):
  assert rr.get_reward(f"{mod}:concise", on_failure=0).value_range == (0.0, 1e6)  # its floor
  unit = rr.get_reward(f"{mod}:relative_length", batched=True, scale=4.0, value_range=[0, 1])
  assert unit.value_range == (0.0, 1.0)
  runner = rr.RewardRunner([unit], timeout_s=30, max_failure_share=1.0)
  runner(RESPONSES, EXAMPLES, TOKENS)  # a value outside the range fails its row
  assert "returned 2.0, outside the channel's value_range" in runner.last_errors["relative_length"]
  with pytest.raises(rr.RewardConfigError, match=r"reward channel 'concise' .*value_range"):
    rr.get_reward(f"{mod}:concise", value_range=(1, 0))


HONEST_42 = ["42", "41", "0"]                  # scores 0, -1, -42
FAILING_42 = ["1e999", "9" * 400, "I don't know"]  # -inf, an int no float holds, raises


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_no_failure_outscores_an_honest_answer(mod, kind):
  """Attack (issue 41, 1): with a 0.0 default failure value, "1e999", a 400-digit integer and
  "I don't know" scored 0 on a reward of -abs(x - 42), as much as the answer and more than a
  near miss. Now a channel without a declared range must give on_failure, and failures score
  the channel's floor, below every honest answer (the control)."""
  with pytest.raises(rr.RewardConfigError, match=r"'distance_to_42' .*declares no "
                     r"value_range, so it must give on_failure"):
    rr.get_reward(f"{mod}:distance_to_42", kind=kind)
  for params in (dict(value_range=[-100, 0]), dict(on_failure=-100.0)):
    runner = rr.RewardRunner([rr.get_reward(f"{mod}:distance_to_42", kind=kind, **params)],
                             timeout_s=30, max_failure_share=1.0)
    r_BGK, metrics = runner([HONEST_42, FAILING_42], [{}, {}], np.ones((2, 3), np.int64))
    np.testing.assert_array_equal(r_BGK[0, :, 0], [0, -1, -42])  # honest: as computed
    np.testing.assert_array_equal(r_BGK[1, :, 0], [-100] * 3)    # failures: the floor
    assert metrics["rewards/distance_to_42/errors"] == 3


def test_process_kind_runs_in_a_worker(mod):
  pids = (0, 2**22)  # Linux's largest pid_max: a pid is out of the default range [-1e6, 1e6]
  runner = rr.RewardRunner([rr.get_reward(f"{mod}:worker_pid", value_range=pids)],
                           timeout_s=30)  # default kind: thread
  assert (runner(RESPONSES, EXAMPLES, TOKENS)[0] == os.getpid()).all()
  runner = rr.RewardRunner([rr.get_reward(f"{mod}:worker_pid", kind="process",
                                          value_range=pids)], timeout_s=30)
  pids = runner(RESPONSES, EXAMPLES, TOKENS)[0]
  zygote = rr.shared_pool()._zygote._proc.pid  # pylint: disable=protected-access
  for pid in np.unique(pids).astype(int):
    with open(f"/proc/{pid}/stat") as f:  # a worker forked by the pool's zygote
      assert int(f.read().rsplit(")", 1)[1].split()[1]) == zygote


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_batched_import_path_channels(mod, kind):
  by_marker = rr.get_reward(f"{mod}:shortest_in_batch", kind=kind, value_range=[0, 1])
  by_param = rr.get_reward(f"{mod}:relative_length", batched=True, scale=2.0, kind=kind,
                           on_failure=-1.0, applies=f"{mod}:is_math")
  assert by_marker.batched and by_param.batched and by_param.on_failure == -1.0
  runner = rr.RewardRunner([by_marker, "format", by_param], timeout_s=30)
  r_BGK, metrics = runner(RESPONSES, EXAMPLES, TOKENS)
  np.testing.assert_array_equal(r_BGK[..., 0], TOKENS == 1)  # the batch minimum, over B*G
  # Called on the rows of the prompts it applies to only (the longest math response: 4).
  np.testing.assert_allclose(r_BGK[..., 2], [[2 / 4, 2 * 4 / 4, 2 * 2 / 4], [np.nan] * 3])
  assert metrics["rewards/relative_length/not_applicable"] == 3
  bad = rr.RewardRunner([rr.get_reward(f"{mod}:too_short", kind=kind, on_failure=0)], timeout_s=30)
  with pytest.raises(rr.RewardConfigError, match=r"'too_short' cannot run on this data .*"
                     r"batched function returned list \[1.0\]; expected a list of 6 rewards"):
    bad(RESPONSES, EXAMPLES, TOKENS)


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_failed_batched_call_fails_every_response(mod, kind):
  runner = rr.RewardRunner([rr.get_reward(f"{mod}:breaks", kind=kind, on_failure=-1.0)],
                           timeout_s=30, max_failure_share=1.0)
  r_BGK, metrics = runner(RESPONSES, EXAMPLES, TOKENS)
  assert (r_BGK == -1.0).all() and metrics["rewards/breaks/errors"] == 6
  assert "the batch broke the scorer" in runner.last_errors["breaks"]
  # A field the data lacks is not a failure: the run stops.
  runner = rr.RewardRunner([rr.get_reward(f"{mod}:relative_length", batched=True, kind=kind,
                                          value_range=[0, 1])],
                           timeout_s=30)
  with pytest.raises(rr.RewardConfigError, match=r"^reward channel 'relative_length' cannot run "
                     r"on this data \(1 of its calls in this batch\): MissingFieldError: example "
                     r"has no field 'topic' \(keys: \['subject'\]\)$"):
    runner(RESPONSES, [{"topic": "math"}, {"subject": "x"}], TOKENS)


def test_bad_import_paths_fail_when_built_naming_the_channel(mod, tmp_path):
  cases = [
      ("no_such_reward_mod_xyz:f", r"^reward channel 'f' \('no_such_reward_mod_xyz:f'\): module "
       r"'no_such_reward_mod_xyz' did not import: ModuleNotFoundError"),
      (f"{mod}:missing", rf"^reward channel 'missing' \('{mod}:missing'\): module '{mod}' has no "
       r"attribute 'missing'$"),
      (f"{mod}:NOT_A_FUNCTION", r"'NOT_A_FUNCTION' is a int, not a function$"),
      (f"{mod}:no_example", r"^reward channel 'no_example' .*function no_example\(response\) must "
       r"accept \(response, example, num_tokens\) positionally: too many positional"),
  ]
  for spec, match in cases:
    with pytest.raises(rr.RewardConfigError, match=match):
      rr.get_reward(spec)
  with pytest.raises(rr.RewardConfigError, match=r"'concise' .*and the parameters \['max_len'\] "
                     r"by keyword: got an unexpected keyword argument 'max_len'"):
    rr.get_reward(f"{mod}:concise", max_len=3)
  with pytest.raises(rr.RewardConfigError, match=r"^reward channel 'concise' .*kind of channel "
                     r"'concise' must be one of"):
    rr.get_reward(f"{mod}:concise", kind="gpu")
  (tmp_path / "broken_reward_mod.py").write_text("import numpy\nraise RuntimeError('boom')\n")
  with pytest.raises(rr.RewardConfigError, match=r"module 'broken_reward_mod' did not import: "
                     r"RuntimeError\('boom'\)"):
    rr.get_reward("broken_reward_mod:f")
  # A function of __main__ (a notebook cell) works on threads, never in a worker process.
  import __main__  # pylint: disable=import-outside-toplevel
  def cell_reward(response, example, num_tokens):
    return 1.0
  cell_reward.__module__ = "__main__"
  setattr(__main__, "cell_reward_for_test", cell_reward)
  try:
    assert rr.get_reward("__main__:cell_reward_for_test", on_failure=0).name == "cell_reward_for_test"
    with pytest.raises(rr.RewardConfigError, match="must be importable by name in a worker"):
      rr.get_reward("__main__:cell_reward_for_test", kind="process", on_failure=0)
  finally:
    delattr(__main__, "cell_reward_for_test")


def test_registered_channel_parameter_errors_name_the_channel():
  with pytest.raises(ValueError, match="threshold") as info:
    rr.get_reward("brief", threshold=-1)
  if hasattr(info.value, "__notes__"):  # Python >= 3.11
    assert info.value.__notes__ == ["while building reward channel 'brief' with parameters "
                                    "{'threshold': -1}"]
