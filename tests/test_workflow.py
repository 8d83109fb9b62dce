"""A researcher's workflow end to end on tiny models: train with W&B (offline) and a
console ETA, resume; plot the run; export it as a Hugging Face checkpoint (the CLI and
`config.export.hf_at_end`) that transformers loads and whose greedy generation equals mr_rl's
greedy sampler token for token, for a dense model, a MoE model and parameters sharded over 8
(fake) devices; the dry run; the offline errors naming the config fields.

The dense run trains the demo's shipped base policy on the arithmetic task; the MoE run a tiny
random Qwen3-MoE checkpoint (`mr_rl.tiny_assets`) on tiny NuminaMath rows. The 8-device check
runs this file as a script in a subprocess (XLA_FLAGS set before jax is imported), as
tests/test_train_scale.py does.
"""

import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap

from mr_rl.testing import xla_env

if __name__ == "__main__":
  xla_env.use_cpu_devices(8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mr_rl import export as export_lib  # noqa: E402
from mr_rl import metrics as metrics_lib  # noqa: E402
from mr_rl import models  # noqa: E402
from mr_rl import sampling  # noqa: E402
from mr_rl import settings as settings_lib  # noqa: E402
from mr_rl.testing import runs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(REPO, "mr_rl", "demo", "assets", "base_policy")
N_NEW = 20  # greedy tokens compared with transformers (short answers end within it, long ones not)
try:
  import wandb  # noqa: F401
  HAVE_WANDB = True
except ImportError:
  HAVE_WANDB = False
WANDB_SKIP = "wandb is not installed (pip install -e '.[wandb]'; CI installs it with '.[test]')"


def _mr_greedy(model, params, tokenizer, p_tok, p_mask, mesh=None) -> list[list[int]]:
  """mr_rl's greedy sampler: the tokens of each row up to and including EOS."""
  out = jax.device_get(sampling.generate_groups(
      model, params, np.asarray(p_tok), np.asarray(p_mask), group_size=1,
      key=jax.random.PRNGKey(0), max_new_tokens=N_NEW, temperature=0.0,
      eos_id=tokenizer.eos_token_id,
      pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
      else tokenizer.eos_token_id, mesh=mesh))
  return [out.tokens[b, 0, :int(out.lengths[b, 0])].tolist() for b in range(len(p_tok))]


def _hf_greedy(directory: str, prompts: list[list[int]]) -> list[list[int]]:
  """transformers' greedy `generate` on an exported directory, one unpadded prompt at a time
  (stopping where the exported generation config says)."""
  import torch
  import transformers
  hf = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
  out = []
  for ids in prompts:
    with torch.no_grad():
      o = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      do_sample=False, max_new_tokens=N_NEW)
    out.append(o[0, len(ids):].tolist())
  return out


def _prompts(policy, examples):
  p_tok, p_mask = policy.encode(examples)
  return p_tok, p_mask, [policy.prompt_ids(ex) for ex in examples]


def _tensors(directory: str) -> dict:
  from safetensors.numpy import load_file
  out = {}
  for fn in sorted(glob.glob(os.path.join(directory, "model*.safetensors"))):
    out.update(load_file(fn))
  return out


def _assert_same_tree(a, b):
  la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in la] == [p for p, _ in lb]
  for (path, x), (_, y) in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


# ------------------------------------------------------------------------------ fixtures
def dense_config(total_steps: int):
  """`mr_rl.testing.runs.arith_config` on the shipped base policy, with the export at the end,
  a greedy evaluation and (when installed) W&B."""
  c = runs.arith_config(BASE, total_steps)
  c.data.options.num_train = 32
  c.data.options.num_eval = 8
  c.rewards.channels = "arith_acc,arith_negative"
  c.checkpoint_every = 1
  c.export.hf_at_end = True
  c.eval.num_prompts = 4
  c.eval.samples_per_prompt = 1
  c.eval.temperature = 0.0
  if HAVE_WANDB:
    c.logging.wandb_project = "mr_rl-test"
  return c


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory):
  """Step 1 with train(), then the `train` pipeline to step 2 in the same workdir (a resume):
  W&B offline, checkpoints at 1 and 2, WORKDIR/hf at the end."""
  from mr_rl import pipelines
  from mr_rl import train as train_lib
  wd = str(tmp_path_factory.mktemp("dense") / "run")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    s1, s2 = (settings_lib.from_config(dense_config(n)) for n in (1, 2))
    comp = train_lib.build(s2)
    lines = []
    first = train_lib.train(s1, wd, comp=comp, log=lines.append)
    res, _ = pipelines.run_train(s2, wd, comp=comp)
  return dict(wd=wd, comp=comp, step1=first.params, final=res.params, lines=lines)


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
  """One step of a tiny Qwen3-MoE (4 experts, top 2) whose base has a generation config."""
  from transformers import GenerationConfig
  from mr_rl import tiny_assets
  from mr_rl import train as train_lib
  root = tmp_path_factory.mktemp("moe")
  ckpt = tiny_assets.make_tiny_checkpoint(str(root / "Qwen3-30B-A3B-Instruct-2507"), "qwen3_moe")
  tok = models.load_tokenizer(ckpt)
  GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id).save_pretrained(ckpt)  # as Qwen3's hub copy
  c = runs.numina_config(ckpt, tiny_assets.make_tiny_data("numina_math", str(root / "data")), 1)
  c.checkpoint_every = 1
  c.optim.lr = 1e-2
  s = settings_lib.from_config(c)
  comp = train_lib.build(s)
  wd = str(root / "run")
  res = train_lib.train(s, wd, comp=comp, log=None)
  return dict(wd=wd, comp=comp, base=ckpt, final=res.params)


# ------------------------------------------------------------------------------ export
def test_export_dense_cli_and_hf_at_end(dense_run, tmp_path):
  wd, comp = dense_run["wd"], dense_run["comp"]
  assert export_lib.checkpoint_steps(wd) == [1, 2]
  out1 = str(tmp_path / "step1")
  assert export_lib.main(["--workdir", wd, "--step", "1", "--out", out1]) == out1  # the CLI
  # the weights: step 1's are the 1-step run's params, WORKDIR/hf the trained policy's
  _assert_same_tree(models.load_pretrained(out1)[1], dense_run["step1"])
  _assert_same_tree(models.load_pretrained(os.path.join(wd, "hf"))[1], dense_run["final"])
  assert not np.array_equal(_tensors(out1)["model.embed_tokens.weight"],
                            _tensors(os.path.join(wd, "hf"))["model.embed_tokens.weight"])
  latest = export_lib.export(wd, str(tmp_path / "latest"), log=None)  # default: the last step
  a, b = _tensors(latest), _tensors(os.path.join(wd, "hf"))
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  # tokenizer files copied; the base names no EOS in config.json: taken from its tokenizer
  from transformers import AutoConfig, AutoTokenizer, GenerationConfig
  for fn in ("tokenizer.json", "tokenizer_config.json"):
    assert open(os.path.join(out1, fn)).read() == open(os.path.join(BASE, fn)).read()
  tok = AutoTokenizer.from_pretrained(out1)
  assert tok.encode("<r>1+2=3</r>") == comp.policy.tokenizer.encode("<r>1+2=3</r>")
  gen = GenerationConfig.from_pretrained(out1)
  assert (gen.eos_token_id, gen.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
  assert AutoConfig.from_pretrained(out1).eos_token_id == tok.eos_token_id
  # transformers' greedy generation equals mr_rl's, for both exports
  p_tok, p_mask, ids = _prompts(comp.policy, comp.eval_examples[:6])
  hf_at_end = os.path.join(wd, "hf")
  for params, directory in ((dense_run["step1"], out1), (dense_run["final"], hf_at_end)):
    mine = _mr_greedy(comp.model, params, comp.policy.tokenizer, p_tok, p_mask)
    assert _hf_greedy(directory, ids) == mine
    assert any(t[-1] == tok.eos_token_id for t in mine)  # some rows stop at EOS ...
    assert any(len(t) == N_NEW for t in mine)            # ... others run to the budget


def test_export_moe_with_generation_config(moe_run, tmp_path):
  out = export_lib.export(moe_run["wd"], str(tmp_path / "moe"), log=None)
  _assert_same_tree(models.load_pretrained(out)[1], moe_run["final"])
  cfg = json.load(open(os.path.join(out, "config.json")))
  assert cfg["model_type"] == "qwen3_moe" and cfg["num_experts"] == 4
  assert "model.layers.0.mlp.experts.3.down_proj.weight" in _tensors(out)
  for fn in ("generation_config.json", "tokenizer_config.json", "tokenizer.json"):
    assert open(os.path.join(out, fn)).read() == open(os.path.join(moe_run["base"], fn)).read()
  from transformers import AutoTokenizer
  tok = AutoTokenizer.from_pretrained(out)
  msgs = [{"role": "user", "content": "What is 2 + 3?"}]
  assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
      moe_run["comp"].policy.tokenizer.apply_chat_template(msgs, tokenize=False,
                                                           add_generation_prompt=True)
  comp = moe_run["comp"]
  p_tok, p_mask, ids = _prompts(comp.policy, comp.train_examples[:4])
  mine = _mr_greedy(comp.model, moe_run["final"], comp.policy.tokenizer, p_tok, p_mask)
  assert _hf_greedy(out, ids) == mine
  assert len({t for row in mine for t in row}) > 3  # not a degenerate repetition


def test_export_errors(dense_run, tmp_path):
  wd = dense_run["wd"]
  with pytest.raises(FileNotFoundError, match=r"no checkpoint step 7 .*saved steps: \[1, 2\]"):
    export_lib.export(wd, str(tmp_path / "x"), step=7, log=None)
  with pytest.raises(FileNotFoundError, match="no checkpoints under"):
    export_lib.export(str(tmp_path), str(tmp_path / "x"), log=None)
  from mr_rl import tiny_assets
  other = tiny_assets.make_tiny_checkpoint(str(tmp_path / "llama"), "llama")
  with pytest.raises(ValueError, match="do not match the base checkpoint's architecture"):
    export_lib.export(wd, str(tmp_path / "x"), base=other, log=None)
  bare = tmp_path / "bare"
  shutil.copytree(os.path.join(wd, "checkpoints"), bare / "checkpoints")
  with pytest.raises(FileNotFoundError, match="no settings.json .*--base=DIR"):
    export_lib.export(str(bare), str(tmp_path / "x"), log=None)
  base_copy = str(tmp_path / "base_copy")  # (a copy: were the guard broken, it would be lost)
  shutil.copytree(BASE, base_copy)
  with pytest.raises(ValueError, match="is the base checkpoint itself"):
    export_lib.export(wd, base_copy, base=base_copy, log=None)
  assert os.path.exists(os.path.join(base_copy, "model.safetensors"))
  out = export_lib.export(str(bare), str(tmp_path / "x"), base=BASE, log=None)  # --base works
  _assert_same_tree(models.load_pretrained(out)[1], dense_run["final"])


def test_export_refuses_a_non_empty_out_unless_overwrite(dense_run, tmp_path, capsys):
  wd = dense_run["wd"]
  out = tmp_path / "taken"
  out.mkdir()
  (out / "notes.txt").write_text("mine")
  (out / "model-00002-of-00002.safetensors").write_bytes(b"a shard of something else")
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  with pytest.raises(SystemExit):
    export_lib.main(["--workdir", wd, "--out", str(out)])
  err = capsys.readouterr().err
  assert "is not empty (2 entries: model-00002-of-00002.safetensors, notes.txt)" in err
  assert "pass --overwrite" in err
  with pytest.raises(FileExistsError, match=r"is not empty .*pass --overwrite"):
    export_lib.export(wd, str(out), log=None)
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing touched
  assert export_lib.main(["--workdir", wd, "--out", str(out), "--overwrite"]) == str(out)
  assert (out / "notes.txt").read_text() == "mine"
  assert not (out / "model-00002-of-00002.safetensors").exists()  # the other export's shard
  _assert_same_tree(models.load_pretrained(str(out))[1], dense_run["final"])
  (tmp_path / "empty").mkdir()  # an existing empty directory is fine
  export_lib.export(wd, str(tmp_path / "empty"), log=None)


def test_an_overwrite_export_failing_midway_keeps_the_earlier_one(dense_run, tmp_path,
                                                                    monkeypatch):
  """`--overwrite` with step 2 over step 1's export, failing at the tokenizer step (after the
  weights and config.json are written): the step-1 export stays whole, nothing else is left."""
  wd, out = dense_run["wd"], str(tmp_path / "policy")
  export_lib.main(["--workdir", wd, "--step", "1", "--out", out])
  before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}

  def fails(path):
    raise RuntimeError("stopped at the tokenizer step")

  monkeypatch.setattr(models, "load_tokenizer", fails)
  with pytest.raises(RuntimeError, match="stopped at the tokenizer step"):
    export_lib.main(["--workdir", wd, "--out", out, "--overwrite"])
  assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == before
  assert sorted(os.listdir(tmp_path)) == ["policy"]  # no incomplete export left beside it
  _assert_same_tree(models.load_pretrained(out)[1], dense_run["step1"])


def _readme_serving_snippet() -> str:
  readme = open(os.path.join(REPO, "README.md")).read()
  step = readme[readme.index("5. **Serve**"):]
  m = re.search(r"```python\n(.*?)```", step, re.S)
  return textwrap.dedent(m.group(1))


def test_readme_serving_snippet_on_an_export_of_the_demo_base_policy(tmp_path, capsys):
  """What README "Workflow" step 5 runs, on `W/hf` as `config.export.hf_at_end` writes it for
  the demo (whose base tokenizer has no chat template): the export's chat template writes the
  prompt the run trained on, and every file is readable by other users."""
  from mr_rl import rollout as rollout_lib
  from mr_rl.data import Example
  from ml_collections.config_flags import config_flags as config_file
  c = config_file.ConfigFileFlagParser(name="config").parse(
      os.path.join(REPO, "configs", "demo.py") + ":smoke")
  s = settings_lib.from_config(c)
  assert s.data.template == "" and s.model.path == BASE
  model, params = models.load_pretrained(BASE)
  tok = models.load_tokenizer(BASE)
  assert not getattr(tok, "chat_template", None)  # the base has none
  W = str(tmp_path / "run")
  old = os.umask(0o022)
  try:
    for _ in range(2):  # a resumed run rewrites its own W/hf
      export_lib.write_hf(model, params, os.path.join(W, "hf"), BASE, settings=s)
  finally:
    os.umask(old)
  for fn in os.listdir(os.path.join(W, "hf")):
    assert os.stat(os.path.join(W, "hf", fn)).st_mode & 0o777 == 0o644, fn
  ns = {"W": W}
  snippet = _readme_serving_snippet()
  exec(snippet, ns)  # pylint: disable=exec-used  (as written: its default question)
  assert ns["question"] == "Q:7+5-3="  # the demo's notation
  assert capsys.readouterr().out  # it printed the decoded answer (a newline at least)
  policy = rollout_lib.Policy(model, tok, lambda ex: ex.prompt, 64, add_bos=True)
  want = policy.prompt_ids(Example.single_turn("u", "arithmetic", "Q:7+5-3=", "9"))
  assert ns["inputs"]["input_ids"][0].tolist() == want  # the prompt as the run wrote it
  assert ns["out"].shape[1] > len(want)
  # a question outside the demo's characters fails with the error the README names
  other, n = re.subn(r'(?m)^question = "[^"]*"', 'question = "What is 7 * 8?"', snippet)
  assert n == 1, snippet
  with pytest.raises(Exception, match=r"WordLevel error: Missing \[UNK\] token") as e:
    exec(other, {"W": W})  # pylint: disable=exec-used
  readme = open(os.path.join(REPO, "README.md")).read()
  assert f"fails with `{e.value}`" in " ".join(readme.split())


def test_readme_serving_snippet_needs_only_what_the_serve_extra_installs(monkeypatch):
  """The snippet imports transformers and runs its models on torch: `pip install -e .[serve]`
  (which the README's step 5 names) installs both."""
  import ast
  import runpy
  import setuptools
  kw = {}
  monkeypatch.setattr(setuptools, "setup", lambda **k: kw.update(k))
  runpy.run_path(os.path.join(REPO, "setup.py"))
  names = {re.split(r"[<>=!~\[; ]", r)[0].lower()
           for r in kw["install_requires"] + kw["extras_require"]["serve"]}
  imported = {a.name.split(".")[0] for node in ast.walk(ast.parse(_readme_serving_snippet()))
              if isinstance(node, (ast.Import, ast.ImportFrom))
              for a in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])}
  assert imported == {"transformers"}, imported
  assert imported | {"torch"} <= names, names
  readme = open(os.path.join(REPO, "README.md")).read()
  step = readme[readme.index("5. **Serve**"):]
  assert step.index('pip install -e ".[serve]"') < step.index("```python")


def _sharded_worker(jobs: list[dict]) -> list[dict]:
  """Restores each run's params onto an 8-device mesh, exports them, samples greedily there."""
  from mr_rl.models import sharding
  assert jax.device_count() == 8, jax.devices()
  out = []
  for job in jobs:
    mesh = sharding.make_mesh(job["mesh"])
    base = export_lib.base_checkpoint(job["workdir"])
    model = models.Transformer(models.config_from_hf(json.load(open(os.path.join(base,
                                                                                 "config.json")))))
    params = export_lib.restore_params(job["workdir"], export_lib.checkpoint_steps(
        job["workdir"])[-1], model, mesh)
    leaf = params["layers"]["mlp"][job["sharded_leaf"]]
    export_lib.export(job["workdir"], job["out"], mesh=mesh, log=None)
    tokens = _mr_greedy(model, params, models.load_tokenizer(base), job["p_tok"], job["p_mask"],
                        mesh=mesh)
    out.append(dict(tokens=tokens, spec=str(leaf.sharding.spec),
                    replicated=bool(leaf.sharding.is_fully_replicated)))
  return out


def test_export_from_params_sharded_on_8_devices(dense_run, moe_run, tmp_path):
  jobs, refs = [], []
  for run, mesh, leaf, examples in (
      (dense_run, dict(data=2, fsdp=2, tensor=2, expert=1), "up_proj",
       dense_run["comp"].eval_examples[:8]),
      (moe_run, dict(data=1, fsdp=2, tensor=1, expert=4), "gate_proj",
       moe_run["comp"].train_examples[:8])):
    p_tok, p_mask, ids = _prompts(run["comp"].policy, examples)
    out = str(tmp_path / f"sharded{len(jobs)}")
    jobs.append(dict(workdir=run["wd"], out=out, mesh=mesh, sharded_leaf=leaf,
                     p_tok=p_tok.tolist(), p_mask=p_mask.tolist()))
    refs.append((run, ids, out))
  spec = tmp_path / "jobs.json"
  spec.write_text(json.dumps(jobs))
  results = xla_env.run_worker(__file__, str(spec), timeout=600)
  for res, (run, ids, out) in zip(results, refs):
    assert not res["replicated"], res["spec"]  # the params really were split over devices
    _assert_same_tree(models.load_pretrained(out)[1], run["final"])
    assert _hf_greedy(out, ids) == res["tokens"]
  assert "expert" in results[1]["spec"]


# ------------------------------------------------------------------------------ W&B
def _wandb_records(path: str):
  """The protobuf records of a W&B offline run file (`run-<id>.wandb`): a LevelDB-log framed
  stream (':W&B' header, 32 KiB blocks, 7-byte record headers) of wandb's own `Record`s."""
  from wandb.proto import wandb_internal_pb2
  data = open(path, "rb").read()
  assert data[:4] == b":W&B", data[:7]
  pos, buf, block = 7, b"", 32768
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:
      pos += left
      continue
    _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
    pos += 7
    if kind == 0 and n == 0:  # zero padding to the block end
      pos += left - 7
      continue
    chunk, pos = data[pos:pos + n], pos + n
    if kind in (1, 2):
      buf = chunk
    else:
      buf += chunk
    if kind in (1, 4):
      rec = wandb_internal_pb2.Record()
      rec.ParseFromString(buf)
      yield rec


def _tensorboard_scalars(workdir: str) -> dict[int, dict[str, float]]:
  """{step: {tag: value}} from the TensorBoard event files (TFRecord framing, tensorboardX's
  Event protos)."""
  from tensorboardX.proto import event_pb2
  out: dict[int, dict[str, float]] = {}
  for fn in sorted(glob.glob(os.path.join(workdir, "tb", "events.out.tfevents.*"))):
    with open(fn, "rb") as f:
      while header := f.read(12):
        (n,) = struct.unpack("<Q", header[:8])
        ev = event_pb2.Event()
        ev.ParseFromString(f.read(n))
        f.read(4)
        for v in ev.summary.value:
          out.setdefault(ev.step, {})[v.tag] = v.simple_value
  return out


@pytest.mark.skipif(not HAVE_WANDB, reason=WANDB_SKIP)
def test_wandb_offline_run_names_config_and_resume(dense_run):
  wd = dense_run["wd"]
  run_id = open(os.path.join(wd, metrics_lib.WANDB_ID_FILE)).read().strip()
  files = sorted(glob.glob(os.path.join(wd, "wandb", "offline-run-*", "run-*.wandb")))
  assert len(files) == 2  # the first run and its resume ...
  tb = _tensorboard_scalars(wd)
  saved = json.load(open(os.path.join(wd, "settings.json")))
  steps = []
  for fn in files:
    recs = list(_wandb_records(fn))
    (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
    assert run.run_id == run_id and run.project == "mr_rl-test"  # ... are the same W&B run
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["aggregator"] == saved["aggregator"] == {"name": "amrp", "hp": {}}
    assert config["rewards"]["channels"] == ["arith_acc", "arith_negative"]
    for r in recs:
      if r.WhichOneof("record_type") != "history":
        continue
      item = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
      step = item["_step"]
      steps.append(step)
      logged = {k: v for k, v in item.items() if not k.startswith("_")}
      assert logged.keys() == tb[step].keys()  # the TensorBoard names, the same scalars
      for k, v in logged.items():
        np.testing.assert_allclose(v, tb[step][k], rtol=1e-6, err_msg=k)
  assert sorted(steps) == [0, 1]  # (W&B names its run directories by the second: the two
  # starts' order among them is not their order when both began in the same second)
  profiles = [k for k in tb[0] if k.startswith("profile/arith_acc")]
  assert profiles and all("=" not in k and "," not in k for k in profiles)


def test_wandb_project_without_wandb_fails_at_start_up(monkeypatch):
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  c = dense_config(1)
  c.logging.wandb_project = "p"
  with pytest.raises(ValueError, match=r"config.logging.wandb_project='p' needs the wandb package"):
    settings_lib.from_config(c)
  c.logging.wandb_mode = "sometimes"
  with pytest.raises(ValueError, match="config.logging.wandb_mode='sometimes' is not valid"):
    settings_lib.from_config(c)


# ------------------------------------------------------------------------------ console, plots
def test_console_lines_end_with_an_eta(dense_run):
  steps = [l for l in dense_run["lines"] if not l.startswith("program ")]  # compiles aside
  assert len(steps) == 1
  assert re.search(r"^step 1/1 \| R .* \| ETA 0s$", steps[0])


def test_eta_excludes_the_first_step_once_a_second_has_run():
  t = iter([0.0, 30.0, 32.0, 35.0])
  eta = metrics_lib.ETA(10, clock=lambda: next(t))
  assert eta.update(0) == 9 * 30.0   # only the first (compiling) step is known
  assert eta.update(1) == 8 * 2.0
  assert eta.update(2) == 7 * 2.5
  assert [metrics_lib.format_duration(x) for x in (4.4, 185, 7620, 0)] == \
      ["4s", "3m05s", "2h07m", "0s"]
  line = metrics_lib.console_line(3, 10, {"reward/scalar/mean": 0.5}, [], eta_s=185)
  assert line.endswith("| ETA 3m05s")


def test_plots_of_a_real_run(dense_run, tmp_path):
  from mr_rl import plots
  paths = plots.plot_run(dense_run["wd"], str(tmp_path))
  names = [os.path.basename(p) for p in paths]
  assert names == ["rewards.png", "scalar_reward.png", "weights.png", "profiles.png",
                   "kl_ref.png", "entropy.png", "response_length.png"]  # AMRP logs weights
  assert all(os.path.getsize(p) > 5000 for p in paths)


# ------------------------------------------------------------------------------ dry run, offline
def test_dry_run_prints_settings_and_estimate_without_weights(tmp_path):
  no_weights = tmp_path / "ckpt"
  no_weights.mkdir()
  for fn in ("config.json", "tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(BASE, fn), no_weights / fn)  # no model.safetensors
  r = subprocess.run([sys.executable, "-m", "mr_rl.main", "--config=configs/demo.py",
                      f"--config.model.path={no_weights}", "--config.total_steps=7", "--dry_run"],
                     capture_output=True, text=True, cwd=REPO, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  text = r.stdout
  block = text[text.index("{"):text.index("\n}\n") + 2]
  s = json.loads(block)
  assert s["total_steps"] == 7 and s["model"]["path"] == str(no_weights)
  assert s["pipeline"] == "demo" and s["logging"]["wandb_project"] == ""
  assert re.search(r"compute estimate: v5p [0-9.e+-]+, .*h100 [0-9.e+-]+(, h200 [0-9.e+-]+)? "
                   r"chip-hours", text)
  assert "0.5M parameters" in text
  r = subprocess.run([sys.executable, "-m", "mr_rl.main", "--config=configs/demo.py"],
                     capture_output=True, text=True, cwd=REPO, timeout=300)
  assert r.returncode != 0 and "--workdir is required (except with --dry_run)" in r.stderr


def test_dry_run_estimate_equals_the_paper_estimate():
  from mr_rl.config_lib import args, estimates
  from mr_rl.config_lib.dry_run import dry_run
  for name in ("amrp_math.py", "tag_moe.py"):  # a dense train run; TAG with MoE and probes
    c = args.load_config_module(os.path.join(REPO, "configs", name)).get_config(None)
    text = dry_run(c)
    assert f"v5p {estimates.estimate_config(c, 'v5p'):.3g}," in text, text[-600:]
    assert f"h100 {estimates.estimate_config(c, 'h100'):.3g}," in text
    assert f"h200 {estimates.estimate_config(c, 'h200'):.3g} chip-hours" in text


def test_offline_errors_name_the_config_fields(monkeypatch, tmp_path):
  import datasets
  import huggingface_hub.constants
  from mr_rl import data
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(OSError, match=r"Qwen/Qwen3-0.6B.*--config\.model\.path=DIR"):
    models.load_pretrained("Qwen/Qwen3-0.6B")
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  with pytest.raises(data.DatasetUnavailableError) as e:
    data.load_dataset("math500", cache_dir=str(tmp_path))
  assert "--config.data.path=PATH" in str(e.value)
  assert "--config.data.eval_set_options.math500.path=PATH" in str(e.value)


if __name__ == "__main__":
  print(json.dumps(_sharded_worker(json.load(open(sys.argv[1])))))
