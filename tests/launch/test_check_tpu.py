"""launch/check.py --topology: the programs compiled by XLA:TPU itself, deviceless, on this host.

libtpu (the `tpu` extra, in the test extra) compiles for a TPU slice without a TPU. Here:

  * the tiny models' programs for v5p-8 (4 chips, so the mesh's sharding and the Pallas
    kernel's `shard_map` are exercised): the policy step, the reference forward and the static
    sampler; the continuous engine's programs with LoRA; an MoE policy step through the real
    `jax.lax.ragged_dot`; 'auto' attention resolving to the Pallas TPU kernel. What compiled is
    what `mr_rl.program_plan.expected_programs` says a run of those settings compiles;
  * the user's example config, `configs/amrp_math.py` (Qwen3-4B) on its slice v5p-8: every
    program stays under 90% of HBM (the check's 10% headroom), so a config that stops fitting
    on the pod cannot land;
  * the flag's errors: a name that is no slice, and no libtpu, say what to do.

Each check runs in a subprocess (the check sets up jax for its compiler).
"""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(REPO, "launch", "check.py")
sys.path.insert(0, os.path.join(REPO, "launch"))
import tpu_slice  # noqa: E402  pylint: disable=wrong-import-position

try:
  import libtpu  # noqa: F401  pylint: disable=unused-import
  HAVE_LIBTPU = True
except ImportError:
  HAVE_LIBTPU = False
needs_libtpu = pytest.mark.skipif(not HAVE_LIBTPU, reason='libtpu missing: pip install -e ".[tpu]"')

TINY = ["--config=configs/tag_math.py", "--topology=v5p-8", "--mesh=data=2,fsdp=2",
        "--rows=16", "--prompt_len=32", "--new_tokens=32", "--micro_batches=2"]
# check.py's program -> the program of a training run (mr_rl.compilation.PROGRAMS).
RUN_NAME = {"policy_step": "policy_step", "ref_logprob": "logprob_forward", "sampler": "sampler",
            "engine_prefill": "engine_prefill", "engine_step": "engine_step",
            "engine_shrink": "engine_shrink", "engine_init": "engine_init",
            "engine_gather": "engine_gather", "engine_append": "engine_append"}
# Device programs of a run the check does not size: small ones (the signal, the finite check,
# LoRA's merge, the engine's init and gather of 8 rows) and PPO's (not in these settings).
UNSIZED = {"signal", "finite_check", "lora_merge", "engine_init", "engine_gather", "ppo_step",
           "value_forward"}


def _env(**extra):
  """The environment a user's check runs in: without the test processes' XLA:CPU fast-compile
  flags (tests/conftest.py), which would change what XLA:TPU compiles."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return dict(env, JAX_PLATFORMS="cpu", **extra)


def _check(args, timeout=900):
  out = subprocess.run([sys.executable, CHECK] + args, cwd=REPO, capture_output=True, text=True,
                       timeout=timeout, env=_env())
  return out.returncode, out.stdout, out.stderr


def _compiled(text):
  """{program: (GB total per device, verdict)} from the report's per-device lines."""
  out = {}
  for m in re.finditer(r"^  (\w+)\s+args .*= +([\d.]+) (MB|GB) (.*?)  \(compiled in", text,
                       re.MULTILINE):
    out[m.group(1)] = (float(m.group(2)) * (1e-3 if m.group(3) == "MB" else 1), m.group(4))
  return out


def _expected(config_arg, sets):
  """The device programs `expected_programs` predicts for the config with `sets` applied."""
  from mr_rl import config_lib, program_plan, settings
  path, _, arg = config_arg.partition(":")
  c = config_lib.load_config_module(os.path.join(REPO, path)).get_config(arg or None)
  for key, value in sets.items():
    node = c
    *parents, leaf = key.split(".")
    for name in parents:
      node = node[name]
    node[leaf] = value
  s = settings.from_config(c)
  return {n for n, count in program_plan.expected_programs(s).items() if count} - UNSIZED


def test_slice_names_map_to_the_tpu_topologies():
  assert tpu_slice.topology_name("v5p-8") == ("v5p:2x2x1", {})
  assert tpu_slice.topology_name("v5p-32") == ("v5p:2x2x4", {})
  assert tpu_slice.topology_name("v5p-128") == ("v5p:4x4x4", {})
  assert tpu_slice.topology_name("v5e-16") == ("v5e:4x4", {})
  assert tpu_slice.topology_name("v6e-8") == ("v6e:2x4", {})
  assert tpu_slice.topology_name("v4-8") == ("v4:2x2x1", {})
  assert tpu_slice.topology_name("v5p-2") == ("v5p:1x1x1",
                                              {"chips_per_host_bounds": (1, 1, 1)})
  for bad in ("v5p-7", "v5p-12", "tpu-8", "v9-8"):
    with pytest.raises(tpu_slice.SliceError, match="topology"):
      tpu_slice.topology_name(bad)


@needs_libtpu
def test_tiny_programs_compile_for_v5p_8_as_a_run_predicts():
  """Static sampler, and the MoE's ragged_dot: XLA:TPU compiles what a run compiles."""
  rc, text, err = _check(TINY + ["--preset=tiny_qwen3"])
  assert rc == 0, text[-3000:] + err[-3000:]
  assert "XLA:TPU" in text and "4 chips of TPU v5 on 1 host" in text, text
  assert "pallas_tpu for the TPU" in text, text   # 'auto' resolved for the target
  compiled = _compiled(text)
  assert {RUN_NAME[n] for n in compiled} == _expected("configs/tag_math.py", {}), compiled
  assert all("fits" in v for _, v in compiled.values()), compiled

  rc, text, err = _check(["--config=configs/tag_moe.py", "--topology=v5p-8",
                          "--mesh=tensor=2,expert=2", "--preset=tiny_moe:moe_impl=ragged",
                          "--rows=8", "--prompt_len=16", "--new_tokens=16", "--micro_batches=2",
                          "--programs=policy_step,sampler"])
  assert rc == 0, text[-3000:] + err[-3000:]
  assert "jax.lax.ragged_dot, as XLA:TPU compiles it" in text, text
  assert set(_compiled(text)) == {"policy_step", "sampler"}, text


@needs_libtpu
def test_continuous_engine_and_lora_compile_for_v5p_8_as_a_run_predicts():
  """The engine's programs (the Pallas kernel inside its shard_map) with a LoRA train state."""
  sets = {"rollout.engine": "continuous", "model.lora.rank": 4}
  rc, text, err = _check(TINY + ["--preset=tiny_qwen3", "--set", "rollout.engine=continuous",
                                 "--set", "model.lora.rank=4"])
  assert rc == 0, text[-3000:] + err[-3000:]
  assert "LoRA rank 4" in text, text
  compiled = _compiled(text)
  assert {RUN_NAME[n] for n in compiled} == _expected("configs/tag_math.py", sets), compiled


@needs_libtpu
def test_multiturn_turn_programs_compile_for_v5p_8_as_a_run_predicts():
  """configs/math_tools.py's rollouts are its turn programs (launch/check_turns.py), not its
  engine's: compiled under the mesh by XLA:TPU, the names a run compiles."""
  rc, text, err = _check(TINY + ["--preset=tiny_qwen3", "--config=configs/math_tools.py",
                                 "--slots=8"])
  assert rc == 0, text[-3000:] + err[-3000:]
  assert "sampler  multi-turn rollouts" in text and "append R=8 rows x A=128 ids" in text, text
  compiled = _compiled(text)
  assert {"engine_append", "engine_step", "engine_gather"} <= set(compiled), compiled
  assert {RUN_NAME[n] for n in compiled} - UNSIZED == _expected("configs/math_tools.py", {})
  assert all("fits" in v for _, v in compiled.values()), compiled


@needs_libtpu
def test_the_users_example_config_fits_v5p_8_with_headroom():
  """configs/amrp_math.py (the README's pod command) under XLA:TPU on v5p-8: every program
  under 90% of HBM."""
  rc, text, err = _check(["--config=configs/amrp_math.py", "--topology=v5p-8"], timeout=1500)
  compiled = _compiled(text)
  assert {"policy_step", "ref_logprob", "sampler"} <= set(compiled), text[-4000:] + err[-2000:]
  assert rc == 0, text[-4000:]
  assert "every program fits with 10% headroom (XLA:TPU, v5p-8)" in text, text[-2000:]


def test_topology_errors_say_what_to_do(tmp_path):
  rc, _, err = _check(TINY + ["--preset=tiny_qwen3", "--topology=tpu-8"], timeout=120)
  assert rc == 2 and "Cloud TPU slice name" in err, err
  # Without libtpu (hidden from the import system), the flag fails at once with the install line.
  hide = tmp_path / "libtpu"
  hide.mkdir()
  (hide / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
  env = _env(PYTHONPATH=str(tmp_path))
  out = subprocess.run([sys.executable, CHECK] + TINY + ["--preset=tiny_qwen3"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env=env)
  assert out.returncode == 2 and 'pip install -e ".[tpu]"' in out.stderr, out.stderr[-2000:]


def test_fit_bisects_to_the_largest_passing_candidate(capsys):
  import check  # launch/check.py
  calls = []

  def passes(x):
    calls.append(x)
    return x <= 24, "passes" if x <= 24 else "fails"

  candidates = [4, 8, 12, 16, 20, 24, 28, 32, 64]
  assert check._bisect(candidates, passes, str) == 24  # pylint: disable=protected-access
  assert len(calls) <= 4, calls          # log2 of the candidates, not all of them
  assert check._bisect([8, 16], lambda x: (False, "fails"), str) is None  # pylint: disable=protected-access
  assert "fails" in capsys.readouterr().out


@needs_libtpu
def test_fit_prints_the_settings_that_fit():
  """--fit on a tiny model: every micro-batch fits, so the largest (all rows in one) is chosen,
  and the whole check then runs at it."""
  rc, text, err = _check(TINY + ["--preset=tiny_qwen3", "--fit", "--programs=policy_step"])
  assert rc == 0, text[-3000:] + err[-3000:]
  assert "settings that fit: --set optim.num_micro_batches=1" in text, text[-3000:]
  assert "micro_batches=1" in text and "every program fits with 10% headroom" in text, text
