"""Paper configs, tiny runlocal assets and launch tools (docs/style.md §2, §11-13).

* Every sweep point of every `configs/<file>.py` (except the demos) resolves: `get_config(point)`
  and its `runlocal` variant pass `mr_rl.settings.from_config`, or fail there with the
  ValueError `config_lib.blocker` predicts (PPO not wired; reward channels not registered).
* Paper values: spot checks of the hyperparameters each table needs.
* ONE training step of one representative point per config file, on CPU through the real
  trainer (`mr_rl.pipelines.run` via `python -m mr_rl.config_lib smoke`: tiny checkpoint +
  tokenizer from `mr_rl.tiny_assets`, tiny local data files in the hub schemas, 2 prompts x G 2,
  8 new tokens; 'tag' pipelines probe 1 step per channel). All sweep points are resolved, but
  only one per file is run (CI budget); the runs share one process, so the trainer's compiled
  sampler and steps are reused across files.
* `launch/check.py` compiles the step, reference pass and sampler of a tiny preset on 8 fake
  CPU devices (own process); the shell scripts pass `bash -n`; a config file loads through
  `ml_collections.config_flags` from another working directory.
"""

import pathlib
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import pytest

from mr_rl import aggregators
from mr_rl import config_lib as cl
from mr_rl import pipelines
from mr_rl import settings as settings_lib
from mr_rl import tiny_assets
from mr_rl.aggregators import amrp
from mr_rl.registry import PIPELINES

REPO = str(pathlib.Path(__file__).resolve().parents[2])
FILES = sorted(os.path.splitext(os.path.basename(p))[0]
               for p in glob.glob(os.path.join(REPO, "configs", "*.py"))
               if os.path.basename(p) not in ("demo.py", "demo_tools.py", "__init__.py"))
# Shared by both xdist workers and across runs; builds are atomic, the directory name carries
# a hash of the mr_rl/tiny_assets files.
os.environ.setdefault("MR_RL_CACHE", os.path.join(tempfile.gettempdir(), "mr_rl_test_cache"))

REPRESENTATIVE = {
    "amrp_math": "model=qwen3_4b,method=amrp",
    "amrp_alce": "model=qwen3_4b,dataset=eli5,method=drbo_delta",
    "amrp_align": "model=qwen3_4b,method=static",
    "amrp_algorithms": "algorithm=gdpo,method=amrp",
    "amrp_priors": "variant=init",
    "amrp_ablation": "variant=additive",
    "amrp_sensitivity": "interval=2",
    "amrp_dynamics": "setting=math,method=static",
    "tag_math": "model=qwen3_4b,task=brief,method=mo_grpo",
    "tag_code": "model=qwen3_1_7b,task=fast,method=additive",
    "tag_drift": "model=qwen3_1_7b,task=negative",                   # election only
    "tag_kl_sweep": "task=brief,beta=0.01",                          # KL penalty step
    "tag_three_channels": "model=qwen3_1_7b,method=rubric_dropout",
    "tag_lambda": "lam=0.5",                                         # probes + TAG training
    "tag_moe": "task=negative,method=additive",                      # MoE family
    "tag_downweight": "w_a=0.3",
    "math_tools": "method=tag",                                      # multi-turn, python tool
}


def _module(name):
  return cl.load_config_module(os.path.join(REPO, "configs", f"{name}.py"))


def _resolve(c):
  """from_config(c), or check it raises the ValueError the blocker predicts; returns (s, why)."""
  why = cl.blocker(c)
  if why is None:
    return settings_lib.from_config(c), None
  needle = re.search(r"\['([^']+)'", why).group(1)
  with pytest.raises(ValueError, match=re.escape(needle)):
    settings_lib.from_config(c)
  return None, why


def test_every_config_file_is_documented():
  readme = open(os.path.join(REPO, "configs", "README.md")).read()
  assert set(REPRESENTATIVE) == set(FILES)
  for name in FILES:
    m = _module(name)
    doc = m.__doc__
    assert f"python -m mr_rl.main --config=configs/{name}.py" in doc, name
    assert "TPU slice:" in doc and "Estimate:" in doc, name
    assert f"configs/{name}.py" in readme, name
    assert callable(m.get_config) and callable(m.sweep)


@pytest.mark.parametrize("name", FILES)
def test_every_sweep_point_resolves(name):
  m = _module(name)
  points = m.sweep()
  assert len(points) == len(set(points)) > 0
  assert REPRESENTATIVE[name] in points
  for point in points:
    c = m.get_config(point)
    s, why = _resolve(c)
    if s is not None:  # the papers' shared GRPO settings
      assert (s.rollout.group_size, s.data.batch_prompts) == (8, 32), point
      assert s.update.lr == 1e-6 and (s.update.loss.eps_low, s.update.loss.eps_high) == (0.2, 0.28)
      assert s.model.path in cl.paper.MODELS_BY_HUB, point
    local = m.get_config(point + ",runlocal")
    s_local, why_local = _resolve(local)
    assert why_local == why
    if s_local is not None:
      assert s_local.total_steps <= 1 and s_local.rollout.max_new_tokens == 8
      # Loading records paths in the cache (built when the run starts, `local.build_assets`).
      root = tiny_assets.asset_dir()
      assert s_local.model.path.startswith(root) and s_local.data.path.startswith(root)
      assert cl.local.BUILD_HOOK in local.setup.split(",")


_SEEN_AT_START = []


@PIPELINES.register("test_runlocal_assets_at_start")
def _record_assets(config, workdir):
  """A pipeline that records what the run finds on disk when it starts."""
  paths = [config.model.path, config.data.path] + [
      o.path for o in config.data.eval_set_options.values()] + [
      p.path for p in config.rewards.params.values() if "path" in p]
  _SEEN_AT_START.append({p: os.path.exists(p) for p in paths})
  _SEEN_AT_START.append(os.path.isfile(os.path.join(config.model.path, "config.json")))


def test_a_dry_run_writes_nothing_and_a_run_builds_the_assets(tmp_path, monkeypatch):
  """`--dry_run` of a `:runlocal` point leaves the cache (under $HOME here) empty: loading the
  config records paths only. A run builds them when it starts (`pipelines.run` calls the
  `config.setup` hook before the pipeline; the smoke test below trains on them)."""
  home = tmp_path / "home"
  home.mkdir()
  env = {k: v for k, v in os.environ.items() if k != "MR_RL_CACHE"}
  env.update(HOME=str(home), PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  for target in ("amrp_alce.py:dataset=asqa,method=amrp,runlocal",  # model, data, eval sets
                 "amrp_align.py:method=static,runlocal"):             # + the tiny reward model
    p = subprocess.run([sys.executable, "-m", "mr_rl.main", f"--config=configs/{target}",
                        "--dry_run"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "is not built yet: config.setup" in p.stdout, p.stdout[-2000:]
    assert [str(f) for f in home.rglob("*")] == [], target
  monkeypatch.setenv("MR_RL_CACHE", str(tmp_path / "cache"))
  c = _module("amrp_align").get_config("method=static,runlocal")
  assert not (tmp_path / "cache").exists()
  c.pipeline = "test_runlocal_assets_at_start"
  _SEEN_AT_START.clear()
  pipelines.run(c, str(tmp_path / "run"))
  seen, model_ok = _SEEN_AT_START
  assert len(seen) >= 3 and all(seen.values()), seen
  assert model_ok and all(p.startswith(str(tmp_path / "cache")) for p in seen)
  assert cl.local.build_assets(c) is None  # finished assets are reused


def test_bad_arguments_name_the_choices():
  m = _module("tag_math")
  with pytest.raises(ValueError, match=r"unknown argument 'modle'.*'model'"):
    m.get_config("modle=qwen3_4b")
  with pytest.raises(ValueError, match=r"method='tagg' is not valid.*'tag'"):
    m.get_config("method=tagg")
  with pytest.raises(ValueError, match="given twice"):
    m.get_config("task=brief,task=negative")
  with pytest.raises(ValueError, match="no sweep point matches"):
    m.sweep("model=qwen3_4b,subset=hard")


def test_tag_math_has_a_lora_variant():
  m = _module("tag_math")
  full, lora = m.get_config("method=additive"), m.get_config("method=additive,lora=16")
  assert full.model.lora.rank == 0 and lora.model.lora.rank == 16
  assert lora.model.lora.alpha == 32.0 and lora.optim.lr == 10 * full.optim.lr
  s, _ = _resolve(m.get_config("method=additive,lora=16,runlocal"))
  if s is not None:
    assert s.update.lora is not None and s.update.lora.rank == 16 and s.model.lora == s.update.lora


@pytest.mark.parametrize("name", ["amrp_math", "amrp_align", "amrp_alce", "tag_code"])
def test_paper_configs_have_a_lora_variant(name):
  """`lora=R` (cl.set_lora, as tag_math): rank R, alpha 2R, lr x 10; the sweep keeps lora=0."""
  m = _module(name)
  full, lora = m.get_config(None), m.get_config("lora=32")
  assert full.model.lora.rank == 0 and lora.model.lora.rank == 32
  assert lora.model.lora.alpha == 64.0 and lora.optim.lr == 10 * full.optim.lr
  lora.model.lora.rank, lora.model.lora.alpha = 0, full.model.lora.alpha  # else the same run
  lora.optim.lr = full.optim.lr
  assert lora.to_dict() == full.to_dict()
  s, _ = _resolve(m.get_config("lora=8"))
  if s is not None:
    assert s.update.lora is not None and s.update.lora.rank == 8
  assert not any("lora" in point for point in m.sweep())


def test_paper_values():
  g = lambda name, arg=None: _module(name).get_config(arg)
  c = g("amrp_math", "model=deepseek_math_7b,method=amrp")
  assert c.model.path == "deepseek-ai/deepseek-math-7b-base" and c.total_steps == 313
  assert c.aggregator.name == "amrp" and c.aggregator.hp.to_dict() == amrp.DEFAULTS  # one source
  hp = aggregators.get("amrp", **c.aggregator.hp).hyperparameters  # AMRP's (1, 5, 5, 1)
  assert {k: hp[k] for k in ("lam", "k_s", "k_p", "interval", "rho", "eps")} == dict(
      lam=1.0, k_s=5.0, k_p=5.0, interval=1, rho=0.9, eps=1e-6)
  assert (hp["prior"], hp["use_s"], hp["use_v"], hp["use_p"], hp["additive"]) == (
      None, True, True, True, False)
  assert c.rewards.channels == "accuracy,format,length" and c.rollout.max_new_tokens == 3000
  assert c.rewards.params.length.to_dict() == {"max_full": 2800, "zero_at": 3000}
  assert c.data.eval_sets == "math500,amc,aime" and c.eval.num_prompts == 2656
  assert g("amrp_math", "method=base").total_steps == 0
  c = g("amrp_alce", "model=llama3_1_8b,dataset=eli5,method=static")
  assert c.model.path == "meta-llama/Llama-3.1-8B-Instruct" and c.rollout.max_new_tokens == 500
  assert c.total_steps == 75 and c.eval.num_prompts == 200
  assert g("amrp_priors", "variant=static").aggregator.hp.w == [1.5, 0.75, 0.75]
  init, prior = g("amrp_priors", "variant=init"), g("amrp_priors", "variant=prior")
  assert (init.aggregator.hp.persistent_prior, prior.aggregator.hp.persistent_prior) == (False, True)
  agg_hp = lambda name, arg: g(name, arg).aggregator.hp.to_dict()
  assert agg_hp("amrp_ablation", "variant=no_p") == dict(amrp.DEFAULTS, use_p=False)
  assert agg_hp("amrp_ablation", "variant=additive") == dict(amrp.DEFAULTS, additive=True)
  assert agg_hp("amrp_sensitivity", "interval=8") == dict(amrp.DEFAULTS, interval=8)
  with pytest.raises(ValueError, match=r"\['k_q'\] are not AMRP hyperparameters.*'k_p'"):
    cl.set_amrp(g("amrp_math"), k_q=1.0)
  c = g("amrp_algorithms", "algorithm=ppo,method=static")
  assert (c.advantage.name, c.advantage.gamma, c.advantage.lam) == ("ppo", 1.0, 1.0)
  c = g("tag_math", "model=llama3_2_3b,task=brief,method=weighted")
  assert c.data.name == "big_math_llama_calibrated" and c.rewards.params.brief.threshold == 128
  assert c.aggregator.hp.w == [0.9, 0.1] and c.total_steps == 500
  assert g("tag_math", "model=qwen3_4b,task=brief,method=min").rewards.params.brief.threshold == 200
  assert g("tag_moe", "task=brief,method=tag").rewards.params.brief.threshold == 512
  c = g("tag_math", "method=dr_grpo")
  assert c.advantage.name == "dr_grpo" and c.optim.loss.loss_agg == "seq-mean-token-sum-norm"
  assert g("tag_math", "method=mo_grpo").advantage.name == "mo_grpo"
  assert g("tag_math", "method=additive_kl").optim.loss.kl_coef == 0.1
  c = g("tag_math", "method=tag")
  assert (c.pipeline, c.anchor.probe_steps, c.anchor.held_out_prompts) == ("tag", 300, 256)
  assert c.anchor.probe_batch_prompts * c.rollout.group_size == 32
  assert g("tag_drift").total_steps == 0
  assert [g("tag_kl_sweep", f"beta={b}").optim.loss.kl_coef for b in ("0.01", "1.0")] == [0.01, 1.0]
  assert g("tag_lambda", "lam=4").anchor.lam == 4.0
  assert g("tag_downweight", "w_a=0.2").aggregator.hp.w == [0.8, 0.2]
  assert g("tag_three_channels").rewards.channels == "accuracy,brief,negative"
  assert g("tag_code", "task=noop").rewards.channels == "code_correct,code_noop"
  assert len(_module("tag_math").sweep()) == 4 * 2 * 12 + 6


def test_amrp_sensitivity_varies_the_amrp_defaults():
  """Table 7 varies one symbol at a time around mr_rl.aggregators.amrp.DEFAULTS (the one source
  of AMRP's defaults): each axis holds the default once, the first point is the default point,
  and a point changes only its own symbols."""
  m = _module("amrp_sensitivity")
  defaults = aggregators.get("amrp").hyperparameters
  for key, values in m.CHOICES.items():
    assert len([v for v in values if m.TYPES[key](v) == defaults[key]]) == 1, key
  points = m.sweep()
  assert len(points) == 10 and points[0] == "lam=1.0"
  for arg in (None, points[0]):
    hp = m.get_config(arg).aggregator.hp
    assert aggregators.get("amrp", **hp).hyperparameters == defaults, arg
  c = m.get_config("k_s=2.5,interval=4")
  assert c.aggregator.hp.to_dict() == dict(amrp.DEFAULTS, k_s=2.5, interval=4)
  assert {k: v for k, v in aggregators.get("amrp", **c.aggregator.hp).hyperparameters.items()
          if v != defaults[k]} == {"k_s": 2.5, "interval": 4}


def _doc_numbers(doc):
  text = " ".join(doc.split())
  m = re.search(r"Estimate: ([\d.]+) v5p chip-hours for the default point.*?whole \w+ ([\d.]+)",
                text)
  assert m, "docstring lacks 'Estimate: X v5p chip-hours for the default point ... whole table Y'"
  return float(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("name", FILES)
def test_docstring_estimates_match_the_cost_model(name):
  m = _module(name)
  point, total = _doc_numbers(m.__doc__)
  assert point == pytest.approx(round(cl.estimate_config(m.get_config())), abs=1)
  assert total == pytest.approx(round(sum(cl.estimate_config(m.get_config(p)) for p in m.sweep())),
                                abs=1)


def test_estimate_scales_as_documented():
  one = cl.estimate_device_hours("qwen3_4b", steps=1, rows=256, prompt_len=1024, new_tokens=3000)
  assert cl.estimate_device_hours("qwen3_4b", steps=10, rows=256, prompt_len=1024,
                                  new_tokens=3000) == pytest.approx(10 * one)
  sizes = cl.model_sizes("qwen3_4b")  # published: 4.02B parameters
  assert sizes["total"] == pytest.approx(4.02e9, rel=0.01)
  assert cl.model_sizes("qwen3_30b_a3b")["active"] == pytest.approx(3.3e9, rel=0.1)


def test_every_representative_config_can_run_here():
  """No representative config names a reward channel this checkout lacks (its one-step run
  below would otherwise have to be skipped)."""
  blocked = {n: cl.blocker(_module(n).get_config(p)) for n, p in REPRESENTATIVE.items()}
  assert not {n: why for n, why in blocked.items() if why}


def test_blocker_predicts_the_start_up_error():
  """A config naming an unregistered channel is reported by `blocker`, and `from_config`
  refuses it with the ValueError naming that channel (what the sweep listing relies on)."""
  name = sorted(REPRESENTATIVE)[0]
  c = _module(name).get_config(REPRESENTATIVE[name])
  c.rewards.channels = str(c.rewards.channels) + ",no_such_channel"
  why = cl.blocker(c)
  assert why is not None and "no_such_channel" in why
  s, reason = _resolve(c)  # asserts from_config raises the predicted ValueError
  assert s is None and reason == why


def _check_run(name, c, workdir):
  s = settings_lib.from_config(c)
  names = s.rewards.channels
  ev = json.load(open(os.path.join(workdir, "eval.json")))
  assert f"eval/{names[s.rewards.primary]}" in ev, (name, sorted(ev))
  for eval_set in s.data.eval_sets:  # benchmark sets (AMRP math: math500, amc, aime)
    assert f"eval/{eval_set}/{names[s.rewards.primary]}" in ev, (name, eval_set, sorted(ev))
  if s.pipeline == "tag":
    drift = json.load(open(os.path.join(workdir, "drift.json")))
    assert [d["channel"] for d in drift["channels"]] == list(names)
    assert drift["anchor"] in names
    assert all(math.isfinite(d["rev_kl_per_token"]) for d in drift["channels"])
  nan_channels = [f"eval {ch}" for ch in names if ev.get(f"eval/nan/{ch}", 0)]
  if s.total_steps:
    from mr_rl import metrics as metrics_lib
    recs = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    assert [r["step"] for r in recs] == [0], name
    assert math.isfinite(recs[0]["loss/policy"]), name
    for ch in names:
      assert f"reward/{ch}/mean" in recs[0], (name, ch)
      if recs[0][f"reward/{ch}/nan_frac"] > 0:
        nan_channels.append(f"train {ch}")
      # Failures score 0, not NaN. (An environment channel has no runner: a multi-turn run
      # counts its environments' errors instead.)
      if recs[0].get(f"reward_runner/{ch}/errors", recs[0].get("multiturn/env_errors")) > 0:
        nan_channels.append(f"train {ch} failed")
  return nan_channels


def test_one_step_per_config_file(tmp_path):
  """One step of every runnable representative point, in ONE subprocess (shared compiles).

  `python -m mr_rl.config_lib smoke` runs them through `mr_rl.pipelines.run`; one process keeps
  the runs together under pytest-xdist. Every reward
  channel must score every sample (the tiny policy writes valid strings, so a NaN or a failed
  call means a broken channel or plumbing)."""
  targets = [f"configs/{n}.py:{p}" for n, p in REPRESENTATIVE.items()]
  out_json = tmp_path / "smoke.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")  # (XLA_FLAGS: tests/conftest.py's fast compile)
  proc = subprocess.run([sys.executable, "-m", "mr_rl.config_lib", "smoke", *targets,
                         f"--workdir_root={tmp_path / 'runs'}", f"--json={out_json}"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
  assert out_json.exists(), proc.stderr[-5000:]
  results = json.load(open(out_json))
  failures, nans = [], []
  for target in targets:
    res = results[target]
    if res["status"] != "ok":
      failures.append(f"{target}: {res.get('error')}\n{res.get('traceback', '')[-2000:]}")
      continue
    name, point = os.path.splitext(os.path.basename(target.split(":")[0]))[0], target.split(":")[1]
    c = _module(name).get_config(point + ",runlocal")
    try:
      nans += [f"{name}: {n}" for n in _check_run(name, c, res["workdir"])]
    except Exception as e:  # collect all, report together
      failures.append(f"{target}: {type(e).__name__}: {e}")
  assert not failures, "\n".join(failures)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not nans, "reward channels returned NaN or failed: " + "; ".join(nans)


def test_check_py_on_eight_fake_devices():
  cmd = [sys.executable, os.path.join(REPO, "launch", "check.py"),
         "--config=configs/tag_math.py:model=qwen3_4b", "--preset=tiny_qwen3", "--devices=8",
         "--mesh=data=2,fsdp=2,tensor=2,expert=1", "--rows=16", "--prompt_len=16",
         "--new_tokens=8", "--micro_batches=2"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  text = out.stdout
  assert "{'data': 2, 'fsdp': 2, 'tensor': 2, 'expert': 1} on 8 fake CPU devices" in text
  assert "XLA:CPU: an APPROXIMATION" in text
  for prog in ("policy_step", "ref_logprob", "sampler"):
    assert re.search(rf"{prog}\s+args .* => peak .* fits", text), text
  # The embedding (256 x 64) is split over tensor and fsdp: a quarter per device.
  assert re.search(r"\.params\['embedding'\]\s+\(256, 64\)\s+P\('tensor', 'fsdp'\)\s+0\.02 MB",
                   text), text


def test_launch_scripts_parse():
  for script in ("run_tpu.sh", "pod.sh", "gpu_node.sh", "common.sh"):
    path = os.path.join(REPO, "launch", script)
    out = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
    assert out.returncode == 0, (script, out.stderr)
    assert script == "common.sh" or os.access(path, os.X_OK), script  # common.sh is sourced
  for script in ("pod.sh", "gpu_node.sh", "run_tpu.sh"):
    usage = subprocess.run(["bash", os.path.join(REPO, "launch", script)], capture_output=True,
                           text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr, script


_FAKE_GCLOUD = r"""#!/usr/bin/env bash
# Stand-in for `gcloud compute tpus tpu-vm ...`: records its arguments; describe reports two
# workers; scp keeps the shipped tarball; ssh --worker=i sleeps FAKE_SLEEP_i seconds (exec, so
# a kill stops it) or exits with FAKE_EXIT_i; --worker=all succeeds.
echo "$*" >> "$FAKE_DIR/calls.log"
case "$4" in
  describe) echo '{"networkEndpoints": [{"ipAddress": "10.0.0.1"}, {"ipAddress": "10.0.0.2"}]}' ;;
  scp) cp "$5" "$FAKE_DIR/shipped.tgz" ;;
  ssh)
    for a in "$@"; do case "$a" in --worker=*) w=${a#--worker=} ;; esac; done
    [ "$w" = all ] && exit 0
    echo "worker $w: $*"
    s=FAKE_SLEEP_$w; e=FAKE_EXIT_$w
    [ -n "${!s:-}" ] && exec sleep "${!s}"
    exit "${!e:-0}" ;;
esac
"""


def _run_pod(tmp_path, **worker_env):
  fake = tmp_path / "bin"
  fake.mkdir(parents=True, exist_ok=True)
  (fake / "gcloud").write_text(_FAKE_GCLOUD)
  (fake / "gcloud").chmod(0o755)
  env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", FAKE_DIR=str(fake),
             LOGDIR=str(tmp_path / "logs"), **worker_env)
  return subprocess.run(["bash", os.path.join(REPO, "launch", "pod.sh"), "my-tpu", "zone-a",
                         "configs/tag_math.py:method=tag", "gs://bucket/run"], env=env,
                        capture_output=True, text=True, timeout=120), fake


def test_pod_sh_ships_starts_every_worker_and_stops_at_the_first_failure(tmp_path):
  import tarfile
  ok, fake = _run_pod(tmp_path / "ok")
  assert ok.returncode == 0, ok.stderr
  names = tarfile.open(fake / "shipped.tgz").getnames()
  assert "launch/run_tpu.sh" in names and "configs/tag_math.py" in names
  for w in (0, 1):
    log = (tmp_path / "ok" / "logs" / f"worker-{w}.log").read_text()
    assert f"--worker={w}" in log and "launch/run_tpu.sh configs/tag_math.py:method=tag" in log
  bad, fake = _run_pod(tmp_path / "bad", FAKE_SLEEP_0="60", FAKE_EXIT_1="3")
  assert bad.returncode == 3, bad.stderr          # the failing worker's status, not after 60 s
  assert "worker 1 failed (exit 3)" in bad.stderr
  calls = (fake / "calls.log").read_text()
  assert "--worker=all" in calls and "mr_rl_run.pid" in calls  # runs stopped on every worker


def test_gpu_node_and_run_tpu_scripts_run_main_and_propagate_its_status(tmp_path):
  """Both scripts activate the venv, export the environment and run mr_rl.main; a bad config
  argument fails inside main and its status comes back (run.log / pid file written)."""
  venv = tmp_path / "venv" / "bin"
  venv.mkdir(parents=True)
  # A wrapper, not a symlink: a symlink to a venv's python resolves to the base interpreter
  # without the venv's site-packages (absl lost when the tests run from a venv).
  (venv / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
  (venv / "python").chmod(0o755)
  (venv / "activate").write_text(f'export PATH="{venv}:$PATH"\n')
  env = dict(os.environ, HOME=str(tmp_path), MR_RL_VENV=str(venv.parent), MR_RL_SKIP_INSTALL="1",
             JAX_PLATFORMS="cpu")
  target = "configs/tag_math.py:bogus=1"
  gpu = subprocess.run(["bash", os.path.join(REPO, "launch", "gpu_node.sh"), target,
                        str(tmp_path / "wd")], env=env, capture_output=True, text=True,
                       timeout=300)
  assert gpu.returncode != 0
  assert "unknown argument 'bogus'" in (tmp_path / "wd" / "run.log").read_text()
  tpu = subprocess.run(["bash", os.path.join(REPO, "launch", "run_tpu.sh"), target,
                        str(tmp_path / "wd2")], env=env, capture_output=True, text=True,
                       timeout=300)
  assert tpu.returncode != 0 and "unknown argument 'bogus'" in tpu.stderr
  assert (tmp_path / "mr_rl_run.pid").read_text().strip().isdigit()
  # Flags after WORKDIR reach mr_rl.main.
  extra = subprocess.run(["bash", os.path.join(REPO, "launch", "gpu_node.sh"), "configs/demo.py",
                          str(tmp_path / "wd3"), "--no_such_flag=1"], env=env,
                         capture_output=True, text=True, timeout=300)
  assert extra.returncode != 0 and "no_such_flag" in extra.stdout, extra.stdout[-2000:]


_FLAGS_SCRIPT = """
from absl import app
from ml_collections import config_flags
cfg = config_flags.DEFINE_config_file("config", None, "", lock_config=True)

def main(argv):
  c = cfg.value
  print(c.total_steps, c.model.path, c.aggregator.name)

app.run(main)
"""


def test_config_loads_through_config_flags_from_another_cwd(tmp_path):
  target = os.path.join(REPO, "configs", "amrp_math.py") + ":model=deepseek_math_7b,method=amrp"
  script = tmp_path / "parse_flags.py"
  script.write_text(_FLAGS_SCRIPT)
  # config_flags finds --config.* overrides in sys.argv, as under `python -m mr_rl.main`.
  out = subprocess.run([sys.executable, str(script), f"--config={target}",
                        "--config.total_steps=7"], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["7", "deepseek-ai/deepseek-math-7b-base", "amrp"]
  # A file that starts from another one's set-up (load_sibling), given by a relative path.
  derived = os.path.relpath(os.path.join(REPO, "configs", "amrp_priors.py"), tmp_path)
  out = subprocess.run([sys.executable, str(script), f"--config={derived}:variant=static"],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["313", "Qwen/Qwen3-4B-Instruct-2507", "weighted"]
  listed = subprocess.run([sys.executable, "-m", "mr_rl.config_lib", "list",
                           os.path.join(REPO, "configs", "amrp_algorithms.py")],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
  assert listed.returncode == 0, listed.stderr[-3000:]
  lines = listed.stdout.strip().splitlines()
  assert len(lines) == 12 and all(l.startswith("python -m mr_rl.main --config=") for l in lines)
  assert sum("algorithm=ppo" in l for l in lines) == 4


def test_tiny_checkpoint_is_idempotent_and_loads_in_transformers(tmp_path):
  from transformers import AutoConfig, AutoTokenizer
  from mr_rl import tiny_assets
  d = tiny_assets.make_tiny_checkpoint(str(tmp_path / "llama"), family="llama")
  stamp = os.path.getmtime(os.path.join(d, "model.safetensors"))
  assert tiny_assets.make_tiny_checkpoint(d, family="llama") == d
  assert os.path.getmtime(os.path.join(d, "model.safetensors")) == stamp
  hf = AutoConfig.from_pretrained(d)
  tok = AutoTokenizer.from_pretrained(d)
  assert hf.model_type == "llama" and hf.vocab_size == len(tok) and hf.num_hidden_layers == 1
  assert (tok.bos_token, tok.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
  assert hf.eos_token_id == tok.eos_token_id and hf.pad_token_id == tok.pad_token_id
  text = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], tokenize=False,
                                 add_generation_prompt=True)
  assert text.startswith("<|begin_of_text|><|start_header_id|>user")
  assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
  ids = tok("What is 7 + 5?", add_special_tokens=False)["input_ids"]
  assert tok.decode(ids) == "What is 7 + 5?"  # byte-level BPE round trip
