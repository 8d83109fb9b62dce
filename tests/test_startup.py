"""Settings that cannot train are refused at start-up and by `--dry_run`, naming the fields
(`mr_rl.startup`; docs/runs.md, "Refused at start-up"): greedy sampling with a group-relative
advantage, prompt + response beyond the model's positions, fewer rows than a batch, rollout
rows the devices cannot split."""

import json
import os
import subprocess
import sys

import pytest

from mr_rl import errors
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.testing.runs import arith_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dry_run(*args, devices=1):
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
  return subprocess.run([sys.executable, "-m", "mr_rl.main", "--config=configs/demo.py:smoke",
                         "--dry_run", *args], capture_output=True, text=True, cwd=ROOT,
                        timeout=300, env=env)


def _fatal(p):
  assert p.returncode == 1, (p.stdout[-2000:], p.stderr[-3000:])
  lines = p.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("FATAL "), p.stderr[-3000:]
  return lines[0]


@pytest.mark.parametrize("flag", ["rollout.temperature=0", "rollout.top_k=1"])
def test_greedy_sampling_with_a_group_relative_advantage_is_refused(flag):
  """Every group of a greedy draw is G copies of one response: the advantage is 0 everywhere
  (frac_zero_std 1, grad_norm 0) for as long as the run goes."""
  line = _fatal(_dry_run(f"--config.{flag}"))
  assert line.startswith(f"FATAL ConfigError: config.{flag} samples greedily"), line
  assert "group-relative advantage (grpo)" in line and "config.eval.temperature=0" in line


def test_prompt_plus_response_beyond_the_model_positions_is_refused(base_policy):
  """The demo policy has 80 positions: 18 + 100 columns were trained on without a word."""
  line = _fatal(_dry_run("--config.rollout.max_new_tokens=100"))
  assert ("config.data.max_prompt_len=18 + config.rollout.max_new_tokens=100 = 118 tokens, "
          "beyond the model's 80 positions") in line, line
  c = arith_config(base_policy, 1)  # the same at start-up (the model loaded)
  c.data.max_prompt_len, c.rollout.max_new_tokens = 40, 41
  with pytest.raises(errors.ConfigError, match=r"max_prompt_len=40 \+ config.rollout."
                                               r"max_new_tokens=41 = 81 tokens, beyond the "
                                               r"model's 80 positions .*" + base_policy):
    train_lib.build(settings_lib.from_config(c))


def test_fewer_rows_than_a_batch_are_refused_naming_the_file_and_field(base_policy, tmp_path):
  path = tmp_path / "three.jsonl"
  path.write_text("".join(json.dumps(dict(problem=f"Q:{i}+1=", solution="", answer=str(i + 1),
                                          subject="arith", level=1, unique_id=f"r{i}")) + "\n"
                          for i in range(3)))
  c = arith_config(base_policy, 1)
  c.data.name, c.data.path, c.data.options = "math500", str(path), {}
  c.rewards.channels = "arith_negative,arith_fmt"
  with pytest.raises(errors.DataError, match=r"\(after the length checks\) has 3 rows, fewer "
                                             r"than one batch of config.data.batch_prompts=4") \
      as e:
    train_lib.build(settings_lib.from_config(c))
  assert str(path) in str(e.value)
  cfg = tmp_path / "cfg.py"  # --dry_run counts a local file's rows (no loader, no model)
  cfg.write_text(_CACHE_CFG.format(base=base_policy, path=str(path)))
  p = subprocess.run([sys.executable, "-m", "mr_rl.main", f"--config={cfg}", "--dry_run"],
                     cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
                     capture_output=True, text=True, timeout=300)
  assert _fatal(p) == (f"FATAL DataError: data file {str(path)!r} has 3 rows, fewer than one "
                       "batch of config.data.batch_prompts=4; give more rows or lower "
                       "config.data.batch_prompts to <= 3")


def test_rollout_rows_the_devices_cannot_split_are_refused():
  """16 rollout rows on 3 devices failed at the first draw in internal terms."""
  line = _fatal(_dry_run(devices=3))
  assert ("config.data.batch_prompts x config.rollout.group_size = 4 x 4 = 16 do not split over "
          "3 ways") in line and "on 3 devices" in line, line
  p = _dry_run("--config.rollout.group_size=3", devices=3)  # 12 rows: 4 a device
  assert p.returncode == 0, p.stderr[-3000:]


def test_the_prompt_style_is_a_setting_or_the_tokenizers_never_the_directory_name(
    base_policy, tmp_path):
  """`data.template` with a local model directory named `my-sft` was refused ("pass
  style='chat' or 'plain' explicitly", which no field set); a chat-named directory whose
  tokenizer has no chat template gave a bare ValueError."""
  import shutil
  from mr_rl import models
  tokenizer = models.load_tokenizer(base_policy)  # (no chat template)
  sft = shutil.copytree(base_policy, tmp_path / "my-sft")
  c = arith_config(str(sft), 1)
  c.data.template = "tag_math"
  s = settings_lib.from_config(c)
  assert train_lib.prompt_style(s, tokenizer) == "plain"  # the tokenizer's
  c.data.style = "chat"
  with pytest.raises(errors.ConfigError, match=r"^config.data.style='chat' renders prompts with "
                                               r"the tokenizer's chat template, and the "
                                               rf"tokenizer of {sft} has none; set "
                                               r"config.data.style='plain'"):
    train_lib.prompt_style(settings_lib.from_config(c), tokenizer)
  chat_named = shutil.copytree(base_policy, tmp_path / "Qwen3-4B-Instruct-2507")
  c = arith_config(str(chat_named), 1)
  c.data.template = "tag_math"
  with pytest.raises(errors.ConfigError, match=r"^config.data.style='' \(the listed style of "):
    train_lib.build(settings_lib.from_config(c))  # before the first prompt is rendered
  c.data.style = "plain"
  assert train_lib.prompt_style(settings_lib.from_config(c), tokenizer) == "plain"


_CACHE_CFG = """
from mr_rl.testing.runs import arith_config

def get_config(arg=None):
  c = arith_config({base!r}, 1)
  c.data.name, c.data.path, c.data.options = "math500", {path!r}, {{}}
  c.rewards.channels = "arith_negative,arith_fmt"
  c.checkpoint_every = 0
  c.eval.num_prompts = 4
  return c
"""


def test_an_unwritable_cache_directory_never_stops_a_run(base_policy, tmp_path):
  """A HOME that cannot be created (a container user's): the optional compile cache under it
  gave a 34-line traceback; with it off, the datasets library's cache directory was reported
  as "data file 'good.jsonl' could not be read"."""
  path = tmp_path / "good.jsonl"
  path.write_text("".join(json.dumps(dict(problem=f"Q:{i}+1=", solution="", answer=str(i + 1),
                                          subject="arith", level=1, unique_id=f"r{i}")) + "\n"
                          for i in range(8)))
  cfg = tmp_path / "cfg.py"
  cfg.write_text(_CACHE_CFG.format(base=base_policy, path=str(path)))
  env = {k: v for k, v in os.environ.items()
         if k not in ("MR_RL_CACHE", "HF_HOME", "HF_DATASETS_CACHE", "XDG_CACHE_HOME")}
  env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", HOME="/proc/no-such-home")
  main = lambda wd, **e: subprocess.run(
      [sys.executable, "-m", "mr_rl.main", f"--config={cfg}", f"--workdir={wd}"], cwd=ROOT,
      env={**env, **e}, capture_output=True, text=True, timeout=600)
  p = main(tmp_path / "a")
  assert p.returncode == 1, p.stderr[-3000:]
  fatal = [l for l in p.stderr.splitlines() if l.startswith("FATAL")]
  assert len(fatal) == 1 and "datasets library's cache directory /proc/no-such-home/" in \
      fatal[0] and "HF_DATASETS_CACHE" in fatal[0] and "good.jsonl" not in fatal[0], p.stderr
  assert "Traceback" not in p.stderr
  p = main(tmp_path / "b", HF_DATASETS_CACHE=str(tmp_path / "ds_cache"))
  assert p.returncode == 0, p.stderr[-3000:]
  warned = [l for l in p.stderr.splitlines() if "compilation cache is off" in l]
  assert len(warned) == 1 and "/proc/no-such-home/.cache/mr_rl/xla" in warned[0] and \
      "config.compile.cache_dir (or MR_RL_CACHE)" in warned[0], p.stderr[-3000:]
