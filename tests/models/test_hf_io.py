"""mr_rl.models.hf_io names damaged or unexpected model files (docs/runs.md, "Damaged files
named"): a truncated safetensors file, a PEFT adapter directory as the model, a hub id that
cannot be fetched; `mr_rl.main` prints each as one FATAL line."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from mr_rl import errors
from mr_rl.models import hf_io

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = os.path.join(ROOT, "mr_rl", "demo", "assets", "base_policy")


def _truncated_copy(tmp_path):
  out = tmp_path / "cut_policy"
  shutil.copytree(BASE, out)
  weights = out / "model.safetensors"
  with open(weights, "r+b") as f:
    f.truncate(os.path.getsize(weights) // 2)
  return out


def test_a_truncated_safetensors_file_is_named(tmp_path):
  """It was `SafetensorError: incomplete metadata, file not fully covered`, with no path."""
  out = _truncated_copy(tmp_path)
  with pytest.raises(errors.DamagedFileError, match=rf"^{out}/model.safetensors is incomplete or "
                                                    r"damaged \(safetensors: "):
    hf_io.load_pretrained(str(out))


def test_a_peft_adapter_directory_as_the_model_points_to_its_base_and_init_from(tmp_path):
  """It was `FileNotFoundError: no config.json`, with no hint about adapters."""
  adapter = tmp_path / "my-adapter"
  adapter.mkdir()
  (adapter / "adapter_config.json").write_text(json.dumps(
      {"peft_type": "LORA", "r": 8, "base_model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507"}))
  with pytest.raises(errors.UserError, match=(
      rf"^{adapter} is a PEFT adapter directory \(adapter_config.json\), not a model: give its "
      r"base model as config.model.path \(Qwen/Qwen3-4B-Instruct-2507\) and the adapters as "
      rf"config.model.lora.init_from={adapter}$")):
    hf_io.load_pretrained(str(adapter))


@pytest.mark.parametrize("case", ["truncated", "offline_hub_id"])
def test_main_prints_one_fatal_line(tmp_path, case):
  """The README's command offline ended in a 130-line traceback; a truncated checkpoint in 36
  lines naming no file."""
  path = _truncated_copy(tmp_path) if case == "truncated" else "Qwen/Qwen3-4B-Instruct-2507"
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
             HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))
  p = subprocess.run([sys.executable, "-m", "mr_rl.main", "--config=configs/demo.py:smoke",
                      "--config.pipeline=train", f"--config.model.path={path}",
                      f"--workdir={tmp_path / 'wd'}"], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 1 and len(lines) == 1, p.stderr[-3000:]
  if case == "truncated":
    assert lines[0].startswith(f"FATAL DamagedFileError: {path}/model.safetensors is incomplete")
  else:
    assert lines[0].startswith("FATAL HubUnavailableError: could not fetch 'Qwen/Qwen3-4B-"
                               "Instruct-2507'") and "--config.model.path=DIR" in lines[0]
  assert not (tmp_path / "wd").exists()  # (refused at start-up: no workdir left)
