"""launch/check.py on a tiny MoE: the grouped-matmul stand-in gives TPU-like memory.

XLA:CPU lowers `jax.lax.ragged_dot` to dense dots over a group-masked copy of the left operand
([M, local experts, K] temporaries); the check compiles the MoE block with
`mr_rl.models.moe.stand_in_grouped_matmul` instead. Here (4 fake devices, tensor 2 x expert 2,
32 experts, so 16 per device): one MoE block's forward temporaries with the stand-in lie between
the largest array of the analytic count (`moe_block_bytes`) and the count's sum (no buffer
reuse), i.e. within a factor 1 of the analytic kernel memory, while the ragged_dot lowering's
exceed the sum several times; and a whole program (the reference pass) compiled with the
stand-in needs less than half the temporaries of the ragged_dot lowering (moe_impl='ragged').
For moe_impl='ep' (`--preset=...:moe_impl=ep`) the policy step compiles with the stand-in and
the block's temporaries lie within `ep_block_bytes`. Three subprocesses (fake devices must be
set before jax is imported), about 40 s of CPU.
"""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = [sys.executable, os.path.join(REPO, "launch", "check.py"),
        "--config=configs/tag_moe.py", "--devices=4",
        "--mesh=tensor=2,expert=2", "--rows=8", "--prompt_len=16", "--new_tokens=16",
        "--micro_batches=2"]
RAGGED = ["--preset=tiny_moe:num_experts=32,moe_impl=ragged", "--programs=ref_logprob,moe_block"]
_MB = {"MB": 1e6, "GB": 1e9}


def _run(extra):
  out = subprocess.run(BASE + extra, cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout


def _bytes(text, label):
  m = re.search(re.escape(label) + r"\s+([\d.]+) (MB|GB)", text)
  assert m, (label, text)
  return float(m.group(1)) * _MB[m.group(2)]


def _ref_temp(text):
  m = re.search(r"ref_logprob\s+args .* temp\s+([\d.]+) (MB|GB)\s+=> peak .* fits", text)
  assert m, text
  return float(m.group(1)) * _MB[m.group(2)]


def test_stand_in_matches_the_analytic_count_and_ragged_dot_does_not():
  text = _run(RAGGED)
  assert "stand_in_grouped_matmul" in text, text
  analytic = _bytes(text, "analytic sum (no buffer reuse)")
  largest = max(_bytes(text, "gathered rows xs [X*U, D]"),
                _bytes(text, "down [X*U, D] (grouped matmul result) + its all-reduce") / 2)
  stand_in = _bytes(text, "XLA temp with stand_in")
  ragged = _bytes(text, "XLA temp with ragged_dot")
  assert largest <= stand_in <= analytic, (largest, stand_in, analytic)
  assert ragged > 3 * analytic, (ragged, analytic)
  # The full program compiled through the ragged_dot lowering: its temporaries are inflated.
  ragged_text = _run(RAGGED + ["--moe_matmul=ragged_dot", "--programs=ref_logprob"])
  assert "XLA:CPU's lowering of jax.lax.ragged_dot" in ragged_text
  assert _ref_temp(text) < 0.5 * _ref_temp(ragged_text), (text, ragged_text)


def _line(text, prog):
  """(args, alias, peak, resident, total) in bytes of one program's line."""
  num = r"\s+([\d.]+) (MB|GB)"
  m = re.search(rf"{prog}\s+args{num}.*?alias{num}.*?=> peak{num} \+ resident{num} ={num} fits",
                text)
  assert m, (prog, text)
  g = m.groups()
  return [float(g[i]) * _MB[g[i + 1]] for i in range(0, 10, 2)]


def test_lora_and_continuous_engine_programs():
  """One run of a tiny LoRA config with the continuous engine on 8 fake devices: the train
  state is the adapter state (donated by the step, which takes the frozen base too), the
  residents follow LoRA's rule (nothing next to the step, the adapter state next to the
  reference pass, base + adapter state next to the sampler), and the engine's three slot
  programs compile at the config's slot count with the analytic slot budget printed."""
  cmd = [sys.executable, os.path.join(REPO, "launch", "check.py"),
         "--config=configs/tag_math.py:lora=8", "--preset=tiny_qwen3:d_model=256,d_ff=512",
         "--devices=8",
         "--mesh=data=2,fsdp=2,tensor=2,expert=1", "--rows=16", "--prompt_len=16",
         "--new_tokens=16", "--micro_batches=2", "--set", "rollout.engine=continuous",
         "--set", "rollout.slots=8"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  text = out.stdout
  assert "training LoRA rank 8, alpha 16, on 14 kernels (frozen base)" in text, text
  state = float(re.search(r"train state:.*?total,\s+([\d.]+) MB per device", text).group(1)) * 1e6
  base = float(re.search(r"frozen base .*?:\s+([\d.]+) MB per device", text).group(1)) * 1e6
  assert 0 < state < base / 2, (state, base)  # adapters + 2 moments: a fraction of the base
  args, alias, _, resident, _ = _line(text, "policy_step")
  assert resident == 0 and abs(alias - state) <= 0.01e6 and args >= state + base - 0.02e6, text
  assert _line(text, "ref_logprob")[3] == state, text
  # The engine: S = 8 slots over 4 data-parallel groups, pools (8, 4), each program fits.
  assert "S=8 slots (pool sizes (8, 4))" in text, text
  assert re.search(r"slot budget \(mr_rl.sampling.memory, .*\): \d+ slots fit", text), text
  for prog in ("engine_prefill", "engine_step", "engine_shrink"):
    assert _line(text, prog)[3] >= base + state - 0.02e6, (prog, text)  # + the sampler's
  assert "  sampler " not in text  # the static sampler is not the config's engine


def test_ep_dispatch_is_compiled_with_the_stand_in_within_its_analytic_count():
  """The check compiles the 'ep' path (policy step included: the stand-in's custom VJP inside
  shard_map) and its one-block count brackets XLA's temporaries."""
  text = _run(["--preset=tiny_moe:num_experts=32,moe_impl=ep", "--programs=policy_step,moe_block"])
  assert "moe_impl='ep', grouped matmuls compiled as" in text, text
  assert re.search(r"policy_step\s+args .* fits", text), text
  analytic = _bytes(text, "analytic sum (no buffer reuse)")
  largest = max(_bytes(text, "local experts' weights at full width, all-gathered (3 x [E/expert, "
                             "D, F])") / 3,
                _bytes(text, "send, received, sorted rows [rows, D]") / 3)
  stand_in = _bytes(text, "XLA temp with stand_in")
  assert largest <= stand_in <= analytic, (largest, stand_in, analytic)


def test_the_readme_command_runs_as_written_and_the_slot_budget_fits_every_engine_program():
  """`python launch/check.py --config=... --programs=engine --slots=budget` (the README's) needs
  no --devices (the config's mesh) nor --preset (a local checkpoint's config.json), and the
  slots the budget says fit make every engine program fit, the tail shrink included (its
  half-size copy is in the budget; XLA:CPU's float32 copy of a 16-bit cache is not an
  accelerator's and is reported apart)."""
  out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check.py"),
                        "--config=configs/demo.py", "--programs=engine", "--slots=budget"],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "every program fits" in out.stdout
  out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check.py"),
                        "--config=configs/tag_math.py", "--devices=4", "--programs=engine",
                        "--slots=budget", "--new_tokens=1024"],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  text = out.stdout
  for name in ("engine_prefill", "engine_step", "engine_shrink"):
    assert re.search(rf"{name} .* fits", text), text
  assert "XLA:CPU's float32 copy of the cache" in text     # bf16 cache (paper configs)
  assert "bfloat16 compute" in text and "float32 master weights" in text


def test_a_multiturn_config_is_checked_on_its_turn_programs():
  """`--config=configs/demo_tools.py --programs=engine` (the multi-turn demo, its local
  checkpoint) on fake CPU devices: the turn programs TurnDraws builds, append included."""
  out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check.py"),
                        "--config=configs/demo_tools.py", "--devices=2", "--mesh=data=2",
                        "--programs=engine"],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  text = out.stdout
  assert "sampler  multi-turn rollouts" in text and "append R=8 rows x A=8 ids" in text, text
  for name in ("engine_init", "engine_prefill", "engine_step", "engine_gather", "engine_append"):
    assert re.search(rf"{name} .* fits", text), text
  assert "engine_shrink" not in text
