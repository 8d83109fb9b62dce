"""`runlocal` (shrink any paper config to a CPU run) and `blocker` (why a config cannot run yet)."""

from __future__ import annotations

import ml_collections

from mr_rl.config_lib.paper import MODELS


RUNLOCAL = dict(batch_prompts=2, group_size=2, max_new_tokens=8,
                max_prompt_len=512)  # the tiny ALCE prompts (3 passages + demo) are ~460 tokens


def runlocal(c, model_key: str):
  """Shrinks config `c` to a CPU run: tiny checkpoint, tiny local data, 1 step of 2 x 2 rollouts.

  The tiny checkpoint (mr_rl.testing) has the paper model's family and sits in a directory named
  after the paper model, so the prompt template style is chosen exactly as for the real one.
  Settings are the same for every config (only family and loss settings differ), so the
  trainer's compiled sampler and step are shared across configs in one process. The end-of-run
  evaluation samples with the rollout settings for the same reason. Files go under
  $MR_RL_CACHE (default ~/.cache/mr_rl); they are written on first use. Returns `c`.
  """
  from mr_rl import testing
  m = MODELS[model_key]
  c.model.path = testing.tiny_checkpoint_for(m.hub.split("/")[-1], m.family)  # 1 layer, d = 32
  c.model.dtype = "float32"
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))  # any devices
  c.optim.num_micro_batches = 1                      # 4 rows: no accumulation needed
  c.data.path = testing.runlocal_data(c.data.name)      # a few records in the hub schema
  c.data.eval_set_options = ml_collections.ConfigDict(  # benchmark sets: tiny local files too
      {n.strip(): {"path": testing.runlocal_data(n.strip())}
       for n in str(c.data.get("eval_sets", "")).split(",") if n.strip()})
  opts = dict(c.data.options.to_dict())
  opts.update(testing.RUNLOCAL_DATA_OPTIONS.get(c.data.name, {}))
  c.data.options = ml_collections.ConfigDict(opts)   # loader options sized for the tiny file
  c.data.batch_prompts = RUNLOCAL["batch_prompts"]   # B = 2
  c.data.max_prompt_len = RUNLOCAL["max_prompt_len"]  # one padded length for every config
  c.rollout.group_size = RUNLOCAL["group_size"]      # G = 2
  c.rollout.max_new_tokens = RUNLOCAL["max_new_tokens"]  # 8 new tokens
  c.rollout.engine, c.rollout.slots = "static", 0      # slot counts are sized for a chip
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
                      path=testing.tiny_reward_model())
  c.rewards.params = ml_collections.ConfigDict(params)
  return c


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
