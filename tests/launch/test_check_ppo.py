"""launch/check.py on a PPO config (launch/check_ppo.py): the trainer's PPO programs and critic.

`configs/amrp_algorithms.py:algorithm=ppo` on a tiny model, 4 fake CPU devices (data 2 x fsdp 2):
the check compiles `ppo_step` and `value_forward` (the programs `update.learner(..., ppo=True)`
jits) in place of GRPO's `policy_step`; the step takes and donates the policy's and the critic's
state; the critic's state (a copy of the trunk, a value head, their Adam moments) stays resident
next to the reference pass, so that program's resident is the GRPO check's plus the critic's.
Then once with XLA:TPU for v5p-8 (libtpu), the two PPO programs only. About a minute of CPU.
"""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--preset=tiny_qwen3", "--mesh=data=2,fsdp=2", "--rows=8", "--prompt_len=16",
        "--new_tokens=16", "--micro_batches=2", "--programs=policy_step,ref_logprob"]
_MB = {"MB": 1e6, "GB": 1e9}
_NUM = r"\s+([\d.]+) (MB|GB)"


def _check(algorithm, *extra, cpu=True):
  cmd = [sys.executable, os.path.join(REPO, "launch", "check.py"),
         f"--config=configs/amrp_algorithms.py:algorithm={algorithm}", *TINY, *extra]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" or cpu}  # TPU: a user's flags
  out = subprocess.run(cmd + (["--devices=4"] if cpu else []), cwd=REPO, capture_output=True,
                       text=True, timeout=600, env=dict(env, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout


def _bytes(m, i=1):
  return float(m.group(i)) * _MB[m.group(i + 1)]


def _programs(text):
  """{program: (args, alias, resident)} in bytes per device, of the report's compiled lines."""
  out = {}
  for m in re.finditer(rf"^  (\w+)\s+args{_NUM}.*?alias{_NUM}.*?\+ resident{_NUM} =.* fits",
                       text, re.MULTILINE):
    out[m.group(1)] = (_bytes(m, 2), _bytes(m, 4), _bytes(m, 6))
  return out


def test_ppo_compiles_the_trainers_programs_and_keeps_the_critic_resident():
  text = _check("ppo")
  progs = _programs(text)
  assert list(progs) == ["ppo_step", "value_forward", "ref_logprob"], text
  state = _bytes(re.search(rf"train state:.*?total,{_NUM} per device", text))
  m = re.search(rf"critic \(PPO, a copy of the trunk \+ value head\):{_NUM} per device "
                rf"\(params{_NUM}, Adam moments{_NUM}\)", text)
  assert m, text
  critic, critic_params, critic_moments = _bytes(m), _bytes(m, 3), _bytes(m, 5)
  params = _bytes(re.search(rf"next to params{_NUM}", text))  # pi_0 per device
  assert abs(critic - state) < 0.02 * state, (critic, state)  # a copy of the policy + head
  args, alias, resident = progs["ppo_step"]
  tol = 0.02e6  # the report's rounding and the step counter, the batch
  assert abs(alias - (state + critic)) <= tol and args >= state + critic - tol, text  # donated
  assert abs(resident - params) <= tol, text                                    # pi_0
  args, _, resident = progs["value_forward"]
  assert abs(args - critic_params) <= tol, text
  assert abs(resident - (state + critic_moments + params)) <= tol, text
  # The GRPO check of the same config keeps the policy's state next to the reference pass;
  # PPO's adds the critic's.
  grpo_text = _check("grpo", "--programs=ref_logprob")
  grpo = _programs(grpo_text)
  assert "critic" not in grpo_text, grpo_text
  assert abs(progs["ref_logprob"][2] - grpo["ref_logprob"][2] - critic) <= tol, (progs, grpo)


try:
  import libtpu  # noqa: F401  pylint: disable=unused-import
  HAVE_LIBTPU = True
except ImportError:
  HAVE_LIBTPU = False


@pytest.mark.skipif(not HAVE_LIBTPU, reason='libtpu missing: pip install -e ".[tpu]"')
def test_ppo_programs_compile_for_v5p_8():
  text = _check("ppo", "--topology=v5p-8", "--programs=policy_step", cpu=False)
  assert "XLA:TPU" in text and "every program fits with 10% headroom" in text, text
  assert list(_programs(text)) == ["ppo_step", "value_forward"], text
