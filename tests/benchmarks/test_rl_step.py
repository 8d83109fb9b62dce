"""benchmarks/rl_step.py's own pieces: the reward both trainers compute, the FLOP count against
torch's FlopCounterMode, the checkpoint writer / position-limit copy, and the step alternation
(every step of every side timed exactly once, and a run that ends by itself) on mr_rl's real
trainer. Only the last test runs TRL's side; it is skipped where TRL is not installed (CI
installs `.[test]`, not `.[bench]`)."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

BENCH = "rl_step"  # the `bench` fixture (tests/benchmarks/conftest.py)
_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=96)


@pytest.fixture(scope="module")
def tok(bench):
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(bench.DEMO_POLICY)


def test_stripped_text_is_what_trl_decodes(bench, tok):
  """mr_rl's response text (special tokens kept) with the specials stripped equals TRL's
  `skip_special_tokens=True` decoding, for any token sequence, so both sides score alike."""
  assert set(bench.special_tokens()) == set(tok.all_special_tokens)
  rng = np.random.default_rng(0)
  specials = bench.special_tokens()
  for n in list(range(6)) + [int(x) for x in rng.integers(6, 60, size=300)]:
    ids = rng.integers(0, len(tok), size=n).tolist()
    mr_rl_text = tok.decode(ids, skip_special_tokens=False)
    trl_text = tok.decode(ids, skip_special_tokens=True)
    assert bench.strip_special(mr_rl_text, specials) == trl_text, ids
    answer = int(rng.integers(-20, 30))
    assert (bench.answer_suffix(bench.strip_special(mr_rl_text, specials), answer)
            == bench.trl_reward("answer_suffix", {})(None, [trl_text], [answer])[0])


def test_answer_suffix_reads_the_tag_free_answer(bench, tok):
  ids = tok("<r>7+5=12</r><a>12</a>", add_special_tokens=False)["input_ids"]
  text = bench.strip_special(tok.decode(ids, skip_special_tokens=False), bench.special_tokens())
  assert text == "7+5=1212"
  assert bench.answer_suffix(text, 12) == 1.0
  assert bench.answer_suffix(text, 13) == 0.0
  assert bench.answer_suffix("", 0) == 0.0


def test_length_target_counts_the_same_tokens(bench):
  """mr_rl's channel gets the response length with EOS; TRL's completion_ids hold EOS too."""
  trl = bench.trl_reward("length_target", {"target": 16})
  assert trl.__name__ == "bench_length_target"
  assert trl(None, ["", ""], [[5] * 16, [5] * 3 + [2]]) == [-0.0, -12.0]
  assert bench.length_target(20, 16) == bench.length_target(12, 16) == -4.0
  with pytest.raises(ValueError, match="unknown benchmark reward 'nope'"):
    bench.trl_reward("nope", {})
  bench._register_channels()  # mr_rl's side, through its reward registry
  from mr_rl.rewards.runner import get_reward
  assert get_reward("bench_length_target", target=16).fn("7+5", {}, 20) == -4.0
  suffix = get_reward("bench_answer_suffix").fn
  assert suffix("<r>7+5=12</r><a>12</a>", {"answer": 12}, 13) == 1.0
  assert suffix("<r>7+5=12</r><a>12</a><pad>", {"answer": 2}, 13) == 1.0
  assert suffix("<r>7+5=12</r><a>13</a>", {"answer": 12}, 13) == 0.0


def test_forward_flops_match_torch_flop_counter(bench, tmp_path):
  """The analytic count (full-square attention, logits everywhere) equals what torch counts for
  the HF model's eager forward (matmuls, linear layers and the two attention bmm's)."""
  torch = pytest.importorskip("torch")
  from torch.utils.flop_counter import FlopCounterMode
  from transformers import AutoModelForCausalLM
  path = bench.write_random_qwen3(str(tmp_path / "tiny"), max_position_embeddings=64, **_TINY)
  model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
  shape = bench.read_shape(path)
  assert shape["vocab"] == 24 and shape["d_ff"] == 96
  for n in (1, 7, 33):
    ids = torch.randint(0, 24, (1, n))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
      model(input_ids=ids)
    assert counter.get_total_flops() == bench.forward_flops(shape, n, n, causal=False)
  # Causal attention counts half the square plus the diagonal; the step is 4 forwards per row.
  s = shape
  att = 4 * s["layers"] * s["heads"] * s["head_dim"]
  assert (bench.forward_flops(s, 10, 10, causal=False) - bench.forward_flops(s, 10, 10)
          == att * (100 - 55))
  assert bench.step_flops(s, [3, 5], [4, 1]) == 4 * (bench.forward_flops(s, 6, 4)
                                                     + bench.forward_flops(s, 5, 1))
  with pytest.raises(ValueError, match="2 prompt lengths for 1 responses"):
    bench.step_flops(s, [3, 5], [4])


def test_raised_position_limit_keeps_outputs(bench, tmp_path):
  """The doubled-cap copy: only max_position_embeddings changes, and outputs below the old
  limit are identical (RoPE); mr_rl's loader reads the new limit."""
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM
  from mr_rl import models
  src = bench.write_random_qwen3(str(tmp_path / "src"), max_position_embeddings=32, **_TINY)
  dst = bench.raise_position_limit(src, str(tmp_path / "dst"), 64)
  with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json")) as g:
    a, b = json.load(f), json.load(g)
  assert b.pop("max_position_embeddings") == 64 and a.pop("max_position_embeddings") == 32
  assert a == b
  ids = torch.randint(0, 24, (2, 30))
  with torch.no_grad():
    la = AutoModelForCausalLM.from_pretrained(src)(input_ids=ids).logits
    lb = AutoModelForCausalLM.from_pretrained(dst)(input_ids=ids).logits
  assert torch.equal(la, lb)
  model, _ = models.load_pretrained(dst)
  assert model.config.max_seq_len == 64
  with pytest.raises(ValueError, match="already allows 64 positions > 48"):
    bench.raise_position_limit(dst, str(tmp_path / "lower"), 48)


def test_recording_runner_sees_every_row_the_trainer_scores(bench, base_policy):
  """mr_rl's side records each step's lengths and prompts through the path the trainer scores
  by (`RewardRunner.start`, rows added as they finish): a real 2-step run, its recorded
  lengths equal the trainer's own response lengths."""
  import dataclasses
  from mr_rl import settings as settings_lib, train as train_lib
  from mr_rl.testing import runs
  c = runs.arith_config(base_policy, 2)
  c.rewards.channels = "arith_len,arith_fmt"
  s = settings_lib.from_config(c)
  comp = train_lib.build(s)
  rec = bench._RecordingRunner(comp.runner)
  res = train_lib.train(s, None, comp=dataclasses.replace(comp, runner=rec), log=None)
  rows = c.data.batch_prompts * c.rollout.group_size
  assert len(rec.lengths) == len(rec.uids) == 2
  assert all(len(v) == rows and min(v) >= 1 for v in rec.lengths)
  assert all(len(u) == c.data.batch_prompts for u in rec.uids)
  for lens, h in zip(rec.lengths, res.history):
    assert np.mean(lens) == pytest.approx(h["response/length_mean"], rel=1e-6)


# ------------------------------------------------------------------------- step alternation
_RUN_BOUND_S = 240.0  # a tiny-model run of a few steps takes ~30 s on 2 loaded cores


def _run_bounded(bench, sides, steps, bound_s=_RUN_BOUND_S):
  """`run_alternating(sides, steps)` in a thread of its own, waited for at most `bound_s`:
  (ended, error, trainer threads still alive afterwards)."""
  box = {}

  def go():
    try:
      bench.run_alternating(sides, steps)
    except BaseException as e:  # noqa: BLE001 (reported by the test)
      box["error"] = e

  runner = threading.Thread(target=go, name="run_alternating", daemon=True)
  runner.start()
  runner.join(bound_s)
  names = {side.name for side in sides}
  alive = [t.name for t in threading.enumerate() if t.name in names and t.is_alive()]
  return not runner.is_alive(), box.get("error"), alive


class _FakeSide:
  """A side whose `run` calls `step_done` `calls` times, each after `step_s` seconds."""

  def __init__(self, bench, name, calls, step_s=0.01):
    self.name, self.baton, self.calls, self.step_s = name, bench.Baton(name), calls, step_s

  def run(self, baton):
    for _ in range(self.calls):
      time.sleep(self.step_s)
      baton.step_done()


def test_alternation_times_each_step_once(bench):
  """Sides that end each step exactly once: every step timed once, the run ends."""
  sides = [_FakeSide(bench, "a", 3), _FakeSide(bench, "b", 3, step_s=0.03)]
  ended, error, alive = _run_bounded(bench, sides, 3, bound_s=30)
  assert ended and error is None and not alive, (ended, error, alive)
  assert len(sides[0].baton.step_s) == len(sides[1].baton.step_s) == 3
  assert min(sides[0].baton.step_s) >= 0.01 and min(sides[1].baton.step_s) >= 0.03


@pytest.mark.parametrize("calls", [4, 2])
def test_alternation_refuses_a_side_off_by_a_step(bench, calls):
  """A side that reports one step too many (as mr_rl's log lines of compiles did) or too few
  makes the run fail at once, naming the side; it never waits for a turn that will not come."""
  sides = [_FakeSide(bench, "a", 3), _FakeSide(bench, "b", calls)]
  ended, error, alive = _run_bounded(bench, sides, 3, bound_s=30)
  assert ended, "run_alternating did not end within 30 s"
  assert not alive, f"trainer threads still running: {alive}"
  assert isinstance(error, RuntimeError) and str(error).startswith("b "), error
  assert len(sides[0].baton.step_s) == 3


@pytest.fixture(scope="module")
def tiny_checkpoint(bench, tmp_path_factory):
  return bench.write_random_qwen3(str(tmp_path_factory.mktemp("tiny_qwen3")),
                                  max_position_embeddings=64, **_TINY)


@pytest.fixture(scope="module")
def mr_rl_run(bench, tiny_checkpoint):
  """mr_rl's real trainer (`train.train`, compiles logged through its `log`) alternated alone
  for 3 steps of <= 8 new tokens on a tiny random Qwen3, bounded in time."""
  side = bench.MrRlSide("mr_rl", tiny_checkpoint, 8, 3, bench.REWARDS["20m"])
  ended, error, alive = _run_bounded(bench, [side], 3)
  return side, ended, error, alive


def test_mr_rl_run_ends_by_itself(mr_rl_run):
  """After its last step the trainer's thread returns and run_alternating ends (it hung for
  the baton's hour: the trainer's log lines after the last counted step waited for a turn)."""
  side, ended, error, alive = mr_rl_run
  assert ended, f"run_alternating did not end within {_RUN_BOUND_S} s"
  assert not alive, f"trainer threads still running: {alive}"
  assert error is None, error
  assert side.history is not None and len(side.history) == 3


def test_mr_rl_steps_timed_once_each(mr_rl_run):
  """One timed turn per trainer step, each covering that step's own stages (rollout, reward,
  update): a turn that ended at a compile's log line timed 0.000 s."""
  side, _, _, _ = mr_rl_run
  step_s = side.baton.step_s
  assert len(step_s) >= 3, f"{len(step_s)} turns for 3 steps: {step_s}"
  assert side.history is not None and len(side.history) == len(step_s) == 3, \
      (step_s, None if side.history is None else len(side.history))
  for i, (t, h) in enumerate(zip(step_s, side.history)):
    own = h["time/rollout"] + h["time/reward"] + h["time/update"]
    assert t >= own > 0, f"step {i}: turn {t:.4f} s < its stages {own:.4f} s ({step_s})"
  assert len(side.records()) == 3


def test_trl_and_mr_rl_alternate_to_the_end(bench, tiny_checkpoint, tmp_path):
  """Both sides as `run_size` pairs them (TRL fed mr_rl's prompt batches): 2 steps each, each
  timed once, and the run ends. Needs TRL (`pip install -e .[bench]`)."""
  pytest.importorskip("trl", reason="TRL is not installed (pip install -e .[bench])")
  pytest.importorskip("accelerate", reason="accelerate is not installed (pip install -e .[bench])")
  reward = bench.REWARDS["20m"]
  mr = bench.MrRlSide("mr_rl", tiny_checkpoint, 8, 2, reward)
  trl = bench.TrlSide("trl", tiny_checkpoint, 8, mr.batches, mr.comp.policy,
                      str(tmp_path / "trl"), reward)
  ended, error, alive = _run_bounded(bench, [mr, trl], 2)
  assert ended, f"run_alternating did not end within {_RUN_BOUND_S} s"
  assert not alive, f"trainer threads still running: {alive}"
  assert error is None, error
  for side in (mr, trl):
    recs = side.records()
    assert len(recs) == len(side.baton.step_s) == 2
    assert all(r["step_s"] > 0 and r["step_s"] >= r["rollout_s"] for r in recs), recs
