"""An export is written whole or not at all (`mr_rl.staged_dir`): a process killed midway (a
real SIGKILL) or an export that raises leaves `out` as it was, absent or the earlier export;
the killed export's leftover is named as incomplete and the next export removes it and says so.
On the demo's shipped base policy (no training needed)."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import jax
import pytest

from mr_rl import export as export_lib
from mr_rl import models
from mr_rl import staged_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(REPO, "mr_rl", "demo", "assets", "base_policy")
SETTINGS = {"data": {"template": ""}, "model": {"path": BASE}}  # the demo's (no template)

# Writes the demo's base policy with its weights halved (unlike any export the tests keep) to
# argv[1] and kills itself (SIGKILL) when the export reaches its tokenizer step: the weights,
# config.json and tokenizer files are written by then, the generation config and chat template
# not yet.
KILLED_EXPORT = textwrap.dedent("""
    import os, signal, sys
    import jax
    from mr_rl import export as export_lib
    from mr_rl import models
    base = sys.argv[2]
    model, params = models.load_pretrained(base)
    params = jax.tree.map(lambda x: x / 2, params)
    def killed(path):
      print("killed at the tokenizer step", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    models.load_tokenizer = killed
    export_lib.write_hf(model, params, sys.argv[1], base,
                        settings={"data": {"template": ""}, "model": {"path": base}})
""")


def _killed_export(out: str) -> None:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
  r = subprocess.run([sys.executable, "-c", KILLED_EXPORT, out, BASE], capture_output=True,
                     text=True, env=env, cwd=REPO, timeout=300)
  assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-3000:])
  assert "killed at the tokenizer step" in r.stdout


def _files(d) -> dict:
  return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def _loads_in_transformers(out: str) -> None:
  from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
  tok = AutoTokenizer.from_pretrained(out)
  assert tok.apply_chat_template([{"role": "user", "content": "Q:7+5-3="}], tokenize=False,
                                 add_generation_prompt=True) == "<bos>Q:7+5-3="
  assert GenerationConfig.from_pretrained(out).eos_token_id == tok.eos_token_id
  AutoModelForCausalLM.from_pretrained(out)


def test_a_killed_export_leaves_out_as_it_was_and_the_next_one_cleans_up(tmp_path):
  out = str(tmp_path / "hf")
  _killed_export(out)
  assert not os.path.exists(out)  # no half-written export under `out`
  (left,) = staged_dir.leftovers(out)  # the killed export's files, under a name that says so
  assert ".incomplete-export." in os.path.basename(left)
  assert {"model.safetensors", "config.json"} <= set(os.listdir(left))
  assert "generation_config.json" not in os.listdir(left)
  model, params = models.load_pretrained(BASE)
  lines = []
  assert export_lib.write_hf(model, params, out, BASE, settings=SETTINGS,
                             log=lines.append) == out
  assert not os.path.exists(left) and staged_dir.leftovers(out) == []
  assert len(lines) == 1 and lines[0].startswith(f"removed {left}: an incomplete export"), lines
  assert "no longer runs" in lines[0]
  _loads_in_transformers(out)
  # a rewrite killed midway leaves the complete earlier export as it was
  (tmp_path / "hf" / "notes.txt").write_text("mine")
  before = _files(out)
  _killed_export(out)
  assert _files(out) == before
  assert len(staged_dir.leftovers(out)) == 1


def test_a_failing_overwrite_keeps_the_earlier_export(tmp_path, monkeypatch):
  out = str(tmp_path / "hf")
  model, params = models.load_pretrained(BASE)
  export_lib.write_hf(model, params, out, BASE, settings=SETTINGS)
  (tmp_path / "hf" / "notes.txt").write_text("mine")
  before = _files(out)

  def fails(path):
    raise RuntimeError("the tokenizer step failed")

  monkeypatch.setattr(models, "load_tokenizer", fails)
  halved = jax.tree.map(lambda x: x / 2, params)  # other weights: a half-done rewrite shows
  with pytest.raises(RuntimeError, match="the tokenizer step failed") as e:
    export_lib.write_hf(model, halved, out, BASE, settings=SETTINGS)
  assert _files(out) == before and staged_dir.leftovers(out) == []
  assert any("is as it was before" in n for n in getattr(e.value, "__notes__", [""])) or \
      sys.version_info < (3, 11)
  monkeypatch.undo()
  export_lib.write_hf(model, params, out, BASE, settings=SETTINGS)  # the rewrite succeeds ...
  assert open(os.path.join(out, "notes.txt")).read() == "mine"  # ... keeping the user's file
  assert sorted(os.listdir(out)) == sorted(before) and staged_dir.leftovers(out) == []
  _loads_in_transformers(out)


# ------------------------------------------------------------------------------ staged_dir
def _dead_pid() -> int:
  p = subprocess.Popen([sys.executable, "-c", "pass"])
  p.wait()
  return p.pid


def test_leftovers_of_stopped_processes_of_this_host_only_are_removed(tmp_path):
  out = str(tmp_path / "exp")
  host = staged_dir.sibling(out, "x")[len(out + ".x."):].rsplit(".", 1)[0]  # (may hold dots)
  dead, live = _dead_pid(), os.getppid()
  paths = {k: f"{out}.{k}" for k in (
      f"incomplete-export.{host}.{dead}", f"incomplete-export.{host}.{live}",
      f"incomplete-export.otherhost.{dead}", f"replaced-export.{host}.{dead}")}
  for p in paths.values():
    os.makedirs(p)
  os.makedirs(out + ".mine")  # not a leftover: never touched
  lines = []
  staged_dir.clean_leftovers(out, lines.append)
  # `out` is absent: the set-aside earlier export is kept (a swap stopped between its renames)
  kept = sorted(p for p in paths.values() if os.path.exists(p))
  assert kept == sorted([paths[f"incomplete-export.{host}.{live}"],
                         paths[f"incomplete-export.otherhost.{dead}"],
                         paths[f"replaced-export.{host}.{dead}"]]), kept
  assert os.path.isdir(out + ".mine")
  assert any(line.startswith("kept ") and "rename it back" in line for line in lines), lines
  assert sum(line.startswith("left ") for line in lines) == 2, lines
  os.makedirs(out)  # once `out` exists the set-aside copy is stale
  staged_dir.clean_leftovers(out, lines.append)
  assert not os.path.exists(paths[f"replaced-export.{host}.{dead}"])


def test_staged_keeps_the_entries_keep_accepts_and_follows_a_symlink(tmp_path):
  real = tmp_path / "real"
  real.mkdir()
  (real / "old.bin").write_text("old export")
  (real / "notes").mkdir()
  (real / "notes" / "a.txt").write_text("mine")
  link = tmp_path / "link"
  link.symlink_to(real)
  with staged_dir.staged(str(link), keep=lambda n: n != "old.bin", log=None) as tmp:
    assert os.path.basename(tmp).startswith("real.incomplete-export.")
    with open(os.path.join(tmp, "new.json"), "w") as f:
      json.dump({}, f)
  assert link.is_symlink() and sorted(os.listdir(real)) == ["new.json", "notes"]
  assert (real / "notes" / "a.txt").read_text() == "mine"
  assert staged_dir.leftovers(str(real)) == []


def test_a_damaged_settings_json_is_named_with_its_path_and_base(tmp_path):
  """A settings.json cut short ended the export in a bare JSONDecodeError naming no file."""
  wd = tmp_path / "run"
  (wd / "checkpoints").mkdir(parents=True)
  settings = wd / "settings.json"
  settings.write_text(json.dumps({"model": {"path": BASE, "lora": {}}})[:20])
  p = subprocess.run([sys.executable, "-m", "mr_rl.export", f"--workdir={wd}",
                      f"--out={tmp_path / 'hf'}"], capture_output=True, text=True, cwd=REPO,
                     env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"), timeout=300)
  assert p.returncode == 1, p.stderr[-3000:]
  assert p.stderr.strip().splitlines() == [
      f"FATAL DamagedFileError: {settings} is damaged (line 1, column 20: Unterminated string "
      "starting at); it names the run's base checkpoint: give that with --base=DIR (and "
      "restore the file from a copy, or from a settings.resume-<step>.json of the same run)"], \
      p.stderr[-3000:]
  logs = []  # with --base the export goes on (to the checkpoints: none here)
  with pytest.raises(FileNotFoundError, match="no checkpoints under"):
    export_lib.export(str(wd), str(tmp_path / "hf"), base=BASE, log=logs.append)
  assert any(f"{settings} is damaged" in l and f"exporting with --base={BASE}" in l
             for l in logs), logs
