"""benchmarks/rl_step.py's own pieces (no TRL needed): the reward both trainers compute, the
FLOP count against torch's FlopCounterMode, and the checkpoint writer / position-limit copy."""

from __future__ import annotations

import json
import os

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
