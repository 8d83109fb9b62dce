r"""The embedded CPU demo: multi-reward GRPO on synthetic arithmetic (runs on 2 CPU cores).

    python -m mr_rl.main --config=configs/demo.py --workdir=/tmp/mr_rl_demo

Starts from the shipped base policy (mr_rl/demo/assets/base_policy, made by
`python -m mr_rl.demo.warmstart`), then compares rp_only, additive, weighted (0.9/0.1), min,
amrp and tag (anchor elected by single-channel probes) on three tasks: `brief` (correct &
brief), `negative` (correct & negative answer) and `acc_fmt_len` (AMRP's three channels).
Writes WORKDIR/report.json, WORKDIR/report.md and WORKDIR/<task>_profiles.png.
Expected runtime: about 8 minutes on 2 idle cores (7.5 min measured, 11 min on one core).
Variant `configs/demo.py:smoke` runs in seconds (tests) and `:seed=N` changes the seed;
`python -m mr_rl.demo.summary DIR1 DIR2 ...` tabulates several seeds against the targets.
"""

import os

import ml_collections

from mr_rl import settings

_BASE_POLICY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "mr_rl", "demo", "assets", "base_policy")


def _parse(arg):
  out = {}
  for part in filter(None, (arg or "").split(",")):
    k, _, v = part.partition("=")
    out[k.strip()] = v.strip() if v else True
  return out


def get_config(arg=None):
  args = _parse(arg)
  unknown = set(args) - {"smoke", "seed"}
  if unknown:
    raise ValueError(f"configs/demo.py: unknown arguments {sorted(unknown)}; valid: smoke, seed")
  c = settings.default_config()
  c.plugins = "mr_rl.demo"          # registers the arithmetic data set, arith_* channels, 'demo'
  c.pipeline = "demo"
  c.seed = int(args.get("seed", 0))
  c.total_steps = 30                # GRPO steps per (task, method)
  c.checkpoint_every = 0            # the demo's sub-runs are short; no checkpoints
  c.log_every = 10
  c.alarm_window = 10
  c.kl_ref_every = 10               # kl_ref/* metrics only (no KL penalty): every 10th step
  c.model.path = _BASE_POLICY
  c.data.name = "arithmetic"
  c.data.batch_prompts = 8          # B; rollout batch B * G = 64
  c.data.max_prompt_len = 16
  c.data.options = ml_collections.ConfigDict(dict(
      num_train=20000, num_eval=512,  # generated train / held-out problems
      seed=c.seed))                 # problem draw (follows the run's seed)
  c.rollout.group_size = 8
  c.rollout.max_new_tokens = 48
  c.optim.lr = 2e-4                 # a tiny model moves slowly at the papers' 1e-6
  c.optim.weight_decay = 0.0
  c.rewards.channels = "arith_acc"  # set per task by the demo driver
  c.rewards.timeout_s = 5.0
  c.anchor.probe_steps = 10         # T (TAG: 300)
  c.anchor.probe_batch_prompts = 8
  c.anchor.held_out_prompts = 64
  c.anchor.samples_per_prompt = 2
  c.anchor.lam = 1.0
  c.eval.num_prompts = 128
  c.eval.samples_per_prompt = 4
  c.eval.temperature = 1.0
  c.demo = ml_collections.ConfigDict(dict(
      tasks="brief,negative,acc_fmt_len",
      methods="rp_only,additive,weighted,min,amrp,tag",
      brief_threshold=14,           # tokens (incl. EOS) below which a response is brief
      len_full_until=12,            # AMRP length rule at toy scale: full reward up to 12 tokens
      len_zero_at=24))              # ... and 0 from 24 tokens
  if "smoke" in args:
    c.total_steps = 2
    c.data.batch_prompts = 4
    c.data.options.num_train = 64
    c.data.options.num_eval = 16
    c.rollout.group_size = 4
    c.rollout.max_new_tokens = 40
    c.anchor.probe_steps = 1
    c.anchor.probe_batch_prompts = 4
    c.anchor.held_out_prompts = 8
    c.anchor.samples_per_prompt = 1
    c.eval.num_prompts = 8
    c.eval.samples_per_prompt = 1
    c.demo.tasks = "negative"
    c.demo.methods = "additive,tag"
  return c
