r"""The embedded CPU demo: multi-reward GRPO on synthetic arithmetic (runs on 2 CPU cores).

    python -m mr_rl.main --config=configs/demo.py --workdir=/tmp/mr_rl_demo

Starts from the shipped base policy (mr_rl/demo/assets/base_policy, made by
`python -m mr_rl.demo.warmstart`, docs/demo.md "Design"), then trains each
task's methods (`DEFAULT_METHODS`: RP-only, additive, 0.9/0.1 weighting, the AND rule, AMRP and
TAG with its anchor elected by single-channel probes) for 80 GRPO steps on three tasks:
`brief` (correct & brief: compatible), `negative` (correct & negative answer: incompatible)
and `acc_fmt_len` (AMRP's accuracy, format and length), each on its own chain lengths. Writes
WORKDIR/report.json, WORKDIR/report.md (every target with yes / no and its value) and
WORKDIR/<task>_{profiles,weights}.png.
Expected runtime: docs/demo.md "Results, seeds 0-4" (at most 15 minutes on 2 idle cores).

Variants (`configs/demo.py:ARG[,ARG]`):
  seed=N  another seed (it also draws the arithmetic problems);
  tasks=A+B  only these tasks, '+'-separated (pilots: `tasks=brief+acc_fmt_len`); each keeps
          its methods, which `--config.demo.methods_for.TASK=m1,m2` can narrow;
  full    more of the papers' tables (at most 40 minutes): AMRP with GDPO and PPO on
          acc_fmt_len, Additive+KL at beta 0.01 and 1 and the down-weighting sweep 0.5 -> 0.1
          on negative, and correct + brief + negative (additive, Rubric Dropout, TAG);
  smoke   seconds (tests).
`python -m mr_rl.demo.summary DIR1 DIR2 ...` tabulates several seeds against the targets.
"""

import os

import ml_collections

from mr_rl import settings

_BASE_POLICY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "mr_rl", "demo", "assets", "base_policy")
# Methods per task: each target's methods, the static baselines, and TAG (anchor election) in
# every task; the `full` variant adds the rest of the papers' tables.
DEFAULT_METHODS = {
    "brief": "rp_only,additive,weighted,tag",
    "negative": "rp_only,additive,weighted,tag",
    "acc_fmt_len": "additive,min,amrp,tag",
}
FULL_METHODS = {
    "brief": "rp_only,additive,weighted,min,amrp,tag",
    "negative": "rp_only,additive,weighted,min,amrp,tag,additive_kl0.01,additive_kl1,"
                "weighted_0.5,weighted_0.3,weighted_0.1",
    "acc_fmt_len": "rp_only,additive,weighted,min,amrp,tag,additive_gdpo,amrp_gdpo,"
                   "additive_ppo,amrp_ppo",
    "brief_negative": "rp_only,additive,dropout,tag",
}
# Problems per task (chains of min..max single-digit terms; the data set's default is 2-7):
# `negative` and `acc_fmt_len` draw long chains only, where accuracy is the hard channel for the
# base policy (the papers' setting: the shortcut pays more reliably than solving, and real
# attempts often run away or break the format; acc_fmt_len's 6-7 terms make step-by-step
# answers overlong and leave few chained answers at full length credit, so static weights
# stay on the shortcut); `brief` draws 4-6 terms, where
# the base's long answers (restated on 4-5 terms, steps on 6) are never brief, its chained
# ones are on 4 terms mostly, and on 5-6 terms only a guess is (3/4 of the prompts have no
# brief correct answer: additive gives up accuracy for the guess, docs/demo.md "Design").
PROBLEMS_FOR = {"brief": {"min_terms": 4, "max_terms": 6}, "negative": {"min_terms": 4},
                "acc_fmt_len": {"min_terms": 6}}


def _parse(arg):
  out = {}
  for part in filter(None, (arg or "").split(",")):
    k, _, v = part.partition("=")
    out[k.strip()] = v.strip() if v else True
  return out


def get_config(arg=None):
  args = _parse(arg)
  unknown = set(args) - {"smoke", "seed", "full", "tasks"}
  if unknown:
    raise ValueError(f"configs/demo.py: unknown arguments {sorted(unknown)}; valid: smoke, "
                     "seed, full, tasks")
  if "smoke" in args and "full" in args:
    raise ValueError("configs/demo.py: smoke and full exclude each other")
  c = settings.default_config()
  c.plugins = "mr_rl.demo"          # registers the arithmetic data set, arith_* channels, 'demo'
  c.pipeline = "demo"
  c.seed = int(args.get("seed", 0))
  c.total_steps = 80                # GRPO steps per (task, method)
  c.checkpoint_every = 0            # the demo's sub-runs are short; no checkpoints
  c.log_every = 10
  c.alarm_window = 10
  c.kl_ref_every = 10               # kl_ref/* metrics only (no KL penalty): every 10th step
  c.model.path = _BASE_POLICY
  c.data.name = "arithmetic"
  c.data.batch_prompts = 8          # B; rollout batch B * G = 64
  c.data.max_prompt_len = 18        # prompts of 7 terms are 17 tokens with <bos>
  c.data.options = ml_collections.ConfigDict(dict(
      num_train=20000, num_eval=512,  # generated train / held-out problems
      min_terms=2, max_terms=7,     # chains of 2-7 single-digit terms
      seed=c.seed))                 # problem draw (follows the run's seed)
  c.rollout.group_size = 8
  c.rollout.max_new_tokens = 48     # the cap: verbose reasoning of long chains overshoots it
  c.optim.lr = 2e-4                 # a tiny model moves slowly at the papers' 1e-6
  c.optim.weight_decay = 0.0
  c.rewards.channels = "arith_acc"  # set per task by the demo driver
  c.rewards.timeout_s = 5.0
  c.anchor.probe_steps = 10         # T (TAG: 300)
  c.anchor.probe_batch_prompts = 8
  c.anchor.held_out_prompts = 64
  c.anchor.samples_per_prompt = 2
  c.anchor.lam = 1.0
  c.eval.num_prompts = 512          # every held-out problem
  c.eval.samples_per_prompt = 2
  c.eval.temperature = 1.0
  c.demo = ml_collections.ConfigDict(dict(
      variant="full" if "full" in args else "smoke" if "smoke" in args else "default",
      tasks="brief,negative,acc_fmt_len",
      methods="rp_only,additive,tag",  # run on every task ...
      methods_for=ml_collections.ConfigDict(DEFAULT_METHODS),  # ... unless listed here
      problems_for=ml_collections.ConfigDict(PROBLEMS_FOR),
      brief_threshold=23,           # tokens (incl. EOS) below which a response is brief
      # AMRP's length rule at toy scale (paper: full to 2,800 tokens, 0 at 3,000), acc_fmt_len
      # only: full to 32, 0 at 40 tokens. On its 6-7 terms a correct chained answer earns full
      # credit mostly on 6 terms, sometimes on 7 (partial otherwise); the base's step-by-step
      # answers, most of its correct reasoning, earn little or none (docs/demo.md "Design").
      len_full_until=32,
      len_zero_at=40,
      ppo_value_lr=1e-3))           # PPO critic learning rate (full variant)
  if "full" in args:
    c.demo.tasks = "brief,negative,acc_fmt_len,brief_negative"
    c.demo.methods_for = ml_collections.ConfigDict(dict(FULL_METHODS))
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
    c.demo.methods_for = ml_collections.ConfigDict()
  if "tasks" in args:
    if "smoke" in args:
      raise ValueError("configs/demo.py: smoke and tasks exclude each other")
    spec = "" if args["tasks"] is True else str(args["tasks"])  # `tasks` or `tasks=`: none
    tasks = [t for t in spec.split("+") if t]
    offered = c.demo.tasks.split(",")
    bad = [t for t in tasks if t not in offered]
    if not tasks or bad:
      raise ValueError(f"configs/demo.py: tasks={spec!r} names {bad or 'no task'}; "
                       f"valid: {'+'.join(offered)}")
    c.demo.tasks = ",".join(tasks)
    c.demo.methods_for = ml_collections.ConfigDict(
        {t: c.demo.methods_for[t] for t in tasks})
  return c
