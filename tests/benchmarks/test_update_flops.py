"""benchmarks/update_flops.py on a tiny model: the compiled step's FLOPs against 3x the
forward on real tokens, trimmed vs packed rows (issue 25 item 5)."""

from __future__ import annotations

import jax
import pytest

from mr_rl import models

BENCH = "update_flops"  # the `bench` fixture (tests/benchmarks/conftest.py)


def test_packed_step_executes_what_real_tokens_need(bench):
  cfg = models.ModelConfig(family="qwen3", vocab_size=24, d_model=64, n_layers=1, n_heads=2,
                           n_kv_heads=1, head_dim=32, d_ff=128, max_seq_len=64)
  model = models.Transformer(cfg)
  params = models.init_params(model, jax.random.PRNGKey(0))
  ro = bench.synthetic_rollout(cfg.vocab_size)
  need = bench.needed_flops(bench.shape_of(cfg), ro)
  trim = bench.measure(model, params, ro, False, 1, repeats=1)
  pack = bench.measure(model, params, ro, True, 2, repeats=1, rows_per_octave=16)
  old = bench.measure(model, params, ro, True, 1, repeats=1, rows_per_octave=2)
  # The same rollout: the same first-step loss and gradient norm whatever the layout.
  for r in (pack, old):
    assert r["policy_loss"] == pytest.approx(trim["policy_loss"], rel=1e-5)
    assert r["grad_norm"] == pytest.approx(trim["grad_norm"], rel=1e-5)
  # Per computed position the step is one forward and one backward (3 forwards; 4 with
  # recomputation), plus full attention squares and elementwise ops: padding is what
  # separates it from `need`.
  fed = ro.prompt_mask.sum() * ro.tokens.shape[1] + ro.lengths.sum() - ro.lengths.size
  for r in (trim, pack, old):
    per_position = r["executed_flops"] / (r["rows"] * r["columns"])
    assert 1.0 < per_position / (need / fed) < 1.25
    assert r["executed_flops"] > need
  assert trim["fill"] < 0.6 < old["fill"] < pack["fill"]
  assert pack["executed_flops"] < old["executed_flops"] < trim["executed_flops"]
  # With M 2 the step is its compiled count plus one more micro-batch program.
  assert pack["micro_batch_flops"] == pytest.approx(pack["executed_flops"] / 2, rel=0.02)
