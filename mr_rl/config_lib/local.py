"""`runlocal` (shrink any paper config to a CPU run) and `blocker` (why a config cannot run yet)."""

from __future__ import annotations

import os

import ml_collections

from mr_rl import rollout_engines
from mr_rl.config_lib.paper import MODELS


RUNLOCAL = dict(batch_prompts=2, group_size=2, max_new_tokens=8,
                max_prompt_len=512)  # the tiny ALCE prompts (3 passages + demo) are ~460 tokens


def runlocal(c, model_key: str):
  """Shrinks config `c` to a CPU run: tiny checkpoint, tiny local data, 1 step of 2 x 2 rollouts.

  The tiny checkpoint (mr_rl.tiny_assets) has the paper model's family and sits in a directory named
  after the paper model, so the prompt template style is chosen exactly as for the real one.
  Settings are the same for every config (only family and loss settings differ), so the
  trainer's compiled sampler and step are shared across configs in one process. The end-of-run
  evaluation samples with the rollout settings for the same reason. Files go under
  $MR_RL_CACHE (default ~/.cache/mr_rl): loading the config only records their paths (so
  `--dry_run` writes nothing); `build_assets`, added to `config.setup`, writes the missing
  ones when the run starts. Returns `c`.
  """
  from mr_rl import tiny_assets
  m = MODELS[model_key]
  c.model.path = tiny_assets.tiny_checkpoint_path(m.hub.split("/")[-1], m.family)  # 1 layer, d = 32
  c.model.dtype = "float32"
  c.model.compute_dtype = ""                         # fp32 compute on CPU (bf16 is emulated there)
  c.rollout.dtype = c.rollout.cache_dtype = ""       # the sampler too
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))  # any devices
  c.optim.num_micro_batches = 1                      # 4 rows: no accumulation needed
  c.data.path = tiny_assets.runlocal_data_path(c.data.name)  # a few records in the hub schema
  c.data.eval_set_options = ml_collections.ConfigDict(  # benchmark sets: tiny local files too
      {n.strip(): {"path": tiny_assets.runlocal_data_path(n.strip())}
       for n in str(c.data.get("eval_sets", "")).split(",") if n.strip()})
  opts = dict(c.data.options.to_dict())
  opts.update(tiny_assets.RUNLOCAL_DATA_OPTIONS.get(c.data.name, {}))
  c.data.options = ml_collections.ConfigDict(opts)   # loader options sized for the tiny file
  c.data.batch_prompts = RUNLOCAL["batch_prompts"]   # B = 2
  c.data.max_prompt_len = RUNLOCAL["max_prompt_len"]  # one padded length for every config
  c.rollout.group_size = RUNLOCAL["group_size"]      # G = 2
  c.rollout.max_new_tokens = RUNLOCAL["max_new_tokens"]  # 8 new tokens
  c.rollout.engine = rollout_engines.DEFAULT          # the engines' options (slot counts)
  c.rollout.update(rollout_engines.config_defaults())  # are sized for a chip
  c.rollout.temperature = 1.0
  c.total_steps = min(int(c.total_steps), 1)         # one step (0 stays 0: eval / election only)
  c.checkpoint_every = 0                             # no orbax checkpoints
  c.log_every = 1
  c.anchor.probe_steps = 1                           # TAG: one probe step per channel
  c.anchor.probe_batch_prompts = RUNLOCAL["batch_prompts"]
  c.anchor.held_out_prompts = RUNLOCAL["batch_prompts"]  # drift on 2 held-out prompts
  c.anchor.samples_per_prompt = RUNLOCAL["group_size"]   # same sampler shapes as the rollouts
  c.eval.every = 0
  c.eval.num_prompts = RUNLOCAL["batch_prompts"]     # final eval: 2 prompts x 2 samples
  c.eval.samples_per_prompt = RUNLOCAL["group_size"]
  c.eval.temperature = 1.0                           # sampled, sharing the rollout sampler
  params = c.rewards.params.to_dict()
  for ch in ("alce_correctness", "alce_citation"):
    if ch in str(c.rewards.channels):
      params[ch] = dict(params.get(ch, {}), verifier="lexical")  # no 11B NLI model on a CPU
  if "length" in params:  # AMRP's length rule scaled to 8 tokens
    params["length"] = dict(max_full=4, zero_at=8)
  for ch in [ch for ch in params if ch.startswith("armorm_")]:  # a tiny 3-objective scorer
    params[ch] = dict(rescale=params[ch].get("rescale"), dtype="float32",
                      on_failure=params[ch].get("on_failure"),
                      path=tiny_assets.tiny_reward_model_path())
  c.rewards.params = ml_collections.ConfigDict(params)
  hooks = [h.strip() for h in str(c.setup).split(",") if h.strip()]
  c.setup = ",".join(hooks + [h for h in [BUILD_HOOK] if h not in hooks])  # built at run start
  return c


BUILD_HOOK = "mr_rl.config_lib.local:build_assets"


def build_assets(c) -> None:
  """Writes the runlocal assets that config `c` names and the cache lacks (a `config.setup`
  hook, called when the run starts): the tiny checkpoint at `model.path`, the data files at
  `data.path` and the eval sets' paths, the tiny reward model of the `armorm_*` channels. A
  path overridden to somewhere else is left alone; finished assets are reused."""
  from mr_rl import tiny_assets
  rel = os.path.relpath(os.path.abspath(c.model.path), tiny_assets.asset_dir())
  parts = rel.split(os.sep)
  if len(parts) == 3 and parts[0] == "models":  # models/<family>/<paper model's name>
    tiny_assets.tiny_checkpoint_for(parts[2], parts[1])
  sets = {str(c.data.name): c.data.path}
  sets.update({n: o.get("path") for n, o in c.data.get("eval_set_options", {}).items()})
  for name, path in sets.items():
    if path == tiny_assets.runlocal_data_path(name):
      tiny_assets.runlocal_data(name)
  for params in c.rewards.params.values():
    if hasattr(params, "get") and params.get("path") == tiny_assets.tiny_reward_model_path():
      tiny_assets.tiny_reward_model()


# ------------------------------------------------------------------------------- blockers
def blocker(c) -> str | None:
  """Why a resolved config cannot run in this checkout yet (None if it can).

  `settings.from_config` raises ValueError for these; the sweep listing marks them.
  """
  from mr_rl.rewards import runner
  have = set(runner.available_rewards())
  missing = [ch for ch in (s.strip() for s in str(c.rewards.channels).split(","))
             if ch and ch not in have and not runner.is_import_path(ch)]
  if missing:
    return f"reward channel(s) {missing} are not registered in mr_rl.rewards"
  return None
