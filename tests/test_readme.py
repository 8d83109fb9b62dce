"""Every command README.md shows is run here as written (placeholders filled in with this
test's paths), or listed in `NOT_RUN` with the reason and where it is covered instead; a
command the README gains fails `test_every_readme_command_is_run_or_accounted_for` until it
is one or the other. The two set-up commands are run from a fresh clone before every stop
(docs/testing.md)."""

import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")

# command prefix -> why it is not run here (and what covers it)
NOT_RUN = {
    'pip install -e . && python -m mr_rl.main --config=configs/demo.py':
        "the set-up demo command (about 9 minutes): run from a fresh clone before every stop",
    'pip install -e ".[test]" && python -m pytest':
        "the set-up test command: this suite",
    "python -m mr_rl.main --config=configs/amrp_math.py --workdir=$W":
        "fetches Qwen3 from the hub and needs a W&B account; the --dry_run line runs its config",
    "python -m mr_rl.export --workdir=$W --step=200":
        "needs a 200-step run; the same CLI without --step runs below on a 2-step run",
    "vllm serve": "vLLM is not installed here (the export's layout is transformers')",
    "python -m mr_rl.main --config=configs/tag_math.py --workdir=$SHARED_DIR --multihost":
        "needs a second host; launch/local_multiprocess.py runs the same on one machine below",
    'pip install -e ".[tpu]" && python launch/check.py --config=configs/amrp_math.py':
        "the libtpu check of the example config (minutes): tests/launch/test_check_tpu.py runs "
        "the same check of the same config (libtpu is in the test extra)",
    "python -m mr_rl.demo.summary": "needs finished demo workdirs; tests/demo/test_demo.py runs "
                                    "its tables on demo reports",
}


def readme_commands() -> list[str]:
  """The shell commands of README.md: each line of its ```bash blocks (continuations joined)
  and each inline `python ...` span."""
  text = open(README).read()
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    joined = re.sub(r"\\\n\s*", "", block)
    commands += [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]
  commands += [" ".join(c.split()) for c in re.findall(r"`(python [^`]+)`", text)]
  return commands


def _not_run(command: str) -> str | None:
  return next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
  """A 2-step run of the demo's model and data (`--config.pipeline=train`): the $W of the
  README's commands."""
  w = tmp_path_factory.mktemp("readme") / "w"
  _run(f"python -m mr_rl.main --config=configs/demo.py:smoke --workdir={w} "
       f"--config.pipeline=train --config.eval.num_prompts=4")
  return w


def _run(command: str, timeout: int = 600) -> subprocess.CompletedProcess:
  argv = shlex.split(command)
  assert argv[0] == "python", command
  out = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                                 PYTHONPATH=REPO))
  assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-3000:])
  return out


def _filled(command: str, w, tmp_path) -> str:
  """The README's placeholders as this test's paths and configs."""
  return (command.replace("$W", str(w)).replace("--workdir=W ", f"--workdir={w} ")
          .replace("--out=DIR", f"--out={tmp_path / 'out'}")
          .replace("--config=...", "--config=configs/demo.py:smoke")
          .replace("/tmp/mp", str(tmp_path / "mp"))
          .replace("/tmp/mr_rl_demo/brief/tag", str(w)))  # (one run of a demo workdir)


RUN = [c for c in readme_commands() if _not_run(c) is None]


def test_every_readme_command_is_run_or_accounted_for():
  commands = readme_commands()
  assert len(commands) >= 8, commands
  stale = [p for p in NOT_RUN if not any(c.startswith(p) for c in commands)]
  assert not stale, f"NOT_RUN names commands the README no longer has: {stale}"
  assert all(c.startswith("python ") for c in RUN), RUN


@pytest.mark.parametrize("command", RUN)
def test_readme_command_runs_as_written(command, demo_run, tmp_path):
  out = _run(_filled(command, demo_run, tmp_path))
  if "mr_rl.plots" in command:
    assert os.listdir(demo_run / "plots"), out.stdout
  if "mr_rl.export" in command:
    assert (tmp_path / "out" / "config.json").exists()
